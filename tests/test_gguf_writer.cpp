#include <gtest/gtest.h>

#include <random>

#include "model/gguf.h"
#include "test_support.h"

namespace strata {
namespace {

bool same_value(const GgufValue& a, const GgufValue& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case GgufType::string: return a.str == b.str;
    case GgufType::f32: case GgufType::f64: return a.f == b.f;
    case GgufType::array:
      if (a.elem_type != b.elem_type || a.elems.size() != b.elems.size()) return false;
      for (size_t k = 0; k < a.elems.size(); ++k)
        if (!same_value(a.elems[k], b.elems[k])) return false;
      return true;
    default: return a.u == b.u && a.i == b.i;
  }
}

GgufValue scalar(GgufType t, int64_t v) {
  GgufValue x;
  x.type = t;
  if (t == GgufType::f32 || t == GgufType::f64) x.f = double(v) + 0.25;
  else if (t == GgufType::i8 || t == GgufType::i16 || t == GgufType::i32 || t == GgufType::i64) x.i = -v;
  else if (t == GgufType::boolean) x.u = v & 1;
  else x.u = uint64_t(v);
  return x;
}

TEST(GgufWriter, RoundTripEveryValueTypeAndNestedArrays) {
  GgufWriter w;
  const GgufType scalars[] = {GgufType::u8,  GgufType::i8,  GgufType::u16, GgufType::i16,
                              GgufType::u32, GgufType::i32, GgufType::f32, GgufType::boolean,
                              GgufType::u64, GgufType::i64, GgufType::f64};
  int k = 0;
  for (GgufType t : scalars) {
    w.set(strfmt("test.scalar.%s", gguf_type_name(t).data()), scalar(t, 100 + k++));
    std::vector<GgufValue> elems;
    for (int j = 0; j < 5; ++j) elems.push_back(scalar(t, j + 1));
    w.set(strfmt("test.array.%s", gguf_type_name(t).data()), GgufValue::make_array(t, elems));
  }
  w.set("test.string", GgufValue::make_string("héllo\nwörld"));
  w.set("test.empty_string", GgufValue::make_string(""));
  w.set("test.strings", GgufValue::make_string_array({"a", "", "ccc"}));
  w.set("test.empty_array", GgufValue::make_array(GgufType::u32, {}));
  // [[1, 2], [3]] and an array of arrays of strings
  w.set("test.nested", GgufValue::make_array(
                           GgufType::array, {GgufValue::make_i32_array({1, 2}), GgufValue::make_i32_array({3})}));
  w.set("test.nested_strings",
        GgufValue::make_array(GgufType::array, {GgufValue::make_string_array({"x", "yy"})}));

  // tensors of several types and ranks, with random bytes
  std::mt19937_64 rng(7);
  struct Spec {
    const char* name;
    GgmlType type;
    std::vector<uint64_t> ne;
  };
  const Spec specs[] = {{"t.f32", GgmlType::f32, {3}},
                        {"t.q4k", GgmlType::q4_k, {512, 3}},
                        {"t.q8", GgmlType::q8_0, {64, 2, 5}},
                        {"t.mxfp4", GgmlType::mxfp4, {32, 1, 2, 3}},
                        {"t.i32", GgmlType::i32, {7}}};
  std::vector<std::vector<uint8_t>> data;
  for (const Spec& s : specs) {
    size_t idx = w.add_tensor(s.name, s.type, s.ne);
    std::vector<uint8_t> d(w.tensors()[idx].n_bytes);
    for (auto& b : d) b = uint8_t(rng());
    data.push_back(std::move(d));
  }
  std::vector<uint8_t> bytes = w.write_memory(data);
  EXPECT_EQ(bytes.size(), w.file_size());

  auto f = GgufFile::parse(bytes, "roundtrip");
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->version(), 3u);
  ASSERT_EQ(f->kvs().size(), 2 * std::size(scalars) + 6);
  // the parsed metadata equals what was written, key by key and in order
  GgufWriter again;
  for (const GgufKv& kv : f->kvs()) again.set(kv.key, kv.value);
  for (size_t j = 0; j < f->kvs().size(); ++j) {
    const GgufValue* v = f->find(f->kvs()[j].key);
    ASSERT_NE(v, nullptr);
    EXPECT_TRUE(same_value(*v, f->kvs()[j].value));
  }
  const GgufValue* nested = f->find("test.nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->elems.size(), 2u);
  EXPECT_EQ(nested->elems[0].elems[1].i, 2);
  EXPECT_EQ(nested->elems[1].elems[0].i, 3);
  EXPECT_EQ(f->find("test.string")->str, "héllo\nwörld");
  EXPECT_DOUBLE_EQ(f->find("test.scalar.f32")->f, 106.25);
  EXPECT_EQ(f->find("test.scalar.i64")->i, -109);

  ASSERT_EQ(f->tensors().size(), std::size(specs));
  for (size_t j = 0; j < std::size(specs); ++j) {
    const GgufTensorInfo& t = f->tensors()[j];
    EXPECT_EQ(t.name, specs[j].name);
    EXPECT_EQ(t.type, specs[j].type);
    EXPECT_EQ(size_t(t.n_dims), specs[j].ne.size());
    auto got = f->tensor_data(t);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data[j].begin(), data[j].end())) << t.name;
  }
}

