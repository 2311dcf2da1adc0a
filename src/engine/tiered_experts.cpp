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

// One look-ahead for both caches: experts with a VRAM slot are not read into RAM.
void TieredExperts::prefetch(int layer, int distance, std::span<const int32_t> experts) {
  if (store_ == nullptr) return;
  if (gpu_ == nullptr) {
    store_->prefetch(layer, distance, experts);
    return;
  }
  std::vector<int32_t> wanted;
  for (int32_t e : experts)
    if (!gpu_->resident(layer, e)) wanted.push_back(e);
  store_->prefetch(layer, distance, wanted);
}

// Each active expert runs where the GPU tier places it (with one): in the device share (a real
// GPU: issued before the CPU's share, added after it), from its VRAM slot (simulated: the CPU
// kernels on the slot's bytes, which are the host's), or on the CPU from host memory: the expert
// store's RAM slots (read from the file on demand or ahead of need) or the model's own stacks.
void TieredExperts::run(const cpu::Matmul& mm, const LayerWeights& l, int il, const Routing& r, const float* h,
                        int64_t n_tok, int64_t n_embd, const GluParams& glu, float* out) {
  if (store_ == nullptr && gpu_ == nullptr) {
    moe_ffn(mm, l, r, h, n_tok, n_embd, out, glu);
    return;
  }
  std::fill(out, out + n_tok * n_embd, 0.0f);
  ExpertBatch batch = group_by_expert(l, r, n_tok, n_embd);
  const std::vector<int32_t>& ids = batch.ids;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<GpuTier::Assignment> sites;
  if (gpu_ != nullptr) {
    gpu_->observe(il, std::span<const int32_t>(r.ids.data(), size_t(n_tok * r.k)));
    std::vector<int64_t> n_of(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) n_of[i] = int64_t(batch.work[i].tokens.size());
    sites = gpu_->place(l, il, ids, n_of);
  }
  std::vector<GpuTier::DeviceFfn> on_device;
  std::vector<size_t> device_idx;
  HostShare host;
  for (size_t i = 0; i < ids.size(); ++i) {
    FfnWork& f = batch.work[i];
    if (!sites.empty() && sites[i].on_device) {
      on_device.push_back({.expert = ids[i], .site = &sites[i], .tokens = f.tokens, .scale = f.scale});
      device_idx.push_back(i);
      continue;
    }
    const bool from_slot = !sites.empty() && sites[i].views.has_value();
    if (from_slot) {
      f.gate = sites[i].views->gate;
      f.up = sites[i].views->up;
      f.down = sites[i].views->down;
    } else if (store_ == nullptr) {  // the CPU's, or shipped (the simulated device computes those from host memory too)
      from_stacks(l, ids[i], f);
    }
    host.add(ids[i], store_ != nullptr && !from_slot, std::move(f));
  }
  if (!on_device.empty()) gpu_->begin_device_share(l, il, on_device, h, n_tok, n_embd, glu);
  run_host(mm, il, host, h, n_tok, glu, out);
  if (!on_device.empty() && !gpu_->end_device_share(out)) {  // a CUDA error: the CPU computes them
    HostShare redo;
    for (size_t i : device_idx) {
      if (store_ == nullptr) from_stacks(l, ids[i], batch.work[i]);
      redo.add(ids[i], store_ != nullptr, std::move(batch.work[i]));
    }
    run_host(mm, il, redo, h, n_tok, glu, out);
  }
  if (gpu_ != nullptr) gpu_->layer_done(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// The host's share in id order. Without streamed experts, one run_ffns. Else in segments of at
// most chunk_experts() streamed experts (with the other experts between them), each segment's
// streamed experts acquired (reads start for those not in RAM), computed (ready experts first)
// and released. run_ffns adds each token's experts in batch order, so `out` sums in id order
// exactly as one call over every expert does (the all-in-RAM run).
void TieredExperts::run_host(const cpu::Matmul& mm, int il, HostShare& host,
                             const float* h, int64_t n_tok, const GluParams& glu, float* out) {
  const std::shared_ptr<const cpu::NumaLayout> numa = cpu::numa_snapshot();
  const size_t n = host.ids.size();
  std::vector<int32_t> streamed_ids;
  for (size_t i = 0; i < n; ++i)
    if (host.streamed[i]) streamed_ids.push_back(host.ids[i]);
  if (streamed_ids.empty()) {
    run_ffns(mm, host.work, h, n_tok, glu, out, numa.get());
    return;
  }
  const size_t chunk = size_t(store_->chunk_experts());
  store_->begin_layer(il, streamed_ids);
  for (size_t i = 0; i < n;) {
    size_t j = i, count = 0;
    std::vector<int32_t> group;
    while (j < n && (count < chunk || !host.streamed[j])) {
      if (host.streamed[j]) {
        group.push_back(host.ids[j]);
        ++count;
      }
      ++j;
    }
    const std::vector<ExpertView> views = store_->acquire(il, group);
    std::vector<StreamedExpert> pending;
    pending.reserve(views.size());  // no reallocation: part[] points into it
    std::vector<FfnWork> part;
    part.reserve(j - i);
    for (size_t k = i, v = 0; k < j; ++k) {
      FfnWork f = std::move(host.work[k]);
      if (host.streamed[k]) {
        f.gate = views[v].gate;
        f.up = views[v].up;
        f.down = views[v].down;
        f.pending = &pending.emplace_back(views[v]);
        ++v;
      }
      part.push_back(std::move(f));
    }
    run_ffns(mm, part, h, n_tok, glu, out, numa.get());
    store_->release(views);
    i = j;
  }
}

}  // namespace strata
