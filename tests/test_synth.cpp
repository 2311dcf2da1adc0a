// strata synth: synthetic models with the layout of real releases (model/synth.h).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <regex>
#include <set>

#include "cpu/quant_traits.h"
#include "engine/session.h"
#include "model/model.h"
#include "model/gguf.h"
#include "model/synth.h"
#include "test_support.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

SynthOptions seeded(uint64_t seed) {
  SynthOptions o;
  o.seed = seed;
  return o;
}
SynthOptions with_vocab(std::string path) {
  SynthOptions o;
  o.vocab_path = std::move(path);
  return o;
}

SynthPlan plan_of(const SynthShape& shape, SynthQuant quant, SynthOptions options = {}) {
  auto plan = build_synth_plan(shape, quant, options);
  STRATA_CHECK(plan.ok(), "building a plan with a generated vocabulary cannot fail");
  return std::move(*plan);
}

SynthPlan plan_of(std::string_view shape, SynthQuant quant, SynthOptions options = {}) {
  const SynthShape* s = find_synth_shape(shape);
  STRATA_CHECK(s != nullptr);
  return plan_of(*s, quant, std::move(options));
}

const GgufTensorInfo& tensor(const SynthPlan& plan, std::string_view name) {
  for (const auto& t : plan.writer.tensors()) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << "no tensor " << name;
  static GgufTensorInfo none;
  return none;
}

size_t tensor_index(const SynthPlan& plan, std::string_view name) {
  const auto& ts = plan.writer.tensors();
  for (size_t i = 0; i < ts.size(); ++i) {
    if (ts[i].name == name) return i;
  }
  STRATA_CHECK(false, "no such tensor");
  return 0;
}

// The values of a tensor of a plan, dequantized by the engine's reference decoder.
std::vector<float> values(const SynthPlan& plan, size_t index) {
  const GgufTensorInfo& t = plan.writer.tensors()[index];
  std::vector<uint8_t> bytes(t.n_bytes);
  plan.fill(index, 0, bytes);
  std::vector<float> out(t.n_elements());
  const QuantTraits& q = quant_traits(t.type);
  STRATA_CHECK(q.dequantize_row != nullptr);
  const uint64_t rows = t.n_elements() / t.ne[0];
  for (uint64_t r = 0; r < rows; ++r) {
    q.dequantize_row(bytes.data() + r * t.row_bytes(), out.data() + r * t.ne[0], int64_t(t.ne[0]));
  }
  return out;
}

struct Moments {
  double mean = 0, std = 0;
};
Moments moments(const std::vector<float>& v) {
  double s = 0, s2 = 0;
  for (float x : v) s += x, s2 += double(x) * x;
  const double mean = s / double(v.size());
  return {mean, std::sqrt(std::max(0.0, s2 / double(v.size()) - mean * mean))};
}

// A llama.cpp-written model of the fixture set: ../shared/fixtures, else the copies vendored in
// tests/data (qwen3moe Q4_K_M).
std::optional<fs::path> fixture_model(std::string_view arch, SynthQuant quant) {
  const fs::path file = fs::path("models") / std::string(arch) /
                        ("model-" + std::string(synth_quant_name(quant)) + ".gguf");
  if (auto dir = test::fixtures_dir(); dir && fs::exists(*dir / file)) return *dir / file;
  if (fs::exists(test::data_dir() / file)) return test::data_dir() / file;
  return std::nullopt;
}

bool same_value(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type || a.u != b.u || a.i != b.i || a.f != b.f || a.str != b.str) return false;
  if (a.type != GgufType::array) return true;
  if (a.elem_type != b.elem_type || a.elems.size() != b.elems.size()) return false;
  for (size_t k = 0; k < a.elems.size(); ++k) {
    if (!same_value(a.elems[k], b.elems[k])) return false;
  }
  return true;
}

// "blk.12.attn_q.weight" -> "blk.#.attn_q.weight"
std::set<std::string> name_patterns(const std::vector<GgufTensorInfo>& tensors) {
  static const std::regex layer(R"(^blk\.\d+\.)");
  std::set<std::string> out;
  for (const auto& t : tensors) out.insert(std::regex_replace(t.name, layer, "blk.#."));
  return out;
}

std::set<std::string> key_names(const GgufFile& f) {
  std::set<std::string> out;
  for (const auto& kv : f.kvs()) out.insert(kv.key);
  return out;
}

constexpr SynthQuant kQuants[] = {SynthQuant::q8_0, SynthQuant::q4_k_m, SynthQuant::mxfp4_moe};

// ---- the tiny shape end to end ----

TEST(SynthTiny, WritesAFileTheReaderAccepts) {
  const fs::path dir = test::scratch_dir("synth_tiny");
  const SynthPlan plan = plan_of("tiny", SynthQuant::q8_0);
  ASSERT_TRUE(plan.write_file((dir / "tiny.gguf").string()).ok());

  auto f = GgufFile::open((dir / "tiny.gguf").string());
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->file_size(), plan.writer.file_size());
  EXPECT_LT(f->file_size(), 8'000'000u);
  EXPECT_EQ(**f->get_string("general.architecture"), "qwen3moe");
  EXPECT_EQ(**f->get_uint("qwen3moe.block_count"), 3u);
  EXPECT_EQ(**f->get_uint("qwen3moe.expert_count"), 8u);
  EXPECT_EQ(f->find("tokenizer.ggml.tokens")->elems.size(), 1024u);
  ASSERT_EQ(f->tensors().size(), 3u + 3u * 12u);  // 12 tensors per qwen3moe layer
  const GgufTensorInfo* up = f->find_tensor("blk.1.ffn_up_exps.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->shape_string(), "[256, 256, 8]");
  EXPECT_EQ(up->type, GgmlType::q8_0);
  EXPECT_EQ(f->find_tensor("blk.2.ffn_gate_inp.weight")->type, GgmlType::f32);
  EXPECT_EQ(f->find_tensor("token_embd.weight")->shape_string(), "[256, 1024]");
  // the bytes on disk are the plan's
  std::vector<uint8_t> expect(up->n_bytes);
  plan.fill(tensor_index(plan, "blk.1.ffn_up_exps.weight"), 0, expect);
  auto got = f->tensor_data(*up);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), expect.begin()));
}

