#include "storage/expert_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace strata {

std::string_view cache_policy_name(CachePolicyKind kind) {
  switch (kind) {
    case CachePolicyKind::lru: return "lru";
    case CachePolicyKind::lfu_decay: return "lfu";
    case CachePolicyKind::layer_lru: return "layer-lru";
  }
  return "?";
}

std::optional<CachePolicyKind> parse_cache_policy(std::string_view name) {
  for (CachePolicyKind k : kAllCachePolicies) {
    if (cache_policy_name(k) == name) return k;
  }
  return std::nullopt;
}

std::unique_ptr<CachePolicy> make_cache_policy(const CachePolicyOptions& options) {
  switch (options.kind) {
    case CachePolicyKind::lru: return std::make_unique<LruPolicy>();
    case CachePolicyKind::lfu_decay: return std::make_unique<LfuDecayPolicy>(options.half_life_tokens);
    case CachePolicyKind::layer_lru: return std::make_unique<LayerLruPolicy>();
  }
  STRATA_CHECK(false, "unknown cache policy");
  return nullptr;
}

// ---- LRU ----

void LruPolicy::reset(const CacheShape& shape, int64_t capacity) {
  STRATA_CHECK(capacity >= 0 && shape.n_keys() >= 0);
  capacity_ = capacity;
  size_ = 0;
  head_ = tail_ = kNoExpert;
  prev_.assign(size_t(shape.n_keys()), kNoExpert);
  next_.assign(size_t(shape.n_keys()), kNoExpert);
  resident_.assign(size_t(shape.n_keys()), 0);
}

void LruPolicy::unlink(ExpertKey key) {
  const ExpertKey p = prev_[size_t(key)], n = next_[size_t(key)];
  (p == kNoExpert ? head_ : next_[size_t(p)]) = n;
  (n == kNoExpert ? tail_ : prev_[size_t(n)]) = p;
}

void LruPolicy::push_front(ExpertKey key) {
  prev_[size_t(key)] = kNoExpert;
  next_[size_t(key)] = head_;
  (head_ == kNoExpert ? tail_ : prev_[size_t(head_)]) = key;
  head_ = key;
}

void LruPolicy::observe(ExpertKey key, int64_t) {
  if (!resident_[size_t(key)] || head_ == key) return;
  unlink(key);
  push_front(key);
}

ExpertKey LruPolicy::insert(ExpertKey key) {
  STRATA_CHECK(!resident_[size_t(key)], "insert of a resident expert");
  if (capacity_ == 0) return key;
  ExpertKey victim = kNoExpert;
  if (size_ == capacity_) {
    victim = tail_;
    unlink(victim);
    resident_[size_t(victim)] = 0;
  } else {
    ++size_;
  }
  push_front(key);
  resident_[size_t(key)] = 1;
  return victim;
}

void LruPolicy::erase(ExpertKey key) {
  STRATA_CHECK(resident_[size_t(key)], "erase of an expert not resident");
  unlink(key);
  resident_[size_t(key)] = 0;
  --size_;
}

// ---- LFU with exponential decay ----
//
// Decaying every score at every step would cost O(n_keys) per step. Instead an access at step t
// adds 2^((t - origin) / hl) and nothing decays: all scores are the true decayed scores times the
// same factor 2^((now - origin) / hl), so their order is the true order. Before the weights
// overflow, everything is multiplied by 2^((origin - now) / hl) and origin moves to now.

namespace {
constexpr double kRescaleExponent = 512;  // weights stay below 2^512 (double overflows at 2^1024)
bool heap_less(double s1, int64_t l1, double s2, int64_t l2) { return s1 < s2 || (s1 == s2 && l1 < l2); }
}  // namespace

void LfuDecayPolicy::reset(const CacheShape& shape, int64_t capacity) {
  STRATA_CHECK(capacity >= 0 && shape.n_keys() >= 0);
  STRATA_CHECK(half_life_tokens_ > 0, "LFU half-life must be positive (infinity: no decay)");
  steps_per_half_life_ = half_life_tokens_ * std::max(1, shape.n_layer);
  origin_ = 0;
  capacity_ = capacity;
  size_ = 0;
  score_.assign(size_t(shape.n_keys()), 0.0);
  last_.assign(size_t(shape.n_keys()), -1);
  version_.assign(size_t(shape.n_keys()), 0);
  resident_.assign(size_t(shape.n_keys()), 0);
  heap_.clear();
}

// The heap is a min-heap on (score, last): std::push_heap builds a max-heap, so the comparison is
// reversed.
bool LfuDecayPolicy::after(const Entry& a, const Entry& b) {
  return heap_less(b.score, b.last, a.score, a.last);
}

