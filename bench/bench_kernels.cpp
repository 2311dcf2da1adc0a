// Kernel benchmarks of issue #4 on the compute pool (cpu/thread_pool.h), the way the forward pass
// runs them:
//  - BM_expert_ffn: the fused expert FFN (moe_ffn) of one MoE layer of qwen3-30b-a3b's shape (128
//    experts of 2048 -> 768 -> 2048, 8 active per token), experts drawn at random from a stack far
//    larger than the caches. One token (decode), or /tokens:N: a speculative verification step of
//    N tokens routed independently, whose bytes are the union of their experts (tokens:512: a
//    prefill batch, with GOPs and peak_frac of the int8 probe as BM_gemm). Counters GBps
//    (expert bytes read per second), bw_frac (GBps / the mean of DRAM read probes taken along the
//    timed loop, bench_common.h DramTracker) and experts (the union's mean size).
//  - BM_gemm: prefill matmuls, W [n_out][n_in] times a batch of 8, 64 or 512 activation rows,
//    through Matmul::matmul (activations quantized once, row chunks as pool tasks, the tile
//    kernel of the start-up ISA). Counters GFLOPs (2 n_in n_out batch per second) and peak_frac
//    (of the int8 peak calibrate.h measures).
//  - BM_onednn_matmul (when built with oneDNN): the same shapes in f32 and bf16 through oneDNN's
//    matmul primitive, for the comparison of issue #4 item 6, with the weights in oneDNN's own
//    packed layout and in the file's (rows contiguous).
//
//  - BM_attention_decode: one decoded token's GQA attention (attention_gqa) over qwen3-30b-a3b's
//    heads (32 query heads in 4 kv heads of 128 dims) after D tokens of context, per KV entry
//    type, over 12 layers' caches used in turn (the bytes of 12 layers exceed the caches of the
//    CPU at depth 4096). Counters GBps (cache bytes read per second) and bw_frac (of the DRAM probes).
//
//  - BM_attend: the decode attention kernel alone (KernelTable::attend of each supported ISA), one
//    thread, a GQA group of 8 query rows of 128 dims over 512 keys that stay in L2: the kernel's
//    compute rate without DRAM's noise. Counter ns_per_key. BM_attend/ISA/TYPE/dram: the same over
//    131072 keys (35 MB of q8_0, 67 MB of f16: past the L3), what one thread gets from DRAM.
//
//  - BM_tile/TYPE/N: the tile kernel alone on one thread, 64 weight rows x 2048 in L2 against N
//    quantized activation rows (a routed expert of pp512 sees about 32), GOPs and peak_frac of
//    the int8 loop on the same thread: the kernel's compute rate without DRAM or the pool.
//    BM_tile/TYPE/k768/N: the same with K = 768 (an expert's down projection, one panel).
//
//   build/bench/strata_bench_kernels --benchmark_filter='expert_ffn|gemm|onednn|attention|attend|tile'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "cpu/calibrate.h"
#include "cpu/kernels.h"
#include "cpu/kv_format.h"
#include "cpu/ops.h"
#include "cpu/quant_traits.h"
#include "cpu/thread_pool.h"
#include "model/blocks.h"

#if STRATA_BENCH_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace strata::bench {
namespace {

// ---- decode attention ----

void BM_attention_decode(benchmark::State& state, KvType type, int64_t depth) {
  constexpr int kLayers = 12, kHeads = 32, kKvHeads = 4, kDim = 128;
  KvCache cache;
  cache.init_key_blocks(kLayers, int(depth + 1), kKvHeads, kDim, kKvHeads * kDim, type);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(kDim)), q(static_cast<size_t>(kHeads * kDim)), out(q.size());
  for (int il = 0; il < kLayers; ++il)
    for (int hk = 0; hk < kKvHeads; ++hk)
      for (int64_t pos = 0; pos <= depth; ++pos) {
        for (float& x : k) x = nd(rng);
        cpu::kv_store_key(type, k.data(), kDim, cache.k_block_bytes(il, hk, pos / KvCache::kKeyBlock),
                          pos % KvCache::kKeyBlock);
        cpu::kv_store_value(type, k.data(), kDim, cache.v_row_bytes(il, hk, pos));
      }
  for (float& x : q) x = nd(rng);
  const AttentionParams p{.n_head = kHeads, .n_head_kv = kKvHeads, .head_dim_k = kDim, .head_dim_v = kDim,
                          .scale = 1.0f / std::sqrt(float(kDim))};
  const size_t bytes = cache.bytes_per_position() / kLayers * size_t(depth + 1);
  DramTracker dram(state);
  int layer = 0;
  for (auto _ : state) {
    attention_gqa(p, cache, layer, q.data(), 1, depth, out.data());
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % kLayers;
    dram.tick();
  }
  set_bandwidth_counters(state, bytes, dram.kernel_seconds(), dram.mean_gbps());
}

