// The engine: the composition root (../shared/DESIGN.md). Engine::open builds, from a config, the
// model's weights, the backend its dense part runs on (CUDA when budgets.vram names a real GPU),
// the tiers of the routed experts (the GPU tier's VRAM cache, the NVMe tier's RAM cache over the
// file) and the one RoutedExperts the forward passes reach them through. Sessions (session.h) of
// an engine run on what it built; the front ends (cli, server) talk to the engine only.
//
// Ownership: the engine owns the model and every tier; the tiers refer to the model and go first
// (destroyed in reverse order of building). Not thread-safe: one forward pass at a time, as for
// its sessions.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "base/error.h"
#include "engine/config.h"
#include "model/experts.h"
#include "model/model.h"
#include "model/model_info.h"

namespace strata {

class ExpertStore;
class GpuTier;
class RowStore;
class StreamedEngram;
class RoutingOverride;
class Session;
class TieredExperts;

class Engine {
 public:
  // The config's model under its budgets: the header is read first and the budgets checked
  // against it and this machine (errors name the key and the numbers), the compute pool started
  // with the config's threads and NUMA layout, the weights loaded (the routed experts left in the
  // file for the NVMe tier when budgets.ram is below the model), then the tiers built.
  // `cmd` prefixes the lines it logs on stderr ("strata run"): notes, and one start-up line that
  // says where every part of the model went.
  static Result<std::unique_ptr<Engine>> open(const Config& config, const char* cmd);
  // A model as loaded, with no tier: every expert from its weights, the CPU backend (tests and
  // tools; set_* below attach tiers).
  explicit Engine(std::unique_ptr<Model> model);
  // The same under `config`, with the model's summary already made.
  Engine(std::unique_ptr<Model> model, const Config& config, ModelSummary summary);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Model& model() const { return *model_; }
  Model& model() { return *model_; }
  const Config& config() const { return config_; }
  const ModelSummary& summary() const { return summary_; }

  // The tiers (null: none). set_* replace one (null: remove it).
  ExpertStore* expert_store() const { return store_.get(); }
  GpuTier* gpu_tier() const { return gpu_.get(); }
  // The backend of quantized-path sessions (null: each session's own CpuBackend).
  const Backend* backend() const { return backend_.get(); }
  void set_expert_store(std::unique_ptr<ExpertStore> store);
  void set_gpu_tier(std::unique_ptr<GpuTier> gpu);
  void set_backend(std::unique_ptr<Backend> backend);
  // deepseek41's Engram rows on the NVMe tier (null: from the model's tables).
  RowStore* engram_store() const { return engram_store_.get(); }
  EngramRows* engram() const;
  void set_engram_store(std::unique_ptr<RowStore> store);
  // Replaces the routers' choices of the main layers (benchmarks: --routing). Not owned.
  RoutingOverride* routing_override() const { return routing_; }
  void set_routing_override(RoutingOverride* routing) { routing_ = routing; }

  // The routed experts over the tiers, as the forward passes call them.
  RoutedExperts& experts() const;

  // Routed-expert uses (one expert of one layer in one forward pass) since start, by the tier its
  // weights came from, and bytes over each link. Without a tier, nothing is counted (every use is
  // RAM's).
  struct TierStats {
    uint64_t uses = 0, vram = 0, ram = 0, nvme = 0;
    uint64_t promotions = 0;   // experts copied into VRAM slots
    uint64_t pcie_bytes = 0;   // host -> device copies of the GPU tier (promotions, shipped experts)
    uint64_t nvme_bytes = 0;   // read from the model file
  };
  TierStats tier_stats() const;

  // After a forward pass: the first read failure of the NVMe tier since the last call (the pass
  // computed that expert as zeros, or skipped those Engram rows; its logits must not be used), as
  // an error naming the file and offset, else ok.
  Status take_error() const;
  // After a forward pass over `sessions` (their positions advanced): the GPU tier's KV booking and
  // its promotions.
  void end_step(std::span<Session* const> sessions) const;
  // A session of this engine is going away (its KV booking is released).
  void session_closed(const Session* session) const;

 private:
  void wire_tiers();
  std::unique_ptr<Model> model_;
  Config config_;
  ModelSummary summary_;
  // destroyed in reverse: the experts over the tiers, the GPU tier (it promotes from the store
  // and saves its heat file from the model's shape), the store, the backend, then the model
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ExpertStore> store_;
  std::unique_ptr<RowStore> engram_store_;
  std::unique_ptr<StreamedEngram> engram_;  // over engram_store_
  std::unique_ptr<GpuTier> gpu_;
  std::unique_ptr<TieredExperts> experts_;  // over gpu_ and store_: rebuilt when they change
  RoutingOverride* routing_ = nullptr;
};

// The NVMe tier's view of a model loaded with streamed experts: each layer's stacks in its file.
struct ExpertLayout;
ExpertLayout expert_layout(const Model& m);

}  // namespace strata
