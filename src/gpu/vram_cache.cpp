#include "gpu/vram_cache.h"

#include <algorithm>
#include <numeric>

namespace strata::gpu {

VramExpertCache::VramExpertCache(Device& dev, uint64_t slot_bytes, int n_layer, int n_expert, VramCacheParams p)
    : dev_(dev), slot_bytes_(slot_bytes), n_layer_(n_layer), n_expert_(n_expert), p_(p) {
  heat_.assign(size_t(n_layer) * size_t(n_expert), 0.0);
  where_.assign(heat_.size(), -1);
  copy_stream_ = dev.new_stream();
}

VramExpertCache::~VramExpertCache() {
  for (Slot& s : slots_) dev_.free(s.buf);
  for (Device::Buffer& b : kv_) dev_.free(b);
  if (scratch_.id >= 0) dev_.free(scratch_);
  if (fixed_.id >= 0) dev_.free(fixed_);
}

Result<std::unique_ptr<VramExpertCache>> VramExpertCache::create(Device& dev, uint64_t fixed_bytes,
                                                                 uint64_t scratch_bytes, uint64_t slot_bytes,
                                                                 int n_layer, int n_expert, VramCacheParams params) {
  STRATA_CHECK(slot_bytes > 0 && n_layer > 0 && n_expert > 0, "VramExpertCache: empty shape");
  const uint64_t need = fixed_bytes + scratch_bytes;
  if (need > dev.capacity() - dev.used())
    return Error{strfmt("budgets.vram: %s cannot hold what every token needs on the GPU: %s (%s of weights, %s of "
                        "scratch); raise the budget to at least that or run without a GPU",
                        format_size(dev.capacity() - dev.used()).c_str(), format_size(need).c_str(),
                        format_size(fixed_bytes).c_str(), format_size(scratch_bytes).c_str())};
  std::unique_ptr<VramExpertCache> c(new VramExpertCache(dev, slot_bytes, n_layer, n_expert, params));
  if (fixed_bytes > 0) c->fixed_ = *dev.alloc(fixed_bytes, false);
  if (scratch_bytes > 0) c->scratch_ = *dev.alloc(scratch_bytes, false);
  c->grow_slots();
  return c;
}

void VramExpertCache::grow_slots() {
  while (dev_.capacity() - dev_.used() >= slot_bytes_) {
    auto buf = dev_.alloc(slot_bytes_);
    if (!buf) return;  // a real device with less free memory than the budget: fewer slots
    Slot s;
    s.buf = *buf;
    s.ready = dev_.new_event();
    s.last_read = dev_.new_event();
    slots_.push_back(s);
  }
}

int64_t VramExpertCache::n_resident() const {
  return std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.key >= 0; });
}

int VramExpertCache::coldest_slot() const {
  int best = -1;
  double best_heat = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const double h = slots_[i].key < 0 ? -1.0 : heat_[size_t(slots_[i].key)];
    if (best < 0 || h < best_heat) {
      best = int(i);
      best_heat = h;
    }
  }
  return best;
}

void VramExpertCache::drop_slot(size_t i) {
  Slot& s = slots_[i];
  if (s.key >= 0) {
    where_[size_t(s.key)] = -1;
    ++evictions_;
  }
  dev_.free(s.buf);
  dev_.free_event(s.ready);
  dev_.free_event(s.last_read);
  slots_.erase(slots_.begin() + long(i));
  for (int& w : where_)  // slots after i moved down by one
    if (w > int(i)) --w;
}

Status VramExpertCache::set_kv_bytes(uint64_t bytes) {
  const uint64_t chunks = (bytes + slot_bytes_ - 1) / slot_bytes_;
  // what the arena can give the KV cache with every expert evicted
  const uint64_t room = max_kv_bytes();
  if (chunks * slot_bytes_ > room)
    return Error{strfmt("VRAM: the KV cache needs %s, but only %s is left beside the fixed weights and scratch",
                        format_size(chunks * slot_bytes_).c_str(), format_size(room).c_str())};
  while (kv_.size() > chunks) {  // shrink: the room becomes slots again
    dev_.free(kv_.back());
    kv_.pop_back();
  }
  while (kv_.size() < chunks) {  // grow: the coldest experts make room
    if (dev_.capacity() - dev_.used() < slot_bytes_) drop_slot(size_t(coldest_slot()));
    kv_.push_back(*dev_.alloc(slot_bytes_, false));
  }
  kv_bytes_ = bytes;
  grow_slots();
  return Status::success();
}

