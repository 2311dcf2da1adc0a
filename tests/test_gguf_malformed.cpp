// Malformed and hostile GGUF files: each gets its specific error, never a crash or an
// out-of-bounds read (run under STRATA_SANITIZE=address to prove the latter).
#include <gtest/gtest.h>

#include <functional>

#include "gguf_builder.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "test_support.h"

namespace strata {
namespace {

using test::RawGguf;

constexpr uint32_t kF32 = 0, kQ4K = 12, kQ8_0 = 8;

// A valid file: two keys, two F32 tensors of 8 and 4 elements.
RawGguf valid_file() {
  RawGguf g;
  g.header(3, 2, 2).kv_str("general.architecture", "test").kv_u32("test.block_count", 1);
  g.tensor("a", {8}, kF32, 0).tensor("b", {4}, kF32, 32);
  g.data(32).data(16);
  return g;
}

struct Case {
  const char* name;
  std::function<RawGguf()> build;
  const char* expect;  // substring of the error
};

const std::vector<Case>& cases() {
  static const std::vector<Case> kCases = {
      {"empty", [] { return RawGguf{}; }, "too short for the magic"},
      {"bad_magic", [] { RawGguf g; g.raw("GGUL", 4).put<uint32_t>(3); return g; }, "expected \"GGUF\""},
      {"version_1", [] { RawGguf g; g.header(1, 0, 0); return g; }, "unsupported GGUF version 1"},
      {"version_99", [] { RawGguf g; g.header(99, 0, 0); return g; }, "unsupported GGUF version 99"},
      {"truncated_header", [] { RawGguf g; g.raw("GGUF", 4).put<uint32_t>(3).put<uint32_t>(0); return g; },
       "truncated while reading header tensor count"},
      {"kv_count_too_large", [] { RawGguf g; g.header(3, 0, 1ull << 40); return g; },
       "claims 1099511627776 metadata entries"},
      {"tensor_count_too_large", [] { RawGguf g; g.header(3, 1ull << 60, 0); return g; },
       "claims 1152921504606846976 tensors"},
      {"absurd_key_length",
       [] { RawGguf g; g.header(3, 0, 1).put<uint64_t>(1ull << 62).raw("abcdefghijkl", 12); return g; },
       "string length 4611686018427387904"},
      {"absurd_string_value",
       [] {
         RawGguf g;
         g.header(3, 0, 1).str("general.name").put<uint32_t>(8).put<uint64_t>(~0ull);
         return g;
       },
       "metadata key 'general.name': string length"},
      {"unknown_value_type",
       [] { RawGguf g; g.header(3, 0, 1).str("k").put<uint32_t>(13).put<uint32_t>(0); return g; },
       "metadata key 'k': unknown value type 13"},
      {"absurd_array_length",
       [] {
         RawGguf g;
         g.header(3, 0, 1).str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8);
         g.put<uint64_t>(1ull << 50);
         return g;
       },
       "array of 1125899906842624 string elements"},
      {"unknown_array_element_type",
       [] { RawGguf g; g.header(3, 0, 1).str("k").put<uint32_t>(9).put<uint32_t>(77).put<uint64_t>(1); return g; },
       "unknown array element type 77"},
      {"arrays_nested_too_deep",
       [] {
         RawGguf g;
         g.header(3, 0, 1).str("k").put<uint32_t>(9);
         for (int d = 0; d < 20; ++d) g.put<uint32_t>(9).put<uint64_t>(1);
         g.put<uint32_t>(4).put<uint64_t>(0);
         return g;
       },
       "nested deeper than 8 levels"},
      {"bool_not_0_or_1",
       [] { RawGguf g; g.header(3, 0, 1).str("b").put<uint32_t>(7).put<uint8_t>(2); return g; },
       "boolean byte is 2"},
      {"duplicate_key",
       [] { RawGguf g; g.header(3, 0, 2).kv_u32("a.b", 1).kv_u32("a.b", 2); return g; },
       "duplicate metadata key 'a.b'"},
      {"alignment_wrong_type",
       [] { RawGguf g; g.header(3, 0, 1).kv_str("general.alignment", "32"); return g; },
       "'general.alignment' has type string, expected u32"},
      {"alignment_not_power_of_two",
       [] { RawGguf g; g.header(3, 0, 1).kv_u32("general.alignment", 48); return g; },
       "'general.alignment' is 48, not a power of two"},
      {"truncated_in_tensor_info",
       [] { RawGguf g; g.header(3, 1, 0).str("t").put<uint32_t>(2).put<uint64_t>(8); g.bytes.resize(g.bytes.size() + 6); return g; },
       "tensor 't'"},
      {"too_many_dims",
       [] { RawGguf g; g.header(3, 1, 0).tensor("t", {1, 1, 1, 1, 1}, kF32, 0).data(4); return g; },
       "tensor 't' has 5 dimensions"},
      {"zero_dims",
       [] { RawGguf g; g.header(3, 1, 0).tensor("t", {}, kF32, 0).data(4); return g; },
       "tensor 't' has 0 dimensions"},
      {"retired_type_id",
       [] { RawGguf g; g.header(3, 1, 0).tensor("t", {32}, 4, 0).data(32); return g; },
       "tensor 't' has unknown ggml type id 4"},
      {"unknown_type_id",
       [] { RawGguf g; g.header(3, 1, 0).tensor("t", {32}, 4000, 0).data(32); return g; },
       "unknown ggml type id 4000"},
      {"shape_overflow",
       [] { RawGguf g; g.header(3, 1, 0).tensor("t", {1ull << 32, 1ull << 32, 4}, kF32, 0).data(4); return g; },
       "overflows the element count"},
      {"byte_size_overflow",
       [] { RawGguf g; g.header(3, 1, 0).tensor("t", {1ull << 62}, kF32, 0).data(4); return g; },
       "overflows the byte size"},
      {"row_not_whole_blocks",
       [] { RawGguf g; g.header(3, 1, 0).tensor("w", {100, 2}, kQ4K, 0).data(1000); return g; },
       "row length 100 is not a multiple of the q4_K block size 256"},
      {"misaligned_offset",
       [] { RawGguf g; g.header(3, 1, 0).tensor("t", {4}, kF32, 4).data(64); return g; },
       "data offset 4 is not a multiple of the alignment 32"},
      {"offset_past_end",
       [] { RawGguf g; g.header(3, 1, 0).tensor("blk.3.ffn_up_exps.weight", {32, 4}, kQ8_0, 1ull << 40).data(136); return g; },
       "tensor 'blk.3.ffn_up_exps.weight': data [1099511627776, +136) ends past the end of the file"},
      {"data_truncated",
       [] { RawGguf g; g.header(3, 1, 0).tensor("t", {64}, kF32, 0).data(200); return g; },
       "ends past the end of the file"},
      {"offset_plus_size_wraps",
       [] { RawGguf g; g.header(3, 1, 0).tensor("t", {64}, kF32, ~0ull - 31).data(256); return g; },
       "ends past the end of the file"},
      {"duplicate_tensor",
       [] { RawGguf g; g.header(3, 2, 0).tensor("t", {8}, kF32, 0).tensor("t", {8}, kF32, 32).data(64); return g; },
       "duplicate tensor 't'"},
      {"overlapping_tensors",
       [] { RawGguf g; g.header(3, 2, 0).tensor("a", {16}, kF32, 0).tensor("b", {16}, kF32, 32).data(96); return g; },
       "tensors 'a' [0, 64) and 'b' [32, 96) overlap"},
  };
  return kCases;
}

TEST(GgufMalformed, ValidBaselineParses) {
  RawGguf g = valid_file();
  auto f = GgufFile::parse(g.bytes, "valid");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensor_data(f->tensors()[1]).size(), 16u);
}

