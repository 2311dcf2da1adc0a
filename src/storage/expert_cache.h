// Routed-expert cache policies and a two-tier replay of routing traces. Pure logic: no I/O, no
// weights; a policy decides which experts stay resident in a tier of N expert slots.
//
// The tiers (../shared/DESIGN.md): VRAM is checked first, then RAM; an expert in neither is read
// from NVMe. They are EXCLUSIVE: an expert lives in at most one tier, so VRAM + RAM hold up to
// V + R distinct experts. On an access:
//   in VRAM            -> VRAM hit
//   in RAM             -> RAM hit; the expert moves up to VRAM (promotion)
//   in neither         -> NVMe miss; the expert enters VRAM
// and whatever VRAM evicts to make room moves down to RAM, whose own victim is dropped (it stays on
// NVMe). A tier may decline an expert (capacity 0, or LFU when the newcomer scores below every
// resident): the expert then goes straight to the tier below. With LRU in both tiers this is one
// LRU stack of V + R slots whose top V are in VRAM, so VRAM hits = LRU(V) and VRAM + RAM hits =
// LRU(V + R).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "storage/routing_trace.h"

namespace strata {

// A routed expert as a dense index: layer * n_expert + expert, in [0, n_layer * n_expert).
using ExpertKey = int32_t;
inline constexpr ExpertKey kNoExpert = -1;

struct CacheShape {
  int32_t n_layer = 0;
  int32_t n_expert = 0;  // per layer
  int32_t n_keys() const { return n_layer * n_expert; }
  ExpertKey key(int32_t layer, int32_t expert) const { return layer * n_expert + expert; }
  int32_t layer_of(ExpertKey k) const { return k / n_expert; }
};

// Residency of one tier. One instance per tier; not thread-safe (one replay or one engine thread
// owns it). Call order per access: observe() on every tier, then contains() / insert() / erase().
class CachePolicy {
 public:
  virtual ~CachePolicy() = default;
  virtual std::string_view name() const = 0;
  // Empties the tier and gives it `capacity` slots (whole model) over `shape`'s experts.
  virtual void reset(const CacheShape& shape, int64_t capacity) = 0;
  // Every access of the hierarchy, in time order, whether or not this tier holds the expert (its
  // recency or frequency changes either way). `step` is the routing step's index (one token at one
  // layer); it never decreases.
  virtual void observe(ExpertKey key, int64_t step) = 0;
  virtual bool contains(ExpertKey key) const = 0;
  // Makes the non-resident `key` resident. Returns the expert evicted for it, kNoExpert when a
  // slot was free, or `key` itself when the tier declines it (nothing changes then).
  virtual ExpertKey insert(ExpertKey key) = 0;
  // Removes the resident `key` (promoted to the tier above).
  virtual void erase(ExpertKey key) = 0;
};

enum class CachePolicyKind {
  lru,        // least recently used, slots shared by all layers
  lfu_decay,  // highest frequency with exponential decay wins, slots shared by all layers
  layer_lru,  // capacity split evenly per layer, LRU within a layer
};
inline constexpr CachePolicyKind kAllCachePolicies[] = {
    CachePolicyKind::lru, CachePolicyKind::lfu_decay, CachePolicyKind::layer_lru};

// "lru", "lfu", "layer-lru".
std::string_view cache_policy_name(CachePolicyKind kind);
std::optional<CachePolicyKind> parse_cache_policy(std::string_view name);

struct CachePolicyOptions {
  // Default: LFU with a half-life of 8 tokens (`strata replay --all`, 1/8 .. 7/8 of each layer's
  // experts): the best of the three at every capacity on the Mixtral trace replayed token-major,
  // and at most 2.4 points below the best on synthetic qwen3-30b-a3b-shaped traces; per-layer LRU
  // falls 10 points short at 1/8 on Mixtral, global LRU 18.
  CachePolicyKind kind = CachePolicyKind::lfu_decay;
  // lfu_decay: an access's weight halves every half_life_tokens tokens (n_layer routing steps
  // each); infinity gives plain LFU over the whole history.
  double half_life_tokens = 8;
};

std::unique_ptr<CachePolicy> make_cache_policy(const CachePolicyOptions& options);

// The concrete policies, for tests and for callers that want one directly.

// LRU over all experts of all layers. O(1) per operation (intrusive list over dense keys).
class LruPolicy final : public CachePolicy {
 public:
  std::string_view name() const override { return "lru"; }
  void reset(const CacheShape& shape, int64_t capacity) override;
  void observe(ExpertKey key, int64_t step) override;
  bool contains(ExpertKey key) const override { return resident_[size_t(key)] != 0; }
  ExpertKey insert(ExpertKey key) override;
  void erase(ExpertKey key) override;

 private:
  void unlink(ExpertKey key);
  void push_front(ExpertKey key);
  int64_t capacity_ = 0;
  int64_t size_ = 0;
  ExpertKey head_ = kNoExpert;  // most recent
  ExpertKey tail_ = kNoExpert;  // least recent: the victim
  std::vector<ExpertKey> prev_, next_;  // [n_keys] list links of resident keys
  std::vector<uint8_t> resident_;       // [n_keys]
};

// Frequency with exponential decay: score(e) = sum over e's past accesses of 2^(-age / half-life),
// age in tokens (routing steps / n_layer); counted for every expert, resident or not. The tier
// holds the highest scores: a newcomer evicts the lowest-scored resident, or is declined when it
// scores lower still (a one-off access does not push out a hot expert). Ties go to recency.
// O(log capacity) per operation (a heap with lazy deletion).
class LfuDecayPolicy final : public CachePolicy {
 public:
  explicit LfuDecayPolicy(double half_life_tokens) : half_life_tokens_(half_life_tokens) {}
  std::string_view name() const override { return "lfu"; }
  void reset(const CacheShape& shape, int64_t capacity) override;
  void observe(ExpertKey key, int64_t step) override;
  bool contains(ExpertKey key) const override { return resident_[size_t(key)] != 0; }
  ExpertKey insert(ExpertKey key) override;
  void erase(ExpertKey key) override;