TEST(GgufWriter, WriteFileStreamsChunksAndReadsBack) {
  GgufWriter w;
  w.set("general.architecture", GgufValue::make_string("test"));
  // 3 tensors, one larger than a chunk of the memory writer (1 MiB), filled by position so any
  // chunking mistake shows up as a wrong byte
  w.add_tensor("a", GgmlType::f32, {5});
  w.add_tensor("big", GgmlType::q8_0, {4096, 300});
  w.add_tensor("c", GgmlType::f16, {33});
  auto pattern = [](size_t idx, uint64_t pos) { return uint8_t((pos * 131 + idx * 17) >> 3); };
  auto fill = [&](size_t idx, uint64_t off, std::span<uint8_t> out) {
    for (size_t j = 0; j < out.size(); ++j) out[j] = pattern(idx, off + j);
  };
  auto path = test::scratch_dir("writer") / "streamed.gguf";
  uint64_t last_progress = 0;
  Status st = w.write_file(path.string(), fill, [&](uint64_t done, uint64_t total) {
    EXPECT_LE(done, total);
    last_progress = done;
  });
  ASSERT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(last_progress, w.file_size());
  auto f = GgufFile::open(path.string());
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->file_size(), w.file_size());
  EXPECT_EQ(f->file_size() % 32, 0u);  // the last tensor is padded like ggml pads it
  for (size_t idx = 0; idx < 3; ++idx) {
    auto d = f->tensor_data(f->tensors()[idx]);
    for (size_t j = 0; j < d.size(); ++j) ASSERT_EQ(d[j], pattern(idx, j)) << idx << " " << j;
  }
  // the memory writer produces the same bytes
  auto mem = w.write_memory(fill);
  auto disk = test::read_file(path);
  EXPECT_EQ(mem, disk);
}

TEST(GgufWriter, UnwritablePathIsAnError) {
  GgufWriter w;
  w.add_tensor("a", GgmlType::f32, {4});
  Status st = w.write_file("/nonexistent-dir/x.gguf", [](size_t, uint64_t, std::span<uint8_t> o) {
    std::fill(o.begin(), o.end(), 1);
  });
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("/nonexistent-dir/x.gguf: cannot create"), std::string::npos);
}

// Rewriting a file llama.cpp wrote, from what the reader parsed, gives the same bytes: the writer
// lays out headers, values, tensor infos, alignment and padding exactly as ggml does.
void expect_byte_identical_rewrite(const std::filesystem::path& model) {
  SCOPED_TRACE(model.string());
  auto f = GgufFile::open(model.string());
  ASSERT_TRUE(f.ok()) << f.error().message;
  GgufWriter w;
  for (const GgufKv& kv : f->kvs()) w.set(kv.key, kv.value);
  for (const GgufTensorInfo& t : f->tensors()) {
    w.add_tensor(t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims));
  }
  auto bytes = w.write_memory([&](size_t idx, uint64_t off, std::span<uint8_t> out) {
    auto src = f->tensor_data(f->tensors()[idx]);
    std::copy_n(src.begin() + off, out.size(), out.begin());
  });
  auto original = test::read_file(model);
  ASSERT_EQ(bytes.size(), original.size());
  EXPECT_TRUE(bytes == original);
}

TEST(GgufWriter, ReproducesVendoredLlamaCppFileByteForByte) {
  expect_byte_identical_rewrite(test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf");
}

TEST(GgufWriter, ReproducesEveryFixtureByteForByte) {
  auto models = test::fixture_models();
  if (models.empty()) GTEST_SKIP() << "../shared/fixtures not found";
  for (const auto& m : models) expect_byte_identical_rewrite(m);
}

}  // namespace
}  // namespace strata