TEST(GgufMalformed, Version2ParsesLikeVersion3) {
  RawGguf g = valid_file();
  g.bytes[4] = 2;  // version field, little-endian u32
  auto f = GgufFile::parse(g.bytes, "v2");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->tensors().size(), 2u);
}

TEST(GgufMalformed, EachCaseHasItsSpecificError) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    RawGguf g = c.build();
    // copy into an exact-size heap buffer so ASan catches any read past the end
    std::vector<uint8_t> exact(g.bytes.begin(), g.bytes.end());
    auto f = GgufFile::parse(exact, c.name);
    ASSERT_FALSE(f.ok()) << "parsed a malformed file";
    EXPECT_NE(f.error().message.find(c.expect), std::string::npos)
        << "got: " << f.error().message << "\nwant: " << c.expect;
    EXPECT_EQ(f.error().message.find('\n'), std::string::npos) << "errors are one line";
    EXPECT_EQ(f.error().message.rfind(c.name, 0), 0u) << "errors start with the file name";
  }
}

// Every prefix of a valid file shorter than it is an error (truncated inside every section:
// header, keys, values, tensor infos, padding, data) and never a crash.
TEST(GgufMalformed, EveryTruncationIsAnError) {
  RawGguf g = valid_file();
  for (size_t n = 0; n < g.bytes.size(); ++n) {
    std::vector<uint8_t> prefix(g.bytes.begin(), g.bytes.begin() + n);
    auto f = GgufFile::parse(prefix, "cut");
    ASSERT_FALSE(f.ok()) << "a prefix of " << n << " bytes parsed";
    const std::string& m = f.error().message;
    EXPECT_TRUE(m.find("truncated") != std::string::npos || m.find("past the end") != std::string::npos ||
                m.find("too short") != std::string::npos || m.find("claims") != std::string::npos ||
                m.find("exceeds") != std::string::npos)
        << n << ": " << m;
  }
}