void BM_attend(benchmark::State& state, cpu::CpuIsa isa, KvType type, int64_t kKeys) {
  constexpr int kRows = 8;
  constexpr int64_t kDim = 128;
  const size_t ks = cpu::kv_key_block_bytes(type, kDim), vs = cpu::kv_value_row_bytes(type, kDim);
  std::vector<uint8_t> k(size_t(kKeys / cpu::kKvKeyBlock) * ks), v(size_t(kKeys) * vs);
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(kDim)), q(static_cast<size_t>(kRows * kDim));
  for (int64_t j = 0; j < kKeys; ++j) {
    for (float& e : x) e = nd(rng);
    cpu::kv_store_key(type, x.data(), kDim, k.data() + size_t(j / cpu::kKvKeyBlock) * ks, j % cpu::kKvKeyBlock);
    for (float& e : x) e = nd(rng);
    cpu::kv_store_value(type, x.data(), kDim, v.data() + size_t(j) * vs);
  }
  for (float& e : q) e = 0.1f * nd(rng);
  std::vector<float> m(kRows), l(kRows), o(static_cast<size_t>(kRows * kDim));
  cpu::AttendArgs a;
  a.rows = kRows;
  a.dk = a.dv = kDim;
  a.q = q.data();
  a.k = k.data();
  a.k_block_stride = ks;
  a.v = v.data();
  a.v_row_stride = vs;
  a.n = kKeys;
  a.m = m.data();
  a.l = l.data();
  a.o = o.data();
  const cpu::AttendFn attend = cpu::cpu_kernels(isa).attend[size_t(type)];
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    std::fill(m.begin(), m.end(), -INFINITY);
    std::fill(l.begin(), l.end(), 0.0f);
    std::fill(o.begin(), o.end(), 0.0f);
    attend(a);
    benchmark::DoNotOptimize(o.data());
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  state.counters["ns_per_key"] = ns / (double(state.iterations()) * double(kKeys));
}

// ---- the fused expert FFN of one MoE layer ----

