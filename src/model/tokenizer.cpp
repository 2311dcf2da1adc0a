// Loading the vocabulary from GGUF metadata, special tokens, and the parts shared by BPE and SPM:
// cutting special tokens out of the text, token -> piece, detokenize. Each rule here is llama.cpp's
// (src/llama-vocab.cpp, llama_vocab::impl::load / tokenize / token_to_piece / detokenize); where
// llama.cpp depends on hash-map iteration order, the lowest id wins.
#include "model/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace strata {

namespace {

// GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
uint32_t attr_from_token_type(int64_t type) {
  switch (type) {
    case 1:
      return token_attr_normal;
    case 2:
      return token_attr_unknown;
    case 3:
      return token_attr_control;
    case 4:
      return token_attr_user_defined;
    case 5:
      return token_attr_unused;
    case 6:
      return token_attr_byte;
    default:
      return token_attr_undefined;  // 0 (undefined) and anything unknown
  }
}

Error key_error(const GgufFile& file, std::string_view key, const std::string& what) {
  return Error{
      strfmt("%s: %.*s: %s", file.name().c_str(), int(key.size()), key.data(), what.c_str())};
}

// An array-typed key's elements, checking the element type; nullptr (and no error) if absent.
Result<const std::vector<GgufValue>*> get_array(const GgufFile& file, std::string_view key,
                                                std::initializer_list<GgufType> elem_types,
                                                const char* expected) {
  const GgufValue* v = file.find(key);
  if (!v) return static_cast<const std::vector<GgufValue>*>(nullptr);
  bool ok = v->type == GgufType::array;
  if (ok) ok = std::find(elem_types.begin(), elem_types.end(), v->elem_type) != elem_types.end();
  if (!ok) {
    std::string got =
        v->type == GgufType::array
            ? strfmt("an array of %s", std::string(gguf_type_name(v->elem_type)).c_str())
            : std::string(gguf_type_name(v->type));
    return key_error(file, key, strfmt("expected %s, found %s", expected, got.c_str()));
  }
  return &v->elems;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out.append(to);
  }
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

constexpr std::string_view kSpmSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space

// Texts llama.cpp recognises as special when the GGUF does not name them (llama_vocab::impl::load).
// DeepSeek's use U+FF5C (fullwidth bar) and U+2581.
constexpr std::string_view kDsEndOfSentence = "<\uff5cend\u2581of\u2581sentence\uff5c>";
constexpr std::string_view kDsFimBegin = "<\uff5cfim\u2581begin\uff5c>";
constexpr std::string_view kDsFimHole = "<\uff5cfim\u2581hole\uff5c>";
constexpr std::string_view kDsFimEnd = "<\uff5cfim\u2581end\uff5c>";
constexpr std::string_view kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",  "<|endoftext|>",     "<|end_of_text|>",
    "<EOT>",      "_<EOT>",     "[EOT]",   kDsEndOfSentence, "<end_of_utterance>"};
constexpr std::string_view kEomTexts[] = {"<|eom_id|>"};
constexpr std::string_view kFimPreTexts[] = {"<|fim_prefix|>",  "<fim-prefix>", "<fim_prefix>",
                                             kDsFimBegin,       "<PRE>",        "\u2581<PRE>",
                                             "<|code_prefix|>", "<|prefix|>"};
constexpr std::string_view kFimSufTexts[] = {"<|fim_suffix|>",  "<fim-suffix>", "<fim_suffix>",
                                             kDsFimHole,        "<SUF>",        "\u2581<SUF>",
                                             "<|code_suffix|>", "<|suffix|>"};
constexpr std::string_view kFimMidTexts[] = {"<|fim_middle|>",  "<fim-middle>", "<fim_middle>",
                                             kDsFimEnd,         "<MID>",        "\u2581<MID>",
                                             "<|code_middle|>", "<|middle|>"};
constexpr std::string_view kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
                                             "[PAD]"};
constexpr std::string_view kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                             "<REPO>", "<reponame>"};
constexpr std::string_view kFimSepTexts[] = {"<|file_sep|>"};
constexpr std::string_view kEogTexts[] = {"<|eot_id|>",
                                          "<|im_end|>",
                                          "<|end|>",
                                          "<|return|>",
                                          "<|call|>",
                                          "<|flush|>",
                                          "<|calls|>",
                                          "<end_of_turn>",
                                          "<|endoftext|>",
                                          "</s>",
                                          "<|eom_id|>",
                                          "<EOT>",
                                          "_<EOT>",
                                          "[EOT]",
                                          "[EOS]",
                                          "<|end_of_text|>",
                                          "<end_of_utterance>",
                                          "<eos>",
                                          "<turn|>",
                                          "<|tool_response>",
                                          kDsEndOfSentence,
                                          "[e~["};

}  // namespace

