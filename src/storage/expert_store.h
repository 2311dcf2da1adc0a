// The host expert cache of the NVMe tier (issue #6): routed experts that do not all fit in
// `budgets.ram` live in fixed-size slots of one RAM arena and are read from the model file on
// demand or ahead of need (routing look-ahead), through the block reader (block_reader.h).
//
// A slot holds one expert of one layer: its gate, up and down matrices, each read as the
// kDirectAlign-aligned range covering it in the file (the file keeps its layout; O_DIRECT wants
// aligned ranges), then row-interleaved in place (cpu/repack.h) when the model's resident weights
// are, so the kernels and the results are those of the all-in-RAM run.
//
// Which experts stay is the cache policy's choice (expert_cache.h: LFU with decay by default).
// Its capacity is the slot count less a reserve; the reserve holds experts in transit: one the
// policy declined but a token needs now, or an evicted one still being read or computed. A slot is
// reused only when no read into it is in flight and no computation holds it (pins), so a read never
// lands in memory a kernel is reading, and an expert is computed only once its three reads are in.
//
// Thread-safety: every public member may be called from any thread; the forward pass calls
// acquire / release for a layer's experts, prefetch for the layers ahead, and compute threads wait
// on ExpertView::wait.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "cpu/weights.h"
#include "storage/block_reader.h"
#include "storage/expert_cache.h"

namespace strata {

// What the store streams: each layer's routed experts as stacked matrices in the file (the store
// knows byte ranges, not models; the engine describes a model so, engine/engine.h).
struct ExpertLayout {
  int n_expert = 0;       // experts per MoE layer
  int n_expert_used = 0;  // chosen per token (the reserve and chunk sizes follow from it)
  // [layer][gate, up, down]: the stacks ([n_expert] matrices in the file's layout, each Weight's
  // data inside `file`); empty Weights for a layer without routed experts
  std::vector<std::array<Weight, 3>> stacks;
  std::span<const uint8_t> file;  // the mapped file the stacks point into (offsets are data - file)
  bool repack = false;            // interleave each matrix where read, as the resident weights are
};

struct ExpertStoreOptions {
  uint64_t cache_bytes = 0;   // RAM for the slots (budgets.ram less the resident part)
  int queue_depth = 32;       // storage.queue_depth
  int prefetch_depth = 2;     // storage.prefetch_depth: layers of routing look-ahead (0: none)
  CachePolicyOptions policy;  // storage.cache_policy
  bool use_io_uring = true;
  bool direct = true;          // O_DIRECT (tests on tmpfs may turn it off)
  const storage::FaultInjection* faults = nullptr;  // tests
};

// Counters since open (or reset_stats). Bytes are file bytes of whole aligned ranges.
struct ExpertStoreStats {
  int64_t accesses = 0;        // experts a layer computed
  int64_t hits = 0;            // ... in RAM or on their way (prefetched) when asked for
  int64_t demand_reads = 0;    // experts read because a layer needed them now
  int64_t prefetch_reads = 0;  // experts read ahead of need
  int64_t prefetch_used = 0;   // prefetched experts a layer then used
  uint64_t bytes_read = 0;
  double read_seconds = 0;     // wall time with at least one read in flight
  double wait_seconds = 0;     // time compute threads spent waiting for reads
  // per look-ahead distance d = 1 .. prefetch_depth: experts predicted, and of those the ones the
  // layer then chose; chosen: experts the layers chose (the recall's denominator)
  std::vector<int64_t> predicted, predicted_right, chosen;
  std::vector<int64_t> demand_reads_by_layer;
  // Found in RAM without a read for this use: the cache's own hits (prefetched experts are misses
  // the look-ahead hid, counted in prefetch_used).
  double hit_rate() const { return accesses ? double(hits - prefetch_used) / double(accesses) : 0.0; }
  // Of the misses, the share a prefetch had already started or finished.
  double prefetch_coverage() const {
    const int64_t misses = accesses - (hits - prefetch_used);
    return misses ? double(prefetch_used) / double(misses) : 0.0;
  }
  double read_gbps() const { return read_seconds > 0 ? double(bytes_read) / read_seconds / 1e9 : 0.0; }
};

// One expert of a layer as the kernels see it. The weights may still be on their way: call wait()
// before reading them (ok() then says whether they arrived).
struct ExpertView {
  Weight gate, up, down;
  const std::atomic<int32_t>* state = nullptr;  // see ExpertStore::SlotState
  std::atomic<int64_t>* wait_ns = nullptr;      // the store's wait counter
  int32_t slot = -1;
  int32_t layer = -1;  // the layer it serves (the profiler's spans)
  // Blocks until the expert's reads completed; false when one failed (the store's take_error()
  // says which file and offset). The first caller to find the bytes in but not yet in the kernels'
  // layout interleaves them (a compute thread that would otherwise wait: the reader's thread stays
  // free to keep the disk busy).
  bool wait() const;
};

class ExpertStore {
 public:
  // kLoading: reads in flight; kRead: bytes in, to be interleaved by the first ExpertView::wait();
  // kRepacking: being interleaved.
  enum SlotState : int32_t { kEmpty = 0, kLoading = 1, kRead = 2, kRepacking = 3, kReady = 4, kFailed = 5 };