// The tiny-* shapes reproduce the llama.cpp-written fixtures: every metadata key and value (but
// general.name / description), every tensor's name, shape, type and offset, in file order.
TEST(SynthFixtures, TinyShapesEqualTheLlamaCppFiles) {
  const std::pair<std::string_view, std::string_view> cases[] = {{"tiny", "qwen3moe"},
                                                                 {"tiny-deepseek2", "deepseek2"},
                                                                 {"tiny-gpt-oss", "gpt-oss"},
                                                                 {"tiny-mixtral", "llama"},
                                                                 {"tiny-deepseek4", "deepseek4"}};
  int compared = 0;
  for (auto [shape, arch] : cases) {
    for (SynthQuant q : kQuants) {
      auto path = fixture_model(arch, q);
      if (!path) continue;
      SCOPED_TRACE(std::string(shape) + " " + std::string(synth_quant_name(q)));
      auto want = GgufFile::open(path->string());
      ASSERT_TRUE(want.ok()) << want.error().message;
      const std::vector<uint8_t> bytes = plan_of(shape, q).write_memory();
      auto got = GgufFile::parse(bytes, "synth");
      ASSERT_TRUE(got.ok()) << got.error().message;

      ASSERT_EQ(got->kvs().size(), want->kvs().size());
      for (size_t k = 0; k < got->kvs().size(); ++k) {
        const GgufKv& g = got->kvs()[k];
        const GgufKv& w = want->kvs()[k];
        EXPECT_EQ(g.key, w.key);
        if (g.key == "general.name" || g.key == "general.description") continue;
        EXPECT_TRUE(same_value(g.value, w.value)) << g.key << ": " << g.value.to_display_string()
                                                  << " vs " << w.value.to_display_string();
      }
      ASSERT_EQ(got->tensors().size(), want->tensors().size());
      for (size_t k = 0; k < got->tensors().size(); ++k) {
        const GgufTensorInfo& g = got->tensors()[k];
        const GgufTensorInfo& w = want->tensors()[k];
        EXPECT_EQ(g.name, w.name);
        EXPECT_EQ(g.shape_string(), w.shape_string()) << g.name;
        EXPECT_EQ(g.type, w.type) << g.name << ": " << ggml_type_name(g.type) << " vs "
                                  << ggml_type_name(w.type);
        EXPECT_EQ(g.offset, w.offset) << g.name;
      }
      ++compared;
    }
  }
  if (test::fixtures_dir()) {
    EXPECT_EQ(compared, 11);  // Q8_0 and Q4_K_M of each, and gpt-oss's MXFP4_MOE
  } else {
    EXPECT_EQ(compared, 1);  // the vendored qwen3moe Q4_K_M
  }
}

