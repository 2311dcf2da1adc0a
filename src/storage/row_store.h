// Rows of large tables in a read-only file, read into a RAM row cache through the block reader:
// the NVMe tier of deepseek41's Engram tables (issue #32). The store knows byte ranges, not models:
// table t is n_rows rows of row_bytes bytes from file offset `offset` (the engine describes the
// model's tables so).
//
// The rows a step needs are known before it needs them (Engram rows depend on token ids alone), so
// the caller names them early with prefetch() and collects them with gather():
//  - prefetch sorts and deduplicates the rows not in RAM, takes a cache slot for each, and reads
//    them as the aligned blocks that cover them (rows smaller than a block are read as their
//    block; rows in the same or adjacent blocks are merged into one read of up to max_read bytes),
//    all queued at once at the reader's depth;
//  - gather copies the rows out in the order asked, waiting for those still in flight and reading
//    any not prefetched. Rows prefetched for a table stay pinned in their slots until its next
//    gather (or prefetch), so a batch's rows are never evicted between the two.
// A failed read (after the block reader's retries) fails the gather: it returns false and
// take_error() names the file and offset; the rows are never zeros. A later gather reads them again.
//
// Which rows stay is RowCache's choice (row_cache.h: CLOCK). Thread-safety: every public member may
// be called from any thread; completions run on the reader's thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "storage/block_reader.h"
#include "storage/row_cache.h"

namespace strata {

struct RowTable {
  uint64_t offset = 0;   // file offset of row 0
  uint64_t n_rows = 0;
  uint32_t row_bytes = 0;
};

struct RowStoreOptions {
  uint64_t cache_bytes = 0;  // RAM for the row slots (storage.engram_cache)
  int queue_depth = 64;
  size_t max_read = 128 * 1024;  // bytes of one merged read at most
  bool use_io_uring = true;
  bool direct = true;
  const storage::FaultInjection* faults = nullptr;  // tests
};

// Counters since open (or reset_stats). A lookup is one distinct row of one prefetch or gather
// that was not already asked for in this step.
struct RowStoreStats {
  int64_t rows = 0;            // rows gathered (repeats included)
  int64_t lookups = 0;         // distinct rows asked for
  int64_t cached = 0;          // ... found in RAM (no read for this step): the cache's hits
  int64_t prefetched = 0;      // rows read by prefetch
  int64_t demand = 0;          // rows gather had to read (not prefetched)
  int64_t reads = 0;           // block reads submitted
  uint64_t bytes_read = 0;     // their bytes (whole aligned blocks)
  double read_seconds = 0;     // wall time with at least one read in flight
  double wait_seconds = 0;     // time gather spent waiting for reads
  double hit_rate() const { return lookups ? double(cached) / double(lookups) : 0.0; }
  double read_gbps() const { return read_seconds > 0 ? double(bytes_read) / read_seconds / 1e9 : 0.0; }
};

class RowStore {
 public:
  // Errors: no tables, a table that does not fit the file, the file cannot be opened, a cache
  // smaller than kMinRows rows of the widest table.
  static constexpr int64_t kMinRows = 4096;
  static Result<std::unique_ptr<RowStore>> open(std::vector<RowTable> tables, const std::string& path,
                                                 const RowStoreOptions& options);
  ~RowStore();

  // Table t's `rows` (any order, repeats allowed) will be gathered next: reads start now for the
  // rows not in RAM. Rows beyond half the cache's slots are left for gather to read.
  void prefetch(int t, std::span<const int64_t> rows);
  // Table t's `rows` into out [rows.size()][row_bytes], in order. False when a read failed
  // (take_error() says which); out is then unspecified. `tag` labels the profiler's wait spans (the
  // caller's layer).
  bool gather(int t, std::span<const int64_t> rows, uint8_t* out, int tag = -1);
  // The first read failure since the last call, naming the file and offset (ok when none).
  Status take_error();

  RowStoreStats stats() const;
  void reset_stats();
  std::string_view read_method() const { return reader_->method(); }
  int64_t n_slots() const { return cache_.capacity(); }
  const std::vector<RowTable>& tables() const { return tables_; }

 private:
  enum SlotState : uint8_t { kEmpty = 0, kLoading = 1, kReady = 2, kFailed = 3 };
  struct Read {
    uint64_t offset = 0;
    size_t bytes = 0;
    uint8_t* buffer = nullptr;  // aligned, owned until completion
    std::vector<std::pair<uint64_t, int64_t>> rows;  // (file offset of the row, slot)
  };
  RowStore(std::vector<RowTable> tables, const RowStoreOptions& options);
  static uint64_t key(int t, int64_t row) { return uint64_t(t) << 40 | uint64_t(row); }
  // Takes slots for the absent rows of `rows` (sorted, distinct) of table t, pinned, and submits
  // their reads; rows with no slot to take are skipped. Returns the slots, -1 where skipped. mu_ held.
  std::vector<int64_t> read_rows_locked(int t, std::span<const int64_t> rows, std::unique_lock<std::mutex>& lock);
  void done(uint64_t tag, const Status& status);
  void unpin_locked(int64_t slot);
  // Staging buffers of whole blocks, kept for reuse (up to kPoolBytes): allocating and freeing
  // one per read cost page faults at every read. mu_ held.
  uint8_t* take_buffer_locked(size_t bytes);
  void give_buffer_locked(uint8_t* buffer, size_t bytes);
  static constexpr size_t kPoolBytes = size_t(64) << 20;
  std::vector<std::vector<uint8_t*>> pool_;  // [blocks - 1]
  size_t pool_bytes_ = 0;

  std::vector<RowTable> tables_;
  RowStoreOptions options_;
  std::string path_;
  uint32_t slot_bytes_ = 0;
  std::vector<uint8_t> arena_;  // [slot][slot_bytes_]
  std::unique_ptr<storage::BlockReader> reader_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  RowCache cache_;
  std::vector<uint8_t> state_;                  // [slot] SlotState
  // the gather in progress (one at a time: gather_mu_) waits for the slots marked wanted_, counted
  // in wanted_left_; a completion wakes it only when the last of them is in
  std::mutex gather_mu_;
  std::vector<uint8_t> wanted_;                 // [slot]
  int64_t wanted_left_ = 0;
  std::vector<std::vector<int64_t>> pinned_;    // [table]: slots prefetch pinned for the next gather
  std::unordered_map<uint64_t, Read> reads_;    // by tag
  uint64_t next_tag_ = 1;
  int in_flight_ = 0;
  double busy_since_ = 0;
  RowStoreStats stats_;
  Status error_;
};

}  // namespace strata
