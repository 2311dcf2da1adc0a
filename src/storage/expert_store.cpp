#include "storage/expert_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <utility>
#include <cinttypes>

#include "base/profiler.h"
#include "cpu/repack.h"

namespace strata {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRoles = 3;  // gate, up, down
constexpr size_t kAlign = storage::kDirectAlign;

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

double now_seconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

}  // namespace

bool ExpertView::wait() const {
  if (state == nullptr) return true;
  auto& st = const_cast<std::atomic<int32_t>&>(*state);  // the slot's, which the store owns
  std::chrono::steady_clock::time_point t0{};
  for (;;) {
    int32_t v = st.load(std::memory_order_acquire);
    if (v == ExpertStore::kReady || v == ExpertStore::kFailed) {
      if (t0 != Clock::time_point{}) {
        const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
        if (wait_ns != nullptr) wait_ns->fetch_add(ns, std::memory_order_relaxed);
        prof::record(prof::Part::experts, layer, prof::Link::nvme_wait, prof::now_ns() - ns, ns);
      }
      return v == ExpertStore::kReady;
    }
    if (v == ExpertStore::kRead) {
      // another thread may win: then look again (waiting on whatever the failed exchange saw
      // could be waiting on kReady, which nobody will change)
      if (!st.compare_exchange_strong(v, ExpertStore::kRepacking, std::memory_order_acquire)) continue;
      for (const Weight* w : {&gate, &up, &down}) {
        if (!w->interleaved) continue;
        Weight file_layout = *w;
        file_layout.interleaved = false;
        cpu::interleave(file_layout, const_cast<uint8_t*>(w->data), /*on_pool=*/false);
      }
      st.store(ExpertStore::kReady, std::memory_order_release);
      st.notify_all();
      continue;
    }
    if (t0 == Clock::time_point{}) t0 = Clock::now();
    st.wait(v, std::memory_order_acquire);
  }
}

ExpertStore::ExpertStore(const ExpertStoreOptions& options) : options_(options) {}

ExpertStore::~ExpertStore() {
  {
    std::lock_guard lock(mu_);
    prefetch_queue_.clear();  // completions during the drain must not start more reads
  }
  if (reader_) reader_->drain();  // no read may land in the arena, nor call back, after this
  reader_.reset();
  if (arena_ != nullptr) ::munmap(arena_, size_t(n_slots_) * slot_bytes_);
}