void LfuDecayPolicy::push(ExpertKey key) {
  const uint32_t v = ++version_[size_t(key)];
  heap_.push_back({score_[size_t(key)], last_[size_t(key)], key, v});
  std::push_heap(heap_.begin(), heap_.end(), after);
  // Every access of a resident pushes an entry; drop the dead ones once they dominate.
  if (heap_.size() > 2 * size_t(size_) + 64) {
    std::erase_if(heap_, [&](const Entry& e) { return !live(e); });
    std::make_heap(heap_.begin(), heap_.end(), after);
  }
}

void LfuDecayPolicy::pop_stale() {
  while (!heap_.empty() && !live(heap_.front())) {
    std::pop_heap(heap_.begin(), heap_.end(), after);
    heap_.pop_back();
  }
}

void LfuDecayPolicy::rescale(int64_t step) {
  const double f = std::exp2(-double(step - origin_) / steps_per_half_life_);
  for (double& s : score_) s *= f;
  for (Entry& e : heap_) e.score *= f;  // a positive factor keeps the heap order
  origin_ = step;
}

void LfuDecayPolicy::observe(ExpertKey key, int64_t step) {
  double exponent = 0;
  if (std::isfinite(steps_per_half_life_)) {
    exponent = double(step - origin_) / steps_per_half_life_;
    if (exponent > kRescaleExponent) {
      rescale(step);
      exponent = 0;
    }
  }
  score_[size_t(key)] += std::exp2(exponent);
  last_[size_t(key)] = step;
  if (resident_[size_t(key)]) push(key);
}

ExpertKey LfuDecayPolicy::insert(ExpertKey key) {
  STRATA_CHECK(!resident_[size_t(key)], "insert of a resident expert");
  if (capacity_ == 0) return key;
  ExpertKey victim = kNoExpert;
  if (size_ == capacity_) {
    pop_stale();
    STRATA_CHECK(!heap_.empty(), "full LFU tier without a live heap entry");
    const Entry& top = heap_.front();
    if (heap_less(score_[size_t(key)], last_[size_t(key)], top.score, top.last)) return key;
    victim = top.key;
    resident_[size_t(victim)] = 0;
    std::pop_heap(heap_.begin(), heap_.end(), after);
    heap_.pop_back();
  } else {
    ++size_;
  }
  resident_[size_t(key)] = 1;
  push(key);
  return victim;
}

void LfuDecayPolicy::erase(ExpertKey key) {
  STRATA_CHECK(resident_[size_t(key)], "erase of an expert not resident");
  resident_[size_t(key)] = 0;
  --size_;
}

// ---- per-layer LRU ----

void LayerLruPolicy::reset(const CacheShape& shape, int64_t capacity) {
  STRATA_CHECK(capacity >= 0 && shape.n_keys() >= 0);
  shape_ = shape;
  const size_t n_layer = size_t(shape.n_layer);
  capacity_.assign(n_layer, 0);
  for (size_t l = 0; l < n_layer; ++l) {
    capacity_[l] = capacity / shape.n_layer + (int64_t(l) < capacity % shape.n_layer ? 1 : 0);
  }
  size_.assign(n_layer, 0);
  head_.assign(n_layer, kNoExpert);
  tail_.assign(n_layer, kNoExpert);
  prev_.assign(size_t(shape.n_keys()), kNoExpert);
  next_.assign(size_t(shape.n_keys()), kNoExpert);
  resident_.assign(size_t(shape.n_keys()), 0);
}

void LayerLruPolicy::unlink(ExpertKey key) {
  const size_t l = size_t(shape_.layer_of(key));
  const ExpertKey p = prev_[size_t(key)], n = next_[size_t(key)];
  (p == kNoExpert ? head_[l] : next_[size_t(p)]) = n;
  (n == kNoExpert ? tail_[l] : prev_[size_t(n)]) = p;
}

void LayerLruPolicy::push_front(ExpertKey key) {
  const size_t l = size_t(shape_.layer_of(key));
  prev_[size_t(key)] = kNoExpert;
  next_[size_t(key)] = head_[l];
  (head_[l] == kNoExpert ? tail_[l] : prev_[size_t(head_[l])]) = key;
  head_[l] = key;
}

void LayerLruPolicy::observe(ExpertKey key, int64_t) {
  if (!resident_[size_t(key)]) return;
  unlink(key);
  push_front(key);
}

ExpertKey LayerLruPolicy::insert(ExpertKey key) {
  STRATA_CHECK(!resident_[size_t(key)], "insert of a resident expert");
  const size_t l = size_t(shape_.layer_of(key));
  if (capacity_[l] == 0) return key;
  ExpertKey victim = kNoExpert;
  if (size_[l] == capacity_[l]) {
    victim = tail_[l];
    unlink(victim);
    resident_[size_t(victim)] = 0;
  } else {
    ++size_[l];
  }
  push_front(key);
  resident_[size_t(key)] = 1;
  return victim;
}

void LayerLruPolicy::erase(ExpertKey key) {
  STRATA_CHECK(resident_[size_t(key)], "erase of an expert not resident");
  unlink(key);
  resident_[size_t(key)] = 0;
  --size_[size_t(shape_.layer_of(key))];
}