// tiny-deepseek41 against ik_llama.cpp's dialect as the deepseek41 fixture writes it (a Python
// writer: its key order is not llama.cpp's): every key with its type and value, but the Engram
// hash layout (its own primes, multipliers and token map: random, of the same shape) and the
// names; every tensor's name, type and shape, but the tables' row counts (their
// primes). It loads and runs.
TEST(SynthFixtures, TinyDeepSeek41HasTheFixturesLayout) {
  auto dir = test::fixtures_dir();
  if (!dir) GTEST_SKIP() << "../shared/fixtures not found";
  auto want = GgufFile::open((*dir / "models" / "deepseek41" / "model-Q8_0.gguf").string());
  ASSERT_TRUE(want.ok()) << want.error().message;
  const std::vector<uint8_t> bytes = plan_of("tiny-deepseek41", SynthQuant::q8_0).write_memory();
  auto got = GgufFile::parse(bytes, "synth");
  ASSERT_TRUE(got.ok()) << got.error().message;
  ASSERT_EQ(got->kvs().size(), want->kvs().size());
  for (const GgufKv& w : want->kvs()) {
    const GgufValue* g = got->find(w.key);
    ASSERT_NE(g, nullptr) << w.key;
    EXPECT_EQ(g->type, w.value.type) << w.key;
    EXPECT_EQ(g->elem_type, w.value.elem_type) << w.key;
    EXPECT_EQ(g->elems.size(), w.value.elems.size()) << w.key;
    const bool layout = w.key == "deepseek41.engram.multipliers" || w.key == "deepseek41.engram.primes" ||
                        w.key == "deepseek41.engram.offsets" || w.key == "deepseek41.engram.token_map";
    if (layout || w.key == "general.name" || w.key == "general.description") continue;
    EXPECT_TRUE(same_value(*g, w.value)) << w.key << ": " << g->to_display_string() << " vs "
                                         << w.value.to_display_string();
  }
  ASSERT_EQ(got->tensors().size(), want->tensors().size());
  for (const GgufTensorInfo& w : want->tensors()) {
    const GgufTensorInfo* g = got->find_tensor(w.name);
    ASSERT_NE(g, nullptr) << w.name;
    EXPECT_EQ(g->type, w.type) << w.name;
    EXPECT_EQ(g->ne[0], w.ne[0]) << w.name;
    if (w.name.find("engram_embd") == std::string::npos) {
      EXPECT_EQ(g->shape_string(), w.shape_string()) << w.name;
    }
  }
  auto m = Model::load(std::move(*got));
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ((*m)->hparams().kv_source, (std::vector<int>{-1, 1, 1, 3}));
  Session s(**m, 64, cpu::MatmulPath::quantized);
  auto l = s.eval(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  ASSERT_TRUE(l.ok()) << l.error().message;
  for (float v : *l) ASSERT_TRUE(std::isfinite(v));
}

// ---- the real shapes, checked without writing their data ----

struct BigShapeCase {
  std::string_view shape;
  size_t n_tensors;
  std::map<std::string, std::string> shapes;  // tensor -> shape_string
};

TEST(SynthShapes, RealShapesHaveTheReleasedLayout) {
  const BigShapeCase cases[] = {
      {"qwen3-30b-a3b",
       3 + 48 * 12,
       {{"token_embd.weight", "[2048, 151936]"},
        {"output.weight", "[2048, 151936]"},
        {"blk.0.attn_q.weight", "[2048, 4096]"},
        {"blk.0.attn_k.weight", "[2048, 512]"},
        {"blk.0.attn_output.weight", "[4096, 2048]"},
        {"blk.0.attn_q_norm.weight", "[128]"},
        {"blk.0.ffn_gate_inp.weight", "[2048, 128]"},
        {"blk.0.ffn_up_exps.weight", "[2048, 768, 128]"},
        {"blk.47.ffn_down_exps.weight", "[768, 2048, 128]"}}},
      {"deepseek-v2-lite",
       3 + 11 + 26 * 15,  // dense layer 0, then MoE layers with shared experts
       {{"token_embd.weight", "[2048, 102400]"},
        {"blk.0.attn_q.weight", "[2048, 3072]"},
        {"blk.0.attn_kv_a_mqa.weight", "[2048, 576]"},
        {"blk.0.attn_kv_a_norm.weight", "[512]"},
        {"blk.0.attn_k_b.weight", "[128, 512, 16]"},
        {"blk.0.attn_v_b.weight", "[512, 128, 16]"},
        {"blk.0.attn_output.weight", "[2048, 2048]"},
        {"blk.0.ffn_up.weight", "[2048, 10944]"},
        {"blk.1.ffn_gate_inp.weight", "[2048, 64]"},
        {"blk.1.ffn_gate_exps.weight", "[2048, 1408, 64]"},
        {"blk.26.ffn_down_exps.weight", "[1408, 2048, 64]"},
        {"blk.26.ffn_down_shexp.weight", "[2816, 2048]"}}},
      {"gpt-oss-20b",
       3 + 24 * 19,
       {{"token_embd.weight", "[2880, 201088]"},
        {"blk.0.attn_q.weight", "[2880, 4096]"},
        {"blk.0.attn_k.bias", "[512]"},
        {"blk.0.attn_output.weight", "[4096, 2880]"},
        {"blk.0.attn_sinks.weight", "[64]"},
        {"blk.0.ffn_gate_inp.bias", "[32]"},
        {"blk.0.ffn_up_exps.weight", "[2880, 2880, 32]"},
        {"blk.23.ffn_down_exps.bias", "[2880, 32]"}}},
      {"gpt-oss-120b", 3 + 36 * 19, {{"blk.35.ffn_gate_exps.weight", "[2880, 2880, 128]"}}},
      {"mixtral-8x7b",
       3 + 32 * 10,
       {{"token_embd.weight", "[4096, 32000]"},
        {"blk.0.attn_k.weight", "[4096, 1024]"},
        {"blk.31.ffn_down_exps.weight", "[14336, 4096, 8]"}}},
      // 43 layers of 24 tensors; 3 hash layers (table, no exp_probs_b); 41 compressed layers (4
      // compressor tensors), 21 of ratio 4 (6 indexer tensors); the head's 3 stream tensors
      {"deepseek-v4-flash",
       3 + 3 + 43 * 24 + 41 * 4 + 21 * 6,
       {{"token_embd.weight", "[4096, 129280]"},
        {"output_hc_fn.weight", "[16384, 4]"},
        {"blk.0.hc_attn_fn.weight", "[16384, 24]"},
        {"blk.0.attn_q_b.weight", "[1024, 32768]"},
        {"blk.0.attn_kv.weight", "[4096, 512]"},
        {"blk.0.attn_output_a.weight", "[4096, 8192]"},
        {"blk.0.attn_output_b.weight", "[8192, 4096]"},
        {"blk.2.ffn_gate_tid2eid.weight", "[6, 129280]"},
        {"blk.2.attn_compressor_kv.weight", "[4096, 1024]"},
        {"blk.2.indexer.attn_q_b.weight", "[1024, 8192]"},
        {"blk.3.attn_compressor_ape.weight", "[512, 128]"},
        {"blk.42.ffn_up_exps.weight", "[4096, 2048, 256]"}}},
  };
  for (const BigShapeCase& c : cases) {
    for (SynthQuant q : kQuants) {
      SCOPED_TRACE(std::string(c.shape) + " " + std::string(synth_quant_name(q)));
      const SynthPlan plan = plan_of(c.shape, q);
      EXPECT_EQ(plan.writer.tensors().size(), c.n_tensors);
      for (const auto& [name, shape] : c.shapes) {
        EXPECT_EQ(tensor(plan, name).shape_string(), shape) << name;
      }
    }
  }
}

uint64_t data_bytes(const SynthPlan& plan) {
  uint64_t n = 0;
  for (const auto& t : plan.writer.tensors()) n += t.n_bytes;
  return n;
}

// Sizes and types as the real quantized releases have them.
TEST(SynthShapes, QuantMixesMatchReleases) {
  {
    // Qwen3-30B-A3B-Q4_K_M.gguf releases are 18.6 GB
    const SynthPlan p = plan_of("qwen3-30b-a3b", SynthQuant::q4_k_m);
    EXPECT_NEAR(double(data_bytes(p)), 18.55e9, 0.1e9);
    EXPECT_EQ(tensor(p, "token_embd.weight").type, GgmlType::q4_k);
    EXPECT_EQ(tensor(p, "output.weight").type, GgmlType::q6_k);
    EXPECT_EQ(tensor(p, "blk.0.attn_q.weight").type, GgmlType::q4_k);
    // use_more_bits(layer, 48): layers 0-5, 42-47 and 8, 11, ..., 41
    EXPECT_EQ(tensor(p, "blk.0.attn_v.weight").type, GgmlType::q6_k);
    EXPECT_EQ(tensor(p, "blk.6.attn_v.weight").type, GgmlType::q4_k);
    EXPECT_EQ(tensor(p, "blk.8.attn_v.weight").type, GgmlType::q6_k);
    EXPECT_EQ(tensor(p, "blk.7.ffn_down_exps.weight").type, GgmlType::q4_k);
    EXPECT_EQ(tensor(p, "blk.47.ffn_down_exps.weight").type, GgmlType::q6_k);
    EXPECT_EQ(tensor(p, "blk.7.ffn_up_exps.weight").type, GgmlType::q4_k);
    EXPECT_EQ(tensor(p, "blk.7.attn_output.weight").type, GgmlType::q4_k);  // not 8 experts
    EXPECT_EQ(tensor(p, "blk.7.ffn_gate_inp.weight").type, GgmlType::f32);
  }
  {
    const SynthPlan p = plan_of("qwen3-30b-a3b", SynthQuant::mxfp4_moe);
    EXPECT_EQ(tensor(p, "blk.0.ffn_down_exps.weight").type, GgmlType::mxfp4);
    EXPECT_EQ(tensor(p, "blk.0.attn_q.weight").type, GgmlType::q8_0);
    EXPECT_EQ(tensor(p, "output.weight").type, GgmlType::q8_0);
  }
  {
    // ggml-org's gpt-oss-20b-mxfp4.gguf is 12.1 GB, gpt-oss-120b 63.4 GB
    EXPECT_NEAR(double(data_bytes(plan_of("gpt-oss-20b", SynthQuant::mxfp4_moe))), 12.1e9, 0.1e9);
    EXPECT_NEAR(double(data_bytes(plan_of("gpt-oss-120b", SynthQuant::mxfp4_moe))), 63.4e9, 0.3e9);
    // rows of n_embd = 2880 cannot be K-quants: llama-quantize's fallbacks
    const SynthPlan p = plan_of("gpt-oss-20b", SynthQuant::q4_k_m);
    EXPECT_EQ(tensor(p, "token_embd.weight").type, GgmlType::q5_0);
    EXPECT_EQ(tensor(p, "output.weight").type, GgmlType::q8_0);
    EXPECT_EQ(tensor(p, "blk.0.ffn_gate_exps.weight").type, GgmlType::q5_0);
    EXPECT_EQ(tensor(p, "blk.0.ffn_down_exps.weight").type, GgmlType::q8_0);  // Q6_K layer
    EXPECT_EQ(tensor(p, "blk.4.ffn_down_exps.weight").type, GgmlType::q5_0);
    EXPECT_EQ(tensor(p, "blk.0.attn_output.weight").type, GgmlType::q4_k);  // rows of 4096
    EXPECT_EQ(tensor(p, "blk.0.attn_sinks.weight").type, GgmlType::f32);
    EXPECT_EQ(tensor(p, "blk.0.ffn_up_exps.bias").type, GgmlType::f32);
  }
  {
    // DeepSeek-V2-Lite-Chat Q4_K_M releases are 10.4 GB
    const SynthPlan p = plan_of("deepseek-v2-lite", SynthQuant::q4_k_m);
    EXPECT_NEAR(double(data_bytes(p)), 10.37e9, 0.1e9);
    EXPECT_EQ(tensor(p, "blk.3.attn_k_b.weight").type, GgmlType::q5_0);        // rows of 128
    EXPECT_EQ(tensor(p, "blk.1.ffn_down_exps.weight").type, GgmlType::q8_0);   // Q6_K, rows 1408
    EXPECT_EQ(tensor(p, "blk.4.ffn_down_exps.weight").type, GgmlType::q5_0);   // Q4_K, rows 1408
    EXPECT_EQ(tensor(p, "blk.4.ffn_down_shexp.weight").type, GgmlType::q4_k);  // rows of 2816
    EXPECT_EQ(tensor(p, "blk.0.ffn_down.weight").type, GgmlType::q8_0);        // rows of 10944
    const SynthPlan m = plan_of("deepseek-v2-lite", SynthQuant::mxfp4_moe);
    EXPECT_EQ(tensor(m, "blk.3.attn_k_b.weight").type, GgmlType::mxfp4);  // 3D, as llama-quantize
    EXPECT_EQ(tensor(m, "blk.3.ffn_gate_shexp.weight").type, GgmlType::q8_0);
  }
  {
    // Mixtral has 8 experts: llama-quantize's 8-expert rules
    const SynthPlan p = plan_of("mixtral-8x7b", SynthQuant::q4_k_m);
    EXPECT_EQ(tensor(p, "blk.9.attn_k.weight").type, GgmlType::q8_0);
    EXPECT_EQ(tensor(p, "blk.9.attn_v.weight").type, GgmlType::q8_0);
    EXPECT_EQ(tensor(p, "blk.9.attn_output.weight").type, GgmlType::q5_k);
  }
  for (SynthQuant q : kQuants) {
    const SynthPlan p = plan_of("qwen3-30b-a3b", q);
    for (const auto& t : p.writer.tensors()) {
      const bool float_kept = t.n_dims == 1 || t.name.find("ffn_gate_inp") != std::string::npos;
      EXPECT_EQ(t.type == GgmlType::f32, float_kept) << t.name;
      if (q == SynthQuant::q8_0 && !float_kept) {
        EXPECT_EQ(t.type, GgmlType::q8_0) << t.name;
      }
    }
  }
}

// The real shapes use the fixture architectures' key and tensor-name patterns; V2-Lite differs
// from the V3-style deepseek2 fixture exactly where the models differ.
TEST(SynthShapes, RealShapesFollowTheFixtureArchitectures) {
  if (!test::fixtures_dir()) GTEST_SKIP() << "../shared/fixtures not found (set STRATA_FIXTURES)";
  struct Case {
    std::string_view shape, arch;
    std::set<std::string> fixture_only_tensors, fixture_only_keys, synth_only_tensors;
  };
  const Case cases[] = {
      {"qwen3-30b-a3b", "qwen3moe", {}, {}, {}},
      {"gpt-oss-20b", "gpt-oss", {}, {}, {}},
      {"gpt-oss-120b", "gpt-oss", {}, {}, {}},
      {"mixtral-8x7b", "llama", {}, {}, {}},
      {"deepseek-v4-flash", "deepseek4", {}, {}, {}},
      {"deepseek-v2-lite",
       "deepseek2",
       {"blk.#.attn_q_a.weight", "blk.#.attn_q_a_norm.weight", "blk.#.attn_q_b.weight",
        "blk.#.exp_probs_b.bias"},
       {"deepseek2.attention.q_lora_rank"},
       {"blk.#.attn_q.weight"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.shape));
    auto path = fixture_model(c.arch, SynthQuant::q8_0);
    ASSERT_TRUE(path.has_value());
    auto want = GgufFile::open(path->string());
    ASSERT_TRUE(want.ok()) << want.error().message;
    const SynthPlan plan = plan_of(c.shape, SynthQuant::q8_0);
    std::set<std::string> want_tensors = name_patterns(want->tensors());
    for (const auto& n : c.fixture_only_tensors) EXPECT_EQ(want_tensors.erase(n), 1u) << n;
    for (const auto& n : c.synth_only_tensors) want_tensors.insert(n);
    EXPECT_EQ(name_patterns(plan.writer.tensors()), want_tensors);

    std::set<std::string> want_keys = key_names(*want);
    for (const auto& k : c.fixture_only_keys) EXPECT_EQ(want_keys.erase(k), 1u) << k;
    auto kvs = synth_metadata(*find_synth_shape(c.shape), SynthQuant::q8_0, {});
    ASSERT_TRUE(kvs.ok());
    std::set<std::string> got_keys;
    for (const auto& kv : *kvs) got_keys.insert(kv.key);
    EXPECT_EQ(got_keys, want_keys);
  }
}

// ---- the values ----

// deepseek4's token id -> experts tables: k distinct experts in range for every token, every
// expert used; and the synthetic model loads and runs with finite logits, batch = one at a time.
TEST(SynthValues, DeepSeek4TablesAndForward) {
  const SynthPlan plan = plan_of("tiny-deepseek4", SynthQuant::q8_0, seeded(5));
  const std::vector<uint8_t> bytes = plan.write_memory();
  auto file = GgufFile::parse(bytes, "tiny-deepseek4");
  ASSERT_TRUE(file.ok()) << file.error().message;
  const GgufTensorInfo* t = file->find_tensor("blk.0.ffn_gate_tid2eid.weight");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->type, GgmlType::i32);
  const auto data = file->tensor_data(*t);
  const int k = int(t->ne[0]);
  std::vector<int> uses(8, 0);
  for (uint64_t row = 0; row < t->ne[1]; ++row) {
    std::vector<int32_t> ids(static_cast<size_t>(k));
    std::memcpy(ids.data(), data.data() + row * 4 * uint64_t(k), 4 * size_t(k));
    for (int j = 0; j < k; ++j) {
      ASSERT_GE(ids[size_t(j)], 0);
      ASSERT_LT(ids[size_t(j)], 8);
      ++uses[size_t(ids[size_t(j)])];
      for (int i = 0; i < j; ++i) ASSERT_NE(ids[size_t(i)], ids[size_t(j)]) << "row " << row;
    }
  }
  for (int u : uses) EXPECT_GT(u, 0);
  auto model = Model::load(std::move(*file));
  ASSERT_TRUE(model.ok()) << model.error().message;
  std::vector<int32_t> ids;
  for (int i = 0; i < 40; ++i) ids.push_back((i * 37 + 11) % 1000);
  Session batch(**model, 64, cpu::MatmulPath::exact);
  auto all = batch.eval(ids, true);
  ASSERT_TRUE(all.ok());
  Session seq(**model, 64, cpu::MatmulPath::exact);
  const size_t V = size_t((*model)->hparams().n_vocab);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto l = seq.eval(std::span<const int32_t>(&ids[i], 1));
    ASSERT_TRUE(l.ok());
    for (size_t j = 0; j < V; ++j) {
      ASSERT_TRUE(std::isfinite((*l)[j]));
      ASSERT_NEAR((*l)[j], (*all)[i * V + j], 1e-4f);
    }
  }
  // a file whose last layer is a multi-token-prediction (nextn) layer: the main layers load, the
  // nextn layer is counted and left out (MTP is not built for deepseek4)
  SynthPlan with_mtp = plan_of("tiny-deepseek4", SynthQuant::q8_0, seeded(5));
  with_mtp.writer.set("deepseek4.nextn_predict_layers", GgufValue::make_u32(1));
  const std::vector<uint8_t> mtp_bytes = with_mtp.write_memory();
  auto mtp_file = GgufFile::parse(mtp_bytes, "tiny-deepseek4-mtp");
  ASSERT_TRUE(mtp_file.ok());
  auto mtp = Model::load(std::move(*mtp_file));
  ASSERT_TRUE(mtp.ok()) << mtp.error().message;
  EXPECT_EQ((*mtp)->hparams().n_layer, 2);
  EXPECT_EQ((*mtp)->hparams().n_nextn, 1);
  EXPECT_EQ((*mtp)->mtp, nullptr);
  EXPECT_NE((*mtp)->mtp_error.find("not built for deepseek4"), std::string::npos) << (*mtp)->mtp_error;
  Session s(**mtp, 64, cpu::MatmulPath::exact);
  auto l = s.eval(ids);
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(std::all_of(l->begin(), l->end(), [](float x) { return std::isfinite(x); }));
}

