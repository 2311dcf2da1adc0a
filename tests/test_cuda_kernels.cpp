// The CUDA kernels (gpu/cuda_kernels.h) and the CUDA backend (gpu/cuda_backend.h) against the CPU,
// on fresh random data:
//  - the matmul per format against a double-precision dot of the dequantized weights: every value
//    within 1e-5 of sum |w x| (float accumulation in another order);
//  - each backend op against CpuBackend's on the exact path: rms_norm 1e-5, rope 5e-4 (the angle
//    as pos * scale^i against the CPU's running product; positions up to 300), attention (GQA and
//    MLA) and the FFN 1e-4 relative (another summation order, float against half caches);
//  - whole models: logits on the CUDA backend against the fixtures' exact logits, within the
//    fixtures README's bounds for the quantized path;
//  - the CUDA device of the GPU tier (gpu/cuda_device.h): copies through its pinned staging ring
//    land whole and in order with events; the gather / scatter kernels of the experts' rows; the
//    tier's routed experts on the GPU against the CPU-only path (the GPU's experts take float
//    activations where the CPU quantizes them to 8 bits: the same bounds as above).
// Everything but the first test skips, saying so, where no CUDA device is usable (every CPU-only
// machine: scripts/gpu-check.sh runs them on a GPU host).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpu/fp16.h"
#include "cpu/quant_traits.h"
#include "engine/engine.h"
#include "engine/session.h"
#include "gpu/cuda_backend.h"
#include "gpu/cuda_device.h"
#include "engine/gpu_tier.h"
#include "gpu/cuda_kernels.h"
#include "gpu/gpu_devices.h"
#include "model/blocks.h"
#include "test_support.h"

namespace strata {
namespace {

#define SKIP_WITHOUT_DEVICE()                                                                     \
  do {                                                                                            \
    if (!gpu::cuda_usable()) {                                                                    \
      const GpuDevices d = list_gpu_devices();                                                    \
      GTEST_SKIP() << "no usable CUDA device (" << (d.error.empty() ? "not built with CUDA" : d.error) \
                   << "): checked by scripts/gpu-check.sh on a GPU host";                         \
    }                                                                                             \
  } while (0)

TEST(CudaKernels, WithoutADeviceEverythingSaysSo) {
  if (gpu::cuda_usable()) GTEST_SKIP() << "a CUDA device is usable here";
  const GpuDevices d = list_gpu_devices();
  auto be = CudaBackend::create(1 << 20);
  ASSERT_FALSE(be.ok());
  if (!d.built_with_cuda) {
    EXPECT_NE(be.error().message.find("without the CUDA library"), std::string::npos) << be.error().message;
    auto p = gpu::device_alloc(64);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.error().message.find("without the CUDA library"), std::string::npos);
    const Status st = gpu::cuda_matmul(GgmlType::f32, nullptr, 1, 1, 4, nullptr, 1, nullptr);
    ASSERT_FALSE(st.ok());
    EXPECT_FALSE(gpu::cuda_has_matmul(GgmlType::q4_k));
    EXPECT_FALSE(gpu::stream_create().ok());
    EXPECT_FALSE(gpu::event_create().ok());
    EXPECT_FALSE(gpu::pinned_alloc(64).ok());
  } else {
    EXPECT_NE(be.error().message.find("no usable CUDA device"), std::string::npos) << be.error().message;
  }
  auto dev = gpu::CudaDevice::create(uint64_t(1) << 30);
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.error().message.find("no usable CUDA device"), std::string::npos) << dev.error().message;
  std::vector<uint8_t> bytes;
  auto loaded = test::synth_q8_model("tiny", bytes);
  ASSERT_TRUE(loaded);
  Engine engine(std::move(loaded));
  Model* m = &engine.model();
  auto tier = GpuTier::create_cuda(*m, {.vram_bytes = uint64_t(1) << 30});
  ASSERT_FALSE(tier.ok());
  EXPECT_NE(tier.error().message.find("no usable CUDA device"), std::string::npos) << tier.error().message;
}

