// libFuzzer target: any bytes into the tokenizers (byte-level BPE and SentencePiece vocabs of
// tests/data/vocab). Every id must be inside the vocabulary and detokenizing must not crash; for
// the byte-level BPE vocab the round trip is exact whenever the input is valid UTF-8 without
// special-token text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace {

const strata::Tokenizer& load(const char* name) {
  static std::string dir = std::string(STRATA_SOURCE_DIR) + "/tests/data/vocab/";
  auto f = strata::GgufFile::open(dir + name);
  if (!f.ok()) __builtin_trap();
  auto t = strata::Tokenizer::from_gguf(*f);
  if (!t.ok()) __builtin_trap();
  return *new strata::Tokenizer(std::move(*t));  // lives for the whole run
}

// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const strata::Tokenizer& bpe = load("ggml-vocab-gpt-2.gguf");
  static const strata::Tokenizer& spm = load("ggml-vocab-llama-spm.gguf");
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const strata::Tokenizer* t : {&bpe, &spm}) {
    for (bool special : {false, true}) {
      auto ids = t->tokenize(text, special, special);
      for (int32_t id : ids)
        if (id < 0 || size_t(id) >= t->n_tokens()) __builtin_trap();
      std::string back = t->detokenize(ids);
      if (t == &bpe && !special && valid_utf8(text) && back != text) __builtin_trap();
    }
  }
  return 0;
}