TEST(GgufMalformed, TruncatedRealModel) {
  auto bytes = test::read_file(test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf");
  auto whole = GgufFile::parse(bytes, "whole");
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  // cut inside the metadata, inside the tensor infos, and inside the last tensor's data
  for (size_t n : {size_t(100), size_t(30000), size_t(whole->data_offset() - 5), bytes.size() - 1}) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + std::min(n, bytes.size()));
    auto f = GgufFile::parse(prefix, "cut");
    EXPECT_FALSE(f.ok()) << n;
  }
}

// Flipping any single header or metadata byte of a real file never crashes the reader.
TEST(GgufMalformed, ByteFlipsNeverCrash) {
  auto bytes = test::read_file(test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf");
  auto whole = GgufFile::parse(bytes, "whole");
  ASSERT_TRUE(whole.ok());
  const size_t n_meta = size_t(whole->data_offset());
  uint64_t state = 12345;
  int failures = 0;
  for (int k = 0; k < 3000; ++k) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    size_t at = size_t((state >> 33) % n_meta);
    std::vector<uint8_t> copy(bytes.begin(), bytes.begin() + n_meta + 4096);
    copy[at] ^= uint8_t(1u << ((state >> 20) & 7));
    auto f = GgufFile::parse(copy, "flip");
    failures += f.ok() ? 0 : 1;
  }
  EXPECT_GT(failures, 0);  // many flips land in lengths and counts and must be caught
}