void VramExpertCache::observe(int layer, std::span<const int32_t> ids) {
  STRATA_CHECK(layer >= 0 && layer < n_layer_, "VramExpertCache: layer out of range");
  for (int32_t e : ids) {
    STRATA_CHECK(e >= 0 && e < n_expert_, "VramExpertCache: expert out of range");
    heat_[size_t(layer) * size_t(n_expert_) + size_t(e)] += 1.0;
  }
}

int VramExpertCache::end_step(const HostBytes& host) {
  for (double& h : heat_) h *= p_.decay;
  return promote(p_.max_promotions, host);
}

int VramExpertCache::warm_start(std::span<const double> heat, const HostBytes& host) {
  STRATA_CHECK(heat.size() == heat_.size(), "warm_start: one count per (layer, expert)");
  heat_.assign(heat.begin(), heat.end());
  return promote(int(std::min<size_t>(slots_.size(), size_t(1) << 30)), host);
}

int VramExpertCache::promote(int limit, const HostBytes& host) {
  if (slots_.empty() || limit <= 0) return 0;
  // candidates: the hottest non-resident experts, hottest first
  std::vector<int> order(heat_.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t n_cand = std::min<size_t>(order.size(), size_t(limit) + slots_.size());
  std::partial_sort(order.begin(), order.begin() + long(n_cand), order.end(),
                    [&](int a, int b) { return heat_[size_t(a)] > heat_[size_t(b)]; });
  int done = 0;
  for (size_t c = 0; c < n_cand && done < limit; ++c) {
    const int key = order[c];
    if (where_[size_t(key)] >= 0 || heat_[size_t(key)] <= 0) continue;
    const int victim = coldest_slot();
    Slot& s = slots_[size_t(victim)];
    if (s.key >= 0 && heat_[size_t(key)] <= (1.0 + p_.hysteresis) * heat_[size_t(s.key)])
      break;  // no hotter candidates follow
    // its bytes; none: not in host memory now (experts streamed from NVMe and not in a RAM slot),
    // a candidate again at a later step
    const std::vector<std::span<const uint8_t>> pieces = host(key / n_expert_, key % n_expert_);
    if (pieces.empty()) continue;
    if (s.key >= 0) {
      where_[size_t(s.key)] = -1;
      ++evictions_;
    }
    // the copy waits for every kernel that read the slot's previous expert
    dev_.wait_event(copy_stream_, s.last_read);
    uint64_t at = 0;
    for (std::span<const uint8_t> piece : pieces) {
      dev_.copy_h2d(copy_stream_, s.buf, at, piece.data(), piece.size());
      at += piece.size();
    }
    STRATA_CHECK(at <= slot_bytes_, "VramExpertCache: an expert's pieces overflow its slot");
    dev_.record_event(s.ready, copy_stream_);
    s.key = key;
    where_[size_t(key)] = victim;
    ++promotions_;
    ++done;
  }
  return done;
}

int VramExpertCache::ready_slot(int layer, int expert, int stream) const {
  const int slot = where_[size_t(layer) * size_t(n_expert_) + size_t(expert)];
  if (slot < 0) return -1;
  return dev_.event_done(slots_[size_t(slot)].ready, stream) ? slot : -1;
}

void VramExpertCache::run(int stream, int slot, double seconds, const std::function<void()>& fn) {
  Slot& s = slots_[size_t(slot)];
  if (!dev_.event_done(s.ready, stream)) ++stalls_;
  dev_.wait_event(stream, s.ready);
  const int reads[] = {s.buf.id};
  dev_.launch(stream, reads, seconds, fn);
  dev_.record_event(s.last_read, stream);  // one compute stream: later reads end later
}

}  // namespace strata::gpu
