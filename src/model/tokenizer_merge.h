// The bigram merge loop both tokenizers share (llama.cpp's llm_tokenizer_bpe and
// llm_tokenizer_spm): a string is cut into one symbol per UTF-8 sequence, candidate merges of
// neighbours wait in a priority queue, and the best is applied until none is left. What differs
// (how a pair is ranked, what it is looked up as) is in the caller's Bigram ordering and
// add_bigram callback.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

namespace strata::tokenizer_detail {

struct MergeSymbol {
  int32_t prev, next;   // neighbours in the linked list, -1 at the ends
  uint32_t offset, n;   // bytes of the string; n = 0 once merged into its left neighbour
};

// Lengths by the high nibble of the first byte; continuation bytes are not checked here.
inline size_t utf8_len(uint8_t c) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[c >> 4];
}

// One symbol per UTF-8 sequence of `s` (a truncated sequence at the end is one short symbol).
inline void split_symbols(std::string_view s, std::vector<MergeSymbol>& symbols) {
  symbols.clear();
  for (uint32_t off = 0; off < s.size();) {
    const uint32_t len = uint32_t(std::min(s.size() - off, utf8_len(uint8_t(s[off]))));
    const int32_t idx = int32_t(symbols.size());
    symbols.push_back({idx - 1, off + len == s.size() ? -1 : idx + 1, off, len});
    off += len;
  }
}

// Runs the merges. `queue` is a heap ordered by `lower_priority`; Bigram has `left`, `right` and
// `size` (bytes of both symbols when queued: stale once either changed). add_bigram(left, right)
// pushes a candidate for two neighbours if the pair can merge (it ignores negative indices).
template <class Bigram, class Less, class Add>
void merge_bigrams(std::vector<MergeSymbol>& symbols, std::vector<Bigram>& queue, Less lower_priority,
                   Add&& add_bigram) {
  for (int32_t i = 1; i < int32_t(symbols.size()); ++i) add_bigram(i - 1, i);
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), lower_priority);
    const Bigram b = queue.back();
    queue.pop_back();
    MergeSymbol& l = symbols[size_t(b.left)];
    MergeSymbol& r = symbols[size_t(b.right)];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // outdated
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[size_t(r.next)].prev = b.left;
    add_bigram(l.prev, b.left);
    add_bigram(b.left, l.next);
  }
}

}  // namespace strata::tokenizer_detail