std::span<const std::string_view> end_of_generation_texts() { return kEogTexts; }

namespace {

template <size_t N>
bool is_one_of(std::string_view s, const std::string_view (&list)[N]) {
  return std::find(std::begin(list), std::end(list), s) != std::end(list);
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
  Tokenizer t;
  {
    auto model = file.require_string("tokenizer.ggml.model");
    if (!model) return model.error();
    t.model_name_ = *model;
    auto pre = file.get_string("tokenizer.ggml.pre");
    if (!pre) return pre.error();
    t.pre_name_ = pre->value_or("");
  }
  if (t.model_name_ == "llama") {
    t.kind_ = TokenizerKind::spm;
  } else if (t.model_name_ == "gpt2") {
    t.kind_ = TokenizerKind::bpe;
  } else {
    return key_error(file, "tokenizer.ggml.model",
                     strfmt("unsupported tokenizer '%s' (strata reads 'gpt2', byte-level BPE, and "
                            "'llama', SentencePiece)",
                            t.model_name_.c_str()));
  }

  // ---- tokens, scores, types ----
  auto tokens = get_array(file, "tokenizer.ggml.tokens", {GgufType::string}, "an array of strings");
  if (!tokens) return tokens.error();
  if (!*tokens)
    return key_error(file, "tokenizer.ggml.tokens", "missing: the file has no vocabulary");
  const std::vector<GgufValue>& texts = **tokens;
  const size_t n = texts.size();
  if (n == 0) return key_error(file, "tokenizer.ggml.tokens", "the vocabulary is empty");
  if (n > size_t(INT32_MAX)) return key_error(file, "tokenizer.ggml.tokens", "too many tokens");

  auto scores = get_array(file, "tokenizer.ggml.scores", {GgufType::f32, GgufType::i32},
                          "an array of f32 or i32");
  if (!scores) return scores.error();
  if (*scores && (*scores)->size() != n) {
    return key_error(
        file, "tokenizer.ggml.scores",
        strfmt("%zu scores for %zu tokens (tokenizer.ggml.tokens)", (*scores)->size(), n));
  }
  auto types = get_array(file, "tokenizer.ggml.token_type", {GgufType::i32}, "an array of i32");
  if (!types) return types.error();
  if (*types && (*types)->size() != n) {
    return key_error(
        file, "tokenizer.ggml.token_type",
        strfmt("%zu token types for %zu tokens (tokenizer.ggml.tokens)", (*types)->size(), n));
  }

  t.tokens_.resize(n);
  t.token_ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    Token& tok = t.tokens_[i];
    tok.text = texts[i].str;
    if (tok.text.empty()) tok.text = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp
    if (*scores) {
      const GgufValue& s = (**scores)[i];
      tok.score = s.type == GgufType::f32 ? float(s.f) : float(s.i);
    }
    if (*types) tok.attr = attr_from_token_type((**types)[i].i);
    auto [it, inserted] = t.token_ids_.emplace(tok.text, TokenId(i));
    if (!inserted) {
      return key_error(
          file, "tokenizer.ggml.tokens",
          strfmt("duplicate token '%s' at ids %d and %zu", tok.text.c_str(), it->second, i));
    }
  }

  // ---- per-type defaults (llama_vocab::impl::load), then the file's own settings ----
  if (t.kind_ == TokenizerKind::spm) {
    t.bos_ = 1;
    t.eos_ = 2;
    t.unk_ = 0;
    t.add_space_prefix_ = true;
    t.add_bos_ = true;
    t.add_eos_ = false;
    t.clean_spaces_ = false;
  } else {
    t.bos_ = 11;
    t.eos_ = 11;
    t.add_space_prefix_ = false;
    t.clean_spaces_ = true;
    STRATA_TRY(t.init_bpe(file));  // pre-tokenizer (may change add_bos / clean_spaces) and merges
  }
  {
    auto v = file.get_bool("tokenizer.ggml.add_space_prefix");
    if (!v) return v.error();
    if (v->has_value()) t.add_space_prefix_ = **v;
  }

