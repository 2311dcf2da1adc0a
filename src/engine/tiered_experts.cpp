#include "engine/tiered_experts.h"

#include <chrono>
#include <memory>

#include "engine/gpu_tier.h"
#include "model/blocks.h"
#include "storage/expert_store.h"

namespace strata {

namespace {

// An expert of the store as the FFN runner sees it: in once its three reads are.
class StreamedExpert final : public PendingWeights {
 public:
  explicit StreamedExpert(const ExpertView& v) : v_(v) {}
  bool arrived() const override { return v_.state->load(std::memory_order_relaxed) != ExpertStore::kLoading; }
  bool wait() const override { return v_.wait(); }

 private:
  const ExpertView& v_;
};

void from_stacks(const LayerWeights& l, int32_t e, FfnWork& f) {
  f.gate = l.gate_exps.slice(e);
  f.up = l.up_exps.slice(e);
  f.down = l.down_exps.slice(e);
}

}  // namespace

int TieredExperts::lookahead_depth() const { return store_ != nullptr ? store_->prefetch_depth() : 0; }

void TieredExperts::prefetch(int layer, int distance, std::span<const int32_t> experts) {
  if (store_ != nullptr) store_->prefetch(layer, distance, experts);
}

void TieredExperts::run(const cpu::Matmul& mm, const LayerWeights& l, int il, const Routing& r, const float* h,
                        int64_t n_tok, int64_t n_embd, const GluParams& glu, float* out) {
  if (store_ == nullptr && gpu_ == nullptr) {
    moe_ffn(mm, l, r, h, n_tok, n_embd, out, glu);
    return;
  }
  std::fill(out, out + n_tok * n_embd, 0.0f);
  ExpertBatch batch = group_by_expert(l, r, n_tok, n_embd);
  if (store_ != nullptr) run_streamed(mm, il, batch, h, n_tok, glu, out);
  else run_gpu(mm, l, il, r, batch, h, n_tok, n_embd, glu, out);
}

// Groups of at most chunk_experts(), each acquired (reads start for the experts not in RAM),
// computed (ready experts first) and released. Groups go in id order and run_ffns adds each
// token's experts in id order, so `out` sums exactly as in one call.
void TieredExperts::run_streamed(const cpu::Matmul& mm, int il, ExpertBatch& batch, const float* h, int64_t n_tok,
                                 const GluParams& glu, float* out) {
  const std::vector<int32_t>& ids = batch.ids;
  const size_t chunk = size_t(store_->chunk_experts());
  const std::shared_ptr<const cpu::NumaLayout> numa = cpu::numa_snapshot();
  store_->begin_layer(il, ids);
  for (size_t c0 = 0; c0 < ids.size(); c0 += chunk) {
    const std::span<const int32_t> group(ids.data() + c0, std::min(chunk, ids.size() - c0));
    const std::vector<ExpertView> views = store_->acquire(il, group);
    std::vector<StreamedExpert> pending;
    pending.reserve(group.size());
    std::vector<FfnWork> part;
    part.reserve(group.size());
    for (size_t i = 0; i < group.size(); ++i) {
      FfnWork f = std::move(batch.work[c0 + i]);
      f.gate = views[i].gate;
      f.up = views[i].up;
      f.down = views[i].down;
      f.pending = &pending.emplace_back(views[i]);
      part.push_back(std::move(f));
    }
    run_ffns(mm, part, h, n_tok, glu, out, numa.get());
    store_->release(views);
  }
}

// The GPU tier's placement per expert: from its VRAM slot (simulated: the CPU kernels on the
// slot's bytes, the same as the host's), in the device share (a real GPU, issued before the CPU's
// share and added after it), or on the CPU from the model's weights.
void TieredExperts::run_gpu(const cpu::Matmul& mm, const LayerWeights& l, int il, const Routing& r,
                            ExpertBatch& batch, const float* h, int64_t n_tok, int64_t n_embd, const GluParams& glu,
                            float* out) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t>& ids = batch.ids;
  std::vector<FfnWork>& sorted = batch.work;
  gpu_->observe(il, std::span<const int32_t>(r.ids.data(), size_t(n_tok * r.k)));
  std::vector<int64_t> n_of(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) n_of[i] = int64_t(sorted[i].tokens.size());
  const std::vector<GpuTier::Assignment> sites = gpu_->place(l, il, ids, n_of);
  // a real GPU's share: its kernels are issued now and run while the CPU computes the rest
  std::vector<GpuTier::DeviceFfn> on_device;
  std::vector<size_t> device_idx;
  std::vector<FfnWork> on_cpu;
  on_cpu.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    FfnWork& f = sorted[i];
    if (sites[i].on_device) {
      on_device.push_back({.expert = ids[i], .site = &sites[i], .tokens = f.tokens, .scale = f.scale});
      device_idx.push_back(i);
      continue;
    }
    if (sites[i].views) {  // from its VRAM slot (the simulated device computes it with the same kernels)
      f.gate = sites[i].views->gate;
      f.up = sites[i].views->up;
      f.down = sites[i].views->down;
    } else {  // the CPU's, or shipped (the simulated device computes those from host memory too)
      from_stacks(l, ids[i], f);
    }
    on_cpu.push_back(std::move(f));
  }
  if (!on_device.empty()) gpu_->begin_device_share(l, il, on_device, h, n_tok, n_embd, glu);
  const std::shared_ptr<const cpu::NumaLayout> numa = cpu::numa_snapshot();
  run_ffns(mm, on_cpu, h, n_tok, glu, out, numa.get());
  if (!on_device.empty() && !gpu_->end_device_share(out)) {  // a CUDA error: the CPU computes them
    std::vector<FfnWork> redo;
    for (size_t i : device_idx) {
      from_stacks(l, ids[i], sorted[i]);
      redo.push_back(std::move(sorted[i]));
    }
    run_ffns(mm, redo, h, n_tok, glu, out, numa.get());
  }
  gpu_->layer_done(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace strata
