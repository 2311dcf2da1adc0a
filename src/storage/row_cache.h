// Which rows of a set of row tables stay in a RAM cache of fixed row slots (deepseek41's Engram
// tables: hundreds of millions of rows of a few hundred bytes, looked up by hashed n-grams, of
// which the hot ones recur). Pure policy: no I/O, no memory of the rows; unit-tested on traces.
//
// CLOCK (second chance): a row is admitted on its miss; a hit sets its reference bit; to make room
// the hand passes over the slots, clearing set bits, and evicts the first unpinned slot whose bit
// is clear. Pinned slots (rows being read, or held for a pending lookup) are never evicted.
// Memory: 21 bytes a slot (key, bit, pins, the index's share), 8% of a 272-byte row; an LRU list
// and a hash map would cost 60-80.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata {

class RowCache {
 public:
  static constexpr uint64_t kNone = ~uint64_t(0);
  explicit RowCache(int64_t capacity);  // capacity < 2^30

  int64_t capacity() const { return int64_t(key_.size()); }
  int64_t size() const { return size_; }
  // The slot holding `key` (and marks it referenced), or -1.
  int64_t find(uint64_t key);
  // Makes the absent `key` resident: its slot, with the key it evicted in *evicted (kNone when a
  // slot was free); -1 when every slot is pinned (nothing changes).
  int64_t insert(uint64_t key, uint64_t* evicted);
  // Forgets the row of `slot` (a failed read); the slot becomes free. Its pins must be 0.
  void erase_slot(int64_t slot);
  uint64_t key_of(int64_t slot) const { return key_[size_t(slot)]; }
  void pin(int64_t slot) { ++pins_[size_t(slot)]; }
  // Returns the pins left.
  int32_t unpin(int64_t slot) { return --pins_[size_t(slot)]; }
  int32_t pins(int64_t slot) const { return pins_[size_t(slot)]; }

 private:
  size_t home(uint64_t key) const;
  int64_t lookup(uint64_t key) const;  // slot or -1
  void index_erase(uint64_t key);
  std::vector<uint64_t> key_;    // [slot]: the row it holds, kNone when free
  std::vector<uint8_t> ref_;     // [slot]: referenced since the hand last passed
  std::vector<int32_t> pins_;    // [slot]
  std::vector<int64_t> free_;    // free slots
  std::vector<int32_t> index_;   // open addressing (linear probing, 2x the slots), key -> slot, -1 empty
  size_t mask_ = 0;
  int64_t hand_ = 0, size_ = 0;
};

}  // namespace strata