// rows x cols random weights of `type` in the file's layout (random blocks with sane scales where
// the type has no quantizer).
std::vector<uint8_t> random_weights(std::mt19937& rng, GgmlType type, int64_t rows, int64_t cols) {
  std::normal_distribution<float> nd;
  const QuantTraits& t = quant_traits(type);
  const size_t row_bytes = ggml_row_bytes(type, cols);
  std::vector<uint8_t> w(size_t(rows) * row_bytes);
  std::vector<float> wf(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = &w[size_t(r) * row_bytes];
    if (type == GgmlType::mxfp4) {
      for (size_t b = 0; b < row_bytes; b += 17) {
        row[b] = uint8_t(120 + rng() % 12);
        for (int i = 1; i < 17; ++i) row[b + size_t(i)] = uint8_t(rng());
      }
    } else if (type == GgmlType::q6_k) {  // no quantizer: random blocks, a small finite d
      for (size_t b = 0; b < row_bytes; b += 210) {
        for (int i = 0; i < 208; ++i) row[b + size_t(i)] = uint8_t(rng());
        const uint16_t d = f32_to_fp16(0.001f + 0.004f * float(rng() % 100) / 100);
        std::memcpy(row + b + 208, &d, 2);
      }
    } else if (type == GgmlType::q4_k) {  // no quantizer: small finite d and dmin
      for (size_t b = 0; b < row_bytes; b += 144) {
        for (int i = 4; i < 144; ++i) row[b + size_t(i)] = uint8_t(rng());
        const uint16_t d = f32_to_fp16(0.002f + 0.01f * float(rng() % 100) / 100), dmin = f32_to_fp16(0.004f);
        std::memcpy(row + b, &d, 2);
        std::memcpy(row + b + 2, &dmin, 2);
      }
    } else {
      EXPECT_NE(t.from_float, nullptr) << ggml_type_name(type);
      for (float& v : wf) v = nd(rng);
      t.from_float(wf.data(), row, cols);
    }
  }
  return w;
}

// Device copies that free themselves.
struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) {
    auto r = gpu::device_alloc(bytes);
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (r) p = *r;
  }
  ~Dev() { gpu::device_free(p); }
  float* f() const { return static_cast<float*>(p); }
};

TEST(CudaKernels, MatmulMatchesTheCpuReferencePerFormat) {
  SKIP_WITHOUT_DEVICE();
  std::printf("  large batches: %s\n", gpu::cuda_gemm_library().c_str());
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const int64_t rows = 37, cols = 1024;
  for (GgmlType type :
       {GgmlType::f32, GgmlType::bf16, GgmlType::q8_0, GgmlType::q4_k, GgmlType::q6_k, GgmlType::mxfp4}) {
    // one token, a batch that is not a multiple of the kernel's 8, and one for cuBLAS (when loaded)
    for (int64_t n_tok : {1, 11, 70}) {
      SCOPED_TRACE(std::string(ggml_type_name(type)) + " tokens " + std::to_string(n_tok));
      ASSERT_TRUE(gpu::cuda_has_matmul(type));
      const size_t row_bytes = ggml_row_bytes(type, cols);
      const std::vector<uint8_t> w = random_weights(rng, type, rows, cols);
      std::vector<float> x(size_t(n_tok * cols));
      for (float& v : x) v = nd(rng);
      std::vector<float> y(size_t(n_tok * rows), NAN);
      Dev dw(w.size()), dx(x.size() * 4), dy(y.size() * 4);
      ASSERT_TRUE(gpu::copy_to_device(dw.p, w.data(), w.size()).ok());
      ASSERT_TRUE(gpu::copy_to_device(dx.p, x.data(), x.size() * 4).ok());
      const Status st = gpu::cuda_matmul(type, static_cast<const uint8_t*>(dw.p), rows, cols, row_bytes, dx.f(), n_tok,
                                         dy.f());
      ASSERT_TRUE(st.ok()) << st.error().message;
      ASSERT_TRUE(gpu::copy_to_host(y.data(), dy.p, y.size() * 4).ok());
      std::vector<float> wf(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        quant_traits(type).dequantize_row(&w[size_t(r) * row_bytes], wf.data(), cols);
        for (int64_t t = 0; t < n_tok; ++t) {
          double ref = 0, mag = 0;
          for (int64_t k = 0; k < cols; ++k) {
            ref += double(wf[size_t(k)]) * x[size_t(t * cols + k)];
            mag += std::fabs(double(wf[size_t(k)]) * x[size_t(t * cols + k)]);
          }
          EXPECT_NEAR(y[size_t(t * rows + r)], ref, 1e-5 * mag + 1e-6) << "row " << r << " token " << t;
        }
      }
    }
  }
}

void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double rel, const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  double mag = 0;
  for (float v : ref) mag = std::max(mag, double(std::fabs(v)));
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i)
    if (!(std::fabs(got[i] - ref[i]) <= rel * mag + 1e-6)) {
      ADD_FAILURE() << what << " [" << i << "]: " << got[i] << " vs " << ref[i] << " (max |ref| " << mag << ")";
      ++bad;
    }
}

std::vector<float> randn(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}