void BM_expert_ffn(benchmark::State& state, GgmlType type, int n_layers, int64_t n_tok) {
  constexpr int64_t kEmbd = 2048, kFf = 768, kExperts = 128, kUsed = 8;
  // per layer three stacks of 128 experts: 3 x 128 x 0.9 MB at Q4_K (340 MB), far beyond any L3;
  // several layers, taken in turn, spread the reads over gigabytes as a whole model does
  struct Layer {
    std::unique_ptr<RandomWeights> gate, up, down;
  };
  static std::vector<Layer> layers;
  static GgmlType built = GgmlType::f32;
  if (built != type || int(layers.size()) != n_layers) {
    layers.clear();
    for (int i = 0; i < n_layers; ++i)
      layers.push_back({std::make_unique<RandomWeights>(type, kEmbd, kFf, kExperts, 3 * i + 1),
                        std::make_unique<RandomWeights>(type, kEmbd, kFf, kExperts, 3 * i + 2),
                        std::make_unique<RandomWeights>(type, kFf, kEmbd, kExperts, 3 * i + 3)});
    built = type;
  }
  std::vector<LayerWeights> lw(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    lw[i].gate_exps = layers[i].gate->stack();
    lw[i].up_exps = layers[i].up->stack();
    lw[i].down_exps = layers[i].down->stack();
  }
  const cpu::Matmul be(cpu::MatmulPath::quantized);
  const std::vector<float> h = activations(kEmbd * n_tok, 7);
  std::vector<float> out(static_cast<size_t>(kEmbd * n_tok));
  std::mt19937 rng(42);
  Routing r;
  r.k = int(kUsed);
  r.ids.resize(size_t(kUsed * n_tok));
  r.weights.assign(size_t(kUsed * n_tok), 1.0f / kUsed);
  const size_t expert_bytes = 2 * lw[0].gate_exps.mat_bytes() + lw[0].down_exps.mat_bytes();
  size_t next_layer = 0, union_sum = 0;
  DramTracker dram(state);
  for (auto _ : state) {
    // per token 8 distinct experts (a partial Fisher-Yates over 128 ids)
    std::array<bool, kExperts> used{};
    for (int64_t t = 0; t < n_tok; ++t) {
      std::array<int32_t, kExperts> ids;
      for (int i = 0; i < kExperts; ++i) ids[size_t(i)] = i;
      for (int j = 0; j < kUsed; ++j) {
        std::swap(ids[size_t(j)], ids[size_t(j + int(rng() % uint32_t(kExperts - j)))]);
        r.ids[size_t(t * kUsed + j)] = ids[size_t(j)];
        used[size_t(ids[size_t(j)])] = true;
      }
    }
    union_sum += size_t(std::count(used.begin(), used.end(), true));
    moe_ffn(be, lw[next_layer], r, h.data(), n_tok, kEmbd, out.data());
    next_layer = (next_layer + 1) % lw.size();
    benchmark::DoNotOptimize(out.data());
    dram.tick();
  }
  const double experts = double(union_sum) / double(std::max<int64_t>(1, state.iterations()));
  set_bandwidth_counters(state, size_t(experts * double(expert_bytes)), dram.kernel_seconds(), dram.mean_gbps());
  state.counters["experts"] = experts;
  if (n_tok >= 32) {  // a prefill batch: the weights' int8 operations against the int8 probe
    const double ops = 2.0 * 3 * double(kEmbd * kFf * kUsed * n_tok) * double(state.iterations());
    const double gops = ops / dram.kernel_seconds() / 1e9, peak = int8_peak_gops();
    state.counters["GOPs"] = gops;
    state.counters["peak_frac"] = peak > 0 ? gops / peak : 0.0;
  }
  state.SetLabel(std::string(quant_traits(type).name) + " " + std::string(cpu::isa_name()));
}

// ---- prefill GEMM ----

struct GemmShape {
  int64_t n_in, n_out;
};
constexpr GemmShape kGemmShape{2048, 768};  // an expert's gate / up of qwen3-30b-a3b

