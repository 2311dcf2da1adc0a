// The weight quantizers (cpu/quantize.h) against the scalar dequantizers on fresh random data, and
// strata quantize (model/quantize_model.h): the types it picks per tensor, and a written file that
// loads and holds its tensors within each format's error.
//
// Error bounds: the RMS of (dequantize(quantize(x)) - x) over the RMS of x, on gaussian rows of
// 256-2048 elements with one outlier of 8 standard deviations per 512 (weights have them). The
// worst of 1500 seeds x 8 rows (EachFormatRoundTripsWithinItsBound prints each run's worst):
// F16 0.00026, Q8_0 0.0075, Q6_K 0.0238, Q4_K 0.0883, Q4_0 0.119, MXFP4 0.150; the bounds leave
// 40% or more over those.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "cpu/quant_traits.h"
#include "cpu/quantize.h"
#include "kernel_test_random.h"
#include "model/gguf.h"
#include "model/quantize_model.h"
#include "test_support.h"

namespace strata {
namespace {

struct Bound {
  GgmlType type;
  double max_rel_rms;
};

constexpr Bound kBounds[] = {
    {GgmlType::f16, 0.0005}, {GgmlType::q8_0, 0.014}, {GgmlType::q6_k, 0.034},
    {GgmlType::q4_k, 0.125}, {GgmlType::q4_0, 0.2},    {GgmlType::mxfp4, 0.21},
};

std::vector<float> weight_like(Rng& rng, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  const float scale = rng.uniform(0.001f, 2.0f);
  for (float& v : x) v = rng.normal() * scale;
  // outliers of a fixed size, 8 standard deviations: a gaussian times 8 made the error's tail
  // heavy (an outlier of 30 sigma set a block's scale) and a fixed bound flaky
  for (int i = 0; i < int(n / 512); ++i) x[size_t(rng.int_in(0, int(n) - 1))] = (rng.int_in(0, 1) ? 8.0f : -8.0f) * scale;
  return x;
}

std::vector<float> round_trip(GgmlType type, const std::vector<float>& x) {
  const int64_t n = int64_t(x.size());
  std::vector<uint8_t> q(ggml_row_bytes(type, uint64_t(n)));
  quantize_row(type, x.data(), q.data(), n);
  std::vector<float> y(x.size());
  quant_traits(type).dequantize_row(q.data(), y.data(), n);
  return y;
}

double rel_rms(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    e += double(y[i] - x[i]) * double(y[i] - x[i]);
    s += double(x[i]) * double(x[i]);
  }
  return std::sqrt(e / s);
}

TEST(Quantize, EachFormatRoundTripsWithinItsBound) {
  SEED_TRACE();
  Rng rng(101);
  for (const Bound& b : kBounds) {
    SCOPED_TRACE(std::string(ggml_type_name(b.type)));
    ASSERT_TRUE(can_quantize(b.type));
    double worst = 0;
    for (int rep = 0; rep < 8; ++rep) {
      const std::vector<float> x = weight_like(rng, 256 * int64_t(rng.int_in(1, 8)));
      const std::vector<float> y = round_trip(b.type, x);
      const double err = rel_rms(x, y);
      worst = std::max(worst, err);
      EXPECT_LT(err, b.max_rel_rms);
      EXPECT_GT(err, 0.0);  // every format here loses something on random floats
      for (float v : y) ASSERT_TRUE(std::isfinite(v));
    }
    std::printf("%-6s worst relative RMS error %.5f (bound %.4f)\n", std::string(ggml_type_name(b.type)).c_str(),
                worst, b.max_rel_rms);
  }
}

// More bits, less error: on the same rows Q6_K < Q4_K < Q4_0, and Q8_0 < Q6_K.
TEST(Quantize, FormatsRankByTheirBits) {
  SEED_TRACE();
  Rng rng(104);
  double e8 = 0, e6 = 0, e4k = 0, e40 = 0;
  for (int rep = 0; rep < 16; ++rep) {
    const std::vector<float> x = weight_like(rng, 2048);
    e8 += rel_rms(x, round_trip(GgmlType::q8_0, x));
    e6 += rel_rms(x, round_trip(GgmlType::q6_k, x));
    e4k += rel_rms(x, round_trip(GgmlType::q4_k, x));
    e40 += rel_rms(x, round_trip(GgmlType::q4_0, x));
  }
  EXPECT_LT(e8, e6);
  EXPECT_LT(e6, e4k);
  EXPECT_LT(e4k, e40);
}

// A row already on a format's grid comes back unchanged (quantize then dequantize is a
// projection): the scale and the codes agree with what the dequantizer reads. (The K formats
// search their scales again and may settle on another grid.)
TEST(Quantize, GridValuesAreFixedPoints) {
  SEED_TRACE();
  Rng rng(102);
  for (GgmlType type : {GgmlType::f16, GgmlType::q8_0, GgmlType::q4_0, GgmlType::mxfp4}) {
    SCOPED_TRACE(std::string(ggml_type_name(type)));
    const std::vector<float> x = weight_like(rng, 1024);
    const std::vector<float> once = round_trip(type, x);
    const std::vector<float> twice = round_trip(type, once);
    EXPECT_EQ(twice, once);
  }
}

TEST(Quantize, ZerosAndConstantsAreExact) {
  for (const Bound& b : kBounds) {
    SCOPED_TRACE(std::string(ggml_type_name(b.type)));
    const std::vector<float> zeros(512, 0.0f);
    for (float v : round_trip(b.type, zeros)) ASSERT_EQ(v, 0.0f);
    const std::vector<float> ones(512, 0.5f);  // a power of two: every format represents it
    for (float v : round_trip(b.type, ones)) ASSERT_NEAR(v, 0.5f, 1e-3f);
  }
}

// The mixes pick llama-quantize's types by tensor name.
TEST(Quantize, MixesPickTypesByTensor) {
  // A header-only file with a qwen3moe-like set of tensors, 8 layers.
  GgufWriter w;
  w.set("general.architecture", GgufValue::make_string("qwen3moe"));
  w.set("qwen3moe.block_count", GgufValue::make_u32(8));
  w.add_tensor("token_embd.weight", GgmlType::f32, {256, 1024});
  w.add_tensor("output_norm.weight", GgmlType::f32, {256});
  for (int il = 0; il < 8; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    w.add_tensor(b + "attn_v.weight", GgmlType::f32, {256, 128});
    w.add_tensor(b + "attn_q.weight", GgmlType::f32, {256, 256});
    w.add_tensor(b + "ffn_gate_inp.weight", GgmlType::f32, {256, 8});
    w.add_tensor(b + "ffn_down_exps.weight", GgmlType::f32, {256, 256, 8});
    w.add_tensor(b + "ffn_up_exps.weight", GgmlType::f32, {256, 256, 8});
  }
  w.add_tensor("blk.0.odd_rows.weight", GgmlType::f32, {80, 64});  // rows of 80: only F16 fits
  const std::vector<uint8_t> header = w.header_bytes();
  auto f = GgufFile::parse_header(header, w.file_size(), "mix");
  ASSERT_TRUE(f) << f.error().message;
  auto type = [&](const char* name, QuantMix mix) { return quantized_type(*f, *f->find_tensor(name), mix); };

  EXPECT_EQ(type("output_norm.weight", QuantMix::q4_k_m), GgmlType::f32);
  EXPECT_EQ(type("blk.3.ffn_gate_inp.weight", QuantMix::q4_0), GgmlType::f32);  // the router stays
  EXPECT_EQ(type("token_embd.weight", QuantMix::q4_k_m), GgmlType::q6_k);  // tied: it is the head
  EXPECT_EQ(type("token_embd.weight", QuantMix::q8_0), GgmlType::q8_0);
  EXPECT_EQ(type("blk.3.attn_q.weight", QuantMix::q4_k_m), GgmlType::q4_k);
  // use_more_bits(i, 8): layers 0 and 7, and every third from 1 + 2
  EXPECT_EQ(type("blk.0.attn_v.weight", QuantMix::q4_k_m), GgmlType::q6_k);
  EXPECT_EQ(type("blk.1.attn_v.weight", QuantMix::q4_k_m), GgmlType::q4_k);
  EXPECT_EQ(type("blk.3.ffn_down_exps.weight", QuantMix::q4_k_m), GgmlType::q6_k);
  EXPECT_EQ(type("blk.7.ffn_down_exps.weight", QuantMix::q4_k_m), GgmlType::q6_k);
  EXPECT_EQ(type("blk.4.ffn_down_exps.weight", QuantMix::q4_k_m), GgmlType::q4_k);
  EXPECT_EQ(type("blk.4.ffn_up_exps.weight", QuantMix::mxfp4_moe), GgmlType::mxfp4);
  EXPECT_EQ(type("blk.4.attn_q.weight", QuantMix::mxfp4_moe), GgmlType::q8_0);
  EXPECT_EQ(type("blk.4.attn_q.weight", QuantMix::f16), GgmlType::f16);
  EXPECT_EQ(type("blk.0.odd_rows.weight", QuantMix::q4_k_m), GgmlType::f16);  // falls back
  EXPECT_EQ(type("blk.0.odd_rows.weight", QuantMix::q8_0), GgmlType::f16);

  EXPECT_EQ(quant_mix_from_name("q4_k_m"), QuantMix::q4_k_m);
  EXPECT_EQ(quant_mix_from_name("MXFP4_MOE"), QuantMix::mxfp4_moe);
  EXPECT_FALSE(quant_mix_from_name("q4_k_s"));
}

// A float file quantized end to end: metadata copied, file type set, each tensor within its bound.
TEST(Quantize, WritesAFileThatHoldsTheTensors) {
  SEED_TRACE();
  Rng rng(103);
  GgufWriter w;
  w.set("general.architecture", GgufValue::make_string("qwen3moe"));
  w.set("general.name", GgufValue::make_string("quantize-test"));
  w.set("qwen3moe.block_count", GgufValue::make_u32(1));
  std::vector<std::vector<float>> data;
  const std::vector<std::pair<std::string, std::vector<uint64_t>>> tensors = {
      {"token_embd.weight", {256, 64}}, {"output_norm.weight", {256}}, {"blk.0.attn_q.weight", {256, 32}},
      {"blk.0.ffn_up_exps.weight", {256, 16, 4}}};
  for (const auto& [name, ne] : tensors) {
    w.add_tensor(name, GgmlType::f32, ne);
    uint64_t n = 1;
    for (uint64_t d : ne) n *= d;
    data.push_back(weight_like(rng, int64_t(n)));
  }
  std::vector<std::vector<uint8_t>> bytes;
  for (const auto& d : data)
    bytes.emplace_back(reinterpret_cast<const uint8_t*>(d.data()), reinterpret_cast<const uint8_t*>(d.data() + d.size()));
  const auto dir = test::scratch_dir("quantize_file");
  test::write_file(dir / "f32.gguf", w.write_memory(bytes));
  auto in = GgufFile::open((dir / "f32.gguf").string());
  ASSERT_TRUE(in) << in.error().message;

  for (QuantMix mix : {QuantMix::q8_0, QuantMix::q4_k_m, QuantMix::mxfp4_moe}) {
    SCOPED_TRACE(std::string(quant_mix_name(mix)));
    const auto out_path = dir / "out.gguf";
    uint64_t last_done = 0;
    ASSERT_TRUE(quantize_gguf(*in, out_path.string(), mix, [&](uint64_t done, uint64_t) { last_done = done; }));
    uint64_t total = 0;
    for (const GgufTensorInfo& t : in->tensors()) total += t.n_bytes;
    EXPECT_EQ(last_done, total);
    auto out = GgufFile::open(out_path.string());
    ASSERT_TRUE(out) << out.error().message;
    EXPECT_EQ(*out->get_string("general.name").value(), "quantize-test");
    EXPECT_TRUE(out->get_uint("general.file_type").value().has_value());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const GgufTensorInfo* t = out->find_tensor(tensors[i].first);
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t->type, quantized_type(*in, *in->find_tensor(t->name), mix));
      std::vector<float> y(data[i].size());
      const int64_t row = int64_t(t->ne[0]);
      for (int64_t r = 0; r < int64_t(y.size()) / row; ++r)
        quant_traits(t->type).dequantize_row(out->tensor_data(*t).data() + uint64_t(r) * t->row_bytes(),
                                             y.data() + r * row, row);
      double bound = 0;
      for (const Bound& b : kBounds) {
        if (b.type == t->type) bound = b.max_rel_rms;
      }
      if (t->type == GgmlType::f32)
        EXPECT_EQ(y, data[i]);
      else
        EXPECT_LT(rel_rms(data[i], y), bound) << t->name;
    }
  }
  // a path that cannot be written is an error, not a partial file
  EXPECT_FALSE(quantize_gguf(*in, (dir / "no-such-dir" / "x.gguf").string(), QuantMix::q8_0));
}