TEST(CudaBackend, OpsMatchTheCpuBackend) {
  SKIP_WITHOUT_DEVICE();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  // a backend per section, made after the host data it copies (it knows weights by address) and
  // gone before them; every op here has a device kernel and fits the budget
  auto device = [] {
    auto be = CudaBackend::create(uint64_t(1) << 30, cpu::MatmulPath::exact);
    EXPECT_TRUE(be.ok()) << be.error().message;
    return be ? std::move(*be) : nullptr;
  };
  auto all_on_device = [](const CudaBackend& be) {
    const CudaBackend::Stats st = be.stats();
    EXPECT_TRUE(st.error.empty()) << st.error;
    EXPECT_EQ(st.host_ops, 0);
    EXPECT_GT(st.device_ops, 0);
  };
  const CpuBackend c(cpu::MatmulPath::exact);

  // rms_norm, with and without a weight
  {
    const int64_t n_tok = 5, n = 384;
    const std::vector<float> x = randn(rng, size_t(n_tok * n)), wv = randn(rng, size_t(n));
    const Weight w = Weight::f32(wv.data(), n);
    const auto be = device();
    ASSERT_NE(be, nullptr);
    const CudaBackend& g = *be;
    std::vector<float> a(x.size()), b(x.size());
    g.rms_norm_rows(x.data(), w, n_tok, n, 1e-6f, a.data());
    c.rms_norm_rows(x.data(), w, n_tok, n, 1e-6f, b.data());
    expect_close(a, b, 1e-5, "rms_norm");
    g.rms_norm_rows(x.data(), Weight{}, n_tok, n, 1e-6f, a.data());
    c.rms_norm_rows(x.data(), Weight{}, n_tok, n, 1e-6f, b.data());
    expect_close(a, b, 1e-5, "rms_norm without a weight");
    all_on_device(g);
  }
  // rope: NEOX, NORM, YaRN, partial rotation
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE("rope variant " + std::to_string(variant));
    cpu::RopeParams p;
    const int n_head = 4, head_dim = 64;
    p.kind = variant == 1 ? cpu::RopeKind::norm : cpu::RopeKind::neox;
    p.n_rot = variant == 3 ? 32 : head_dim;
    p.freq_base = 10000.0f;
    if (variant == 2) {
      p.factor = 4.0f, p.n_ctx_orig = 4096, p.ext_factor = 1.0f;
      p.freq_base = 150000.0f;
    }
    const int64_t n_tok = 7, pos0 = 293;
    std::vector<float> a = randn(rng, size_t(n_tok * n_head * head_dim)), b = a;
    const auto be = device();
    ASSERT_NE(be, nullptr);
    const CudaBackend& g = *be;
    g.rope(a.data(), n_tok, n_head, head_dim, pos0, p);
    c.rope(b.data(), n_tok, n_head, head_dim, pos0, p);
    expect_close(a, b, 5e-4, "rope");
    all_on_device(g);
  }
  // attention: float and half caches, GQA groups, a window, sinks
  for (KvType type : {KvType::f32, KvType::f16})
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE(std::string(type == KvType::f16 ? "half" : "float") + " attention variant " +
                   std::to_string(variant));
      // variant 3: 128-wide heads in groups of 2 (every lane holds 4 output values)
      const int H = variant == 3 ? 4 : 8, HKV = 2, DK = variant == 3 ? 128 : 64, DV = DK, ctx = 100;
      const int64_t pos0 = 70, n_tok = variant == 1 ? 1 : 9;
      KvCache cache;
      cache.init_key_blocks(2, ctx, HKV, DK, HKV * DV, type);
      std::normal_distribution<float> nd;
      for (int64_t pos = 0; pos < pos0 + n_tok; ++pos)
        for (int hk = 0; hk < HKV; ++hk) {
          const int64_t kb = KvCache::kKeyBlock;
          for (int d = 0; d < DK; ++d) {
            if (type == KvType::f16) cache.k_block16(1, hk, pos / kb)[d * kb + pos % kb] = f32_to_fp16(nd(rng));
            else cache.k_block(1, hk, pos / kb)[d * kb + pos % kb] = nd(rng);
          }
          for (int d = 0; d < DV; ++d) {
            if (type == KvType::f16) cache.v_head16(1, hk)[pos * DV + d] = f32_to_fp16(nd(rng));
            else cache.v_head(1, hk)[pos * DV + d] = nd(rng);
          }
        }
      const std::vector<float> sinks = randn(rng, H), q = randn(rng, size_t(n_tok * H * DK));
      const AttentionParams p{.n_head = H,
                              .n_head_kv = HKV,
                              .head_dim_k = DK,
                              .head_dim_v = DV,
                              .scale = 0.125f,
                              .n_swa = variant == 2 ? 16 : 0,
                              .sinks = variant == 2 ? sinks.data() : nullptr};
      std::vector<float> a(size_t(n_tok * H * DV)), b(a.size());
      const auto be = device();
      ASSERT_NE(be, nullptr);
      const CudaBackend& g = *be;
      g.attention_gqa(p, cache, 1, q.data(), n_tok, pos0, a.data());
      c.attention_gqa(p, cache, 1, q.data(), n_tok, pos0, b.data());
      expect_close(a, b, 1e-4, "attention");
      all_on_device(g);
    }
  // MLA's core: latent rows of 64 + 16 values, 4 heads, a decode and a block of queries
  for (int64_t n_tok : {1, 7}) {
    SCOPED_TRACE("mla, tokens " + std::to_string(n_tok));
    const int H = 4, R = 64, ROPE = 16, W = R + ROPE, ctx = 80;
    const int64_t pos0 = 50;
    KvCache cache;
    cache.init(2, ctx, W, 0);
    std::normal_distribution<float> nd;
    for (int64_t pos = 0; pos < pos0 + n_tok; ++pos)
      for (int i = 0; i < W; ++i) cache.k_row(1, pos)[i] = nd(rng);
    const std::vector<float> q = randn(rng, size_t(n_tok * H * W));
    std::vector<float> a(size_t(n_tok * H * R)), b(a.size());
    const auto be = device();
    ASSERT_NE(be, nullptr);
    const CudaBackend& g = *be;
    g.attention_mla(H, R, ROPE, 0.1f, cache, 1, q.data(), n_tok, pos0, a.data());
    c.attention_mla(H, R, ROPE, 0.1f, cache, 1, q.data(), n_tok, pos0, b.data());
    expect_close(a, b, 1e-4, "attention_mla");
    all_on_device(g);
  }
  // matmul and the SwiGLU FFN (silu; swiglu_oai with biases), Q8_0 weights, accumulate and scale
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("ffn variant " + std::to_string(variant));
    const int64_t E = 256, F = 512, n_tok = 3;
    const std::vector<uint8_t> gw = random_weights(rng, GgmlType::q8_0, F, E), uw = random_weights(rng, GgmlType::q8_0, F, E),
                               dw = random_weights(rng, GgmlType::q8_0, E, F);
    auto weight = [](const std::vector<uint8_t>& bytes, int64_t n_in, int64_t n_out) {
      Weight w;
      w.data = bytes.data();
      w.type = GgmlType::q8_0;
      w.n_in = n_in;
      w.n_out = n_out;
      w.row_bytes = ggml_row_bytes(GgmlType::q8_0, n_in);
      return w;
    };
    const Weight gate = weight(gw, E, F), up = weight(uw, E, F), down = weight(dw, F, E);
    const std::vector<float> h = randn(rng, size_t(n_tok * E)), scale = {0.5f, 1.0f, 2.0f}, gb = randn(rng, size_t(F)),
                             ub = randn(rng, size_t(F)), db = randn(rng, size_t(E));
    SwigluOptions opt;
    if (variant == 1) {
      opt.gate_b = gb.data(), opt.up_b = ub.data(), opt.down_b = db.data();
      opt.glu = {GluKind::swiglu_oai, 1.702f, 7.0f};
    } else if (variant == 2) {
      opt.glu = {GluKind::silu_clamp, 1.0f, 1.5f};  // limits that clamp
    }
    std::vector<float> a = randn(rng, size_t(n_tok * E)), b = a;
    const auto be = device();
    ASSERT_NE(be, nullptr);
    const CudaBackend& g = *be;
    g.swiglu_ffn(gate, up, down, h.data(), n_tok, scale.data(), true, a.data(), opt);
    c.swiglu_ffn(gate, up, down, h.data(), n_tok, scale.data(), true, b.data(), opt);
    expect_close(a, b, 1e-4, "swiglu_ffn");
    std::vector<float> ya(size_t(n_tok * F)), yb(ya.size());
    g.matmul(gate, h.data(), n_tok, ya.data());
    c.matmul(gate, h.data(), n_tok, yb.data());
    expect_close(ya, yb, 1e-5, "matmul");
    all_on_device(g);
  }
}