TEST(SynthValues, SameSeedSameBytesWhateverTheChunkingAndThreads) {
  const SynthPlan a = plan_of("tiny", SynthQuant::q4_k_m, seeded(7));
  const std::vector<uint8_t> whole = a.write_memory();
  EXPECT_EQ(plan_of("tiny", SynthQuant::q4_k_m, seeded(7)).write_memory(), whole);
  const std::vector<uint8_t> other = plan_of("tiny", SynthQuant::q4_k_m, seeded(8)).write_memory();
  ASSERT_EQ(other.size(), whole.size());
  EXPECT_NE(other, whole);
  // the header is the same; nearly every data byte differs
  const size_t header = a.writer.header_bytes().size();
  size_t same = 0;
  for (size_t k = header; k < whole.size(); ++k) same += whole[k] == other[k];
  EXPECT_LT(double(same) / double(whole.size() - header), 0.1);

  // odd pieces on one thread reproduce the bytes of whole tensors on all threads
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (size_t i = 0; i < a.writer.tensors().size(); ++i) {
    const GgufTensorInfo& t = a.writer.tensors()[i];
    std::vector<uint8_t> pieces(t.n_bytes);
    for (uint64_t off = 0; off < t.n_bytes; off += 9973) {
      const uint64_t n = std::min<uint64_t>(9973, t.n_bytes - off);
      a.fill(i, off, std::span<uint8_t>(pieces.data() + off, n));
    }
    const uint8_t* in_file = whole.data() + header + t.offset;
    EXPECT_TRUE(std::equal(pieces.begin(), pieces.end(), in_file)) << t.name;
  }
  omp_set_num_threads(threads);
}