 private:
  struct Entry {
    double score;      // score_[key] when pushed
    int64_t last;      // last_[key] when pushed (ties: the older access is evicted first)
    ExpertKey key;
    uint32_t version;  // live while it equals version_[key] and the key is resident
  };
  static bool after(const Entry& a, const Entry& b);  // heap order: the root is the lowest
  bool live(const Entry& e) const {
    return resident_[size_t(e.key)] && version_[size_t(e.key)] == e.version;
  }
  void push(ExpertKey key);
  void pop_stale();
  void rescale(int64_t step);
  double half_life_tokens_;
  double steps_per_half_life_ = 0;  // half_life_tokens * n_layer
  int64_t origin_ = 0;              // scores are stored multiplied by 2^((origin - now) / hl)
  int64_t capacity_ = 0;
  int64_t size_ = 0;
  std::vector<double> score_;    // [n_keys] decayed count, scaled by 2^((now - origin) / hl)
  std::vector<int64_t> last_;    // [n_keys] step of the last access, -1 never
  std::vector<uint32_t> version_;  // [n_keys] bumped at every push
  std::vector<uint8_t> resident_;
  std::vector<Entry> heap_;      // min-heap of resident keys by (score, last), with stale entries
};

// Slots split evenly per layer (capacity / n_layer each; the first capacity % n_layer layers get
// one more), LRU within a layer; a layer never takes another layer's slot.
class LayerLruPolicy final : public CachePolicy {
 public:
  std::string_view name() const override { return "layer-lru"; }
  void reset(const CacheShape& shape, int64_t capacity) override;
  void observe(ExpertKey key, int64_t step) override;
  bool contains(ExpertKey key) const override { return resident_[size_t(key)] != 0; }
  ExpertKey insert(ExpertKey key) override;
  void erase(ExpertKey key) override;

 private:
  void unlink(ExpertKey key);
  void push_front(ExpertKey key);
  CacheShape shape_;
  std::vector<int64_t> capacity_, size_;  // [n_layer]
  std::vector<ExpertKey> head_, tail_;    // [n_layer] most / least recent resident of the layer
  std::vector<ExpertKey> prev_, next_;    // [n_keys]
  std::vector<uint8_t> resident_;         // [n_keys]
};

// ---- replay ----

struct TierCapacity {
  int64_t vram_experts = 0;  // expert slots, whole model
  int64_t ram_experts = 0;
};

enum class Tier : uint8_t { vram, ram, nvme };

// Counts of one replay (whole trace, or one layer).
struct TierCounts {
  int64_t accesses = 0;
  int64_t vram_hits = 0;
  int64_t ram_hits = 0;
  int64_t misses = 0;  // NVMe reads
};

struct ReplayResult {
  TierCounts total;
  std::vector<TierCounts> per_layer;  // [n_layer]
  double n_tokens = 0;                // RoutingTrace::n_tokens()

  double vram_hit_rate() const { return rate(total.vram_hits); }
  double ram_hit_rate() const { return rate(total.ram_hits); }  // of all accesses
  double hit_rate() const { return rate(total.vram_hits + total.ram_hits); }
  double miss_rate() const { return rate(total.misses); }
  double misses_per_token() const { return n_tokens > 0 ? double(total.misses) / n_tokens : 0.0; }
  double vram_hits_per_token() const { return n_tokens > 0 ? double(total.vram_hits) / n_tokens : 0.0; }
  double ram_hits_per_token() const { return n_tokens > 0 ? double(total.ram_hits) / n_tokens : 0.0; }

 private:
  double rate(int64_t n) const { return total.accesses ? double(n) / double(total.accesses) : 0.0; }
};

// The exclusive VRAM / RAM hierarchy (header comment), one policy instance per tier.
class TierSim {
 public:
  TierSim(const CacheShape& shape, const CachePolicyOptions& options, const TierCapacity& capacity);
  // One expert access at routing step `step`; returns where it was found.
  Tier access(int32_t layer, int32_t expert, int64_t step);
  const CachePolicy& vram() const { return *vram_; }
  const CachePolicy& ram() const { return *ram_; }

 private:
  CacheShape shape_;
  std::unique_ptr<CachePolicy> vram_, ram_;
};

// Replays the whole trace through a fresh TierSim.
ReplayResult replay_trace(const RoutingTrace& trace, const CachePolicyOptions& options,
                          const TierCapacity& capacity);

// Hits of Belady's optimum on the trace with one cache of `capacity` slots: on a miss it keeps,
// among the residents and the newcomer, the experts used again soonest (declining the newcomer
// when its next use is the farthest). No online policy of `capacity` slots, in any tier
// arrangement, gets more hits; belady_hits(trace, V + R) bounds VRAM + RAM hits and
// belady_hits(trace, V) bounds VRAM hits.
int64_t belady_hits(const RoutingTrace& trace, int64_t capacity);

}  // namespace strata