// A backend with no room for weights computes every matmul and norm on the host: the results are
// the CPU's, and the counts say so.
TEST(CudaBackend, NoRoomForWeightsMeansTheHost) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(7);
  auto be = CudaBackend::create(0, cpu::MatmulPath::exact);
  ASSERT_TRUE(be.ok()) << be.error().message;
  const CpuBackend c(cpu::MatmulPath::exact);
  const int64_t n = 256, rows = 64, n_tok = 3;
  const std::vector<float> wv = randn(rng, size_t(n * rows)), x = randn(rng, size_t(n_tok * n)), nv = randn(rng, size_t(n));
  const Weight w = Weight::f32(wv.data(), n, rows), norm = Weight::f32(nv.data(), n);
  std::vector<float> a(size_t(n_tok * rows)), b(a.size()), na(x.size()), nb(x.size());
  (*be)->matmul(w, x.data(), n_tok, a.data());
  c.matmul(w, x.data(), n_tok, b.data());
  EXPECT_EQ(a, b);
  (*be)->rms_norm_rows(x.data(), norm, n_tok, n, 1e-6f, na.data());
  c.rms_norm_rows(x.data(), norm, n_tok, n, 1e-6f, nb.data());
  EXPECT_EQ(na, nb);
  const CudaBackend::Stats st = (*be)->stats();
  EXPECT_EQ(st.host_ops, 2);
  EXPECT_EQ(st.device_ops, 0);
  EXPECT_EQ(st.weight_bytes, 0u);
  EXPECT_TRUE(st.error.empty()) << st.error;
}