// Every generated type decodes (with the engine's reference dequantization) to values of the
// intended mean and spread, and the embedding carries its shared channels.
TEST(SynthValues, BlocksDecodeToTheIntendedStatistics) {
  // A tiny variant whose attn_output rows (8 x 40 = 320) are not whole K blocks, so that the
  // Q5_K of 8-expert models falls back to Q5_1 as llama-quantize does.
  SynthShape odd = *find_synth_shape("tiny");
  odd.head_dim = 40;
  std::set<GgmlType> seen;
  for (auto [shape, quant] : {std::pair{*find_synth_shape("tiny"), SynthQuant::q4_k_m},
                              std::pair{*find_synth_shape("tiny-deepseek2"), SynthQuant::q4_k_m},
                              std::pair{*find_synth_shape("tiny-gpt-oss"), SynthQuant::mxfp4_moe},
                              std::pair{odd, SynthQuant::q4_k_m}}) {
    const SynthPlan plan = plan_of(shape, quant, seeded(3));
    for (size_t i = 0; i < plan.writer.tensors().size(); ++i) {
      const GgufTensorInfo& t = plan.writer.tensors()[i];
      const SynthTensorFill& f = plan.fills[i];
      SCOPED_TRACE(t.name + " " + std::string(ggml_type_name(t.type)));
      seen.insert(t.type);
      const std::vector<float> v = values(plan, i);
      ASSERT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); }));
      const Moments m = moments(v);
      switch (f.kind) {
        case SynthFill::table:
          ADD_FAILURE() << "none of these shapes has a table";
          break;
        case SynthFill::weight: {
          // mxfp4 scales are powers of two: within a factor sqrt(2) of the wanted std
          const double tol = t.type == GgmlType::mxfp4 ? 0.45 : 0.15;
          EXPECT_NEAR(m.std / f.std, 1.0, tol);
          EXPECT_NEAR(m.mean / f.std, 0.0, 0.05);
          break;
        }
        case SynthFill::embedding: {
          std::vector<float> shared, rest;
          for (size_t k = 0; k < v.size(); ++k) {
            (k % t.ne[0] < kSynthSharedChannels ? shared : rest).push_back(v[k]);
          }
          EXPECT_NEAR(moments(shared).mean / f.std, 1.0, 0.15);
          EXPECT_NEAR(moments(rest).mean / f.std, 0.0, 0.05);
          EXPECT_NEAR(moments(rest).std / f.std, 1.0, 0.15);
          break;
        }
        case SynthFill::norm:
          EXPECT_NEAR(m.mean, 1.0, 0.05);
          EXPECT_NEAR(m.std, f.std, 0.5 * f.std);
          break;
        case SynthFill::bias:
        case SynthFill::router:
          EXPECT_NEAR(m.mean, 0.0, 4 * f.std / std::sqrt(double(v.size())) + 1e-3);
          EXPECT_NEAR(m.std / f.std, 1.0, v.size() < 100 ? 0.6 : 0.2);
          break;
      }
    }
  }
  const std::set<GgmlType> all = {GgmlType::f32,  GgmlType::q8_0, GgmlType::q5_0, GgmlType::q5_1,
                                  GgmlType::q4_k, GgmlType::q5_k, GgmlType::q6_k, GgmlType::mxfp4};
  EXPECT_EQ(seen, all);
}

