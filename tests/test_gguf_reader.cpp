#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "test_support.h"

namespace strata {
namespace {

using test::data_dir;

// Checks a llama.cpp-written fixture against the facts its config.json states.
void check_fixture(const std::filesystem::path& model) {
  SCOPED_TRACE(model.string());
  auto f = GgufFile::open(model.string());
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->version(), 3u);
  EXPECT_GT(f->tensors().size(), 10u);
  EXPECT_EQ(f->data_offset() % f->alignment(), 0u);

  std::ifstream in(model.parent_path() / "config.json");
  ASSERT_TRUE(in.good());
  auto cfg = nlohmann::json::parse(in);
  // quant name from "model-<Q>.gguf"
  std::string q = model.stem().string().substr(6);
  ASSERT_TRUE(cfg["quants"].contains(q)) << q;
  EXPECT_EQ(f->file_size(), cfg["quants"][q]["file_size"].get<uint64_t>());

  // every architecture key llama.cpp was given is there with the value given
  for (auto& [key, value] : cfg["gguf_kv"].items()) {
    const GgufValue* v = f->find(key);
    ASSERT_NE(v, nullptr) << key;
    if (value.is_number_integer()) {
      auto got = f->get_int(key);
      ASSERT_TRUE(got.ok()) << got.error().message;
      EXPECT_EQ(**got, value.get<int64_t>()) << key;
    } else if (value.is_number_float()) {
      auto got = f->get_float(key);
      ASSERT_TRUE(got.ok()) << got.error().message;
      EXPECT_NEAR(**got, value.get<double>(), 1e-6 * std::abs(value.get<double>())) << key;
    } else if (value.is_string()) {
      auto got = f->get_string(key);
      ASSERT_TRUE(got.ok()) << got.error().message;
      EXPECT_EQ(**got, value.get<std::string>()) << key;
    }
  }
  // tensors tile the data section in order, each aligned, the last ending at the file's end
  uint64_t end = 0;
  for (const auto& t : f->tensors()) {
    EXPECT_EQ(t.offset % f->alignment(), 0u) << t.name;
    EXPECT_GE(t.offset, end) << t.name;
    end = t.offset + t.n_bytes;
  }
  // (writers may pad the last tensor to the alignment)
  EXPECT_LE(f->data_offset() + end, f->file_size());
  EXPECT_LT(f->file_size() - (f->data_offset() + end), f->alignment());
  // tokenizer metadata is present and sized like the vocabulary
  const GgufValue* tokens = f->find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->type, GgufType::array);
  EXPECT_EQ(tokens->elem_type, GgufType::string);
  const GgufTensorInfo* embd = f->find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->ne[1], tokens->elems.size());
}

TEST(GgufReader, VendoredFixture) {
  check_fixture(data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf");
}

TEST(GgufReader, EveryFixtureModel) {
  auto models = test::fixture_models();
  if (models.empty()) GTEST_SKIP() << "../shared/fixtures not found: only the vendored model was read";
  for (const auto& m : models) check_fixture(m);
}

TEST(GgufReader, QwenShapesAndTypes) {
  auto f = GgufFile::open((data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf").string());
  ASSERT_TRUE(f.ok()) << f.error().message;
  const GgufTensorInfo* up = f->find_tensor("blk.0.ffn_up_exps.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->n_dims, 3);
  EXPECT_EQ(up->ne[0], 256u);  // n_embd
  EXPECT_EQ(up->ne[1], 256u);  // expert FFN
  EXPECT_EQ(up->ne[2], 8u);    // experts
  EXPECT_EQ(up->type, GgmlType::q4_k);
  EXPECT_EQ(up->n_bytes, 256u / 256 * 144 * 256 * 8);
  auto arch = f->require_string("general.architecture");
  ASSERT_TRUE(arch.ok());
  EXPECT_EQ(*arch, "qwen3moe");
  auto wrong = f->require_uint("general.architecture");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("general.architecture"), std::string::npos);
  EXPECT_NE(wrong.error().message.find("string"), std::string::npos);
  auto missing = f->require_uint("qwen3moe.no_such_key");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("missing"), std::string::npos);
}

}  // namespace
}  // namespace strata