// The logits of `model_path` on the CUDA backend against the fixture's exact logits, within the
// fixtures README's bounds for the quantized path; both layouts (mapped, and read into RAM with
// the rows the CPU kernels interleave).
void check_model_on_cuda(const std::filesystem::path& dir, const std::string& quant) {
  for (MappedFile::Mode mode : {MappedFile::Mode::mmap, MappedFile::Mode::ram}) {
    SCOPED_TRACE(dir.string() + " " + quant + (mode == MappedFile::Mode::ram ? " ram" : " mmap"));
    auto model = Model::load((dir / ("model-" + quant + ".gguf")).string(), mode);
    ASSERT_TRUE(model.ok()) << model.error().message;
    auto be = CudaBackend::create(uint64_t(4) << 30);
    ASSERT_TRUE(be.ok()) << be.error().message;
    const CudaBackend* cuda = be->get();
    Engine engine(std::move(*model));
    engine.set_backend(std::move(*be));
    const int V = engine.model().hparams().n_vocab;
    std::ifstream in(dir / "tokens.json");
    const auto ids = nlohmann::json::parse(in)["ids"].get<std::vector<int32_t>>();
    ASSERT_FALSE(ids.empty());
    Session s(engine, 256, cpu::MatmulPath::quantized);
    ASSERT_EQ(&s.backend(), cuda);
    auto logits = s.eval(ids, true);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    const test::LogitStats st = test::compare(*logits, test::read_f32(dir / ("logits-" + quant + ".exact.f32")), V);
    std::printf("  %s on CUDA: median rms_rel %.4f, cos>=0.99 %.0f%%, top-1 %.1f%%\n", dir.filename().c_str(),
                st.median_rms_rel, 100 * st.frac_cos_099, 100 * st.top1);
    EXPECT_LE(st.median_rms_rel, 0.05);
    EXPECT_GE(st.frac_cos_099, 0.90);
    EXPECT_GE(st.top1, 0.85);
    EXPECT_GE(st.top1_clear, 0.95);
    const CudaBackend::Stats cs = cuda->stats();
    EXPECT_TRUE(cs.error.empty()) << cs.error;
    EXPECT_GT(cs.device_ops, 0);
  }
}

TEST(CudaBackend, VendoredQwen3MoeLogits) {
  SKIP_WITHOUT_DEVICE();
  check_model_on_cuda(test::data_dir() / "models" / "qwen3moe", "Q4_K_M");
}

TEST(CudaBackend, FixtureLogitsOfEveryArchitecture) {
  SKIP_WITHOUT_DEVICE();
  const auto dir = test::fixtures_dir();
  if (!dir) GTEST_SKIP() << "../shared/fixtures not found";
  for (const char* arch : {"qwen3moe", "qwen2moe", "llama", "gpt-oss", "deepseek2", "deepseek4", "deepseek41"})
    for (const auto& entry : std::filesystem::directory_iterator(*dir / "models" / arch)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("model-", 0) != 0 || entry.path().extension() != ".gguf") continue;
      check_model_on_cuda(entry.path().parent_path(), name.substr(6, name.size() - 11));
    }
}