// ---- tiers ----

TierSim::TierSim(const CacheShape& shape, const CachePolicyOptions& options,
                 const TierCapacity& capacity)
    : shape_(shape), vram_(make_cache_policy(options)), ram_(make_cache_policy(options)) {
  vram_->reset(shape, capacity.vram_experts);
  ram_->reset(shape, capacity.ram_experts);
}

Tier TierSim::access(int32_t layer, int32_t expert, int64_t step) {
  STRATA_CHECK(layer >= 0 && layer < shape_.n_layer && expert >= 0 && expert < shape_.n_expert);
  const ExpertKey key = shape_.key(layer, expert);
  vram_->observe(key, step);
  ram_->observe(key, step);
  if (vram_->contains(key)) return Tier::vram;
  const bool in_ram = ram_->contains(key);
  const Tier found = in_ram ? Tier::ram : Tier::nvme;
  // The expert goes up to VRAM; what VRAM lets go of (its victim, or the expert itself when VRAM
  // declines it) goes down to RAM.
  const ExpertKey down = vram_->insert(key);
  if (down == key) {
    if (!in_ram) ram_->insert(key);
    return found;
  }
  if (in_ram) ram_->erase(key);
  if (down != kNoExpert) ram_->insert(down);
  return found;
}

ReplayResult replay_trace(const RoutingTrace& trace, const CachePolicyOptions& options,
                          const TierCapacity& capacity) {
  const CacheShape shape{.n_layer = trace.n_layer, .n_expert = trace.n_expert};
  TierSim sim(shape, options, capacity);
  ReplayResult r;
  r.n_tokens = trace.n_tokens();
  r.per_layer.assign(size_t(trace.n_layer), {});
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    const RoutingStep& s = trace.steps[i];
    TierCounts& c = r.per_layer[size_t(s.layer)];
    for (int32_t e : trace.experts_of(s)) {
      ++c.accesses;
      switch (sim.access(s.layer, e, int64_t(i))) {
        case Tier::vram: ++c.vram_hits; break;
        case Tier::ram: ++c.ram_hits; break;
        case Tier::nvme: ++c.misses; break;
      }
    }
  }
  for (const TierCounts& c : r.per_layer) {
    r.total.accesses += c.accesses;
    r.total.vram_hits += c.vram_hits;
    r.total.ram_hits += c.ram_hits;
    r.total.misses += c.misses;
  }
  return r;
}

// ---- Belady ----

int64_t belady_hits(const RoutingTrace& trace, int64_t capacity) {
  STRATA_CHECK(capacity >= 0);
  const CacheShape shape{.n_layer = trace.n_layer, .n_expert = trace.n_expert};
  const size_t n = trace.experts.size();
  std::vector<ExpertKey> keys(n);
  for (const RoutingStep& s : trace.steps) {
    for (uint32_t j = 0; j < s.count; ++j)
      keys[s.first + j] = shape.key(s.layer, trace.experts[s.first + j]);
  }
  // Accesses in time order are steps in order, each step's experts in order: the trace stores
  // them that way (first increases with the step index).
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> next_use(n);
  {
    std::vector<int64_t> seen(size_t(shape.n_keys()), kNever);
    for (size_t i = n; i-- > 0;) {
      next_use[i] = seen[size_t(keys[i])];
      seen[size_t(keys[i])] = int64_t(i);
    }
  }
  if (capacity == 0) return 0;

  struct Entry {
    int64_t next;  // the resident's next use when pushed; live while it is still its next use
    ExpertKey key;
  };
  auto before = [](const Entry& a, const Entry& b) { return a.next < b.next; };  // max-heap
  std::vector<Entry> heap;
  std::vector<int64_t> cur_next(size_t(shape.n_keys()), -1);  // -1: not resident
  auto live = [&](const Entry& e) { return cur_next[size_t(e.key)] == e.next; };
  int64_t size = 0, hits = 0;
  for (size_t i = 0; i < n; ++i) {
    const ExpertKey k = keys[i];
    if (cur_next[size_t(k)] >= 0) {
      ++hits;
    } else if (size < capacity) {
      ++size;
    } else {
      while (!live(heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), before);
        heap.pop_back();
      }
      if (next_use[i] >= heap.front().next) continue;  // the newcomer is needed last: decline it
      cur_next[size_t(heap.front().key)] = -1;
      std::pop_heap(heap.begin(), heap.end(), before);
      heap.pop_back();
    }
    cur_next[size_t(k)] = next_use[i];
    heap.push_back({next_use[i], k});
    std::push_heap(heap.begin(), heap.end(), before);
    if (heap.size() > 2 * size_t(capacity) + 64) {
      std::erase_if(heap, [&](const Entry& e) { return !live(e); });
      std::make_heap(heap.begin(), heap.end(), before);
    }
  }
  return hits;
}

}  // namespace strata