void BM_gemm(benchmark::State& state, GgmlType type, int64_t batch) {
  const RandomWeights w(type, kGemmShape.n_in, kGemmShape.n_out, 1, 11);
  const cpu::Matmul be(cpu::MatmulPath::quantized);
  const std::vector<float> x = activations(kGemmShape.n_in * batch, 5);
  std::vector<float> y(static_cast<size_t>(kGemmShape.n_out * batch));
  const double peak = int8_peak_gops();
  const double t0 = now_seconds();
  for (auto _ : state) {
    be.matmul(w.stack(), x.data(), batch, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  const double s = now_seconds() - t0;
  const double gflops = 2.0 * double(kGemmShape.n_in * kGemmShape.n_out * batch) * double(state.iterations()) / s / 1e9;
  state.counters["GFLOPs"] = gflops;
  state.counters["peak_frac"] = peak > 0 ? gflops / peak : 0.0;
  state.counters["int8_peak_GOPs"] = peak;
  state.SetLabel(std::string(quant_traits(type).name) + " " + std::string(cpu::isa_name()));
}

// The tile kernel alone on one thread: 64 rows x 2048 of `type` (interleaved as the loader
// leaves them; 73 KB of Q4_K, in L2) against n_tok quantized activation rows, the way a routed
// expert of a 512-token prefill meets it (about 32 tokens). peak_frac: against this thread's int8
// loop (calibrate.h's probe on one thread), run in turn with the kernel so that both see the same
// phase of the VM.
void BM_tile(benchmark::State& state, GgmlType type, int64_t kIn, int64_t n_tok) {
  constexpr int64_t kOut = 64;
  const RandomWeights w(type, kIn, kOut, 1, 13);
  const cpu::Matmul be(cpu::MatmulPath::quantized);
  const std::vector<float> x = activations(kIn * n_tok, 9);
  std::vector<uint8_t> abuf(be.act_row_bytes(type, kIn) * size_t(n_tok));
  for (int64_t t = 0; t < n_tok; ++t)
    be.prepare_row(type, x.data() + t * kIn, kIn, abuf.data() + size_t(t) * be.act_row_bytes(type, kIn));
  const cpu::ActRows a{abuf.data(), be.act_row_bytes(type, kIn), n_tok};
  std::vector<float> y(static_cast<size_t>(kOut * n_tok));
  const Weight ws = w.stack();
  const bool avx512 = cpu::cpu_kernels().isa == cpu::CpuIsa::avx512;
  auto probe = [&] {  // GOP/s of the int8 loop on this thread
    const double t0 = now_seconds();
    const double macs = avx512 ? cpu::detail::int8_loop_avx512(200000) : cpu::detail::int8_loop_avx2(200000);
    return 2 * macs / (now_seconds() - t0) / 1e9;
  };
  double kernel_s = 0, peak = 0;
  int64_t n_probe = 0;
  for (auto _ : state) {
    const double t0 = now_seconds();
    for (int i = 0; i < 16; ++i) be.tile(ws, 0, kOut, a, y.data(), kOut);
    kernel_s += now_seconds() - t0;
    benchmark::DoNotOptimize(y.data());
    if (state.iterations() % 64 == 0) {
      peak += probe();
      ++n_probe;
    }
  }
  const double gops = 2.0 * double(kIn * kOut * n_tok) * 16 * double(state.iterations()) / kernel_s / 1e9;
  state.counters["GOPs"] = gops;
  state.counters["peak_frac"] = n_probe > 0 ? gops / (peak / double(n_probe)) : 0.0;
  state.SetLabel(std::string(quant_traits(type).name) + " " + std::string(cpu::isa_name()) + " 1 thread");
}

#if STRATA_BENCH_ONEDNN
// oneDNN's matmul, y [batch][n_out] = x [batch][n_in] W^T, weights in `dt` (f32 or bf16),
// activations in the same type, f32 out; its own threading (OpenMP) with the same thread count.
// packed: the weights in the layout oneDNN chooses (a repack of the file's); else as the file
// has them, row n of W contiguous (format "ba" of the K x N weights).
void BM_onednn_matmul(benchmark::State& state, dnnl::memory::data_type dt, int64_t batch, bool packed) {
  using namespace dnnl;
  engine eng(engine::kind::cpu, 0);
  stream strm(eng);
  const memory::dim M = batch, K = kGemmShape.n_in, N = kGemmShape.n_out;
  memory::desc src_md({M, K}, dt, memory::format_tag::ab);
  memory::desc wei_md({K, N}, dt, packed ? memory::format_tag::any : memory::format_tag::ba);
  memory::desc dst_md({M, N}, memory::data_type::f32, memory::format_tag::ab);
  matmul::primitive_desc pd;
  try {
    pd = matmul::primitive_desc(matmul::desc(src_md, wei_md, dst_md), eng);  // oneDNN 2.x API
  } catch (const dnnl::error& e) {
    state.SkipWithError(e.what());
    return;
  }
  memory src(pd.src_desc(), eng), wei(pd.weights_desc(), eng), dst(pd.dst_desc(), eng);
  // fill: f32 values (bf16: their upper halves)
  const std::vector<float> xs = activations(M * K, 3), ws = activations(K * N, 4);
  auto fill = [dt](memory& m, const std::vector<float>& v) {
    if (dt == memory::data_type::f32) {
      std::memcpy(m.get_data_handle(), v.data(), std::min(m.get_desc().get_size(), v.size() * 4));
    } else {
      auto* p = static_cast<uint16_t*>(m.get_data_handle());
      const size_t n = std::min(m.get_desc().get_size() / 2, v.size());
      for (size_t i = 0; i < n; ++i) {
        uint32_t b;
        std::memcpy(&b, &v[i], 4);
        p[i] = uint16_t(b >> 16);
      }
    }
  };
  fill(src, xs);
  fill(wei, ws);  // layout is oneDNN's; values are random either way
  matmul prim(pd);
  const double t0 = now_seconds();
  for (auto _ : state) {
    prim.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    strm.wait();
  }
  const double s = now_seconds() - t0;
  state.counters["GFLOPs"] = 2.0 * double(M * K * N) * double(state.iterations()) / s / 1e9;
  state.SetLabel(std::string(dt == memory::data_type::f32 ? "f32" : "bf16") + (packed ? " packed" : " file layout"));
}
#endif

const int kRegistered = [] {
  for (GgmlType type : {GgmlType::q4_k, GgmlType::q6_k, GgmlType::q8_0, GgmlType::mxfp4}) {
    const std::string tname(quant_traits(type).name);
    benchmark::RegisterBenchmark(("BM_expert_ffn/" + tname).c_str(), BM_expert_ffn, type, 1, 1)
        ->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1.0);
    if (type != GgmlType::q4_k) continue;
    // 16 layers: 5.4 GB, the reads spread as a whole model's are
    benchmark::RegisterBenchmark(("BM_expert_ffn/" + tname + "/16_layers").c_str(), BM_expert_ffn, type, 16, 1)
        ->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(3.0);
    for (int64_t n_tok : {2, 4, 9, 512})  // verification steps of k = 1, 3 and 8 drafts; a pp512 batch
      benchmark::RegisterBenchmark(("BM_expert_ffn/" + tname + "/16_layers/tokens:" + std::to_string(n_tok)).c_str(),
                                   BM_expert_ffn, type, 16, n_tok)
          ->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(3.0);
  }
  for (cpu::CpuIsa isa : {cpu::CpuIsa::avx2, cpu::CpuIsa::avx512})
    if (cpu::isa_supported(isa))
      for (KvType type : {KvType::f16, KvType::q8_0})
        for (int64_t keys : {512, 131072})  // in L2; from DRAM
          benchmark::RegisterBenchmark((std::string("BM_attend/") + std::string(cpu::isa_name(isa)) + "/" +
                                        cpu::kv_type_name(type) + (keys > 512 ? "/dram" : ""))
                                           .c_str(),
                                       BM_attend, isa, type, keys)
              ->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1.0);
  for (KvType type : {KvType::f32, KvType::f16, KvType::q8_0})
    for (int64_t depth : {1024, 4096, 16384})
      benchmark::RegisterBenchmark(
          (std::string("BM_attention_decode/") + cpu::kv_type_name(type) + "/" + std::to_string(depth)).c_str(),
          BM_attention_decode, type, depth)
          ->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1.0);
  for (GgmlType type : {GgmlType::q4_k, GgmlType::q6_k, GgmlType::q8_0, GgmlType::mxfp4, GgmlType::q4_0,
                        GgmlType::q5_k, GgmlType::bf16, GgmlType::f16}) {
    const std::string tname(quant_traits(type).name);
    for (int64_t batch : {8, 64, 512})
      benchmark::RegisterBenchmark(("BM_gemm/" + tname + "/" + std::to_string(batch)).c_str(), BM_gemm, type, batch)
          ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
  }
  if (cpu::cpu_kernels().isa != cpu::CpuIsa::scalar)
    for (GgmlType type : {GgmlType::q4_k, GgmlType::q6_k, GgmlType::q8_0})
      for (int64_t k : {2048, 768})
        for (int64_t n_tok : {8, 32, 128})
          benchmark::RegisterBenchmark(("BM_tile/" + std::string(quant_traits(type).name) + (k == 2048 ? "" : "/k768") +
                                        "/" + std::to_string(n_tok)).c_str(),
                                       BM_tile, type, k, n_tok)
              ->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1.0);
#if STRATA_BENCH_ONEDNN
  for (auto dt : {dnnl::memory::data_type::f32, dnnl::memory::data_type::bf16})
    for (bool packed : {true, false})
      for (int64_t batch : {8, 64, 512})
        benchmark::RegisterBenchmark(
            (std::string("BM_onednn_matmul/") + (dt == dnnl::memory::data_type::f32 ? "f32/" : "bf16/") +
             (packed ? "packed/" : "file/") + std::to_string(batch)).c_str(), BM_onednn_matmul, dt, batch, packed)
            ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
#endif
  return 0;
}();

}  // namespace
}  // namespace strata::bench