Result<std::unique_ptr<ExpertStore>> ExpertStore::open(const ExpertLayout& layout, const std::string& path,
                                                        const ExpertStoreOptions& options) {
  const int n_layer = int(layout.stacks.size());
  if (layout.n_expert <= 0) return Error{path + ": the model has no routed experts to stream"};
  if (options.queue_depth < 1 || options.queue_depth > 1024)
    return Error{strfmt("storage.queue_depth is %d, expected 1 to 1024", options.queue_depth)};
  if (options.prefetch_depth < 0 || options.prefetch_depth > 8)
    return Error{strfmt("storage.prefetch_depth is %d, expected 0 to 8", options.prefetch_depth)};
  std::unique_ptr<ExpertStore> s(new ExpertStore(options));
  s->shape_ = CacheShape{n_layer, layout.n_expert};

  // Where each matrix of each expert lies in the file, and where in a slot it goes: a slot has one
  // region per role, big enough for the aligned range covering that role's matrix in any layer.
  const uint8_t* base = layout.file.data();
  const size_t L = size_t(n_layer);
  s->stacks_.resize(L * kRoles);
  s->role_offset_.assign(L * kRoles, 0);
  s->interleave_.assign(L * kRoles, 0);
  s->matrices_.resize(size_t(s->shape_.n_keys()) * kRoles);
  for (size_t il = 0; il < L; ++il) {
    const std::array<Weight, kRoles>& stacks = layout.stacks[il];
    if (!stacks[0]) continue;
    size_t offset = 0;
    for (int r = 0; r < kRoles; ++r) {
      const Weight& st = stacks[r];
      STRATA_CHECK(st.n_mat == layout.n_expert && !st.interleaved, "streamed experts must stay in the file's layout");
      STRATA_CHECK(st.data >= base && st.data + size_t(st.n_mat) * st.mat_bytes() <= base + layout.file.size(),
                   "a streamed stack lies inside the layout's file");
      s->stacks_[il * kRoles + size_t(r)] = st;
      s->role_offset_[il * kRoles + size_t(r)] = offset;
      offset += round_up(st.mat_bytes(), kAlign) + kAlign;  // an aligned cover is at most this
      Weight one = st.slice(0);
      s->interleave_[il * kRoles + size_t(r)] = layout.repack && cpu::can_interleave(one);
      for (int64_t e = 0; e < layout.n_expert; ++e) {
        const uint64_t at = uint64_t(st.data - base) + uint64_t(e) * st.mat_bytes();
        const uint64_t first = at / kAlign * kAlign, end = round_up(at + st.mat_bytes(), kAlign);
        s->matrices_[size_t(s->shape_.key(int32_t(il), int32_t(e))) * kRoles + size_t(r)] =
            Matrix{first, size_t(end - first), size_t(at - first)};
      }
    }
    s->slot_bytes_ = std::max(s->slot_bytes_, offset);
  }
  if (s->slot_bytes_ == 0) return Error{path + ": the model has no routed-expert layers to stream"};

  // The reserve: slots for experts in transit, outside the policy's capacity. The pinned experts
  // of the chunk being computed are at most chunk_ (declined by the policy, or evicted while
  // pinned); prefetched experts the policy declined wait for their layer in the rest (prefetch
  // never takes the last chunk_ free slots).
  s->chunk_ = std::min(layout.n_expert, std::max(8, 2 * layout.n_expert_used));
  s->reserve_ = int64_t(s->chunk_) + (options.queue_depth + kRoles - 1) / kRoles + 1 +
                int64_t(options.prefetch_depth) * layout.n_expert_used;
  s->n_slots_ = int64_t(options.cache_bytes / s->slot_bytes_);
  const int64_t min_slots = s->min_slots_ = s->reserve_ + layout.n_expert_used;  // a cache of one token's experts
  if (s->n_slots_ < min_slots) {
    return Error{strfmt("the routed-expert cache needs at least %" PRId64 " slots of %.1f MiB = %.0f MiB, "
                        "but budgets.ram leaves %.0f MiB for it (raise budgets.ram)",
                        min_slots, double(s->slot_bytes_) / 0x1p20, double(min_slots) * double(s->slot_bytes_) / 0x1p20,
                        double(options.cache_bytes) / 0x1p20)};
  }

  const size_t arena_bytes = size_t(s->n_slots_) * s->slot_bytes_;
  void* p = ::mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return Error{strfmt("cannot reserve %.0f MiB for the routed-expert cache", double(arena_bytes) / 0x1p20)};
  s->arena_ = static_cast<uint8_t*>(p);
  (void)::madvise(p, arena_bytes, MADV_HUGEPAGE);
  s->slots_ = std::make_unique<Slot[]>(size_t(s->n_slots_));
  for (int64_t i = s->n_slots_ - 1; i >= 0; --i) s->free_.push_back(int32_t(i));
  s->slot_of_.assign(size_t(s->shape_.n_keys()), -1);
  s->policy_ = make_cache_policy(options.policy);
  s->policy_->reset(s->shape_, s->n_slots_ - s->reserve_);
  s->predicted_.resize(L * size_t(options.prefetch_depth + 1));
  s->reset_stats();

  storage::BlockReaderOptions ro;
  ro.queue_depth = options.queue_depth;
  ro.use_io_uring = options.use_io_uring;
  ro.direct = options.direct;
  ro.buffer = std::span<uint8_t>(s->arena_, arena_bytes);
  ro.faults = options.faults;
  ExpertStore* self = s.get();
  auto reader = storage::make_block_reader({path}, ro, [self](uint64_t tag, const Status& st) { self->on_read_done(tag, st); });
  if (!reader) return reader.error();
  s->reader_ = std::move(*reader);
  return s;
}

Weight ExpertStore::view(int32_t slot, int role) const {
  const Slot& sl = slots_[size_t(slot)];
  const size_t layer = size_t(shape_.layer_of(sl.key));
  const Matrix& m = matrices_[size_t(sl.key) * kRoles + size_t(role)];
  Weight w = stacks_[layer * kRoles + size_t(role)].slice(0);
  w.data = arena_ + size_t(slot) * slot_bytes_ + role_offset_[layer * kRoles + size_t(role)] + m.skip;
  w.interleaved = interleave_[layer * kRoles + size_t(role)] != 0;
  return w;
}