// The CLI reports each malformed file with a non-zero exit and one line on stderr.
TEST(GgufMalformed, InfoCommandReportsOneLineErrors) {
  auto dir = test::scratch_dir("malformed");
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    auto path = dir / (std::string(c.name) + ".gguf");
    test::write_file(path, c.build().bytes);
    std::string out;
    int rc = test::run_cli("info \"" + path.string() + "\"", &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find(c.expect), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  }
  std::string out;
  EXPECT_EQ(test::run_cli("info \"" + (dir / "does-not-exist.gguf").string() + "\"", &out), 1);
  EXPECT_NE(out.find("cannot open"), std::string::npos) << out;
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Hyperparameters a hostile header can set on the DeepSeek families: each an error naming the
// key, never undefined behaviour. (The first was fuzz_gguf_reader's finding: an
// expert_shared_count of 721420289 overflowed the shared FFN width.)
TEST(GgufMalformed, HostileDeepSeekHyperparameters) {
  struct Case {
    const char* shape;
    const char* key;
    GgufValue value;
    const char* message;
  };
  std::vector<int32_t> bad_ratios = {0, 5, 128};
  std::vector<int32_t> early = {2, 2, 2, 1}, window = {0, 0, 2, 1}, negative = {0, -2, 2, 1};
  auto u64s = [](const std::vector<uint64_t>& v) {
    std::vector<GgufValue> e;
    for (uint64_t x : v) e.push_back(GgufValue::make_u64(x));
    return GgufValue::make_array(GgufType::u64, std::move(e));
  };
  const Case cases[] = {
      {"tiny-deepseek2", "deepseek2.expert_shared_count", GgufValue::make_u32(721420289), "expert_shared_count"},
      {"tiny-deepseek4", "deepseek4.expert_shared_count", GgufValue::make_u32(721420289), "expert_shared_count"},
      {"tiny-deepseek4", "deepseek4.nextn_predict_layers", GgufValue::make_u32(3), "nextn_predict_layers"},
      {"tiny-deepseek4", "deepseek4.attention.compress_ratios", GgufValue::make_i32_array(bad_ratios), "compress ratio 5"},
      {"tiny-deepseek4", "deepseek4.attention.output_lora_rank", GgufValue::make_u32(24), "output groups"},
      {"tiny-deepseek4", "deepseek4.expert_gating_func", GgufValue::make_u32(2), "expert_gating_func"},
      // deepseek41: layer roles, the Engram hash layout
      {"tiny-deepseek41", "deepseek41.attention.compress_ratios", GgufValue::make_i32_array(early), "before any layer"},
      {"tiny-deepseek41", "deepseek41.attention.compress_ratios", GgufValue::make_i32_array(window), "window-only"},
      {"tiny-deepseek41", "deepseek41.attention.compress_ratios", GgufValue::make_i32_array(negative), "compress_ratios"},
      {"tiny-deepseek41", "deepseek41.hash_layer_count", GgufValue::make_u32(1), "hash_layer_count"},
      {"tiny-deepseek41", "deepseek41.engram.primes", u64s(std::vector<uint64_t>(12, 1000000)), "do not fit"},
      {"tiny-deepseek41", "deepseek41.engram.primes", u64s(std::vector<uint64_t>(12, 0)), "do not fit"},
      {"tiny-deepseek41", "deepseek41.engram.offsets", u64s(std::vector<uint64_t>(11, 0)), "offsets must be an array of 12"},
      {"tiny-deepseek41", "deepseek41.engram.multipliers", u64s({1, 2, 3}), "multipliers must be"},
      {"tiny-deepseek41", "deepseek41.engram.token_map", u64s(std::vector<uint64_t>(1000, 1)), "token_map must hold"},
      {"tiny-deepseek41", "deepseek41.engram.token_map", GgufValue::make_f32_array(std::vector<float>(1024, 0.5f)), "token_map"},
      {"tiny-deepseek41", "deepseek41.engram.layer_ids", u64s({2, 0}), "layer_ids must be ascending"},
      {"tiny-deepseek41", "deepseek41.engram.layer_ids", u64s({0, 9}), "layer_ids must be ascending"},
      {"tiny-deepseek41", "deepseek41.engram.max_ngram_size", GgufValue::make_u32(1), "max_ngram_size"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.shape) + " " + c.key);
    auto plan = build_synth_plan(*find_synth_shape(c.shape), SynthQuant::q8_0, {});
    ASSERT_TRUE(plan.ok());
    plan->writer.set(c.key, c.value);
    const std::vector<uint8_t> bytes = plan->write_memory();
    auto file = GgufFile::parse(bytes, c.shape);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto m = Model::load(std::move(*file));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.error().message.find(c.message), std::string::npos) << m.error().message;
  }
}

}  // namespace
}  // namespace strata
