// engine/json_constraint.h: the JSON-object prefix check a forced tool call's arguments are held
// to, against nlohmann's parser as the reference: every prefix of valid objects is accepted, and
// the closing completes each into valid JSON; invalid texts are refused at the first bad byte.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/json_constraint.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "test_support.h"

namespace strata {
namespace {

const char* const kValid[] = {
    "{}",
    R"({"location": "Paris, France", "unit": "celsius"})",
    R"( {"a":[1,-2.5e+3,0.25,true,false,null,{"b":[]}],"c":"\u00e9\n\"q\"","d":{}} )",
    R"({"n": -0, "m": 0.0e0, "k": 12E-2, "s": "ünïcode ✓"})",
    R"({"nested": [[[]], [{}], [{"x": [1, [2, [3]]]}]]})",
};

TEST(JsonConstraint, EveryPrefixOfAnObjectIsAcceptedAndCloses) {
  for (const char* text : kValid) {
    const std::string t = text;
    // the text up to the object's last byte (trailing whitespace is not part of what it accepts)
    const std::string obj = t.substr(0, t.find_last_of('}') + 1);
    for (size_t n = 0; n <= obj.size(); ++n) {
      JsonPrefix j;
      ASSERT_TRUE(j.push(obj.substr(0, n))) << obj << " refused at " << n;
      const std::string closed = obj.substr(0, n) + j.closing();
      const auto parsed = nlohmann::json::parse(closed, nullptr, false);
      ASSERT_FALSE(parsed.is_discarded()) << "closing of '" << obj.substr(0, n) << "' gave '" << closed << "'";
      EXPECT_TRUE(parsed.is_object()) << closed;
      EXPECT_EQ(j.complete(), n == obj.size()) << obj.substr(0, n);
      JsonPrefix k = j;
      ASSERT_TRUE(k.push(j.closing()));
      EXPECT_TRUE(k.complete());
    }
    // byte by byte gives the same as all at once
    JsonPrefix bytes;
    for (char c : obj) ASSERT_TRUE(bytes.push(std::string_view(&c, 1)));
    EXPECT_TRUE(bytes.complete());
    EXPECT_FALSE(bytes.push(" ")) << "nothing after the object";
  }
}

TEST(JsonConstraint, InvalidTextIsRefusedAndLeavesTheStateAlone) {
  const char* const kInvalid[] = {"[1]", "\"s\"", "{,}", R"({"a" 1})", R"({"a":})", R"({"a":01})", R"({"a":1,})",
                                  R"({"a":tru})", R"({"a":"\x"})", R"({"a":1.})", "{\"a\":\"\x01\"}", R"({"a":[1 2]})",
                                  R"({"a":1]})", "}"};
  for (const char* text : kInvalid) {
    const std::string t = text;
    JsonPrefix j;
    size_t bad = t.size();
    for (size_t n = 0; n < t.size(); ++n) {
      if (!j.push(std::string_view(&t[n], 1))) {
        bad = n;
        break;
      }
    }
    // the reference agrees the text is not an object, and whatever prefix was accepted still closes
    EXPECT_TRUE(nlohmann::json::parse(t, nullptr, false).is_discarded() || !nlohmann::json::parse(t).is_object()) << t;
    if (bad == t.size()) {
      EXPECT_FALSE(j.complete()) << t;  // accepted as a prefix only ("{\"a\":1." needs digits)
    }
    const std::string closed = t.substr(0, bad) + j.closing();
    EXPECT_FALSE(nlohmann::json::parse(closed, nullptr, false).is_discarded()) << t << " -> " << closed;
  }
}

// Random walks: bytes drawn from JSON's alphabet, each kept only when accepted; every state
// reached closes into valid JSON, which the reference parses.
TEST(JsonConstraint, RandomWalksAlwaysClose) {
  // no exponents: the reference refuses numbers beyond a double's range (2e9287), JSON does not
  const std::string alphabet = "{}[]\":,0123456789.-+ trufalsn\\\"abcé";
  std::mt19937 rng(7);
  for (int walk = 0; walk < 300; ++walk) {
    JsonPrefix j;
    std::string text;
    for (int step = 0; step < 80 && !j.complete(); ++step) {
      const std::string c(1, alphabet[rng() % alphabet.size()]);
      if (j.push(c)) text += c;
    }
    const std::string closed = text + j.closing();
    const auto parsed = nlohmann::json::parse(closed, nullptr, false);
    ASSERT_FALSE(parsed.is_discarded()) << text << " -> " << closed;
    EXPECT_TRUE(parsed.is_object());
  }
}

// The logits mask on a real vocabulary: only tokens that keep the prefix valid survive, the
// best of them first; end of generation is refused.
TEST(JsonConstraint, MaskKeepsOnlyValidTokens) {
  auto file = GgufFile::open((test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf").string());
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto tok = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> logits(tok->n_tokens());
  for (float& l : logits) l = nd(rng);
  for (TokenId t : tok->eog_tokens()) logits[size_t(t)] = 100.0f;  // the model wants to stop
  JsonPrefix j;
  ASSERT_TRUE(j.push(R"({"location": "Pa)"));
  std::vector<float> masked = logits;
  ASSERT_TRUE(constrain_to_json(masked, j, *tok, false, 40));
  int kept = 0;
  for (size_t t = 0; t < masked.size(); ++t) {
    if (!std::isfinite(masked[t])) continue;
    ++kept;
    EXPECT_FALSE(tok->is_eog(TokenId(t)));
    JsonPrefix k = j;
    EXPECT_TRUE(k.push(tok->token_to_piece(TokenId(t), false))) << tok->token_to_piece(TokenId(t), false);
    EXPECT_EQ(masked[t], logits[t]);
  }
  EXPECT_EQ(kept, 40);
  // after the object closes nothing is valid: the caller ends the call
  JsonPrefix done;
  ASSERT_TRUE(done.push("{}"));
  std::vector<float> none = logits;
  EXPECT_FALSE(constrain_to_json(none, done, *tok, false));
}

}  // namespace
}  // namespace strata