// The KV mirror (CudaBackend): attention copies in only the rows from pos0 on, and stays right
// across appends, a rewind that rewrites rows, a re-initialised cache and a released one.
TEST(CudaBackend, KvMirrorFollowsAppendsRewindsAndNewCaches) {
  SKIP_WITHOUT_DEVICE();
  auto be = CudaBackend::create(uint64_t(1) << 30, cpu::MatmulPath::exact);
  ASSERT_TRUE(be.ok()) << be.error().message;
  const CudaBackend& g = **be;
  const CpuBackend c(cpu::MatmulPath::exact);
  std::mt19937 rng(21);
  std::normal_distribution<float> nd;
  const int H = 4, HKV = 2, D = 64, ctx = 96;
  const int64_t kb = KvCache::kKeyBlock;
  KvCache cache;
  cache.init_key_blocks(1, ctx, HKV, D, HKV * D, KvType::f16);
  auto write = [&](int64_t from, int64_t to) {
    for (int64_t pos = from; pos < to; ++pos)
      for (int hk = 0; hk < HKV; ++hk)
        for (int d = 0; d < D; ++d) {
          cache.k_block16(0, hk, pos / kb)[d * kb + pos % kb] = f32_to_fp16(nd(rng));
          cache.v_head16(0, hk)[pos * D + d] = f32_to_fp16(nd(rng));
        }
  };
  const AttentionParams p{.n_head = H, .n_head_kv = HKV, .head_dim_k = D, .head_dim_v = D, .scale = 0.125f};
  auto check = [&](int64_t pos0, int64_t n_tok, const char* what) {
    SCOPED_TRACE(what);
    const std::vector<float> q = randn(rng, size_t(n_tok * H * D));
    std::vector<float> a(size_t(n_tok * H * D)), b(a.size());
    const uint64_t before = g.stats().h2d_bytes;
    g.attention_gqa(p, cache, 0, q.data(), n_tok, pos0, a.data());
    c.attention_gqa(p, cache, 0, q.data(), n_tok, pos0, b.data());
    expect_close(a, b, 1e-4, what);
    return g.stats().h2d_bytes - before;
  };
  write(0, 40);
  check(0, 40, "prefill");
  write(40, 41);
  // one decoded token copies its key block and value row, not the 41 rows
  // per KV head one key block (D x 32 halves) and one value row (D halves), and the query
  const uint64_t one = check(40, 1, "decode");
  EXPECT_EQ(one, uint64_t(HKV) * (uint64_t(kb) * D * 2 + D * 2) + uint64_t(H) * D * 4) << "bytes copied in";
  write(41, 46);
  check(41, 5, "a block of drafts");
  write(43, 46);  // rejected drafts: rows 43.. rewritten
  check(43, 3, "after a rewind");
  cache.init_key_blocks(1, ctx, HKV, D, HKV * D, KvType::f16);  // a new cache in the same memory
  write(0, 6);
  check(5, 1, "a new cache: its rows before pos0 copied, not taken for the old one's");
  const uint64_t mirrors = g.stats().kv_mirror_bytes;
  g.release_cache(cache);
  EXPECT_LT(g.stats().kv_mirror_bytes, mirrors) << "release frees the cache's mirror";
  write(6, 7);
  check(6, 1, "after release: the rows before pos0 copied again");
  EXPECT_TRUE(g.stats().error.empty()) << g.stats().error;
  EXPECT_GT(g.stats().device_ops, 0);
}

// The tier's CUDA device: the budget, booked and backed buffers, a copy larger than the staging
// ring (4 x 4 MiB) landing whole, ordered for the compute stream by an event.
TEST(CudaDevice, CopiesThroughTheStagingRingLandWholeAndInOrder) {
  SKIP_WITHOUT_DEVICE();
  auto dev = gpu::CudaDevice::create(uint64_t(64) << 20);
  ASSERT_TRUE(dev.ok()) << dev.error().message;
  gpu::CudaDevice& d = **dev;
  EXPECT_FALSE(d.alloc(uint64_t(65) << 20).ok());
  auto booked = d.alloc(uint64_t(1) << 20, false);
  ASSERT_TRUE(booked.ok());
  EXPECT_EQ(booked->data, nullptr);
  const uint64_t n = (uint64_t(18) << 20) + 123;
  auto buf = d.alloc(n);
  ASSERT_TRUE(buf.ok()) << buf.error().message;
  EXPECT_EQ(d.used(), n + (uint64_t(1) << 20));
  std::vector<uint8_t> src(n), back(n);
  std::mt19937 rng(5);
  for (uint8_t& b : src) b = uint8_t(rng());
  const int copy = d.new_stream(), ready = d.new_event();
  d.copy_h2d(copy, *buf, 0, src.data(), n);
  d.record_event(ready, copy);
  d.wait_event(d.compute_stream(), ready);
  const int done = d.new_event();
  d.record_event(done, d.compute_stream());
  ASSERT_TRUE(d.synchronize(done));
  EXPECT_TRUE(d.event_done(ready, copy));
  ASSERT_TRUE(gpu::copy_to_host(back.data(), buf->data, n).ok());
  EXPECT_TRUE(back == src);
  EXPECT_EQ(d.bytes_copied(), n);
  EXPECT_TRUE(d.error().empty()) << d.error();
  d.free(*buf);
  d.free(*booked);
  EXPECT_EQ(d.used(), 0u);
}

