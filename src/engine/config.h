// The run-time configuration: a TOML file (presets in configs/, every key in docs/config.md),
// overridden key by key from the command line. One mechanism: the file is parsed into a table,
// each override (`--set budgets.ram=16GiB`, or a flag such as -t that names a key) replaces one
// entry of that table, and the merged table is validated into a Config in one place. An unknown
// key, a value of the wrong type or range, or a size that does not parse is an Error naming the
// key (and the file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/mapped_file.h"
#include "cpu/numa.h"
#include "model/kv_cache.h"
#include "model/model_info.h"

namespace strata {

// The limits of a machine: measured by `strata calibrate` (cached) or stated in a config's
// [hardware] table (a preset describing a box the user plans for). 0 = unknown.
struct HardwareLimits {
  double dram_gbps = 0;         // streaming read of RAM by all compute threads, GB/s
  double weights_gbps = 0;      // what the decode kernels achieve reading expert weights, GB/s
  double nvme_gbps = 0;         // O_DIRECT reads at the configured queue depth, GB/s
  double nvme_4k_gbps = 0;      // random 4 KiB O_DIRECT reads at queue depth 64 (Engram rows), GB/s
  double repack_gbps = 0;       // experts read from NVMe interleaved for the kernels by all threads, GB/s
  double pcie_h2d_gbps = 0;     // host to device copies from pinned memory, GB/s
  double pcie_d2h_gbps = 0;     // device to host
  double cpu_int8_gops = 0;     // int8 GOP/s the prefill GEMM kernels reach (2 ops per MAC)
  double cpu_bf16_gflops = 0;   // bf16 (or f32 FMA) peak
  double gpu_gbps = 0;          // VRAM read bandwidth, GB/s
  double gpu_tflops = 0;        // GPU matrix throughput on quantized weights, TFLOP/s
  // What the whole CPU forward pass reaches of the kernel-bound prediction (attention, routing and
  // dispatch cost on top of the kernels): measured by `strata calibrate -m MODEL`. 0 = unknown
  // (the planner then predicts the kernel-bound upper bound).
  double cpu_decode_efficiency = 0;
  double cpu_prefill_efficiency = 0;
  uint64_t ram_bytes = 0;       // installed RAM (the planner's default ram budget is 90% of it)
  uint64_t vram_bytes = 0;      // VRAM of the GPU (0: no GPU)
  std::string cpu_name;
  std::string gpu_name;
};

// Fills the fields of `into` that are 0 / empty from `from`.
void fill_unknown(HardwareLimits& into, const HardwareLimits& from);

struct Config {
  std::string source = "defaults";  // the file it came from, for messages

  // [model]
  std::string model_path;  // empty: the bundled model
  int ctx = 0;             // context cap; 0: the model's training context
  MappedFile::Mode load = MappedFile::Mode::automatic;
  KvType kv_type = KvType::f16;  // GQA KV cache entries (the exact path is always float)

  // [budgets]; nullopt: automatic (ram: what the machine has available; vram: none)
  std::optional<uint64_t> ram_budget;
  uint64_t vram_budget = 0;

  // [gpu]
  bool gpu_simulate = false;  // the GPU tier on the simulated device (docs/gpu.md)
  int gpu_max_promotions = 4;  // experts copied into the VRAM cache per step at most
  std::string gpu_heat_file;   // routing counts: loaded at start (warm start), saved at exit

  // [cpu]
  int threads = 0;  // 0: one per physical core
  bool pin = true;
  bool repack = true;  // weights read into RAM rewritten into the kernels' layouts (cpu/repack.h)

  // [numa]: policy and topology (docs/numa.md); STRATA_TOPOLOGY in the environment sets the
  // topology when the config does not
  cpu::NumaOptions numa;

  // [storage]
  int queue_depth = 32;    // io_uring queue depth of NVMe reads (calibration, streaming)
  int prefetch_depth = 2;  // layers of routing look-ahead for NVMe prefetch
  std::string cache_policy = "lfu";
  // RAM for deepseek41's Engram row cache when its tables are streamed (0: an eighth of what
  // budgets.ram leaves for streaming, at most the tables)
  uint64_t engram_cache = 0;
  // deepseek41's Engram tables when the model is streamed: "stream" (read row by row, the
  // default) or "ram" (copied into RAM with the resident weights, counted in budgets.ram)
  std::string engram_tables = "stream";