void ExpertStore::begin_layer(int layer, std::span<const int32_t> experts) {
  std::lock_guard lock(mu_);
  ++step_;
  std::erase_if(prefetch_queue_, [&](ExpertKey k) { return shape_.layer_of(k) <= layer; });
  // prefetched experts of earlier layers that those did not choose: no longer wanted
  for (int32_t s : std::exchange(transit_prefetched_, {})) {
    Slot& sl = slots_[size_t(s)];
    if (!sl.prefetched || sl.mapped) continue;  // used (or taken in by the policy) meanwhile
    if (shape_.layer_of(sl.key) < layer) {
      sl.prefetched = false;
      maybe_free(s);
    } else {
      transit_prefetched_.push_back(s);
    }
  }
  // how well the look-ahead predicted this layer
  const int D = options_.prefetch_depth;
  for (int d = 1; d <= D; ++d) {
    std::vector<int32_t>& p = predicted_[size_t(layer) * size_t(D + 1) + size_t(d)];
    if (p.empty()) continue;
    stats_.predicted[size_t(d - 1)] += int64_t(p.size());
    stats_.chosen[size_t(d - 1)] += int64_t(experts.size());
    for (int32_t e : p)
      stats_.predicted_right[size_t(d - 1)] += std::count(experts.begin(), experts.end(), e) > 0;
    p.clear();
  }
}

std::vector<ExpertView> ExpertStore::acquire(int layer, std::span<const int32_t> experts) {
  STRATA_CHECK(int(experts.size()) <= chunk_, "acquire() of more experts than chunk_experts()");
  std::unique_lock lock(mu_);
  std::vector<ExpertView> views;
  views.reserve(experts.size());
  for (int32_t e : experts) {
    STRATA_CHECK(e >= 0 && e < shape_.n_expert);
    const ExpertKey key = shape_.key(layer, e);
    policy_->observe(key, step_);
    ++stats_.accesses;
    int32_t s = slot_of_[size_t(key)];
    if (s >= 0) {
      ++stats_.hits;
      Slot& sl = slots_[size_t(s)];
      if (sl.prefetched) {
        ++stats_.prefetch_used;
        sl.prefetched = false;
      }
      if (!sl.mapped) promote(key, s);  // prefetched in transit: the policy may keep it now
    } else {
      s = admit(key, &lock);
      start_read(s, true);
      ++stats_.demand_reads;
      ++stats_.demand_reads_by_layer[size_t(layer)];
    }
    Slot& sl = slots_[size_t(s)];
    ++sl.pins;
    views.push_back({view(s, 0), view(s, 1), view(s, 2), &sl.state, &wait_ns_, s, layer});
  }
  return views;
}

std::optional<ExpertView> ExpertStore::pin_if_in_ram(int layer, int expert) {
  STRATA_CHECK(expert >= 0 && expert < shape_.n_expert && layer >= 0 && layer < shape_.n_layer);
  std::lock_guard lock(mu_);
  const int32_t s = slot_of_[size_t(shape_.key(layer, expert))];
  if (s < 0) return std::nullopt;
  Slot& sl = slots_[size_t(s)];
  const int32_t state = sl.state.load(std::memory_order_acquire);
  if (state != kRead && state != kRepacking && state != kReady) return std::nullopt;
  ++sl.pins;
  return ExpertView{view(s, 0), view(s, 1), view(s, 2), &sl.state, &wait_ns_, s, layer};
}

void ExpertStore::promote(ExpertKey key, int32_t slot) {
  const ExpertKey victim = policy_->insert(key);
  if (victim == key) return;  // declined: freed after its use
  if (victim != kNoExpert) {
    const int32_t idle = evict(victim);
    if (idle >= 0) {
      free_.push_back(idle);
      freed_.notify_all();
    }
  }
  slots_[size_t(slot)].mapped = true;
}

int32_t ExpertStore::evict(ExpertKey victim) {
  const int32_t vs = slot_of_[size_t(victim)];
  STRATA_CHECK(vs >= 0 && slots_[size_t(vs)].mapped, "the policy evicted an expert the store does not hold");
  slot_of_[size_t(victim)] = -1;
  Slot& v = slots_[size_t(vs)];
  v.mapped = false;
  v.prefetched = false;
  if (v.pins == 0 && v.state.load(std::memory_order_relaxed) != kLoading) {
    v.key = kNoExpert;  // idle: the caller may reuse it at once
    v.state.store(kEmpty, std::memory_order_relaxed);
    return vs;
  }
  return -1;  // in transit: freed when its pins and reads are done (maybe_free)
}