// ---- routing ----

// Share of the top-k selections each expert gets, for hidden states `h` ([n][n_embd]) routed by
// `router` ([n_expert][n_embd]) after an RMSNorm with weight `norm`.
std::vector<double> expert_shares(const std::vector<std::vector<float>>& h,
                                  const std::vector<float>& router, const std::vector<float>& norm,
                                  int n_expert, int top_k) {
  const size_t n_embd = norm.size();
  std::vector<double> count(n_expert, 0);
  std::vector<float> x(n_embd);
  std::vector<std::pair<float, int>> logits(n_expert);
  for (const auto& row : h) {
    double ss = 0;
    for (float v : row) ss += double(v) * v;
    const float inv = float(1.0 / std::sqrt(ss / double(n_embd) + 1e-6));
    for (size_t c = 0; c < n_embd; ++c) x[c] = row[c] * inv * norm[c];
    for (int e = 0; e < n_expert; ++e) {
      float dot = 0;
      for (size_t c = 0; c < n_embd; ++c) dot += router[e * n_embd + c] * x[c];
      logits[e] = {dot, e};
    }
    std::partial_sort(logits.begin(), logits.begin() + top_k, logits.end(), std::greater<>());
    for (int k = 0; k < top_k; ++k) count[logits[k].second] += 1;
  }
  for (double& c : count) c /= double(h.size()) * top_k;
  return count;
}

