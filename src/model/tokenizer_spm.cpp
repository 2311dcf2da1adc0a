// SentencePiece BPE as llama.cpp runs it (src/llama-vocab.cpp, llm_tokenizer_spm_session): the
// text (already prefixed and with ' ' -> U+2581) is cut into UTF-8 characters, adjacent symbols
// whose concatenation is a token are merged highest score first (leftmost on ties), and a symbol
// that is not a token is resegmented into the two it was merged from, or else into byte tokens.
#include <algorithm>
#include <unordered_map>

#include "model/tokenizer.h"
#include "model/tokenizer_merge.h"

namespace strata {


// llama_vocab::byte_to_token for SPM: "<0xXX>", else the byte as a one-byte token. llama.cpp
// throws when neither exists; here the unknown token stands in (or nothing, without one).
TokenId Tokenizer::byte_token_spm(uint8_t byte) const {
  static constexpr char kHex[] = "0123456789ABCDEF";
  const char buf[6] = {'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
  TokenId id = find_token(std::string_view(buf, 6));
  if (id != kNoToken) return id;
  const char raw = char(byte);
  id = find_token(std::string_view(&raw, 1));
  return id != kNoToken ? id : unk_;
}

void Tokenizer::tokenize_spm(std::string_view text, std::vector<TokenId>& out) const {
  using Symbol = tokenizer_detail::MergeSymbol;  // offsets into `text`
  struct Bigram {
    float score;
    int32_t left, right;
    uint32_t size;
  };
  // llm_bigram_spm::comparator: highest score first, then leftmost
  auto lower_priority = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };

  std::vector<Symbol> symbols;
  tokenizer_detail::split_symbols(text, symbols);
  if (symbols.empty()) return;

  std::vector<Bigram> queue;
  // text of a merge -> the two symbols it was last made from (llama.cpp's rev_merge)
  std::unordered_map<std::string_view, std::pair<int32_t, int32_t>> rev_merge;
  auto add_bigram = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[size_t(left)];
    const Symbol& r = symbols[size_t(right)];
    const std::string_view s = text.substr(l.offset, l.n + r.n);  // l and r are adjacent
    const TokenId id = find_token(s);
    if (id == kNoToken) return;
    queue.push_back({tokens_[size_t(id)].score, left, right, uint32_t(s.size())});
    std::push_heap(queue.begin(), queue.end(), lower_priority);
    rev_merge[s] = {left, right};
  };
  tokenizer_detail::merge_bigrams(symbols, queue, lower_priority, add_bigram);

  // Resegment. Merged symbols are tokens by construction, so the recursion only splits what
  // rev_merge knows; the depth bound guards against a malformed vocabulary looping.
  auto resegment = [&](auto&& self, const Symbol& sym, size_t depth) -> void {
    const std::string_view s = text.substr(sym.offset, sym.n);
    const TokenId id = find_token(s);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
    auto it = rev_merge.find(s);
    if (it == rev_merge.end() || depth > symbols.size()) {
      for (char c : s) {
        const TokenId b = byte_token_spm(uint8_t(c));
        if (b != kNoToken) out.push_back(b);
      }
      return;
    }
    self(self, symbols[size_t(it->second.first)], depth + 1);
    self(self, symbols[size_t(it->second.second)], depth + 1);
  };
  for (int32_t i = 0; i != -1; i = symbols[size_t(i)].next)
    resegment(resegment, symbols[size_t(i)], 0);
}

}  // namespace strata
