// Text <-> token ids from a GGUF's tokenizer.* metadata, reproducing llama.cpp
// (src/llama-vocab.cpp, src/unicode.cpp) id for id:
//  - byte-level BPE (tokenizer.ggml.model = "gpt2"): the pre-tokenizer splits text with the
//    regexes llama.cpp uses for the file's tokenizer.ggml.pre (several regexes in sequence for some
//    types, each splitting the pieces of the previous one), every piece is mapped byte by byte to
//    GPT-2's printable code points, and merges are applied lowest rank first, leftmost first;
//  - SentencePiece (tokenizer.ggml.model = "llama"): a leading-space prefix, ' ' -> U+2581,
//    bigram merges by score, then llama.cpp's resegmentation and <0xXX> byte fallback.
// Special tokens (CONTROL, USER_DEFINED, UNKNOWN) are cut out of the text first, longest first;
// CONTROL and UNKNOWN ones only when parse_special is true (USER_DEFINED always, as llama.cpp
// does).
//
// A Tokenizer is immutable after from_gguf() and may be used from any number of threads at once;
// copies share the compiled regexes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "model/gguf.h"

namespace strata {

using TokenId = int32_t;
constexpr TokenId kNoToken = -1;

enum class TokenizerKind {
  bpe,  // byte-level BPE, tokenizer.ggml.model = "gpt2"
  spm,  // SentencePiece BPE with byte fallback, tokenizer.ggml.model = "llama"
};

// Per-token attribute bits, llama.cpp's llama_token_attr (a token may carry several).
enum TokenAttr : uint32_t {
  token_attr_undefined = 0,
  token_attr_unknown = 1u << 0,
  token_attr_unused = 1u << 1,
  token_attr_normal = 1u << 2,
  token_attr_control = 1u << 3,
  token_attr_user_defined = 1u << 4,
  token_attr_byte = 1u << 5,
  token_attr_normalized = 1u << 6,
  token_attr_lstrip =
      1u << 7,  // whitespace left of the special token is dropped when it is cut out
  token_attr_rstrip = 1u << 8,  // likewise to its right
  token_attr_single_word = 1u << 9,
};

struct DetokenizeOptions {
  // CONTROL and UNKNOWN tokens as their text (llama.cpp's unparse_special); else as nothing.
  bool render_special = true;
  // Drop a leading BOS / trailing EOS when the vocab adds them (llama.cpp's remove_special).
  bool remove_special = false;
  // llama.cpp's clean_up_tokenization_spaces pass (" ," -> "," etc.), applied only when the vocab
  // asks for it (clean_spaces()). Off by default so that detokenize(tokenize(s)) == s.
  bool clean_spaces = false;
};

// The texts llama.cpp takes for end-of-generation tokens when a vocabulary has them
// (<|im_end|>, <|eot_id|>, <|call|>, ...).
std::span<const std::string_view> end_of_generation_texts();

class Tokenizer {
 public:
  // Reads tokenizer.ggml.{model, pre, tokens, scores, token_type, merges, *_token_id, add_*}.
  // Errors name the file and the key: a missing or mistyped key, arrays of different lengths, an
  // unknown model or pre-tokenizer name, a duplicate token, a special id outside the vocab that
  // must be added.
  static Result<Tokenizer> from_gguf(const GgufFile& file);

  // Token ids of `text` (any bytes; invalid UTF-8 is read as U+FFFD per bad byte, as llama.cpp).
  // add_special: prepend BOS / append EOS where the vocab says so (tokenizer.ggml.add_bos_token
  // etc., else llama.cpp's per-type default). parse_special: text spelling a CONTROL token becomes
  // that token; otherwise it is ordinary text.
  std::vector<TokenId> tokenize(std::string_view text, bool add_special, bool parse_special) const;

  // The bytes token `id` stands for: byte-level decoded (BPE), U+2581 -> ' ' (SPM), <0xXX> -> one
  // byte. CONTROL / UNKNOWN tokens give their text when render_special, else "". May be a partial
  // UTF-8 sequence; concatenate pieces before printing. Precondition: 0 <= id < n_tokens().
  std::string token_to_piece(TokenId id, bool render_special = true) const;
  // The pieces of `ids` concatenated, as llama.cpp's llama_detokenize (SPM drops the one leading
  // space its tokenize added).
  std::string detokenize(std::span<const TokenId> ids, const DetokenizeOptions& opt = {}) const;

