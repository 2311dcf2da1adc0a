#include "storage/row_cache.h"

#include "base/error.h"

namespace strata {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

RowCache::RowCache(int64_t capacity) {
  STRATA_CHECK(capacity > 0 && capacity < (int64_t(1) << 30), "row cache capacity out of range");
  key_.assign(size_t(capacity), kNone);
  ref_.assign(size_t(capacity), 0);
  pins_.assign(size_t(capacity), 0);
  for (int64_t s = capacity - 1; s >= 0; --s) free_.push_back(s);
  size_t n = 1;
  while (n < size_t(capacity) * 2) n <<= 1;
  index_.assign(n, -1);
  mask_ = n - 1;
}

size_t RowCache::home(uint64_t key) const { return size_t(mix(key)) & mask_; }

int64_t RowCache::lookup(uint64_t key) const {
  for (size_t i = home(key);; i = (i + 1) & mask_) {
    const int32_t s = index_[i];
    if (s < 0) return -1;
    if (key_[size_t(s)] == key) return s;
  }
}

int64_t RowCache::find(uint64_t key) {
  const int64_t s = lookup(key);
  if (s >= 0) ref_[size_t(s)] = 1;
  return s;
}

// Backward-shift deletion: the entries after the hole that could sit in it move up, so probes
// never need tombstones.
void RowCache::index_erase(uint64_t key) {
  size_t i = home(key);
  while (key_[size_t(index_[i])] != key) i = (i + 1) & mask_;
  for (size_t j = i;;) {
    index_[i] = -1;
    for (;;) {
      j = (j + 1) & mask_;
      if (index_[j] < 0) return;
      const size_t h = home(key_[size_t(index_[j])]);
      // the entry at j may fill the hole at i unless its home lies cyclically in (i, j]
      if (i <= j ? (i < h && h <= j) : (i < h || h <= j)) continue;
      break;
    }
    index_[i] = index_[j];
    i = j;
  }
}

int64_t RowCache::insert(uint64_t key, uint64_t* evicted) {
  *evicted = kNone;
  int64_t slot = -1;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    // two sweeps clear every bit; a third finding nothing means every slot is pinned
    const int64_t n = capacity();
    for (int64_t step = 0; step < 3 * n; ++step) {
      const int64_t s = hand_;
      hand_ = (hand_ + 1) % n;
      if (pins_[size_t(s)] > 0) continue;
      if (ref_[size_t(s)]) {
        ref_[size_t(s)] = 0;
        continue;
      }
      slot = s;
      break;
    }
    if (slot < 0) return -1;
    *evicted = key_[size_t(slot)];
    index_erase(*evicted);
    --size_;
  }
  key_[size_t(slot)] = key;
  ref_[size_t(slot)] = 0;  // a first use: a second one before the hand comes round keeps it
  size_t i = home(key);
  while (index_[i] >= 0) i = (i + 1) & mask_;
  index_[i] = int32_t(slot);
  ++size_;
  return slot;
}

void RowCache::erase_slot(int64_t slot) {
  STRATA_CHECK(pins_[size_t(slot)] == 0 && key_[size_t(slot)] != kNone);
  index_erase(key_[size_t(slot)]);
  key_[size_t(slot)] = kNone;
  ref_[size_t(slot)] = 0;
  free_.push_back(slot);
  --size_;
}

}  // namespace strata
