// The tokenizer against llama.cpp's test vectors (tests/data/vocab and ../shared/fixtures/vocab:
// every string of every vocab, add_special = false, parse_special = false), against the fixture
// models' own tokens.json, and on small vocabularies built in memory (errors, specials, quirks).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "test_support.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using test::data_dir;

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One llama.cpp test vector file pair: ggml-vocab-<name>.gguf.inp / .out.
struct VocabCase {
  std::string text;
  std::vector<TokenId> expected;
};

std::vector<VocabCase> read_cases(const fs::path& gguf) {
  const std::string inp = read_text(gguf.string() + ".inp");
  const std::string out = read_text(gguf.string() + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<VocabCase> cases;
  for (size_t pos = 0; pos < inp.size();) {
    size_t end = inp.find(sep, pos);
    if (end == std::string::npos) break;
    cases.push_back({inp.substr(pos, end - pos), {}});
    pos = end + sep.size();
  }
  std::istringstream lines(out);
  std::string line;
  for (VocabCase& c : cases) {
    if (!std::getline(lines, line)) break;
    std::istringstream ids(line);
    for (TokenId id; ids >> id;) c.expected.push_back(id);
  }
  return cases;
}

std::string ids_string(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

Tokenizer load(const fs::path& gguf) {
  auto file = GgufFile::open(gguf.string());
  EXPECT_TRUE(file.ok()) << (file.ok() ? "" : file.error().message);
  auto tok = Tokenizer::from_gguf(*file);
  EXPECT_TRUE(tok.ok()) << (tok.ok() ? "" : tok.error().message);
  return std::move(tok).value();
}

// Runs every vector of `gguf`; returns "name: passed/total" and records each failure.
std::string check_vocab(const fs::path& gguf, int* n_pass, int* n_total) {
  const std::string name = gguf.filename().string();
  Tokenizer tok = load(gguf);
  const auto cases = read_cases(gguf);
  EXPECT_GT(cases.size(), 20u) << name;
  int pass = 0;
  for (const VocabCase& c : cases) {
    const auto got = tok.tokenize(c.text, /*add_special=*/false, /*parse_special=*/false);
    if (got == c.expected) {
      ++pass;
    } else {
      ADD_FAILURE() << name << ": text '" << c.text << "'\n  expected" << ids_string(c.expected)
                    << "\n  got     " << ids_string(got);
    }
  }
  *n_pass += pass;
  *n_total += int(cases.size());
  return name + ": " + std::to_string(pass) + "/" + std::to_string(cases.size());
}

std::vector<fs::path> shared_vocabs() {
  std::vector<fs::path> out;
  auto dir = test::fixtures_dir();
  if (!dir || !fs::is_directory(*dir / "vocab")) return out;
  for (const auto& e : fs::directory_iterator(*dir / "vocab")) {
    if (e.path().extension() == ".gguf") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(TokenizerVectors, VendoredVocabs) {
  int pass = 0, total = 0;
  std::string summary;
  for (const char* v : {"ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-spm.gguf"}) {
    summary += check_vocab(data_dir() / "vocab" / v, &pass, &total) + "; ";
  }
  EXPECT_EQ(pass, total) << summary;
  std::printf("[ vectors  ] %s\n", summary.c_str());
}

TEST(TokenizerVectors, EverySharedVocab) {
  auto vocabs = shared_vocabs();
  if (vocabs.empty()) {
    GTEST_SKIP()
        << "../shared/fixtures/vocab not found: only the vendored vocabs (gpt-2, llama-spm) "
           "were checked";
  }
  int pass = 0, total = 0;
  std::string summary;
  for (const auto& v : vocabs) summary += check_vocab(v, &pass, &total) + "; ";
  EXPECT_EQ(pass, total) << summary;
  EXPECT_GE(vocabs.size(), 5u) << summary;
  std::printf("[ vectors  ] %s\n", summary.c_str());
}

// detokenize(tokenize(s)) == s for every vector string, byte-level BPE and SentencePiece alike.
void check_round_trip(const fs::path& gguf) {
  Tokenizer tok = load(gguf);
  for (const VocabCase& c : read_cases(gguf)) {
    const auto ids = tok.tokenize(c.text, false, false);
    EXPECT_EQ(tok.detokenize(ids), c.text) << gguf.filename().string() << ":" << ids_string(ids);
  }
}

TEST(TokenizerRoundTrip, VendoredVocabs) {
  check_round_trip(data_dir() / "vocab" / "ggml-vocab-gpt-2.gguf");
  check_round_trip(data_dir() / "vocab" / "ggml-vocab-llama-spm.gguf");
}

TEST(TokenizerRoundTrip, EverySharedVocab) {
  auto vocabs = shared_vocabs();
  if (vocabs.empty()) GTEST_SKIP() << "../shared/fixtures/vocab not found";
  for (const auto& v : vocabs) check_round_trip(v);
}

// tokens.json's text_ids are the tokenization of its text with add_special = false.
void check_model_tokens(const fs::path& model) {
  SCOPED_TRACE(model.string());
  Tokenizer tok = load(model);
  std::ifstream in(model.parent_path() / "tokens.json");
  ASSERT_TRUE(in.good());
  const auto j = nlohmann::json::parse(in);
  const auto text = j["text"].get<std::string>();
  const auto expected = j["text_ids"].get<std::vector<TokenId>>();
  const auto got = tok.tokenize(text, /*add_special=*/false, /*parse_special=*/false);
  EXPECT_EQ(got, expected) << "expected" << ids_string(expected) << "\ngot     " << ids_string(got);
  EXPECT_EQ(tok.detokenize(got), text);
  EXPECT_EQ(tok.bos(), j["bos_id"].get<TokenId>());
  EXPECT_FALSE(tok.add_bos());  // add_bos_token = false in every fixture model
  EXPECT_EQ(tok.tokenize(text, /*add_special=*/true, false), expected);
  EXPECT_TRUE(tok.is_eog(tok.eos()));
}

TEST(TokenizerModels, VendoredQwen3Moe) {
  check_model_tokens(data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf");
}

TEST(TokenizerModels, EveryFixtureModel) {
  auto models = test::fixture_models();
  if (models.empty())
    GTEST_SKIP() << "../shared/fixtures not found: only the vendored model was read";
  for (const auto& m : models) check_model_tokens(m);
}

TEST(TokenizerSpecial, BosAddedWhenTheVocabSaysSo) {
  Tokenizer spm = load(data_dir() / "vocab" / "ggml-vocab-llama-spm.gguf");
  EXPECT_EQ(spm.kind(), TokenizerKind::spm);
  EXPECT_TRUE(spm.add_bos());
  EXPECT_FALSE(spm.add_eos());
  EXPECT_EQ(spm.bos(), 1);
  EXPECT_EQ(spm.eos(), 2);
  const auto plain = spm.tokenize("Hello world", false, false);
  const auto with_bos = spm.tokenize("Hello world", true, false);
  ASSERT_EQ(with_bos.size(), plain.size() + 1);
  EXPECT_EQ(with_bos[0], spm.bos());
  EXPECT_TRUE(std::equal(plain.begin(), plain.end(), with_bos.begin() + 1));
  EXPECT_EQ(spm.tokenize("", true, false), std::vector<TokenId>{1});
  EXPECT_TRUE(spm.tokenize("", false, false).empty());
  // llama.cpp: dropping the BOS also keeps the leading space its prefix added
  DetokenizeOptions opt;
  opt.remove_special = true;
  EXPECT_EQ(spm.detokenize(with_bos, opt), " Hello world");
  EXPECT_EQ(spm.detokenize(with_bos), "<s> Hello world");
  EXPECT_EQ(spm.detokenize(plain), "Hello world");

  Tokenizer gpt2 = load(data_dir() / "vocab" / "ggml-vocab-gpt-2.gguf");
  EXPECT_EQ(gpt2.kind(), TokenizerKind::bpe);
  EXPECT_FALSE(gpt2.add_bos());
  EXPECT_EQ(gpt2.tokenize("Hello world", true, false), gpt2.tokenize("Hello world", false, false));
}

TEST(TokenizerSpecial, ParseSpecialOnAndOff) {
  Tokenizer gpt2 = load(data_dir() / "vocab" / "ggml-vocab-gpt-2.gguf");
  const TokenId eot = gpt2.find_token("<|endoftext|>");
  ASSERT_EQ(eot, 50256);
  EXPECT_TRUE(gpt2.is_control(eot));
  EXPECT_TRUE(gpt2.is_eog(eot));
  const std::string text = "Hello<|endoftext|> world";
  const auto on = gpt2.tokenize(text, false, true);
  const auto off = gpt2.tokenize(text, false, false);
  const auto hello = gpt2.tokenize("Hello", false, false);
  const auto world = gpt2.tokenize(" world", false, false);
  std::vector<TokenId> expect = hello;
  expect.push_back(eot);
  expect.insert(expect.end(), world.begin(), world.end());
  EXPECT_EQ(on, expect);
  EXPECT_EQ(std::count(off.begin(), off.end(), eot), 0);
  EXPECT_GT(off.size(), on.size());
  EXPECT_EQ(gpt2.detokenize(off), text);
  EXPECT_EQ(gpt2.detokenize(on), text);
  DetokenizeOptions hide;
  hide.render_special = false;
  EXPECT_EQ(gpt2.detokenize(on, hide), "Hello world");
  EXPECT_EQ(gpt2.token_to_piece(eot, false), "");

  // SentencePiece: the text after a special token gets the space prefix again (as llama.cpp)
  Tokenizer spm = load(data_dir() / "vocab" / "ggml-vocab-llama-spm.gguf");
  const auto s = spm.tokenize("a</s>b", false, true);
  const auto a = spm.tokenize("a", false, false);
  const auto b = spm.tokenize("b", false, false);
  ASSERT_EQ(s.size(), a.size() + 1 + b.size());
  EXPECT_EQ(s[a.size()], spm.eos());
  EXPECT_NE(spm.tokenize("a</s>b", false, false), s);
}

// Phi-3 (llama.cpp keys this on general.name): whitespace right of its special tokens is dropped.
TEST(TokenizerSpecial, Phi3StripsWhitespaceAfterSpecialTokens) {
  auto dir = test::fixtures_dir();
  if (!dir || !fs::exists(*dir / "vocab" / "ggml-vocab-phi-3.gguf")) {
    GTEST_SKIP() << "../shared/fixtures/vocab/ggml-vocab-phi-3.gguf not found";
  }
  Tokenizer phi = load(*dir / "vocab" / "ggml-vocab-phi-3.gguf");
  const TokenId user = phi.find_token("<|user|>"), end = phi.find_token("<|end|>");
  ASSERT_NE(user, kNoToken);
  ASSERT_NE(end, kNoToken);
  EXPECT_TRUE(phi.token_attr(user) & token_attr_rstrip);
  EXPECT_TRUE(phi.is_eog(end));
  EXPECT_EQ(phi.tokenize("<|user|>\nHello<|end|>\n", false, true),
            (std::vector<TokenId>{user, phi.find_token("\xe2\x96\x81Hello"), end}));
}

// ---- small vocabularies built in memory ----

// GPT-2's printable code point for each byte (bytes_to_unicode), as UTF-8.
std::string byte_symbol(int b) {
  auto printable = [](int x) {
    return (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
  };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int x = 0; x < b; ++x) n += !printable(x);
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

struct VocabSpec {
  std::string model = "gpt2";
  std::string pre = "gpt-2";
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<float> scores;
  std::vector<std::string> merges;
  bool with_merges = true;
};

// A byte-level vocab: the 256 byte symbols, then `extra` tokens.
VocabSpec byte_vocab(std::vector<std::string> extra, std::vector<std::string> merges) {
  VocabSpec v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(byte_symbol(b));
  for (auto& t : extra) v.tokens.push_back(std::move(t));
  v.types.assign(v.tokens.size(), 1);
  v.merges = std::move(merges);
  return v;
}

struct MemoryGguf {
  std::vector<uint8_t> bytes;
  Result<GgufFile> file = Error{"unset"};
};

std::unique_ptr<MemoryGguf> build(
    const VocabSpec& v, const std::vector<std::pair<std::string, GgufValue>>& extra = {}) {
  GgufWriter w;
  w.set("general.architecture", GgufValue::make_string("llama"));
  w.set("tokenizer.ggml.model", GgufValue::make_string(v.model));
  if (!v.pre.empty()) w.set("tokenizer.ggml.pre", GgufValue::make_string(v.pre));
  w.set("tokenizer.ggml.tokens", GgufValue::make_string_array(v.tokens));
  if (!v.types.empty()) w.set("tokenizer.ggml.token_type", GgufValue::make_i32_array(v.types));
  if (!v.scores.empty()) w.set("tokenizer.ggml.scores", GgufValue::make_f32_array(v.scores));
  if (v.with_merges) w.set("tokenizer.ggml.merges", GgufValue::make_string_array(v.merges));
  for (const auto& [k, val] : extra) w.set(k, val);
  auto m = std::make_unique<MemoryGguf>();
  m->bytes = w.write_memory(std::vector<std::vector<uint8_t>>{});
  m->file = GgufFile::parse(m->bytes, "test.gguf");
  EXPECT_TRUE(m->file.ok()) << (m->file.ok() ? "" : m->file.error().message);
  return m;
}

// The error message of loading `v`, "" if it loads.
std::string load_error(const VocabSpec& v,
                       const std::vector<std::pair<std::string, GgufValue>>& extra = {}) {
  auto m = build(v, extra);
  auto t = Tokenizer::from_gguf(*m->file);
  return t.ok() ? std::string() : t.error().message;
}

TEST(TokenizerErrors, BrokenVocabFieldsAreNamed) {
  const VocabSpec good = byte_vocab({"ab"}, {"a b"});
  EXPECT_EQ(load_error(good), "");

  VocabSpec v = good;
  v.scores.assign(v.tokens.size() - 1, 0.0f);
  std::string e = load_error(v);
  EXPECT_NE(e.find("tokenizer.ggml.scores"), std::string::npos) << e;
  EXPECT_NE(e.find("256 scores for 257 tokens"), std::string::npos) << e;

  v = good;
  v.types.push_back(1);
  e = load_error(v);
  EXPECT_NE(e.find("tokenizer.ggml.token_type"), std::string::npos) << e;
  EXPECT_NE(e.find("258 token types for 257 tokens"), std::string::npos) << e;

  v = good;
  v.model = "bert";
  e = load_error(v);
  EXPECT_NE(e.find("tokenizer.ggml.model"), std::string::npos) << e;
  EXPECT_NE(e.find("'bert'"), std::string::npos) << e;

  v = good;
  v.pre = "no-such-pre";
  e = load_error(v);
  EXPECT_NE(e.find("tokenizer.ggml.pre"), std::string::npos) << e;
  EXPECT_NE(e.find("'no-such-pre'"), std::string::npos) << e;

  v = good;
  v.with_merges = false;
  e = load_error(v);
  EXPECT_NE(e.find("tokenizer.ggml.merges"), std::string::npos) << e;

  v = good;
  v.tokens.push_back("ab");
  v.types.push_back(1);
  e = load_error(v);
  EXPECT_NE(e.find("duplicate token 'ab'"), std::string::npos) << e;

  e = load_error(good, {{"tokenizer.ggml.tokens", GgufValue::make_i32_array({1, 2, 3})}});
  EXPECT_NE(e.find("tokenizer.ggml.tokens"), std::string::npos) << e;
  EXPECT_NE(e.find("array of strings"), std::string::npos) << e;

  e = load_error(good, {{"tokenizer.ggml.add_bos_token", GgufValue::make_bool(true)},
                        {"tokenizer.ggml.bos_token_id", GgufValue::make_u32(100000)}});
  EXPECT_EQ(e, "");  // bos falls back to the BPE default (11), inside this vocab
  VocabSpec tiny = byte_vocab({}, {});
  tiny.tokens.resize(5);
  tiny.types.resize(5);
  e = load_error(tiny, {{"tokenizer.ggml.add_bos_token", GgufValue::make_bool(true)}});
  EXPECT_NE(e.find("tokenizer.ggml.add_bos_token"), std::string::npos) << e;

  e = load_error(good, {{"tokenizer.ggml.add_bos_token", GgufValue::make_u32(1)}});
  EXPECT_NE(e.find("tokenizer.ggml.add_bos_token"), std::string::npos) << e;
}

// gpt-oss (o200k_harmony): <|channel|> and friends are always cut out of text and rendered;
// <|end|> ends a message, not the generation, when <|return|> and <|call|> exist.
TEST(TokenizerSpecial, HarmonyTokens) {
  VocabSpec v =
      byte_vocab({"<|channel|>", "<|end|>", "<|return|>", "<|call|>", "<|endoftext|>"}, {});
  v.pre = "gpt-4o";
  for (size_t i = 256; i < v.types.size(); ++i) v.types[i] = 3;  // all CONTROL in the file
  auto m = build(v, {{"tokenizer.ggml.eos_token_id", GgufValue::make_u32(260)}});
  auto t = Tokenizer::from_gguf(*m->file);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->token_attr(256), uint32_t(token_attr_user_defined));
  EXPECT_EQ(t->tokenize("a<|channel|>b", false, false), (std::vector<TokenId>{'a', 256, 'b'}));
  EXPECT_EQ(t->token_to_piece(256, false), "<|channel|>");
  EXPECT_FALSE(t->is_eog(257));  // <|end|>
  EXPECT_TRUE(t->is_eog(258));
  EXPECT_TRUE(t->is_eog(259));
  EXPECT_TRUE(t->is_eog(260));
  EXPECT_EQ(t->eog_tokens(), (std::vector<TokenId>{258, 259, 260}));
  // EOT is the lowest id with one of llama.cpp's end-of-turn texts (llama.cpp: hash order); the
  // harmony rule then takes <|end|> out of the EOG set all the same
  EXPECT_EQ(t->eot(), 257);
  // CONTROL tokens are text unless parse_special
  EXPECT_EQ(t->tokenize("<|return|>", false, true), std::vector<TokenId>{258});
  EXPECT_EQ(t->tokenize("<|return|>", false, false).size(), 10u);
}

// DeepSeek's end of sentence and FIM tokens are recognised by their text.
TEST(TokenizerSpecial, DeepseekSpecialTexts) {
  VocabSpec v =
      byte_vocab({"<\uff5cbegin\u2581of\u2581sentence\uff5c>",
                  "<\uff5cend\u2581of\u2581sentence\uff5c>", "<\uff5cfim\u2581hole\uff5c>"},
                 {});
  v.pre = "deepseek-v3";
  auto m = build(v, {{"tokenizer.ggml.bos_token_id", GgufValue::make_u32(256)},
                     {"tokenizer.ggml.eos_token_id", GgufValue::make_u32(257)},
                     {"tokenizer.ggml.add_bos_token", GgufValue::make_bool(true)}});
  auto t = Tokenizer::from_gguf(*m->file);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->eot(), 257);
  EXPECT_TRUE(t->is_control(257));
  EXPECT_TRUE(t->is_control(258));  // FIM suffix
  EXPECT_EQ(t->eog_tokens(), std::vector<TokenId>{257});
  EXPECT_EQ(t->tokenize("hi", true, false), (std::vector<TokenId>{256, 'h', 'i'}));
}

TEST(TokenizerBpe, MergesByRankAndAddBos) {
  // "a b" (rank 0) makes "ab"; "ab c" (rank 1) makes "abc"; "b c" (rank 2) loses to them
  VocabSpec v = byte_vocab({"ab", "abc", "bc", "<s>"}, {"a b", "ab c", "b c"});
  v.types.back() = 3;  // <s> is CONTROL
  auto m = build(v, {{"tokenizer.ggml.bos_token_id", GgufValue::make_u32(259)},
                     {"tokenizer.ggml.add_bos_token", GgufValue::make_bool(true)}});
  auto t = Tokenizer::from_gguf(*m->file);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->n_merges(), 3u);
  const TokenId abc = t->find_token("abc"), bc = t->find_token("bc"), a = t->find_token("a");
  EXPECT_EQ(t->tokenize("abc", false, false), std::vector<TokenId>{abc});
  EXPECT_EQ(t->tokenize("abc", true, false), (std::vector<TokenId>{259, abc}));
  EXPECT_EQ(t->tokenize("xbc", false, false), (std::vector<TokenId>{t->find_token("x"), bc}));
  EXPECT_EQ(t->tokenize("aabc", false, false), (std::vector<TokenId>{a, abc}));
  EXPECT_EQ(t->tokenize("<s>abc", false, true), (std::vector<TokenId>{259, abc}));
  EXPECT_EQ(t->detokenize(t->tokenize("<s>abc", true, true)), "<s><s>abc");
}

TEST(TokenizerBpe, TildeIsNeitherPunctuationNorSymbolInDeepseekV3) {
  // llama.cpp's collapsed \p{S} lacks '~': "!~" is two pieces for deepseek-v3 (no merge across),
  // one piece for gpt-4o (whose regex has no \p{S}).
  VocabSpec v = byte_vocab({"!~"}, {"! ~"});
  v.pre = "deepseek-v3";
  auto m = build(v);
  auto ds = Tokenizer::from_gguf(*m->file);
  ASSERT_TRUE(ds.ok()) << ds.error().message;
  EXPECT_EQ(ds->tokenize("!~", false, false), (std::vector<TokenId>{'!', '~'}));  // byte b is id b
  EXPECT_EQ(ds->tokenize("a~b", false, false).size(), 3u);
  v.pre = "gpt-4o";
  auto m2 = build(v);
  auto g = Tokenizer::from_gguf(*m2->file);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g->tokenize("!~", false, false), std::vector<TokenId>{256});
}

TEST(TokenizerBpe, EveryPreTokenizerLoadsAndRoundTrips) {
  const std::string text =
      "Hello, y'all! How ARE you 😁 ?我想在apple工作1314151天～ \t\n\n  x  1,024.5 !~ café "
      "DON'T stop\r\n"
      "\xff\xfe broken \xe2\x82 utf8 \xed\xa0\x80 surrogate";
  for (const char* pre :
       {"default", "gpt-2", "llama-bpe", "llama3", "dbrx", "qwen2", "qwen35", "deepseek-llm",
        "deepseek-coder", "deepseek-v3", "gpt-4o", "starcoder", "falcon", "command-r", "megrez"}) {
    VocabSpec v = byte_vocab({}, {});
    v.pre = pre;
    auto m = build(v);
    auto t = Tokenizer::from_gguf(*m->file);
    ASSERT_TRUE(t.ok()) << pre << ": " << t.error().message;
    const auto ids = t->tokenize(text, false, false);
    // invalid bytes come back as U+FFFD, like llama.cpp
    std::string expect = text;
    for (auto [bad, good] :
         {std::pair<std::string, std::string>{"\xff\xfe", "\xef\xbf\xbd\xef\xbf\xbd"},
          {"\xe2\x82 ", "\xef\xbf\xbd\xef\xbf\xbd "}}) {
      expect.replace(expect.find(bad), bad.size(), good);
    }
    EXPECT_EQ(t->detokenize(ids), expect) << pre;
  }
}

TEST(TokenizerBpe, LongInputsAndSpeed) {
  Tokenizer gpt2 = load(data_dir() / "vocab" / "ggml-vocab-gpt-2.gguf");
  // a long run of spaces (backtracking in \s+(?!\S)) and a long word
  const std::string spaces(200000, ' ');
  const auto ids = gpt2.tokenize(spaces + "x", false, false);
  EXPECT_EQ(gpt2.detokenize(ids), spaces + "x");
  const std::string word(100000, 'a');
  EXPECT_EQ(gpt2.detokenize(gpt2.tokenize(word, false, false)), word);

  std::string text;
  for (const VocabCase& c : read_cases(data_dir() / "vocab" / "ggml-vocab-gpt-2.gguf")) {
    text += c.text + "\n";
  }
  while (text.size() < (1u << 20)) text += text;
  const auto t0 = std::chrono::steady_clock::now();
  const auto n = gpt2.tokenize(text, false, false).size();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ speed    ] gpt-2: %.1f MB in %.3f s, %.2f M tokens/s\n", text.size() / 1e6, s,
              n / s / 1e6);
  EXPECT_LT(s, 20.0);
}