void ExpertStore::release(std::span<const ExpertView> views) {
  std::lock_guard lock(mu_);
  for (const ExpertView& v : views) {
    Slot& sl = slots_[size_t(v.slot)];
    STRATA_CHECK(sl.pins > 0, "release() of an expert that is not acquired");
    --sl.pins;
    maybe_free(v.slot);
  }
  pump_prefetch();
}

int32_t ExpertStore::admit(ExpertKey key, std::unique_lock<std::mutex>* wait) {
  const ExpertKey victim = policy_->insert(key);
  const bool declined = victim == key;
  // declined: the expert is still read, into a slot outside the policy's capacity (the reserve),
  // freed once used (a demand read) or once its layer has passed (a prefetch)
  int32_t s = -1, busy_victim = -1;
  bool victim_prefetched = false;
  if (!declined && victim != kNoExpert) {
    const int32_t vs = slot_of_[size_t(victim)];
    victim_prefetched = vs >= 0 && slots_[size_t(vs)].prefetched;
    s = evict(victim);
    if (s < 0) busy_victim = vs;
  }
  if (s < 0) {
    // a prefetch leaves chunk_ free slots: all a demand chunk can need beyond evicting idle experts
    if (wait == nullptr ? free_.size() <= size_t(chunk_) : free_.empty()) {
      if (wait == nullptr) {  // give up, and put back what insert() changed
        if (!declined) policy_->erase(key);
        if (busy_victim >= 0) {  // still in its slot: it stays resident
          STRATA_CHECK(policy_->insert(victim) == kNoExpert, "re-inserting an evicted expert evicted another");
          slot_of_[size_t(victim)] = busy_victim;
          slots_[size_t(busy_victim)].mapped = true;
          slots_[size_t(busy_victim)].prefetched = victim_prefetched;
        }
        return -1;
      }
      // Every slot is resident, pinned or being read; the reserve guarantees reads in flight or
      // pins of other chunks that will free one.
      ++demand_waiting_;
      freed_.wait(*wait, [&] { return !free_.empty(); });
      --demand_waiting_;
    }
    s = free_.back();
    free_.pop_back();
  }
  Slot& sl = slots_[size_t(s)];
  sl.key = key;
  sl.mapped = !declined;
  sl.prefetched = false;
  if (!declined || wait == nullptr) slot_of_[size_t(key)] = s;  // a declined prefetch is found by its layer
  return s;
}

void ExpertStore::start_read(int32_t slot, bool demand) {
  Slot& sl = slots_[size_t(slot)];
  sl.state.store(kLoading, std::memory_order_relaxed);
  sl.reads_left = kRoles;
  sl.failed = false;
  sl.prefetched = !demand;
  if (in_flight_++ == 0) {
    busy_since_ = now_seconds();
    busy_since_ns_ = prof::now_ns();
  }
  const size_t layer = size_t(shape_.layer_of(sl.key));
  uint8_t* dst = arena_ + size_t(slot) * slot_bytes_;
  for (int r = 0; r < kRoles; ++r) {
    const Matrix& m = matrices_[size_t(sl.key) * kRoles + size_t(r)];
    stats_.bytes_read += m.read_bytes;
    reader_->submit({0, m.file_offset, m.read_bytes, dst + role_offset_[layer * kRoles + size_t(r)],
                     uint64_t(slot) * 4 + uint64_t(r)});
  }
}

void ExpertStore::maybe_free(int32_t slot) {
  Slot& sl = slots_[size_t(slot)];
  if (sl.mapped || sl.prefetched || sl.pins > 0 || sl.key == kNoExpert ||
      sl.state.load(std::memory_order_relaxed) == kLoading)
    return;
  if (slot_of_[size_t(sl.key)] == slot) slot_of_[size_t(sl.key)] = -1;
  sl.key = kNoExpert;
  sl.state.store(kEmpty, std::memory_order_relaxed);
  free_.push_back(slot);
  freed_.notify_all();
}

