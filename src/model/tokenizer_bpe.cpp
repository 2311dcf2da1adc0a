// Byte-level BPE: the pre-tokenizer (PCRE2 regexes, llama.cpp's per-type lists), GPT-2's byte
// encoding, and merges by rank.
//
// How llama.cpp splits (src/unicode.cpp, unicode_regex_split), and how this file matches it:
//  - The text is decoded to code points; each invalid UTF-8 byte becomes U+FFFD.
//  - The regexes run in sequence; each one runs inside every piece the previous ones produced, and
//    both its matches and the unmatched gaps between them become pieces.
//  - llama.cpp runs its regexes with std::regex on a stand-in text where every non-ASCII
//    whitespace code point is U+000B, so `\s` means ASCII whitespace plus Unicode White_Space. The
//    matcher here sees the same stand-in (PCRE2's \s then agrees), while the pieces are cut from
//    the real text.
//  - Regexes that use \p{..} classes run in llama.cpp on a "collapsed" text where ASCII keeps its
//    value and other code points become one byte per category; its ASCII table for \p{S} lacks
//    '~', so there '~' is neither P nor S. Regexes with \p{S} therefore see '~' as a private-use
//    stand-in (and their literal '~' also matches it).
//  - The gpt2 and llama3 regexes run through hand-written splitters in llama.cpp; these give the
//    same pieces as the regexes themselves, which run here.
#define PCRE2_CODE_UNIT_WIDTH 8  // UTF-8 subjects
#include <pcre2.h>

#include <algorithm>
#include <array>

#include "model/tokenizer.h"
#include "model/tokenizer_merge.h"