  // The experts of `layout`, read from `path` (the file the layout's stacks are mapped from).
  // Errors: no routed experts; the file cannot be opened; cache_bytes too small for the reserve
  // plus a useful cache (the message gives the minimum).
  static Result<std::unique_ptr<ExpertStore>> open(const ExpertLayout& layout, const std::string& path,
                                                   const ExpertStoreOptions& options);
  ~ExpertStore();

  // Layer `layer` of a forward pass chose `experts` (all of them, distinct): counts the look-ahead's
  // predictions for it, drops its queued prefetches and earlier layers' unused prefetched experts,
  // and advances the policy's clock. Then acquire() takes them in chunks.
  void begin_layer(int layer, std::span<const int32_t> experts);
  // Up to chunk_experts() of the experts begin_layer() named: pins them and starts the reads of
  // those not in RAM, then returns their views in the same order. The caller computes the ready
  // ones first, wait()s for the others, and calls release() with the views when done. Blocks only
  // when every slot is pinned or being read.
  std::vector<ExpertView> acquire(int layer, std::span<const int32_t> experts);
  void release(std::span<const ExpertView> views);
  // The expert if its bytes are in RAM now (read, not in flight and not failed), pinned as
  // acquire() pins (release() it); nothing otherwise, and nothing is read. Not a layer's use: the
  // policy and the counters do not see it (the GPU tier copies hot experts from here).
  std::optional<ExpertView> pin_if_in_ram(int layer, int expert);

  // Experts layer `layer` is predicted to choose, best first, `distance` layers ahead of the one
  // being computed: reads start for those not in RAM, if slots are free; predictions for a layer
  // already computed, or not yet read when a newer prediction arrives, are dropped.
  void prefetch(int layer, int distance, std::span<const int32_t> experts);

  // The first read failure since the last call, as an error naming the file and offset (ok when
  // none), and forgets it. A forward pass that met a failed expert computed it as zeros; the
  // caller reports this error instead of its logits. (A later access reads the expert again.)
  Status take_error();

  int prefetch_depth() const { return options_.prefetch_depth; }
  // Whether a layer's matrices of a role (0 gate, 1 up, 2 down) are row-interleaved in the slots
  // (as the resident weights of a model read into RAM are), once ExpertView::wait() returned.
  bool interleaved(int layer, int role) const { return interleave_[size_t(layer) * 3 + size_t(role)] != 0; }
  // Most experts one acquire() may ask for (a layer with more is computed in groups).
  int chunk_experts() const { return chunk_; }
  int64_t n_slots() const { return n_slots_; }
  // The fewest slots open() accepts: the reserve plus one token's experts.
  int64_t min_slots() const { return min_slots_; }
  size_t slot_bytes() const { return slot_bytes_; }
  uint64_t arena_bytes() const { return uint64_t(n_slots_) * slot_bytes_; }
  std::string_view read_method() const { return reader_->method(); }
  ExpertStoreStats stats() const;
  void reset_stats();