  // Special ids: a default outside the vocabulary is dropped; a file's id outside it is ignored.
  struct SpecialKey {
    const char* key;
    TokenId* id;
  };
  const SpecialKey special_keys[] = {
      {"tokenizer.ggml.bos_token_id", &t.bos_},
      {"tokenizer.ggml.eos_token_id", &t.eos_},
      {"tokenizer.ggml.eot_token_id", &t.eot_},
      {"tokenizer.ggml.eom_token_id", &t.eom_},
      {"tokenizer.ggml.unknown_token_id", &t.unk_},
      {"tokenizer.ggml.seperator_token_id", &t.sep_},  // sic: llama.cpp's spelling
      {"tokenizer.ggml.padding_token_id", &t.pad_},
      {"tokenizer.ggml.mask_token_id", &t.mask_},
      {"tokenizer.ggml.fim_pre_token_id", &t.fim_pre_},
      {"tokenizer.ggml.fim_suf_token_id", &t.fim_suf_},
      {"tokenizer.ggml.fim_mid_token_id", &t.fim_mid_},
      {"tokenizer.ggml.fim_pad_token_id", &t.fim_pad_},
      {"tokenizer.ggml.fim_rep_token_id", &t.fim_rep_},
      {"tokenizer.ggml.fim_sep_token_id", &t.fim_sep_},
      {"tokenizer.ggml.prefix_token_id", &t.fim_pre_},  // deprecated names
      {"tokenizer.ggml.suffix_token_id", &t.fim_suf_},
      {"tokenizer.ggml.middle_token_id", &t.fim_mid_},
  };
  for (const SpecialKey& sk : special_keys) {
    if (*sk.id >= 0 && size_t(*sk.id) >= n) *sk.id = kNoToken;
    auto v = file.get_int(sk.key);
    if (!v) return v.error();
    if (v->has_value() && **v >= 0 && uint64_t(**v) < n) *sk.id = TokenId(**v);
  }
  for (const char* key : {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"}) {
    auto v = file.get_bool(key);
    if (!v) return v.error();
    if (v->has_value()) (std::strstr(key, "bos") ? t.add_bos_ : t.add_eos_) = **v;
  }
  if (t.add_bos_ && t.bos_ == kNoToken) {
    return key_error(
        file, "tokenizer.ggml.add_bos_token",
        "is true, but tokenizer.ggml.bos_token_id is not set (or outside the vocabulary)");
  }
  if (t.add_eos_ && t.eos_ == kNoToken) {
    return key_error(
        file, "tokenizer.ggml.add_eos_token",
        "is true, but tokenizer.ggml.eos_token_id is not set (or outside the vocabulary)");
  }

  // ---- special tokens the file does not name, recognised by their text ----
  auto make_control = [&](TokenId id) { t.tokens_[size_t(id)].attr |= token_attr_control; };
  auto detect = [&](TokenId& slot, std::span<const std::string_view> list) {
    if (slot != kNoToken) return;
    for (size_t i = 0; i < n; ++i) {
      if (std::find(list.begin(), list.end(), t.tokens_[i].text) != list.end()) {
        slot = TokenId(i);
        make_control(slot);
        return;
      }
    }
  };
  detect(t.eot_, kEotTexts);
  detect(t.eom_, kEomTexts);
  detect(t.fim_pre_, kFimPreTexts);
  detect(t.fim_suf_, kFimSufTexts);
  detect(t.fim_mid_, kFimMidTexts);
  detect(t.fim_pad_, kFimPadTexts);
  detect(t.fim_rep_, kFimRepTexts);
  detect(t.fim_sep_, kFimSepTexts);
  for (Token& tok : t.tokens_) {  // control tokens named "...unused..." are unused
    if ((tok.attr & token_attr_control) && tok.text.find("unused") != std::string::npos) {
      tok.attr |= token_attr_unused;
    }
  }

  // End of generation.
  std::vector<TokenId> eog;
  for (TokenId id : {t.fim_pad_, t.fim_rep_, t.fim_sep_}) {
    if (id != kNoToken) eog.push_back(id);
  }
  for (size_t i = 0; i < n; ++i) {
    if (is_one_of(t.tokens_[i].text, kEogTexts)) {
      eog.push_back(TokenId(i));
      make_control(TokenId(i));
    }
  }
  // gpt-oss (o200k_harmony): these are always rendered.
  for (std::string_view s : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    TokenId id = t.find_token(s);
    if (id != kNoToken) t.tokens_[size_t(id)].attr = token_attr_user_defined;
  }
  for (TokenId id : {t.eos_, t.eot_, t.eom_}) {
    if (id != kNoToken) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  auto eog_has = [&](std::string_view s) {
    TokenId id = t.find_token(s);
    return id != kNoToken && std::binary_search(eog.begin(), eog.end(), id);
  };
  auto eog_remove = [&](std::string_view s, uint32_t new_attr) {
    TokenId id = t.find_token(s);
    eog.erase(std::remove(eog.begin(), eog.end(), id), eog.end());
    t.tokens_[size_t(id)].attr = new_attr;
  };
  // o200k_harmony / solar-open: <|end|> ends a message, not the generation.
  const bool has_call = eog_has("<|call|>") || eog_has("<|calls|>");
  if (eog_has("<|end|>") && has_call && (eog_has("<|return|>") || eog_has("<|flush|>"))) {
    eog_remove("<|end|>", token_attr_user_defined);
  }
  if (eog_has("<|tool_response>") && eog_has("</s>")) eog_remove("</s>", token_attr_normal);
  t.eog_ = std::move(eog);

  // Tokens cut out of text before the pre-tokenizer, longest first. std::sort as llama.cpp does,
  // from the same starting order, so that equal lengths come out in the same order.
  for (size_t i = 0; i < n; ++i) {
    if (t.tokens_[i].attr & (token_attr_control | token_attr_user_defined | token_attr_unknown)) {
      t.special_tokens_.push_back(TokenId(i));
    }
  }
  std::sort(t.special_tokens_.begin(), t.special_tokens_.end(), [&](TokenId a, TokenId b) {
    return t.tokens_[size_t(a)].text.size() > t.tokens_[size_t(b)].text.size();
  });

  t.pieces_.resize(n);
  for (size_t i = 0; i < n; ++i) t.pieces_[i] = t.make_piece(TokenId(i));

  // Phi-3: whitespace right of its special tokens belongs to them (llama.cpp keys this on the
  // name).
  {
    auto name = file.get_string("general.name");
    if (!name) return name.error();
    std::string lower = name->value_or("");
    for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    if (lower.find("phi-3") != std::string::npos || lower.find("phi3") != std::string::npos) {
      for (TokenId id : t.special_tokens_) t.tokens_[size_t(id)].attr |= token_attr_rstrip;
      auto set_rstrip = [&](std::string_view s, bool on) {
        TokenId id = t.find_token(s);
        if (id == kNoToken) return;
        uint32_t& a = t.tokens_[size_t(id)].attr;
        a = on ? (a | token_attr_rstrip) : (a & ~uint32_t(token_attr_rstrip));
      };
      set_rstrip("</s>", true);
      for (std::string_view s : {"<unk>", "<s>", "<|endoftext|>"}) set_rstrip(s, false);
    }
  }
  return t;
}

TokenId Tokenizer::find_token(std::string_view text) const {
  auto it = token_ids_.find(text);
  return it == token_ids_.end() ? kNoToken : it->second;
}

bool Tokenizer::is_eog(TokenId id) const {
  return id != kNoToken && std::binary_search(eog_.begin(), eog_.end(), id);
}

// llama_vocab::impl::tokenizer_st_partition: for each special token (longest first), cut every
// occurrence out of the text fragments that remain.
std::vector<Tokenizer::Fragment> Tokenizer::split_special(std::string_view text,
                                                          bool parse_special) const {
  std::vector<Fragment> frags{Fragment{kNoToken, 0, text.size()}};
  std::vector<Fragment> next;
  for (TokenId id : special_tokens_) {
    const Token& tok = tokens_[size_t(id)];
    if (!parse_special && (tok.attr & (token_attr_control | token_attr_unknown))) continue;
    const std::string_view needle = tok.text;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      size_t off = f.offset, len = f.length;
      while (true) {
        const size_t hit = text.substr(off, len).find(needle);
        if (hit == std::string_view::npos) {
          if (len > 0) next.push_back(Fragment{kNoToken, off, len});
          break;
        }
        size_t left_len = hit;
        if (tok.attr & token_attr_lstrip) {
          while (left_len > 0 &&
                 std::isspace(static_cast<unsigned char>(text[off + left_len - 1]))) {
            --left_len;
          }
        }
        if (left_len > 0) next.push_back(Fragment{kNoToken, off, left_len});
        next.push_back(Fragment{id, 0, 0});
        size_t right_off = off + hit + needle.size();
        size_t right_len = len - hit - needle.size();
        if (right_len == 0) break;
        if (tok.attr & token_attr_rstrip) {
          while (right_len > 0 && std::isspace(static_cast<unsigned char>(text[right_off]))) {
            ++right_off;
            --right_len;
          }
        }
        off = right_off;
        len = right_len;
      }
    }
    frags.swap(next);
  }
  return frags;
}

std::vector<TokenId> Tokenizer::tokenize(std::string_view text, bool add_special,
                                         bool parse_special) const {
  std::vector<TokenId> out;
  std::vector<Fragment> frags;
  if (!text.empty()) frags = split_special(text, parse_special);

  if (kind_ == TokenizerKind::spm) {
    bool prev_special = true;  // the first text gets the space prefix
    if (add_special && add_bos_) out.push_back(bos_);
    std::string buf;
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      buf.clear();
      if (add_space_prefix_ && prev_special) buf.push_back(' ');
      buf.append(text.substr(f.offset, f.length));
      replace_all(buf, " ", kSpmSpace);
      tokenize_spm(buf, out);
      prev_special = false;
    }
    if (add_special && add_eos_) out.push_back(eos_);
  } else {
    if (add_special && add_bos_) out.push_back(bos_);
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
      } else {
        tokenize_bpe(text.substr(f.offset, f.length), out);
      }
    }
    if (add_special && add_eos_) out.push_back(eos_);
  }
  return out;
}