  // [server]
  std::string host = "127.0.0.1";
  int port = 8080;
  int max_sequences = 4;  // sequences decoded together (continuous batching)
  int max_queue = 16;     // requests waiting for a slot before new ones get 429
  bool cache_prompt = true;  // a request reuses the longest prompt prefix a free slot holds
  int prefill_chunk = 512;   // prompt tokens evaluated per step (0: a whole prompt at once)
  uint64_t max_body = uint64_t(4) << 20;
  std::string api_key;    // empty: none

  // [hardware]: stated limits; the rest comes from the calibration cache
  HardwareLimits hardware;
};

// One `key=value` override (dotted key, TOML value: `budgets.ram=16GiB`, `cpu.threads=4`,
// `model.load="ram"`; a bare word is taken as a string).
struct ConfigOverride {
  std::string key;
  std::string value;
};
Result<ConfigOverride> parse_override(std::string_view text);

// Parses `text` (TOML; `name` in messages) with `overrides` applied on top.
Result<Config> parse_config(std::string_view text, std::string name,
                            const std::vector<ConfigOverride>& overrides = {});
// Reads `path` (empty: no file, only defaults and overrides).
Result<Config> load_config(const std::string& path, const std::vector<ConfigOverride>& overrides = {});

// "22GiB", "512 MiB", "1.5GB", "4096" (bytes), "auto" is not a size. Binary (KiB..TiB) and decimal
// (KB..TB) units, case-insensitive; B optional ("16G" = 16 GiB, as llama.cpp users write it).
Result<uint64_t> parse_size(std::string_view text);

// Every key the config accepts, "table.key", with its one-line description (docs/config.md lists
// the same; a test keeps them in step).
struct ConfigKey {
  std::string_view key;
  std::string_view what;
};
std::vector<ConfigKey> config_keys();

// The checks of budgets.ram / budgets.vram against this machine (`mem`, `n_gpus`) and a model
// whose KV cache for the planned context takes `kv_bytes`, and the load mode they
// imply: an Error names the key and the numbers; `notes` gets lines to print.
struct BudgetCheck {
  MappedFile::Mode load = MappedFile::Mode::automatic;
  // > 0: the routed experts do not all fit; they are streamed from the file by the NVMe tier
  // (storage/expert_store.h) with this much RAM for its cache, and every other weight is copied
  // into RAM.
  uint64_t expert_cache_bytes = 0;
  // > 0 (with expert_cache_bytes): deepseek41's Engram tables stay in the file too, read row by
  // row into a row cache of this much RAM (storage/row_store.h); taken from the streamed part.
  uint64_t engram_cache_bytes = 0;
  std::vector<std::string> notes;
};
// Memory strata keeps out of the expert cache for everything else it allocates (activations,
// scratch buffers, the tokenizer, thread stacks): the cache gets budgets.ram less the resident
// weights, the KV cache and this.
inline constexpr uint64_t kRamOverhead = uint64_t(256) << 20;
// model.load = "auto" reads the file into RAM when the weights, the KV cache and this much more
// fit in the memory available now (the rest of the process, the page cache's working set, the OS).
inline constexpr uint64_t kLoadMargin = uint64_t(1) << 30;
Result<BudgetCheck> check_budgets(const Config& c, const ModelSummary& s, uint64_t kv_bytes,
                                  const SystemMemory& mem, int n_gpus);

// The calibration cache: `strata calibrate` writes it, everything that needs the machine's
// limits reads it. $STRATA_CALIBRATION, else $XDG_CACHE_HOME/strata/calibration.toml, else
// ~/.cache/strata/calibration.toml.
std::string calibration_path();
struct Calibration {
  HardwareLimits limits;
  std::string date;  // when it was measured
  std::string isa;   // kernel ISA it was measured with
  int threads = 0;
};
// nullopt when the file does not exist; an Error when it exists but does not parse.
Result<std::optional<Calibration>> read_calibration(const std::string& path);
// The limits a command works with: the config's [hardware] keys, the rest from this machine's
// calibration cache (if any). `source` says where they came from ("none" when from neither).
struct ResolvedLimits {
  HardwareLimits limits;
  std::string source;
};
Result<ResolvedLimits> resolve_limits(const Config& c);
Status write_calibration(const std::string& path, const Calibration& c);

}  // namespace strata