void ExpertStore::on_read_done(uint64_t tag, const Status& status) {
  const int32_t s = int32_t(tag / 4);
  std::lock_guard lock(mu_);
  Slot& sl = slots_[size_t(s)];
  if (!status.ok()) {
    // reported by the forward pass that holds the expert; an unused prefetch's failure is not
    // its business (the expert is read again if a layer chooses it)
    if (sl.pins > 0 && error_.ok()) error_ = status;
    sl.failed = true;
  }
  if (--sl.reads_left > 0) return;
  const bool ok = !sl.failed;
  if (!ok) {  // not kept: a later access reads it again
    if (sl.mapped) policy_->erase(sl.key);
    if (slot_of_[size_t(sl.key)] == s) slot_of_[size_t(sl.key)] = -1;
    sl.mapped = false;
    sl.prefetched = false;
  }
  const size_t layer = size_t(shape_.layer_of(sl.key));
  const bool repack = interleave_[layer * kRoles] || interleave_[layer * kRoles + 1] || interleave_[layer * kRoles + 2];
  sl.state.store(!ok ? kFailed : repack ? kRead : kReady, std::memory_order_release);
  sl.state.notify_all();
  if (--in_flight_ == 0) {
    stats_.read_seconds += now_seconds() - busy_since_;
    prof::record(prof::Part::experts, -1, prof::Link::nvme_read, busy_since_ns_, prof::now_ns() - busy_since_ns_);
  }
  maybe_free(s);
  pump_prefetch();
}

void ExpertStore::prefetch(int layer, int distance, std::span<const int32_t> experts) {
  STRATA_CHECK(distance >= 1 && distance <= options_.prefetch_depth && layer < shape_.n_layer);
  std::lock_guard lock(mu_);
  predicted_[size_t(layer) * size_t(options_.prefetch_depth + 1) + size_t(distance)].assign(experts.begin(), experts.end());
  // a newer prediction for the layer replaces the one still queued
  std::erase_if(prefetch_queue_, [&](ExpertKey k) { return shape_.layer_of(k) == layer; });
  auto at = std::find_if(prefetch_queue_.begin(), prefetch_queue_.end(), [&](ExpertKey k) { return shape_.layer_of(k) > layer; });
  std::vector<ExpertKey> items;
  for (int32_t e : experts) {
    STRATA_CHECK(e >= 0 && e < shape_.n_expert);
    const ExpertKey key = shape_.key(layer, e);
    if (slot_of_[size_t(key)] < 0) items.push_back(key);
  }
  prefetch_queue_.insert(at, items.begin(), items.end());
  pump_prefetch();
}

void ExpertStore::pump_prefetch() {
  // Prefetch keeps at most a queue depth of block reads in flight, so a demand read waits behind
  // one batch at most.
  const int max_experts = std::max(1, options_.queue_depth / kRoles);
  while (!prefetch_queue_.empty() && in_flight_ < max_experts && demand_waiting_ == 0) {
    const ExpertKey key = prefetch_queue_.front();
    prefetch_queue_.pop_front();
    if (slot_of_[size_t(key)] >= 0) continue;
    const int32_t s = admit(key, nullptr);
    if (s < 0) continue;
    start_read(s, false);
    if (!slots_[size_t(s)].mapped) transit_prefetched_.push_back(s);
    ++stats_.prefetch_reads;
  }
}

ExpertStore::SlotCounts ExpertStore::slot_counts() const {
  std::lock_guard lock(mu_);
  SlotCounts c;
  c.free = int64_t(free_.size());
  for (int64_t i = 0; i < n_slots_; ++i) {
    const Slot& sl = slots_[size_t(i)];
    if (sl.key == kNoExpert) continue;  // counted in free_ (or leaked: `other` stays short)
    if (sl.mapped) {
      ++c.resident;
    } else if (sl.prefetched) {
      ++c.prefetched;
    } else {
      ++c.other;
    }
  }
  c.other += n_slots_ - (c.free + c.resident + c.prefetched + c.other);
  return c;
}

Status ExpertStore::take_error() {
  std::lock_guard lock(mu_);
  Status e = error_;
  error_ = Status::success();
  return e;
}

ExpertStoreStats ExpertStore::stats() const {
  std::lock_guard lock(mu_);
  ExpertStoreStats s = stats_;
  if (in_flight_ > 0) s.read_seconds += now_seconds() - busy_since_;
  s.wait_seconds = double(wait_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

void ExpertStore::reset_stats() {
  std::lock_guard lock(mu_);
  stats_ = ExpertStoreStats{};
  const size_t D = size_t(options_.prefetch_depth);
  stats_.predicted.assign(D, 0);
  stats_.demand_reads_by_layer.assign(size_t(shape_.n_layer), 0);
  stats_.predicted_right.assign(D, 0);
  stats_.chosen.assign(D, 0);
  wait_ns_.store(0, std::memory_order_relaxed);
  if (in_flight_ > 0) {
    busy_since_ = now_seconds();
    busy_since_ns_ = prof::now_ns();
  }
}

}  // namespace strata