// llama_vocab::impl::token_to_piece with special = true.
std::string Tokenizer::make_piece(TokenId id) const {
  const Token& tok = tokens_[size_t(id)];
  if (tok.attr & (token_attr_unknown | token_attr_control | token_attr_user_defined))
    return tok.text;
  if (tok.attr & token_attr_normal) {
    if (kind_ == TokenizerKind::bpe) return decode_byte_level(tok.text);
    std::string s = tok.text;
    replace_all(s, kSpmSpace, " ");
    return s;
  }
  if (tok.attr & token_attr_byte) {
    // "<0xXX>"; a malformed byte token is rendered as its text
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    if (tok.text.size() >= 5 && hex(tok.text[3]) >= 0 && hex(tok.text[4]) >= 0) {
      return std::string(1, char(hex(tok.text[3]) * 16 + hex(tok.text[4])));
    }
    return tok.text;
  }
  return {};  // unused / undefined tokens render as nothing
}

std::string Tokenizer::token_to_piece(TokenId id, bool render_special) const {
  STRATA_CHECK(id >= 0 && size_t(id) < tokens_.size(), "token id outside the vocabulary");
  if (!render_special && (tokens_[size_t(id)].attr & (token_attr_unknown | token_attr_control))) {
    return {};
  }
  return pieces_[size_t(id)];
}