// Untrusted bytes: no crash; SPM gives the bytes back exactly, BPE with bad UTF-8 as U+FFFD.
TEST(TokenizerBpe, RandomBytesAndThreads) {
  Tokenizer gpt2 = load(data_dir() / "vocab" / "ggml-vocab-gpt-2.gguf");
  Tokenizer spm = load(data_dir() / "vocab" / "ggml-vocab-llama-spm.gguf");
  std::mt19937 rng(1234);
  const std::vector<std::string> pieces = {" ",
                                           "\t",
                                           "\n",
                                           "\r",
                                           "~",
                                           "!",
                                           "a",
                                           "Z",
                                           "0",
                                           "9",
                                           "'s",
                                           "\xc3\xa9",
                                           "\xe2\x82\xac",
                                           "\xf0\x9f\x98\x81",
                                           "\xe6\x88\x91",
                                           "<s>",
                                           "</s>"};
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes, valid;
    const int len = int(rng() % 40);
    for (int i = 0; i < len; ++i) {
      bytes += char(rng() % 256);
      valid += pieces[rng() % pieces.size()];
    }
    for (const std::string& s : {bytes, valid}) {
      for (TokenId id : gpt2.tokenize(s, true, true)) {
        ASSERT_TRUE(id >= 0 && size_t(id) < gpt2.n_tokens());
      }
      for (TokenId id : spm.tokenize(s, true, true)) {
        ASSERT_TRUE(id >= 0 && size_t(id) < spm.n_tokens());
      }
    }
    // valid UTF-8 comes back byte for byte (invalid UTF-8 need not: SPM cuts it by lead bytes)
    EXPECT_EQ(spm.detokenize(spm.tokenize(valid, false, false)), valid);
    EXPECT_EQ(gpt2.detokenize(gpt2.tokenize(valid, false, false)), valid);
  }
  // the same results from several threads at once
  const std::string text = read_text(data_dir() / "vocab" / "ggml-vocab-gpt-2.gguf.inp");
  const auto expect = gpt2.tokenize(text, false, false);
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      bool same = true;
      for (int i = 0; i < 20; ++i) same &= gpt2.tokenize(text, false, false) == expect;
      ok[size_t(t)] = same;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_TRUE(ok[size_t(t)]) << "thread " << t;
}

TEST(TokenizerSpm, ByteFallbackAndPieces) {
  Tokenizer spm = load(data_dir() / "vocab" / "ggml-vocab-llama-spm.gguf");
  // a character outside the vocab falls back to its UTF-8 bytes as <0xXX> tokens
  const auto ids = spm.tokenize("\xf0\x9f\xa6\x99", false, false);  // U+1F999
  ASSERT_GE(ids.size(), 4u);
  std::string tail;
  for (size_t i = ids.size() - 4; i < ids.size(); ++i) {
    EXPECT_TRUE(spm.token_attr(ids[i]) & token_attr_byte) << spm.token_text(ids[i]);
    tail += spm.token_to_piece(ids[i]);
  }
  EXPECT_EQ(tail, "\xf0\x9f\xa6\x99");
  EXPECT_EQ(spm.token_to_piece(spm.find_token("\xe2\x96\x81Hello")), " Hello");
  EXPECT_EQ(spm.detokenize(spm.tokenize(" Hello", false, false)), " Hello");
}

}  // namespace
}  // namespace strata