TEST(CudaKernels, GatherAndScatterAddRows) {
  SKIP_WITHOUT_DEVICE();
  const int64_t rows = 9, width = 37;
  std::vector<float> src(size_t(rows * width)), dst(src.size()), scale = {0.5f, -2.0f, 3.0f, 0.25f};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& x : src) x = u(rng);
  for (float& x : dst) x = u(rng);
  const std::vector<int32_t> idx = {7, 2, 0, 5};
  const int64_t n = int64_t(idx.size());
  auto ds = gpu::device_alloc(src.size() * 4), dd = gpu::device_alloc(dst.size() * 4), di = gpu::device_alloc(64),
       dsc = gpu::device_alloc(64), dg = gpu::device_alloc(size_t(n * width) * 4);
  ASSERT_TRUE(ds.ok() && dd.ok() && di.ok() && dsc.ok() && dg.ok());
  ASSERT_TRUE(gpu::copy_to_device(*ds, src.data(), src.size() * 4).ok());
  ASSERT_TRUE(gpu::copy_to_device(*dd, dst.data(), dst.size() * 4).ok());
  ASSERT_TRUE(gpu::copy_to_device(*di, idx.data(), idx.size() * 4).ok());
  ASSERT_TRUE(gpu::copy_to_device(*dsc, scale.data(), scale.size() * 4).ok());
  auto* g = static_cast<float*>(*dg);
  ASSERT_TRUE(gpu::cuda_gather_rows(static_cast<float*>(*ds), static_cast<int32_t*>(*di), n, width, g).ok());
  ASSERT_TRUE(gpu::cuda_scatter_add_rows(static_cast<float*>(*dd), static_cast<int32_t*>(*di),
                                         static_cast<float*>(*dsc), n, width, g).ok());
  std::vector<float> gathered(size_t(n * width)), out(dst.size());
  ASSERT_TRUE(gpu::copy_to_host(gathered.data(), g, gathered.size() * 4).ok());
  ASSERT_TRUE(gpu::copy_to_host(out.data(), *dd, out.size() * 4).ok());
  std::vector<float> want = dst;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < width; ++c) {
      EXPECT_EQ(gathered[size_t(i * width + c)], src[size_t(idx[size_t(i)] * width + c)]);
      want[size_t(idx[size_t(i)] * width + c)] += scale[size_t(i)] * src[size_t(idx[size_t(i)] * width + c)];
    }
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-6f) << i;
  for (void* p : {*ds, *dd, *di, *dsc, *dg}) gpu::device_free(p);
}

// The routers' rule on the device against route_topk on the same logits, per gating, with a
// selection bias and grouped experts (DeepSeek's 8 groups, 4 kept), and Mixtral's plain top-2:
// the same experts, weights within 1e-5 relative.
TEST(CudaKernels, RouteMatchesTheHostRule) {
  SKIP_WITHOUT_DEVICE();
  struct Case {
    Gating gating;
    int n_exp, k, n_group, n_group_used;
    bool bias, norm;
    float scale;
  };
  const Case cases[] = {{Gating::softmax, 128, 8, 1, 1, false, true, 1.0f},
                        {Gating::softmax, 8, 2, 1, 1, false, false, 1.0f},
                        {Gating::sigmoid, 256, 8, 8, 4, true, true, 2.5f},
                        {Gating::softmax_topk, 32, 4, 1, 1, false, false, 1.0f},
                        {Gating::sqrt_softplus, 64, 6, 1, 1, true, true, 1.5f}};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-4, 4);
  for (const Case& c : cases) {
    SCOPED_TRACE(int(c.gating));
    const int64_t n_tok = 13;
    std::vector<float> z(size_t(n_tok * c.n_exp)), bias(size_t(c.n_exp));
    for (float& x : z) x = u(rng);
    for (float& x : bias) x = 0.1f * u(rng);
    HParams hp;
    hp.n_expert = c.n_exp;
    hp.n_expert_used = c.k;
    hp.gating = c.gating;
    hp.n_group = c.n_group;
    hp.n_group_used = c.n_group_used;
    hp.norm_topk = c.norm;
    hp.expert_weights_scale = c.scale;
    LayerWeights l;
    if (c.bias) l.exp_probs_b = Weight::f32(bias.data(), c.n_exp);
    std::vector<int32_t> want_ids(size_t(n_tok * c.k)), got_ids(want_ids.size());
    std::vector<float> want_w(want_ids.size()), got_w(want_ids.size());
    std::vector<float> host = z;
    route_topk(hp, l, host.data(), n_tok, nullptr, want_ids.data(), want_w.data());
    const gpu::RouteArgs a = CudaBackend::route_args(hp);
    ASSERT_TRUE(gpu::cuda_route_supported(a));
    auto dz = gpu::device_alloc(z.size() * 4), db = gpu::device_alloc(bias.size() * 4),
         di = gpu::device_alloc(got_ids.size() * 4), dw = gpu::device_alloc(got_w.size() * 4);
    ASSERT_TRUE(dz.ok() && db.ok() && di.ok() && dw.ok());
    ASSERT_TRUE(gpu::copy_to_device(*dz, z.data(), z.size() * 4).ok());
    ASSERT_TRUE(gpu::copy_to_device(*db, bias.data(), bias.size() * 4).ok());
    ASSERT_TRUE(gpu::cuda_route(a, static_cast<float*>(*dz), c.bias ? static_cast<float*>(*db) : nullptr, n_tok,
                                static_cast<int32_t*>(*di), static_cast<float*>(*dw))
                    .ok());
    ASSERT_TRUE(gpu::copy_to_host(got_ids.data(), *di, got_ids.size() * 4).ok());
    ASSERT_TRUE(gpu::copy_to_host(got_w.data(), *dw, got_w.size() * 4).ok());
    EXPECT_EQ(got_ids, want_ids);
    for (size_t i = 0; i < got_w.size(); ++i) EXPECT_NEAR(got_w[i], want_w[i], 1e-5f * std::fabs(want_w[i]) + 1e-7f) << i;
    for (void* p : {*dz, *db, *di, *dw}) gpu::device_free(p);
  }
  gpu::RouteArgs too_many;
  too_many.n_exp = 2048;
  too_many.k = 8;
  EXPECT_FALSE(gpu::cuda_route_supported(too_many));
}