// Routing every token of the tiny model through every layer's router (hidden state = the
// token's embedding, as the first layer sees it): expert popularity is uneven, and it is the
// shared channels that make it so.
TEST(SynthRouter, ExpertPopularityIsUneven) {
  const SynthPlan plan = plan_of("tiny", SynthQuant::q8_0, seeded(11));
  const SynthShape& s = *find_synth_shape("tiny");
  const std::vector<float> emb = values(plan, tensor_index(plan, "token_embd.weight"));
  std::vector<std::vector<float>> h, h_without_shared;
  for (uint32_t tok = 0; tok < plan.n_vocab; ++tok) {
    h.emplace_back(emb.begin() + tok * s.n_embd, emb.begin() + (tok + 1) * s.n_embd);
    h_without_shared.push_back(h.back());
    std::fill_n(h_without_shared.back().begin(), kSynthSharedChannels, 0.0f);
  }
  const double uniform = 1.0 / s.n_expert;
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const std::string blk = "blk." + std::to_string(l) + ".";
    const std::vector<float> router = values(plan, tensor_index(plan, blk + "ffn_gate_inp.weight"));
    const std::vector<float> norm = values(plan, tensor_index(plan, blk + "ffn_norm.weight"));
    const auto shares = expert_shares(h, router, norm, s.n_expert, s.n_expert_used);
    const auto flat = expert_shares(h_without_shared, router, norm, s.n_expert, s.n_expert_used);
    const double top = *std::max_element(shares.begin(), shares.end());
    const double least = *std::min_element(shares.begin(), shares.end());
    EXPECT_GT(top, 1.25 * uniform);
    EXPECT_LT(least, 0.85 * uniform);
    EXPECT_LT(*std::max_element(flat.begin(), flat.end()), 1.15 * uniform);
    // the popular expert is the one the plan ranked first
    const auto& bias = plan.fills[tensor_index(plan, blk + "ffn_gate_inp.weight")].expert_bias;
    EXPECT_EQ(std::max_element(shares.begin(), shares.end()) - shares.begin(),
              std::max_element(bias.begin(), bias.end()) - bias.begin());
  }
}

// The same at the real scale: Qwen3-30B-A3B's router of one layer (128 experts, top-8) with
// hidden states drawn like its embeddings (unit spread, +1 on the shared channels).
TEST(SynthRouter, ManyExpertsAreSkewedToo) {
  const SynthPlan plan = plan_of("qwen3-30b-a3b", SynthQuant::q4_k_m);
  const SynthShape& s = *find_synth_shape("qwen3-30b-a3b");
  const std::vector<float> router = values(plan, tensor_index(plan, "blk.20.ffn_gate_inp.weight"));
  std::vector<std::vector<float>> h(2000, std::vector<float>(s.n_embd));
  uint64_t x = 12345;
  for (auto& row : h) {
    for (uint32_t c = 0; c < s.n_embd; ++c) {
      double u = 0;  // Irwin-Hall(12) - 6: unit Gaussian-like
      for (int k = 0; k < 12; ++k) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        u += double(x >> 11) / 9007199254740992.0;
      }
      row[c] = float(u - 6.0) + (c < kSynthSharedChannels ? 1.0f : 0.0f);
    }
  }
  const auto shares =
      expert_shares(h, router, std::vector<float>(s.n_embd, 1.0f), s.n_expert, s.n_expert_used);
  std::vector<double> sorted = shares;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const double uniform = 1.0 / s.n_expert;
  EXPECT_GT(sorted.front(), 2.0 * uniform);
  // the 16 most popular experts (1/8 of them) take well over 1/8 of the selections
  EXPECT_GT(std::accumulate(sorted.begin(), sorted.begin() + 16, 0.0), 0.2);
  EXPECT_LT(sorted.back(), 0.5 * uniform);
}

// ---- vocabulary ----