  TokenizerKind kind() const { return kind_; }
  const std::string& model_name() const { return model_name_; }  // tokenizer.ggml.model
  const std::string& pre_name() const { return pre_name_; }  // tokenizer.ggml.pre ("" if absent)
  size_t n_tokens() const { return tokens_.size(); }
  size_t n_merges() const;

  const std::string& token_text(TokenId id) const { return tokens_.at(size_t(id)).text; }
  float token_score(TokenId id) const { return tokens_.at(size_t(id)).score; }
  uint32_t token_attr(TokenId id) const { return tokens_.at(size_t(id)).attr; }
  bool is_control(TokenId id) const { return token_attr(id) & token_attr_control; }
  // The id whose text is exactly `text`, or kNoToken.
  TokenId find_token(std::string_view text) const;

  // Special ids; kNoToken where the vocab has none.
  TokenId bos() const { return bos_; }
  TokenId eos() const { return eos_; }
  TokenId eot() const { return eot_; }
  TokenId eom() const { return eom_; }
  TokenId unk() const { return unk_; }
  TokenId pad() const { return pad_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  bool clean_spaces() const { return clean_spaces_; }
  // End of generation: EOS, EOT, EOM and the turn-ending tokens llama.cpp recognises by text
  // (<|im_end|>, <|eot_id|>, <|return|>, ...). Sorted ascending.
  const std::vector<TokenId>& eog_tokens() const { return eog_; }
  bool is_eog(TokenId id) const;

 private:
  struct Token {
    std::string text;
    float score = 0;
    uint32_t attr = token_attr_normal;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;
  struct BpeModel;  // pre-tokenizer regexes and merge ranks (tokenizer_bpe.cpp)

  // A run of the input that is either ordinary text or one special token.
  struct Fragment {
    TokenId token = kNoToken;  // kNoToken: text [offset, offset + length) of the input
    size_t offset = 0;
    size_t length = 0;
  };

  Status init_bpe(const GgufFile& file);  // tokenizer_bpe.cpp
  void tokenize_bpe(std::string_view text, std::vector<TokenId>& out) const;
  void tokenize_spm(std::string_view text, std::vector<TokenId>& out) const;  // tokenizer_spm.cpp
  std::vector<Fragment> split_special(std::string_view text, bool parse_special) const;
  std::string make_piece(TokenId id) const;
  TokenId byte_token_spm(uint8_t byte) const;
  // GPT-2 byte-level text (each code point standing for one byte) back to the bytes.
  static std::string decode_byte_level(std::string_view text);  // tokenizer_bpe.cpp

  TokenizerKind kind_ = TokenizerKind::bpe;
  std::string model_name_;
  std::string pre_name_;
  std::vector<Token> tokens_;            // [n_tokens]
  StringMap token_ids_;                  // text -> id
  std::vector<std::string> pieces_;      // [n_tokens] token_to_piece(id, render_special = true)
  std::shared_ptr<const BpeModel> bpe_;  // null for SPM

  TokenId bos_ = kNoToken, eos_ = kNoToken, eot_ = kNoToken, eom_ = kNoToken, unk_ = kNoToken,
          pad_ = kNoToken, sep_ = kNoToken, mask_ = kNoToken;
  TokenId fim_pre_ = kNoToken, fim_suf_ = kNoToken, fim_mid_ = kNoToken, fim_pad_ = kNoToken,
          fim_rep_ = kNoToken, fim_sep_ = kNoToken;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
  bool clean_spaces_ = false;
  bool ignore_merges_ = false;  // BPE: a piece that is itself a token is taken whole (llama3)
  std::vector<TokenId> special_tokens_;  // CONTROL | USER_DEFINED | UNKNOWN, longest text first
  std::vector<TokenId> eog_;
};

}  // namespace strata
