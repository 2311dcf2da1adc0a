// The VRAM arena and its elastic cache of hot routed experts (issue #7, docs/gpu.md), on a
// gpu::Device (device.h): the simulated device in tests, CudaDevice on a GPU.
//
// The arena under budgets.vram holds, in this order of precedence:
//   fixed    dense weights, embeddings, head: what every token needs (a start-up error if it does
//            not fit, saying how much is needed);
//   scratch  activations of the largest batch;
//   KV       the KV cache, which grows with context and sequences;
//   experts  slots of one routed expert each (its gate, up and down matrices), in all the rest.
// Fixed, scratch and KV are booked on the device (their memory is the backend's, or host
// memory); only the slots are the cache's own device memory.
// Elastic: when the KV cache grows, the coldest experts are evicted to make room; when it
// shrinks, the freed room becomes slots again.
//
// Hot experts are found online. Each step's routing adds to per-expert counts, which decay by
// `decay` per step. After a step, at most `max_promotions` experts are promoted: the hottest
// that are not resident, each only if it is hotter than the coldest resident by the factor
// (1 + hysteresis), so that two experts of similar heat do not trade places every step. A
// promotion copies the expert from host memory on the copy stream, after every kernel that read
// the slot's previous expert (the slot's last-read event); the slot serves kernels only once its
// copy has completed by the time the compute stream reaches them, so promotions never stall
// compute: until then the expert runs on the CPU.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/error.h"
#include "gpu/device.h"

namespace strata::gpu {

struct VramCacheParams {
  double decay = 0.9;       // per step: counts of about the last 10 steps matter
  int max_promotions = 4;   // per step
  double hysteresis = 0.5;  // a promoted expert must be 1.5x as hot as the one it replaces
};

class VramExpertCache {
 public:
  // fixed + scratch must fit in the device; the rest becomes expert slots of slot_bytes.
  static Result<std::unique_ptr<VramExpertCache>> create(Device& dev, uint64_t fixed_bytes, uint64_t scratch_bytes,
                                                         uint64_t slot_bytes, int n_layer, int n_expert,
                                                         VramCacheParams params = {});
  ~VramExpertCache();

  // The KV cache's part of the arena becomes `bytes` (rounded up to whole slots' worth of
  // memory): growing evicts the coldest experts, shrinking gives slots back. Errors when it would
  // not fit even with every expert evicted; nothing changes then.
  Status set_kv_bytes(uint64_t bytes);
  uint64_t kv_bytes() const { return kv_bytes_; }
  // The largest KV part the arena can give (every expert evicted), in whole slots' worth.
  uint64_t max_kv_bytes() const {
    return ((dev_.capacity() - dev_.used()) / slot_bytes_ + slots_.size() + kv_.size()) * slot_bytes_;
  }

  // One layer's routing in this step: ids of the chosen experts (any count, repeats count twice).
  void observe(int layer, std::span<const int32_t> ids);
  // Ends a step: counts decay, and promotions are issued (returns how many). host(layer, expert)
  // gives the expert's bytes in host memory, in pieces (its gate, up and down matrices) that are
  // copied one after the other into the slot, slot_bytes in all; no pieces: the expert is not in
  // host memory now (streamed from NVMe), it is skipped and stays a candidate.
  using HostBytes = std::function<std::vector<std::span<const uint8_t>>(int layer, int expert)>;
  int end_step(const HostBytes& host);
  // Warm start: the counts become `heat` ([layer][expert], from an earlier run's heat_table())
  // and the hottest experts are promoted at once, as many as there are slots (their copies are
  // queued on the copy stream like any promotion). Returns how many.
  int warm_start(std::span<const double> heat, const HostBytes& host);
  const std::vector<double>& heat_table() const { return heat_; }

  // The slot that can serve (layer, expert) for a kernel on `stream` now: resident, and its copy
  // completed by the stream's time. -1: compute it on the CPU.
  int ready_slot(int layer, int expert, int stream) const;
  // Runs a kernel that reads `slot` on `stream` (Device::launch), after the slot's copy.
  void run(int stream, int slot, double seconds, const std::function<void()>& fn);
  const uint8_t* slot_data(int slot) const { return slots_[size_t(slot)].buf.data; }

  int64_t n_slots() const { return int64_t(slots_.size()); }
  int64_t n_resident() const;
  double heat(int layer, int expert) const { return heat_[size_t(layer) * size_t(n_expert_) + size_t(expert)]; }
  bool resident(int layer, int expert) const { return where_[size_t(layer) * size_t(n_expert_) + size_t(expert)] >= 0; }
  int copy_stream() const { return copy_stream_; }
  uint64_t promotions() const { return promotions_; }
  uint64_t evictions() const { return evictions_; }
  // Kernels that had to wait for their slot's copy (ready_slot should never hand such a slot out).
  uint64_t stalls() const { return stalls_; }

 private:
  struct Slot {
    Device::Buffer buf;
    int key = -1;        // layer * n_expert + expert, -1: empty
    int ready = -1;      // event: its copy completes
    int last_read = -1;  // event: the last kernel reading it ends
  };
  VramExpertCache(Device& dev, uint64_t slot_bytes, int n_layer, int n_expert, VramCacheParams p);
  // Fills the free memory with slots (until the budget, or the device, has no room for one).
  void grow_slots();
  // Promotes at most `limit` of the hottest non-resident experts (end_step's rule).
  int promote(int limit, const HostBytes& host);
  // The resident slot of the coldest expert (or an empty slot), -1 if none.
  int coldest_slot() const;
  void drop_slot(size_t i);

  Device& dev_;
  uint64_t slot_bytes_;
  int n_layer_, n_expert_;
  VramCacheParams p_;
  Device::Buffer fixed_, scratch_;
  std::vector<Device::Buffer> kv_;
  uint64_t kv_bytes_ = 0;
  std::vector<Slot> slots_;
  std::vector<double> heat_;  // [layer][expert]
  std::vector<int> where_;    // [layer][expert] -> slot, -1
  int copy_stream_ = -1;
  uint64_t promotions_ = 0, evictions_ = 0, stalls_ = 0;
};

}  // namespace strata::gpu
