#include "storage/row_store.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <cstring>

#include "base/profiler.h"

namespace strata {

namespace {

constexpr uint64_t kAlign = storage::kDirectAlign;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

RowStore::RowStore(std::vector<RowTable> tables, const RowStoreOptions& options)
    : tables_(std::move(tables)), options_(options), cache_(std::max<int64_t>(1, [&] {
        uint32_t w = 0;
        for (const RowTable& t : tables_) w = std::max(w, t.row_bytes);
        return w == 0 ? int64_t(1) : std::min<int64_t>(int64_t(options.cache_bytes / w), (int64_t(1) << 30) - 1);
      }())) {}

RowStore::~RowStore() {
  if (reader_) reader_->drain();  // no completion may touch the store after this
  reader_.reset();                 // its thread ends before the members it calls back into go
  for (auto& [tag, r] : reads_) std::free(r.buffer);
  for (auto& list : pool_)
    for (uint8_t* b : list) std::free(b);
}

uint8_t* RowStore::take_buffer_locked(size_t bytes) {
  const size_t c = bytes / kAlign - 1;
  if (c < pool_.size() && !pool_[c].empty()) {
    uint8_t* b = pool_[c].back();
    pool_[c].pop_back();
    pool_bytes_ -= bytes;
    return b;
  }
  auto* b = static_cast<uint8_t*>(std::aligned_alloc(kAlign, bytes));
  STRATA_CHECK(b != nullptr, "out of memory for an Engram read");
  return b;
}

void RowStore::give_buffer_locked(uint8_t* buffer, size_t bytes) {
  if (pool_bytes_ + bytes > kPoolBytes) {
    std::free(buffer);
    return;
  }
  const size_t c = bytes / kAlign - 1;
  if (c >= pool_.size()) pool_.resize(c + 1);
  pool_[c].push_back(buffer);
  pool_bytes_ += bytes;
}

Result<std::unique_ptr<RowStore>> RowStore::open(std::vector<RowTable> tables, const std::string& path,
                                                  const RowStoreOptions& options) {
  if (tables.empty()) return Error{path + ": no row tables to stream"};
  if (options.queue_depth < 1 || options.queue_depth > 1024)
    return Error{strfmt("storage.queue_depth is %d, expected 1 to 1024", options.queue_depth)};
  uint32_t widest = 0;
  for (const RowTable& t : tables) {
    if (t.row_bytes == 0 || t.n_rows == 0 || t.n_rows >= (uint64_t(1) << 40))
      return Error{strfmt("%s: a row table of %" PRIu64 " rows of %u bytes", path.c_str(), t.n_rows, t.row_bytes)};
    widest = std::max(widest, t.row_bytes);
  }
  const uint64_t need = uint64_t(kMinRows) * widest;
  if (options.cache_bytes < need)
    return Error{strfmt("the Engram row cache needs at least %.1f MiB (%" PRId64 " rows of %u bytes) but has %.1f MiB "
                        "(storage.engram_cache, or raise budgets.ram)",
                        double(need) / 0x1p20, kMinRows, widest, double(options.cache_bytes) / 0x1p20)};
  std::unique_ptr<RowStore> s(new RowStore(std::move(tables), options));
  s->path_ = path;
  s->slot_bytes_ = widest;
  s->arena_.resize(size_t(s->cache_.capacity()) * widest);
  s->state_.assign(size_t(s->cache_.capacity()), kEmpty);
  s->wanted_.assign(size_t(s->cache_.capacity()), 0);
  s->pinned_.resize(s->tables_.size());
  storage::BlockReaderOptions ro;
  ro.queue_depth = options.queue_depth;
  ro.use_io_uring = options.use_io_uring;
  ro.direct = options.direct;
  ro.faults = options.faults;
  RowStore* self = s.get();
  auto reader = storage::make_block_reader({path}, ro, [self](uint64_t tag, const Status& st) { self->done(tag, st); });
  if (!reader) return reader.error();
  s->reader_ = std::move(*reader);
  // the tables must lie inside the file (a truncated model is an error now, not at a read)
  const uint64_t size = [&] {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) return uint64_t(0);
    std::fseek(f, 0, SEEK_END);
    const long n = std::ftell(f);
    std::fclose(f);
    return n < 0 ? uint64_t(0) : uint64_t(n);
  }();
  for (const RowTable& t : s->tables_)
    if (t.offset + t.n_rows * t.row_bytes > size)
      return Error{strfmt("%s: a row table at offset %" PRIu64 " of %" PRIu64 " bytes runs past the end of the file "
                          "(%" PRIu64 " bytes)", path.c_str(), t.offset, t.n_rows * t.row_bytes, size)};
  return s;
}

std::vector<int64_t> RowStore::read_rows_locked(int t, std::span<const int64_t> rows,
                                                std::unique_lock<std::mutex>& lock) {
  const RowTable& tab = tables_[size_t(t)];
  std::vector<int64_t> slots(rows.size(), -1);
  std::vector<Read> batch;
  for (size_t i = 0; i < rows.size(); ++i) {
    uint64_t evicted = RowCache::kNone;
    const int64_t slot = cache_.insert(key(t, rows[i]), &evicted);
    if (slot < 0) continue;  // every slot pinned: gather reads it
    if (evicted != RowCache::kNone) state_[size_t(slot)] = kEmpty;
    cache_.pin(slot);
    state_[size_t(slot)] = kLoading;
    slots[i] = slot;
    // the row's covering aligned blocks, merged with the previous read when they touch
    const uint64_t at = tab.offset + uint64_t(rows[i]) * tab.row_bytes;
    const uint64_t first = at / kAlign * kAlign, end = (at + tab.row_bytes + kAlign - 1) / kAlign * kAlign;
    if (!batch.empty() && first <= batch.back().offset + batch.back().bytes &&
        end - batch.back().offset <= std::max<uint64_t>(options_.max_read, kAlign)) {
      Read& r = batch.back();
      r.bytes = size_t(std::max<uint64_t>(r.offset + r.bytes, end) - r.offset);
      r.rows.push_back({at, slot});
    } else {
      batch.push_back(Read{first, size_t(end - first), nullptr, {{at, slot}}});
    }
  }
  if (batch.empty()) return slots;
  std::vector<storage::BlockRead> submit;
  for (Read& r : batch) {
    r.buffer = take_buffer_locked(r.bytes);
    const uint64_t tag = next_tag_++;
    submit.push_back({0, r.offset, r.bytes, r.buffer, tag});
    stats_.reads += 1;
    stats_.bytes_read += r.bytes;
    if (in_flight_++ == 0) busy_since_ = now_seconds();
    reads_.emplace(tag, std::move(r));
  }
  // submit outside the lock: a completion (on the reader's thread) takes it
  lock.unlock();
  for (const storage::BlockRead& b : submit) reader_->submit(b);
  lock.lock();
  return slots;
}

void RowStore::done(uint64_t tag, const Status& status) {
  std::lock_guard lock(mu_);
  auto it = reads_.find(tag);
  STRATA_CHECK(it != reads_.end(), "a completion of an unknown Engram read");
  Read& r = it->second;
  bool wake = false;
  for (const auto& [at, slot] : r.rows) {
    if (status.ok()) {
      std::memcpy(&arena_[size_t(slot) * slot_bytes_], r.buffer + (at - r.offset), slot_bytes_);
      state_[size_t(slot)] = kReady;
    } else {
      state_[size_t(slot)] = kFailed;
    }
    if (wanted_[size_t(slot)]) {
      wanted_[size_t(slot)] = 0;
      wake = --wanted_left_ == 0;
    }
  }
  if (!status.ok() && error_.ok()) error_ = status;
  give_buffer_locked(r.buffer, r.bytes);
  reads_.erase(it);
  if (--in_flight_ == 0) stats_.read_seconds += now_seconds() - busy_since_;
  if (wake) cv_.notify_all();
}

void RowStore::unpin_locked(int64_t slot) {
  if (cache_.unpin(slot) == 0 && state_[size_t(slot)] == kFailed) {
    cache_.erase_slot(slot);  // read again when next asked for
    state_[size_t(slot)] = kEmpty;
  }
}

void RowStore::prefetch(int t, std::span<const int64_t> rows) {
  STRATA_CHECK(t >= 0 && size_t(t) < tables_.size());
  std::vector<int64_t> want(rows.begin(), rows.end());
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  std::unique_lock lock(mu_);
  for (int64_t slot : pinned_[size_t(t)]) unpin_locked(slot);  // a prefetch never gathered
  pinned_[size_t(t)].clear();
  std::vector<int64_t> absent;
  const size_t most = size_t(cache_.capacity() / 2);
  for (int64_t row : want) {
    STRATA_CHECK(row >= 0 && uint64_t(row) < tables_[size_t(t)].n_rows, "Engram row out of its table");
    stats_.lookups += 1;
    const int64_t slot = cache_.find(key(t, row));
    if (slot >= 0 && state_[size_t(slot)] == kFailed) continue;  // its gather fails; read again after
    if (slot >= 0) {
      if (state_[size_t(slot)] == kReady) stats_.cached += 1;
      if (pinned_[size_t(t)].size() < most) {
        cache_.pin(slot);
        pinned_[size_t(t)].push_back(slot);
      }
    } else if (slot < 0 && pinned_[size_t(t)].size() + absent.size() < most) {
      absent.push_back(row);
    }
  }
  const std::vector<int64_t> slots = read_rows_locked(t, absent, lock);
  for (int64_t slot : slots)
    if (slot >= 0) {
      pinned_[size_t(t)].push_back(slot);
      stats_.prefetched += 1;
    }
}

bool RowStore::gather(int t, std::span<const int64_t> rows, uint8_t* out, int tag) {
  STRATA_CHECK(t >= 0 && size_t(t) < tables_.size());
  const uint32_t rb = tables_[size_t(t)].row_bytes;
  std::lock_guard one(gather_mu_);
  std::unique_lock lock(mu_);
  stats_.rows += int64_t(rows.size());
  // the slot of every row; rows in no slot are read now (distinct, sorted), pinned like the others
  std::vector<int64_t> slot_of(rows.size(), -1);
  std::vector<int64_t> held;  // slots this gather pinned
  std::vector<int64_t> absent;
  for (size_t i = 0; i < rows.size(); ++i) {
    STRATA_CHECK(rows[i] >= 0 && uint64_t(rows[i]) < tables_[size_t(t)].n_rows, "Engram row out of its table");
    const int64_t slot = cache_.find(key(t, rows[i]));
    if (slot >= 0) {  // a failed one fails this gather below
      cache_.pin(slot);
      held.push_back(slot);
      slot_of[i] = slot;
    } else {
      absent.push_back(rows[i]);
    }
  }
  std::sort(absent.begin(), absent.end());
  absent.erase(std::unique(absent.begin(), absent.end()), absent.end());
  stats_.lookups += int64_t(absent.size());
  stats_.demand += int64_t(absent.size());
  const std::vector<int64_t> read = read_rows_locked(t, absent, lock);
  bool ok = true;
  for (size_t i = 0; i < read.size(); ++i) {
    if (read[i] < 0) {
      // every slot is pinned (a cache far too small for one step): fail loudly, never zeros
      if (error_.ok())
        error_ = Error{strfmt("%s: the Engram row cache (%" PRId64 " rows) cannot hold one step's rows; raise "
                              "storage.engram_cache", path_.c_str(), cache_.capacity())};
      ok = false;
      continue;
    }
    held.push_back(read[i]);  // pinned by the read
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (slot_of[i] >= 0) continue;
    const size_t j = size_t(std::lower_bound(absent.begin(), absent.end(), rows[i]) - absent.begin());
    slot_of[i] = read[j];
  }
  // wait for the rows in flight (one wake-up when the last is in), then copy
  const double t0 = now_seconds();
  for (int64_t slot : slot_of)
    if (slot >= 0 && state_[size_t(slot)] == kLoading && !wanted_[size_t(slot)]) {
      wanted_[size_t(slot)] = 1;
      ++wanted_left_;
    }
  const bool waited = wanted_left_ > 0;
  cv_.wait(lock, [&] { return wanted_left_ == 0; });
  for (size_t i = 0; ok && i < rows.size(); ++i) {
    const int64_t slot = slot_of[i];
    if (slot < 0) continue;
    if (state_[size_t(slot)] != kReady) {
      ok = false;
      break;
    }
    std::memcpy(out + i * rb, &arena_[size_t(slot) * slot_bytes_], rb);
  }
  if (waited) {
    const double w = now_seconds() - t0;
    stats_.wait_seconds += w;
    const int64_t ns = int64_t(w * 1e9);
    prof::record(prof::Part::engram, tag, prof::Link::nvme_wait, prof::now_ns() - ns, ns);
  }
  for (int64_t slot : held) unpin_locked(slot);
  for (int64_t slot : pinned_[size_t(t)]) unpin_locked(slot);
  pinned_[size_t(t)].clear();
  return ok;
}

Status RowStore::take_error() {
  std::lock_guard lock(mu_);
  Status e = error_;
  error_ = Status::success();
  return e;
}

RowStoreStats RowStore::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void RowStore::reset_stats() {
  std::lock_guard lock(mu_);
  stats_ = RowStoreStats{};
}

}  // namespace strata