// The command's one-line errors: an unknown mix, a missing input, the input as the output.
TEST(Quantize, CommandErrorsAreOneLine) {
  const std::string model = (test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf").string();
  const auto dir = test::scratch_dir("quantize_cli");
  std::string out;
  EXPECT_EQ(test::run_cli("quantize \"" + model + "\" \"" + (dir / "x.gguf").string() + "\" Q4_K_S", &out), 2);
  EXPECT_NE(out.find("unknown type 'Q4_K_S'"), std::string::npos) << out;
  EXPECT_EQ(test::run_cli("quantize \"" + (dir / "none.gguf").string() + "\" \"" + (dir / "x.gguf").string() + "\" Q8_0", &out), 1);
  EXPECT_NE(out.find("none.gguf"), std::string::npos) << out;
  EXPECT_EQ(test::run_cli("quantize \"" + model + "\" \"" + model + "\" Q8_0", &out), 2);
  EXPECT_NE(out.find("is the input"), std::string::npos) << out;
  // a quantized input works, with a warning that its errors add up
  ASSERT_EQ(test::run_cli("quantize \"" + model + "\" \"" + (dir / "q8.gguf").string() + "\" Q8_0", &out), 0) << out;
  EXPECT_NE(out.find("warning"), std::string::npos) << out;
  EXPECT_NE(out.find("q4_K -> q8_0"), std::string::npos) << out;
}

}  // namespace
}  // namespace strata