namespace strata {

namespace {

// ---- UTF-8, llama.cpp's way (unicode_cpt_from_utf8 / unicode_cpt_to_utf8) ----

// Decodes like llama.cpp: a lead byte with the right number of continuation bytes (10xxxxxx) is a
// code point (overlong forms and surrogates included); anything else is U+FFFD for one byte. Code
// points above U+10FFFF (which llama.cpp fails on later) become U+FFFD too.
std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  auto cont = [&](size_t i) { return i < n && (p[i] & 0xC0) == 0x80; };
  for (size_t i = 0; i < n;) {
    const uint8_t c = p[i];
    uint32_t cp;
    size_t len;
    if (c < 0x80) {
      cp = c;
      len = 1;
    } else if ((c & 0x40) == 0) {
      cp = 0xFFFD;
      len = 1;
    } else if ((c & 0x20) == 0) {
      if (!cont(i + 1)) {
        out.push_back(0xFFFD);
        ++i;
        continue;
      }
      cp = (uint32_t(c & 0x1F) << 6) | (p[i + 1] & 0x3F);
      len = 2;
    } else if ((c & 0x10) == 0) {
      if (!cont(i + 1) || !cont(i + 2)) {
        out.push_back(0xFFFD);
        ++i;
        continue;
      }
      cp = (uint32_t(c & 0x0F) << 12) | (uint32_t(p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
      len = 3;
    } else if ((c & 0x08) == 0) {
      if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) {
        out.push_back(0xFFFD);
        ++i;
        continue;
      }
      cp = (uint32_t(c & 0x07) << 18) | (uint32_t(p[i + 1] & 0x3F) << 12) |
           (uint32_t(p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F);
      if (cp > 0x10FFFF) cp = 0xFFFD;
      len = 4;
    } else {
      cp = 0xFFFD;
      len = 1;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp <= 0x7F) {
    out.push_back(char(cp));
  } else if (cp <= 0x7FF) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp <= 0xFFFF) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

// Unicode White_Space: llama.cpp's unicode_set_whitespace (Python regex `\s`).
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// ---- GPT-2's byte <-> printable code point table (bytes_to_unicode) ----

struct ByteLevelTable {
  std::array<std::string, 256> byte_to_utf8;  // byte -> UTF-8 of its code point
  std::array<int16_t, 0x144> cp_to_byte;      // code point -> byte, -1 if none

  ByteLevelTable() {
    cp_to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? uint32_t(b) : uint32_t(256 + n++);
      append_utf8(byte_to_utf8[size_t(b)], cp);
      cp_to_byte[cp] = int16_t(b);
    }
  }
};

const ByteLevelTable& byte_level() {
  static const ByteLevelTable table;
  return table;
}

// ---- pre-tokenizer types (llama.cpp's llm_tokenizer_bpe constructor and the name mapping in
// llama_vocab::impl::load). Non-ASCII characters of llama.cpp's regexes are written as \x{..}
// here: some of them (U+1F7D, U+1FBE, U+2126, U+212A, ...) do not survive Unicode normalization
// as literals. ----

constexpr const char* kRegexGpt2 =
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re";
constexpr const char* kRegexLlama3 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kRegexQwen2 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kRegexQwen35 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kRegexGpt4o =
    R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr const char* kRegexDeepseekV3 =
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
// deepseek-llm's cased letters (ranges of Lu/Ll/Lt from its tokenizer.json)
constexpr const char* kRegexDeepseekLlmLetters =
    R"re(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})re"
    R"re(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})re"
    R"re(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})re"
    R"re(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})re"
    R"re(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})re"
    R"re(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D})re"
    R"re(\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})re"
    R"re(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4})re"
    R"re(\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124})re"
    R"re(\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F})re"
    R"re(\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})re"
    R"re(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})re"
    R"re(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})re"
    R"re(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})re"
    R"re(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})re"
    R"re(\x{1E900}-\x{1E943}]+)re";
constexpr const char* kRegexDeepseekLlmPunct =
    R"re(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)re";
constexpr const char* kRegexDeepseekCjk =
    R"re([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)re";

struct PreTokenizerSpec {
  std::vector<std::string_view> names;  // tokenizer.ggml.pre values
  std::vector<const char*> regexes;     // applied in order
  bool ignore_merges = false;           // a piece that is a token is taken whole
  bool add_bos = false;                 // default for tokenizer.ggml.add_bos_token
  bool clean_spaces = true;             // llama.cpp's clean_spaces (detokenize)
};

const std::vector<PreTokenizerSpec>& pre_tokenizer_specs() {
  static const std::vector<PreTokenizerSpec> specs = {
      {{"default"},
       {R"re([\p{P}\$\+<=>\^~\|]+)re", kRegexGpt2, R"re(\p{N}+)re", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "jina-v5-nano"},
       {kRegexLlama3},
       true,
       true},
      {{"dbrx", "smaug-bpe"}, {kRegexLlama3}},
      {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
        "mellum", "modern-bert", "mpt", "olmo", "jais", "exaone4"},
       {kRegexGpt2}},
      {{"trillion", "granite-docling"}, {kRegexGpt2}, false, false, false},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"},
       {kRegexQwen2},
       false,
       false,
       false},
      {{"megrez", "stablelm2"}, {kRegexQwen2}},
      {{"qwen35"}, {kRegexQwen35}, false, false, false},
      {{"deepseek-llm"},
       {"[\r\n]", kRegexDeepseekLlmLetters, kRegexDeepseekLlmPunct, R"re(\s+$)re",
        kRegexDeepseekCjk, R"re(\p{N}+)re"},
       false,
       false,
       false},
      {{"deepseek-coder"},
       {"[\r\n]", R"re(\s?\p{L}+)re", R"re(\s?\p{P}+)re", kRegexDeepseekCjk, R"re(\p{N})re"},
       false,
       false,
       false},
      {{"deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"},
       {R"re(\p{N}{1,3})re", R"re([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)re",
        kRegexDeepseekV3},
       false,
       false,
       false},
      {{"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {kRegexGpt4o}, false, false, false},
      {{"starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"},
       {R"re(\p{N})re", kRegexGpt2}},
      {{"command-r", "smollm"}, {R"re(\p{N})re", kRegexGpt2}, false, false, false},
      {{"falcon"}, {R"re([\p{P}\$\+<=>\^~\|`]+)re", kRegexGpt2, "[0-9][0-9][0-9]"}},
  };
  return specs;
}

const PreTokenizerSpec* find_pre_tokenizer(std::string_view name) {
  if (name.empty()) name = "default";  // llama.cpp warns and uses the default regexes
  for (const PreTokenizerSpec& spec : pre_tokenizer_specs()) {
    if (std::find(spec.names.begin(), spec.names.end(), name) != spec.names.end()) return &spec;
  }
  return nullptr;
}

// ---- PCRE2 ----

constexpr uint32_t kTildeStandIn = 0xE07E;  // private use: neither P nor S, like '~' in llama.cpp
constexpr uint32_t kTildeStandInAlias = 0xE07D;  // where the stand-in itself occurs in the text

// A compiled pre-tokenizer regex. Immutable; matched from any thread with per-thread match data.
class SplitRegex {
 public:
  SplitRegex(pcre2_code* code, bool tilde_is_other)
      : code_(code), tilde_is_other_(tilde_is_other) {}
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;
  ~SplitRegex() { pcre2_code_free(code_); }

  const pcre2_code* code() const { return code_; }
  // Whether this regex sees '~' as llama.cpp's collapsed text does (neither P nor S).
  bool tilde_is_other() const { return tilde_is_other_; }

 private:
  pcre2_code* code_;
  bool tilde_is_other_;
};

// '~' in the pattern also matches the stand-in the text's '~' is replaced by.
std::string rewrite_tilde(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      out += c;
      out += pattern[++i];
    } else if (c == '[' && !in_class) {
      in_class = true;
      out += c;
    } else if (c == ']' && in_class) {
      in_class = false;
      out += c;
    } else if (c == '~') {
      out += in_class ? "~\\x{E07E}" : "[~\\x{E07E}]";
    } else {
      out += c;
    }
  }
  return out;
}

Result<std::unique_ptr<SplitRegex>> compile_regex(std::string_view llama_pattern) {
  const bool tilde_is_other = llama_pattern.find("\\p{S}") != std::string_view::npos;
  const std::string pattern =
      tilde_is_other ? rewrite_tilde(llama_pattern) : std::string(llama_pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return Error{strfmt("pre-tokenizer regex does not compile at offset %zu: %s", size_t(err_off),
                        reinterpret_cast<const char*>(msg))};
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter where JIT is absent
  return std::make_unique<SplitRegex>(code, tilde_is_other);
}

// Per-thread match state: match data, and a JIT stack larger than the 32 KiB default so that long
// runs (a page of spaces) do not exhaust it.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(64, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);

  MatchScratch() {
    if (context && jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

// The text as the regexes see it: code point i is at bytes [offset[i], offset[i + 1]).
struct MatchText {
  std::string bytes;
  std::vector<uint32_t> offset;  // [n + 1]

  void build(const std::vector<uint32_t>& cps, bool tilde_is_other) {
    bytes.clear();
    offset.resize(cps.size() + 1);
    for (size_t i = 0; i < cps.size(); ++i) {
      offset[i] = uint32_t(bytes.size());
      uint32_t cp = cps[i];
      if (cp >= 0x80 && is_white_space(cp)) cp = 0x0B;  // llama.cpp's whitespace stand-in
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xE000;    // surrogates: other, like private use
      if (tilde_is_other) {
        if (cp == '~') {
          cp = kTildeStandIn;
        } else if (cp == kTildeStandIn) {
          cp = kTildeStandInAlias;
        }
      }
      append_utf8(bytes, cp);
    }
    offset[cps.size()] = uint32_t(bytes.size());
  }
  // The code point index starting at byte `b` (a code point boundary).
  uint32_t index_of(uint32_t b, uint32_t lo, uint32_t hi) const {
    return uint32_t(std::lower_bound(offset.begin() + lo, offset.begin() + hi + 1, b) -
                    offset.begin());
  }
};

struct Span {
  uint32_t begin, end;  // code point indices
};

// Splits every span of `spans` by `re`: matches and the gaps between them become spans.
void split_spans(const SplitRegex& re, const MatchText& mt, const std::vector<Span>& spans,
                 std::vector<Span>& out, MatchScratch& scratch) {
  out.clear();
  for (const Span& sp : spans) {
    const uint32_t base = mt.offset[sp.begin];
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(mt.bytes.data() + base);
    const PCRE2_SIZE len = mt.offset[sp.end] - base;
    uint32_t prev = sp.begin;  // end of the last match, as a code point index
    PCRE2_SIZE start = 0;
    while (start <= len) {
      int rc = pcre2_match(re.code(), subject, len, start, PCRE2_NO_UTF_CHECK, scratch.data,
                           scratch.context);
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {  // JIT stack or match limit: try the interpreter
        rc = pcre2_match(re.code(), subject, len, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         scratch.data, scratch.context);
      }
      if (rc < 0) break;  // no match (or a limit hit twice): the rest is one gap
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
      const uint32_t ms = mt.index_of(base + uint32_t(ov[0]), sp.begin, sp.end);
      const uint32_t me = mt.index_of(base + uint32_t(ov[1]), sp.begin, sp.end);
      if (me == ms) {  // empty match: not a piece; search again one code point further
        if (ms >= sp.end) break;
        start = mt.offset[ms + 1] - base;
        continue;
      }
      if (ms > prev) out.push_back({prev, ms});
      out.push_back({ms, me});
      prev = me;
      start = ov[1];
    }
    if (prev < sp.end) out.push_back({prev, sp.end});
  }
}

}  // namespace

struct Tokenizer::BpeModel {
  std::vector<std::unique_ptr<SplitRegex>> regexes;
  bool any_tilde_is_other = false;
  StringMap ranks;  // "left right" -> merge rank
  size_t n_merges = 0;
};

Status Tokenizer::init_bpe(const GgufFile& file) {
  const PreTokenizerSpec* spec = find_pre_tokenizer(pre_name_);
  if (!spec) {
    return Error{
        strfmt("%s: tokenizer.ggml.pre: unknown pre-tokenizer '%s' (strata knows default, "
               "gpt-2, llama-bpe/llama3, qwen2, qwen35, deepseek-llm, deepseek-coder, "
               "deepseek-v3, gpt-4o, starcoder, falcon and their aliases)",
               file.name().c_str(), pre_name_.c_str())};
  }
  ignore_merges_ = spec->ignore_merges;
  add_bos_ = spec->add_bos;
  clean_spaces_ = spec->clean_spaces;

  auto model = std::make_shared<BpeModel>();
  for (const char* pattern : spec->regexes) {
    auto re = compile_regex(pattern);
    if (!re) {
      return Error{strfmt("%s: pre-tokenizer '%s': %s", file.name().c_str(), pre_name_.c_str(),
                          re.error().message.c_str())};
    }
    model->any_tilde_is_other |= (*re)->tilde_is_other();
    model->regexes.push_back(std::move(*re));
  }

  const GgufValue* merges = file.find("tokenizer.ggml.merges");
  if (!merges) {
    return Error{
        strfmt("%s: tokenizer.ggml.merges: missing: a gpt2 (BPE) tokenizer needs its merges",
               file.name().c_str())};
  }
  if (merges->type != GgufType::array || merges->elem_type != GgufType::string) {
    return Error{strfmt("%s: tokenizer.ggml.merges: expected an array of strings, found %s",
                        file.name().c_str(), std::string(gguf_type_name(merges->type)).c_str())};
  }
  model->n_merges = merges->elems.size();
  model->ranks.reserve(merges->elems.size());
  for (size_t i = 0; i < merges->elems.size(); ++i) {
    // "left right", split at the first space after the first byte (as llama.cpp); the first of
    // two equal merges keeps its rank.
    const std::string& m = merges->elems[i].str;
    const size_t pos = m.find(' ', 1);
    std::string key = pos == std::string::npos ? std::string(" ") : m;
    model->ranks.emplace(std::move(key), int32_t(i));
  }
  bpe_ = std::move(model);
  return Status::success();
}

size_t Tokenizer::n_merges() const {
  return bpe_ ? bpe_->n_merges : 0;
}

std::string Tokenizer::decode_byte_level(std::string_view text) {
  const ByteLevelTable& table = byte_level();
  std::string out;
  out.reserve(text.size());
  for (uint32_t cp : decode_utf8(text)) {
    if (cp < table.cp_to_byte.size() && table.cp_to_byte[cp] >= 0) {
      out.push_back(char(table.cp_to_byte[cp]));
      continue;
    }
    // llama_decode_text's marker for a code point outside the byte table
    std::string utf8;
    append_utf8(utf8, cp);
    out += "[UNK_BYTE_0x";
    for (char c : utf8) out += strfmt("%02x", unsigned(static_cast<unsigned char>(c)));
    out.append(text);
    out += "]";
  }
  return out;
}

void Tokenizer::tokenize_bpe(std::string_view text, std::vector<TokenId>& out) const {
  const BpeModel& model = *bpe_;
  const ByteLevelTable& table = byte_level();

  // ---- pre-tokenize ----
  const std::vector<uint32_t> cps = decode_utf8(text);
  if (cps.empty()) return;
  MatchText plain, tilde;
  plain.build(cps, false);
  if (model.any_tilde_is_other) tilde.build(cps, true);
  thread_local MatchScratch scratch;
  std::vector<Span> spans{{0, uint32_t(cps.size())}}, next;
  for (const auto& re : model.regexes) {
    split_spans(*re, re->tilde_is_other() ? tilde : plain, spans, next, scratch);
    spans.swap(next);
  }

  // ---- BPE on each piece ----
  using Symbol = tokenizer_detail::MergeSymbol;  // offsets into the piece's byte-level text
  struct Bigram {
    int32_t rank;
    int32_t left, right;
    uint32_t size;  // bytes of left + right when queued: stale if either has changed since
  };
  // llm_bigram_bpe::comparator: lowest rank first, then leftmost
  auto lower_priority = [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::string word, key, bytes;
  std::vector<Symbol> symbols;
  std::vector<Bigram> queue;
  for (const Span& sp : spans) {
    bytes.clear();
    for (uint32_t i = sp.begin; i < sp.end; ++i) append_utf8(bytes, cps[i]);
    word.clear();
    for (char c : bytes) word += table.byte_to_utf8[static_cast<unsigned char>(c)];

    if (ignore_merges_) {
      const TokenId id = find_token(word);
      if (id != kNoToken) {
        out.push_back(id);
        continue;
      }
    }
    tokenizer_detail::split_symbols(word, symbols);
    queue.clear();
    auto add_bigram = [&](int32_t left, int32_t right) {
      if (left < 0 || right < 0) return;
      const Symbol& l = symbols[size_t(left)];
      const Symbol& r = symbols[size_t(right)];
      key.assign(word, l.offset, l.n);
      key += ' ';
      key.append(word, r.offset, r.n);
      auto it = model.ranks.find(std::string_view(key));
      if (it == model.ranks.end()) return;
      queue.push_back({it->second, left, right, l.n + r.n});
      std::push_heap(queue.begin(), queue.end(), lower_priority);
    };
    tokenizer_detail::merge_bigrams(symbols, queue, lower_priority, add_bigram);
    for (int32_t i = 0; i != -1; i = symbols[size_t(i)].next) {
      const Symbol& s = symbols[size_t(i)];
      const std::string_view piece(word.data() + s.offset, s.n);
      const TokenId id = find_token(piece);
      if (id != kNoToken) {
        out.push_back(id);
        continue;
      }
      // not a token: each byte of it that is a token on its own (as llama.cpp; others vanish)
      for (char c : piece) {
        const TokenId b = find_token(std::string_view(&c, 1));
        if (b != kNoToken) out.push_back(b);
      }
    }
  }
}

}  // namespace strata