std::string Tokenizer::detokenize(std::span<const TokenId> ids,
                                  const DetokenizeOptions& opt) const {
  bool remove_space = add_space_prefix_;
  if (opt.remove_special && add_bos_ && !ids.empty() && ids.front() == bos_) {
    remove_space = false;
    ids = ids.subspan(1);
  }
  if (opt.remove_special && add_eos_ && !ids.empty() && ids.back() == eos_) {
    ids = ids.first(ids.size() - 1);
  }
  std::string text;
  for (TokenId id : ids) {
    std::string piece = token_to_piece(id, opt.render_special);
    if (remove_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    remove_space = false;
    text += piece;
  }
  if (!(opt.clean_spaces && clean_spaces_) || text.empty()) return text;

  // llama.cpp's three in-place passes, index for index.
  char* s = text.data();
  int32_t total = int32_t(text.size());
  // " ?", " !", " .", " ," lose the space
  const int32_t total1 = total;
  total = 1;
  for (int32_t i = 1; i < total1; ++i) {
    const char x = s[i];
    if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --total;
    s[total++] = x;
  }
  // " ' " -> "'"
  const int32_t total2 = total;
  total = 1;
  for (int32_t i = 1; i < total2; ++i) {
    const char x = s[i];
    if (x == '\'' && i + 1 < total2 && s[i - 1] == ' ' && s[i + 1] == ' ') {
      --total;
      s[++i] = '\0';
    }
    s[total++] = x;
  }
  // " 's", " 'm", " 're", " 've" lose the space
  const int32_t total3 = total;
  total = 1;
  for (int32_t i = 1; i < total3; ++i) {
    const char x = s[i];
    if (s[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
      const char x1 = s[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --total;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < total3) {
        const char x2 = s[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --total;
      }
    }
    s[total++] = x;
  }
  text.resize(size_t(total));
  return text;
}

}  // namespace strata
