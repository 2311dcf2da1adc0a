#include <gtest/gtest.h>

#include "model/model_info.h"
#include "test_support.h"

namespace strata {
namespace {

TEST(ModelInfo, ClassifiesTensorNames) {
  struct {
    const char* name;
    TensorRole role;
  } cases[] = {
      {"token_embd.weight", TensorRole::embedding},
      {"output.weight", TensorRole::output},
      {"output_norm.weight", TensorRole::norm},
      {"blk.0.attn_q.weight", TensorRole::attention},
      {"blk.12.attn_kv_a_mqa.weight", TensorRole::attention},
      {"blk.3.attn_sinks.weight", TensorRole::attention},
      {"blk.1.indexer.attn_q_b.weight", TensorRole::attention},
      {"blk.2.attn_q_a_norm.weight", TensorRole::norm},
      {"blk.0.ffn_gate_inp.weight", TensorRole::router},
      {"blk.0.exp_probs_b.bias", TensorRole::router},
      {"blk.0.ffn_gate_tid2eid.weight", TensorRole::router},
      {"blk.0.ffn_gate_inp_shexp.weight", TensorRole::shared_expert},
      {"blk.0.ffn_up_shexp.weight", TensorRole::shared_expert},
      {"blk.0.ffn_down_exps.weight", TensorRole::routed_expert},
      {"blk.0.ffn_gate_up_exps.bias", TensorRole::routed_expert},
      {"blk.0.ffn_up.weight", TensorRole::dense_ffn},
      {"blk.61.nextn.eh_proj.weight", TensorRole::other},
      {"blk.0.hc_attn_fn.weight", TensorRole::other},
  };
  for (const auto& c : cases) EXPECT_EQ(classify_tensor(c.name), c.role) << c.name;
  EXPECT_EQ(tensor_layer("blk.17.attn_q.weight"), 17);
  EXPECT_EQ(tensor_layer("token_embd.weight"), -1);
  EXPECT_EQ(tensor_layer("blk.x.attn_q.weight"), -1);
}

// Expert and per-token bytes computed here independently, tensor by tensor.
TEST(ModelInfo, ExpertAndActiveBytesOfVendoredModel) {
  auto f = GgufFile::open((test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf").string());
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto s = summarize_model(*f);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->arch, "qwen3moe");
  EXPECT_EQ(s->n_layer, 3u);
  EXPECT_EQ(s->n_expert, 8u);
  EXPECT_EQ(s->n_expert_used, 4u);
  EXPECT_EQ(s->n_moe_layers, 3u);

  uint64_t expected_active = 0, all_bytes = 0, min_e = UINT64_MAX, max_e = 0, routed_params = 0;
  for (int l = 0; l < 3; ++l) {
    uint64_t layer_experts = 0, layer_params = 0;
    for (const char* n : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
      const GgufTensorInfo* t = f->find_tensor(strfmt("blk.%d.%s.weight", l, n));
      ASSERT_NE(t, nullptr);
      layer_experts += t->n_bytes;
      layer_params += t->n_elements();
    }
    min_e = std::min(min_e, layer_experts / 8);
    max_e = std::max(max_e, layer_experts / 8);
    expected_active += layer_experts / 8 * 4;
    routed_params += layer_params / 8 * 4;
  }
  for (const GgufTensorInfo& t : f->tensors()) {
    all_bytes += t.n_bytes;
    if (t.name.find("_exps") != std::string::npos) continue;
    expected_active += t.name == "token_embd.weight" ? t.row_bytes() : t.n_bytes;
  }
  EXPECT_EQ(s->n_bytes, all_bytes);
  EXPECT_EQ(s->expert_bytes_min, min_e);
  EXPECT_EQ(s->expert_bytes_max, max_e);
  EXPECT_LT(min_e, max_e);  // layer 2's ffn_down_exps is Q6_K in Q4_K_M
  EXPECT_EQ(s->active_bytes_per_token, expected_active);
  EXPECT_EQ(s->active_routed_params_per_token, routed_params);
  EXPECT_LT(s->active_routed_params_per_token, s->active_params_per_token);
  uint64_t role_bytes = 0;
  for (const RoleTotals& r : s->roles) role_bytes += r.n_bytes;
  EXPECT_EQ(role_bytes, all_bytes);
}

// An MTP (nextn) layer is not run in decode: a token's active weights, routed or not, are the
// same with and without one, though the routed role's totals grow by the nextn layer's experts.
TEST(ModelInfo, ActiveWeightsLeaveOutTheMtpLayer) {
  std::vector<uint8_t> plain_bytes, mtp_bytes;
  auto plain = test::synth_q8_model("tiny", plain_bytes);
  auto mtp = test::synth_q8_model("tiny", mtp_bytes, 1);
  ASSERT_TRUE(plain && mtp);
  auto a = summarize_model(plain->file());
  auto b = summarize_model(mtp->file());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(b->n_nextn_layers, 1u);
  EXPECT_GT(b->roles[int(TensorRole::routed_expert)].n_params, a->roles[int(TensorRole::routed_expert)].n_params);
  EXPECT_GT(a->active_routed_params_per_token, 0u);
  EXPECT_EQ(b->active_routed_params_per_token, a->active_routed_params_per_token);
  EXPECT_EQ(b->active_params_per_token, a->active_params_per_token);
  EXPECT_EQ(b->active_bytes_per_token, a->active_bytes_per_token);
}

TEST(ModelInfo, DeepSeek2HasDenseAndSharedParts) {
  auto dir = test::fixtures_dir();
  if (!dir) GTEST_SKIP() << "../shared/fixtures not found";
  auto f = GgufFile::open((*dir / "models" / "deepseek2" / "model-Q8_0.gguf").string());
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto s = summarize_model(*f);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->n_moe_layers, 2u);  // layer 0 is dense
  EXPECT_GT(s->roles[int(TensorRole::dense_ffn)].n_bytes, 0u);
  EXPECT_GT(s->roles[int(TensorRole::shared_expert)].n_bytes, 0u);
  EXPECT_EQ(s->roles[int(TensorRole::other)].n_tensors, 0u);
}

TEST(ModelInfo, InfoCommandPrintsTableForEveryModel) {
  auto models = test::fixture_models();
  models.insert(models.begin(), test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf");
  for (const auto& m : models) {
    std::string out;
    int rc = test::run_cli("info \"" + m.string() + "\"", &out);
    EXPECT_EQ(rc, 0) << m << "\n" << out;
    EXPECT_NE(out.find("tensor table"), std::string::npos) << m;
    EXPECT_NE(out.find("blk.*.ffn_up_exps.weight"), std::string::npos) << m;
    EXPECT_NE(out.find("a decode step reads"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace strata

#include "gguf_builder.h"
#include "model/model.h"

namespace strata {
namespace {

// A header whose block_count is far beyond its tensors must be an error, not an allocation of
// billions of layers (found by reasoning over the fuzz target; kept as a regression test).
TEST(ModelLoad, HostileBlockCountIsAnError) {
  test::RawGguf g;
  g.header(3, 1, 6).kv_str("general.architecture", "qwen3moe").kv_u32("qwen3moe.block_count", 2000000000u);
  g.kv_u32("qwen3moe.embedding_length", 32).kv_u32("qwen3moe.context_length", 64);
  g.kv_u32("qwen3moe.attention.head_count", 1).kv_u32("qwen3moe.attention.layer_norm_rms_epsilon", 0);
  g.tensor("token_embd.weight", {32, 4}, 0, 0).data(512);
  auto f = GgufFile::parse(g.bytes, "hostile");
  ASSERT_TRUE(f.ok()) << f.error().message;
  auto m = Model::load(std::move(*f));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("block_count is 2000000000 but the file has only 1 tensors"),
            std::string::npos)
      << m.error().message;
}

TEST(ModelLoad, WrongShapeNamesTheTensor) {
  // the vendored model with one tensor's shape changed in its header: rewrite it with the writer
  auto f = GgufFile::open((test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf").string());
  ASSERT_TRUE(f.ok());
  GgufWriter w;
  for (const GgufKv& kv : f->kvs()) w.set(kv.key, kv.value);
  for (const GgufTensorInfo& t : f->tensors()) {
    std::vector<uint64_t> ne(t.ne, t.ne + t.n_dims);
    if (t.name == "blk.1.attn_k.weight") ne[1] /= 2;  // half the rows
    w.add_tensor(t.name, t.type, ne);
  }
  auto bytes = w.write_memory([](size_t, uint64_t, std::span<uint8_t> out) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = uint8_t(i * 13 + 1);
  });
  auto parsed = GgufFile::parse(bytes, "reshaped");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  auto m = Model::load(std::move(*parsed));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("tensor 'blk.1.attn_k.weight' has shape [256, 64], expected [256, 128]"),
            std::string::npos)
      << m.error().message;
}

}  // namespace
}  // namespace strata