TEST(SynthVocab, GeneratedVocabularyIsPaddedToTheShape) {
  auto kvs = synth_metadata(*find_synth_shape("qwen3-30b-a3b"), SynthQuant::q4_k_m, {});
  ASSERT_TRUE(kvs.ok());
  std::map<std::string, const GgufValue*> by_key;
  for (const auto& kv : *kvs) by_key[kv.key] = &kv.value;
  const auto& tokens = by_key.at("tokenizer.ggml.tokens")->elems;
  const auto& types = by_key.at("tokenizer.ggml.token_type")->elems;
  ASSERT_EQ(tokens.size(), 151936u);
  ASSERT_EQ(types.size(), tokens.size());
  EXPECT_EQ(by_key.at("tokenizer.ggml.model")->str, "gpt2");
  EXPECT_EQ(by_key.at("tokenizer.ggml.pre")->str, "qwen2");
  EXPECT_EQ(by_key.at("tokenizer.ggml.merges")->elems.size(), 767u);
  EXPECT_EQ(tokens[0].str, "!");
  EXPECT_EQ(tokens[256].str, "\xC4\xA0t");  // "Ġt": GPT-2's first merge
  EXPECT_EQ(tokens[1023].str, "<|endoftext|>");
  EXPECT_EQ(types[1023].i, 3);  // CONTROL
  EXPECT_EQ(by_key.at("tokenizer.ggml.eos_token_id")->u, 1023u);
  EXPECT_EQ(tokens[151935].str, "[PAD151935]");
  EXPECT_EQ(types[151935].i, 5);  // UNUSED
  std::set<std::string> unique;
  for (const auto& t : tokens) unique.insert(t.str);
  EXPECT_EQ(unique.size(), tokens.size());
}

TEST(SynthVocab, VocabularyFromAFileSetsTheTokenCount) {
  const std::string vocab = (test::data_dir() / "vocab" / "ggml-vocab-gpt-2.gguf").string();
  const SynthShape& shape = *find_synth_shape("tiny-deepseek2");
  auto plan = build_synth_plan(shape, SynthQuant::q8_0, with_vocab(vocab));
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  EXPECT_EQ(plan->n_vocab, 50257u);
  EXPECT_EQ(tensor(*plan, "token_embd.weight").shape_string(), "[256, 50257]");
  EXPECT_EQ(tensor(*plan, "output.weight").shape_string(), "[256, 50257]");
  auto kvs = synth_metadata(shape, SynthQuant::q8_0, with_vocab(vocab));
  ASSERT_TRUE(kvs.ok());
  auto vocab_file = GgufFile::open(vocab);
  ASSERT_TRUE(vocab_file.ok());
  size_t copied = 0;
  for (const auto& kv : *kvs) {
    if (kv.key == "deepseek2.vocab_size") {
      EXPECT_EQ(kv.value.u, 50257u);
    }
    if (kv.key.rfind("tokenizer.", 0) != 0) continue;
    ++copied;
    const GgufValue* want = vocab_file->find(kv.key);
    ASSERT_NE(want, nullptr) << kv.key;
    EXPECT_TRUE(same_value(kv.value, *want)) << kv.key;
  }
  EXPECT_EQ(copied, 7u);  // every tokenizer.* key of the file

  // a file that is not a GGUF
  const fs::path dir = test::scratch_dir("synth_vocab");
  test::write_file(dir / "not.gguf", {'n', 'o', 't', ' ', 'g', 'g', 'u', 'f'});
  auto bad = build_synth_plan(shape, SynthQuant::q8_0, with_vocab((dir / "not.gguf").string()));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("--vocab"), std::string::npos) << bad.error().message;
}

// ---- the command ----

// Exit code and output of `strata <args>`; the output must be one line.
void expect_one_line_error(const std::string& args, const std::string& needle) {
  SCOPED_TRACE(args);
  std::string out;
  EXPECT_NE(test::run_cli(args, &out), 0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find(needle), std::string::npos) << out;
}

TEST(SynthCli, WritesTinyAndRejectsBadArguments) {
  const fs::path dir = test::scratch_dir("synth_cli");
  const std::string out = (dir / "tiny.gguf").string();
  std::string log;
  ASSERT_EQ(test::run_cli("synth --shape tiny --quant mxfp4 --seed 5 -o " + out, &log), 0) << log;
  auto f = GgufFile::open(out);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->find_tensor("blk.0.ffn_up_exps.weight")->type, GgmlType::mxfp4);
  EXPECT_EQ(f->file_size(), plan_of("tiny", SynthQuant::mxfp4_moe, seeded(5)).writer.file_size());
  EXPECT_NE(log.find("wrote " + out), std::string::npos) << log;

  ASSERT_EQ(test::run_cli("synth --list", &log), 0) << log;
  EXPECT_NE(log.find("qwen3-30b-a3b"), std::string::npos) << log;
  EXPECT_NE(log.find("deepseek-v2-lite"), std::string::npos) << log;

  expect_one_line_error("synth --shape qwen9 --quant q4_k -o " + out, "unknown shape 'qwen9'");
  expect_one_line_error("synth --shape tiny --quant q3_k -o " + out, "unknown quant 'q3_k'");
  expect_one_line_error("synth --shape tiny --quant q8_0", "required");
  expect_one_line_error("synth --shape tiny --quant q8_0 -o " + (dir / "no/such/dir.gguf").string(),
                        "cannot create");
  expect_one_line_error("synth --shape tiny --quant q8_0 --vocab " + out + ".missing -o " + out,
                        "--vocab");

  // --layers N: the first N layers of the shape
  const std::string cut = (dir / "tiny-1l.gguf").string();
  ASSERT_EQ(test::run_cli("synth --shape tiny --quant q8_0 --layers 1 -o " + cut, &log), 0) << log;
  auto g = GgufFile::open(cut);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_NE(g->find_tensor("blk.0.ffn_up_exps.weight"), nullptr);
  EXPECT_EQ(g->find_tensor("blk.1.ffn_up_exps.weight"), nullptr);
  expect_one_line_error("synth --shape tiny --quant q8_0 --layers 999 -o " + cut, "--layers 999 is outside");
}

}  // namespace
}  // namespace strata