// The GPU tier on the CUDA device: a third of the experts fit in VRAM; decoding fills the slots,
// those experts run on the GPU while the CPU computes the rest, and the logits stay within the
// bounds of the quantized path of the CPU-only run.
class GpuTierCudaArch : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuTierCudaArch, RoutedExpertsOnTheGpuMatchTheCpuOnlyPath) {
  SKIP_WITHOUT_DEVICE();
  std::vector<uint8_t> bytes;
  auto loaded = test::synth_q8_model(GetParam(), bytes);
  ASSERT_TRUE(loaded);
  Engine engine(std::move(loaded));
  Model* m = &engine.model();
  const int V = m->hparams().n_vocab;
  const std::vector<int32_t> ids = test::random_ids(48, 3, V);
  auto decode = [&](std::vector<float>& all) {
    Session s(engine, 64);
    auto first = s.eval(std::span<const int32_t>(ids.data(), 16), true);  // a prefill: busy experts may ship
    ASSERT_TRUE(first.ok()) << first.error().message;
    all = *first;
    for (size_t i = 16; i < ids.size(); ++i) {
      auto l = s.eval(std::span<const int32_t>(&ids[i], 1));
      ASSERT_TRUE(l.ok());
      all.insert(all.end(), l->begin(), l->end());
    }
  };
  std::vector<float> cpu, gpu;
  decode(cpu);
  const int n_moe = int(std::count_if(m->layers.begin(), m->layers.end(), [](const LayerWeights& l) { return l.is_moe(); }));
  GpuTier::Options o;
  // the two ship slots, and a third of the experts
  o.vram_bytes = GpuTier::arena_bytes(*m, 2 + n_moe * m->hparams().n_expert / 3);
  o.costs.cpu_gbps = 20;
  o.costs.cpu_ops = 1e12;
  o.cache.max_promotions = 64;
  auto tier = GpuTier::create_cuda(*m, o);
  ASSERT_TRUE(tier.ok()) << tier.error().message;
  engine.set_gpu_tier(std::move(*tier));
  decode(gpu);
  const GpuTier::Stats st = engine.gpu_tier()->stats();
  std::printf("  %s: %s\n", GetParam(), engine.gpu_tier()->summary().c_str());
  engine.set_gpu_tier(nullptr);
  ASSERT_EQ(gpu.size(), cpu.size());
  const test::LogitStats ls = test::compare(gpu, cpu, V);
  EXPECT_LE(ls.median_rms_rel, 0.05);
  EXPECT_GE(ls.frac_cos_099, 0.90);
  EXPECT_GE(ls.top1, 0.85);
  EXPECT_GT(st.gpu_uses, 0u);
  EXPECT_GT(st.cpu_uses, 0u);
  EXPECT_GT(st.promotions, 0u);
  EXPECT_EQ(st.stalls, 0u);
}

INSTANTIATE_TEST_SUITE_P(Archs, GpuTierCudaArch,
                         ::testing::Values("tiny", "tiny-deepseek2", "tiny-gpt-oss", "tiny-mixtral", "tiny-deepseek4",
                                           "tiny-deepseek41"));

}  // namespace
}  // namespace strata