  // Where the slots are (tests: with nothing acquired and no read in flight, every slot is free,
  // resident, or a prefetched expert waiting for its layer: `other` is 0, or a slot leaked).
  struct SlotCounts {
    int64_t free = 0, resident = 0, prefetched = 0, other = 0;
  };
  SlotCounts slot_counts() const;
  // Waits until no read is in flight.
  void drain() { reader_->drain(); }

 private:
  struct Matrix {  // one of an expert's three matrices in a slot
    uint64_t file_offset = 0;  // the aligned range read
    size_t read_bytes = 0;
    size_t skip = 0;           // bytes before the matrix in the range
  };
  struct Slot {
    std::atomic<int32_t> state{kEmpty};
    ExpertKey key = kNoExpert;  // the expert it holds or is reading
    int32_t pins = 0;
    int32_t reads_left = 0;
    bool mapped = false;        // key -> slot in slot_of_ (a policy resident), else in transit
    bool prefetched = false;    // read by prefetch and not yet used (kept until its layer passes)
    bool failed = false;        // one of its reads failed
  };

  explicit ExpertStore(const ExpertStoreOptions& options);
  // Under mu_. admit: a slot for the non-resident `key`, inserted into the policy when it accepts
  // it; waits for a free slot on `wait` (demand), else gives up (-1; prefetch).
  int32_t admit(ExpertKey key, std::unique_lock<std::mutex>* wait);
  // A prefetched expert in transit, now used: into the policy if it accepts it.
  void promote(ExpertKey key, int32_t slot);
  // Takes the policy's victim out of the map; returns its slot when it is idle (reusable now).
  int32_t evict(ExpertKey victim);
  void start_read(int32_t slot, bool demand);
  void maybe_free(int32_t slot);
  void pump_prefetch();
  void on_read_done(uint64_t tag, const Status& status);
  Weight view(int32_t slot, int role) const;

  ExpertStoreOptions options_;
  CacheShape shape_;
  int64_t n_slots_ = 0, reserve_ = 0, min_slots_ = 0;
  int chunk_ = 0;
  size_t slot_bytes_ = 0;
  std::vector<Weight> stacks_;                 // [layer * 3 + role] gate, up, down stacks
  std::vector<Matrix> matrices_;               // [key * 3 + role]
  std::vector<size_t> role_offset_;            // [layer * 3 + role] offset in a slot
  std::vector<uint8_t> interleave_;            // [layer * 3 + role] repack after reading
  uint8_t* arena_ = nullptr;
  std::atomic<int64_t> wait_ns_{0};
  std::unique_ptr<Slot[]> slots_;
  std::unique_ptr<storage::BlockReader> reader_;

  mutable std::mutex mu_;
  std::condition_variable freed_;
  std::unique_ptr<CachePolicy> policy_;
  std::vector<int32_t> slot_of_;     // [n_keys] the slot holding it (resident or prefetched), or -1
  std::vector<int32_t> transit_prefetched_;  // prefetched slots the policy declined, not yet used
  std::vector<int32_t> free_;        // slots holding nothing
  std::deque<ExpertKey> prefetch_queue_;  // by layer, each layer's best first
  int64_t step_ = 0;                 // routing steps seen (policy time)
  int in_flight_ = 0;                // expert reads started, not done
  int demand_waiting_ = 0;           // acquire() calls waiting for a free slot: prefetch yields
  double busy_since_ = 0;
  int64_t busy_since_ns_ = 0;        // the same on the profiler's clock
  ExpertStoreStats stats_;
  Status error_ = Status::success();
  std::vector<std::vector<int32_t>> predicted_;  // [layer * (depth + 1) + d] experts predicted
};

}  // namespace strata
