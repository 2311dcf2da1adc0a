#include "model/blocks.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>

#include "base/profiler.h"
#include "cpu/fp16.h"
#include "cpu/kernels.h"
#include "cpu/kv_format.h"
#include "cpu/quant_traits.h"
#include "cpu/thread_pool.h"

namespace strata {

namespace {

// cpu::softmax of x[0..n) with an extra logit `sink` in the denominator that takes no output
// (ggml's soft_max_ext with sinks).
void softmax_with_sink(float* x, int64_t n, float sink) {
  const float mx = cpu::max_value(x, n, sink);
  const float inv = 1.0f / (cpu::exp_sum(x, n, mx) + std::exp(sink - mx));
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

Routing route(const Backend& be, const HParams& hp, const LayerWeights& l, const float* h,
              int64_t n_tok, const int32_t* tokens) {
  Routing r;
  r.k = hp.n_expert_used;
  r.ids.resize(size_t(n_tok) * size_t(r.k));
  r.weights.resize(size_t(n_tok) * size_t(r.k));
  if (!l.tid2eid) {
    be.route(hp, l, h, n_tok, r.ids.data(), r.weights.data());
    return r;
  }
  std::vector<float> logits(size_t(n_tok) * size_t(hp.n_expert));
  be.matmul(l.router, h, n_tok, logits.data());
  add_bias(logits.data(), l.router_b, n_tok, hp.n_expert);
  route_topk(hp, l, logits.data(), n_tok, tokens, r.ids.data(), r.weights.data());
  return r;
}

void route_topk(const HParams& hp, const LayerWeights& l, float* logits, int64_t n_tok, const int32_t* tokens,
                int32_t* ids, float* weights) {
  const int n_exp = hp.n_expert, k = hp.n_expert_used;
  std::vector<float> prob(n_exp), select(n_exp), chosen(k);
  std::vector<int> order(n_exp);
  for (int64_t t = 0; t < n_tok; ++t) {
    float* z = logits + t * n_exp;
    // prob: what the chosen experts are weighted by; select: what they are chosen by
    switch (hp.gating) {
      case Gating::softmax:
        std::copy(z, z + n_exp, prob.begin());
        cpu::softmax(prob.data(), n_exp);
        break;
      case Gating::sigmoid:
        for (int e = 0; e < n_exp; ++e) prob[size_t(e)] = 1.0f / (1.0f + std::exp(-z[e]));
        break;
      case Gating::softmax_topk:  // chosen by the logits; the softmax over the chosen comes below
        std::copy(z, z + n_exp, prob.begin());
        break;
      case Gating::sqrt_softplus:  // softplus(z) = z above 20, as llama.cpp
        for (int e = 0; e < n_exp; ++e) prob[size_t(e)] = std::sqrt(z[e] > 20.0f ? z[e] : std::log1p(std::exp(z[e])));
        break;
    }
    for (int e = 0; e < n_exp; ++e)
      select[size_t(e)] = prob[size_t(e)] + (l.exp_probs_b ? f32(l.exp_probs_b)[e] : 0.0f);

    if (hp.n_group > 1 && hp.n_group_used < hp.n_group) {
      // group-limited: keep the n_group_used groups whose top-2 selection scores sum highest
      const int per = n_exp / hp.n_group;
      std::vector<std::pair<float, int>> group_score;
      for (int g = 0; g < hp.n_group; ++g) {
        std::vector<float> s(select.begin() + g * per, select.begin() + (g + 1) * per);
        std::partial_sort(s.begin(), s.begin() + std::min(2, per), s.end(), std::greater<>());
        group_score.push_back({s[0] + (per > 1 ? s[1] : 0.0f), g});
      }
      std::stable_sort(group_score.begin(), group_score.end(),
                       [](auto& a, auto& b) { return a.first > b.first; });
      for (int gi = hp.n_group_used; gi < hp.n_group; ++gi) {
        const int g = group_score[size_t(gi)].second;
        for (int e = g * per; e < (g + 1) * per; ++e) select[size_t(e)] = -INFINITY;
      }
    }
    if (l.tid2eid) {  // hash-routed: the experts of this token id, in the table's order
      STRATA_CHECK(tokens != nullptr, "a hash-routed layer needs the token ids");
      const int32_t* row = reinterpret_cast<const int32_t*>(l.tid2eid.row(tokens[t]));
      std::copy(row, row + k, order.begin());
    } else {
      std::iota(order.begin(), order.end(), 0);
    }
    // the k best, ties to the lower id (what a stable sort of all n_exp gives; this is 0.8% of a
    // prefill less)
    if (!l.tid2eid)
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
        return select[size_t(a)] > select[size_t(b)] || (select[size_t(a)] == select[size_t(b)] && a < b);
      });
    for (int j = 0; j < k; ++j) chosen[size_t(j)] = prob[size_t(order[size_t(j)])];
    if (hp.gating == Gating::softmax_topk) cpu::softmax(chosen.data(), k);
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += chosen[size_t(j)];
    for (int j = 0; j < k; ++j) {
      float w = chosen[size_t(j)];
      if (hp.norm_topk) w /= sum;
      ids[size_t(t * k + j)] = order[size_t(j)];
      weights[size_t(t * k + j)] = w * hp.expert_weights_scale;
    }
  }
}

namespace {

// act(g) * u, in place in g.
void glu(const GluParams& p, float* g, const float* u, int64_t n) {
  switch (p.kind) {
    case GluKind::silu: {
      // SIMD exp (as ggml's vectorised silu): the MoE FFN of a 512-token prefill 0.5% faster
      static const cpu::SiluMulFn silu_mul = cpu::cpu_kernels().silu_mul;
      silu_mul(g, u, n);
      break;
    }
    case GluKind::swiglu_oai:
      for (int64_t i = 0; i < n; ++i) {
        const float x = std::min(g[i], p.limit), y = std::clamp(u[i], -p.limit, p.limit);
        g[i] = x / (1.0f + std::exp(-p.alpha * x)) * (y + 1.0f);
      }
      break;
    case GluKind::silu_clamp:
      for (int64_t i = 0; i < n; ++i) {
        const float x = std::min(g[i], p.limit), y = std::clamp(u[i], -p.limit, p.limit);
        g[i] = x / (1.0f + std::exp(-x)) * y;
      }
      break;
  }
}

// A task: gate and up: rows [r0, r1) of one FFN's matrices for its tokens [t0, t1) (indices into
// its token list); `block` numbers the (FFN, token range) pairs of the batch, and a down task
// waits for each block's gate/up tasks. Down (ffn and block -1): rows [r0, r1) of every FFN's
// down matrix, for all their tokens.
struct RowTask {
  int32_t ffn, block;
  int64_t r0, r1, t0, t1;
  bool down = false;
};

// Cuts rows [r_begin, r_end) of every FFN's gate/up into tasks, in multiples of 16 rows. Few tokens
// in every FFN (decode): guided over the FFNs' rows one after another (Matmul::guided_rows: long
// tasks first, short last; with four even tasks a thread, one thread waited for the other's last
// at every layer). Else about kTasksPerThread per thread over the whole batch (so that one expert
// with many tokens and seven with one stay balanced), an FFN with many tokens cut into L2-sized
// tiles of rows by tokens (Matmul::kTile*). `order`: the FFNs in the order their tasks are taken
// (ready ones first). Blocks are numbered by (FFN, token range) whatever the rows, so calls for
// other row ranges agree.
constexpr int64_t kTasksPerThread = 4;
std::vector<RowTask> row_tasks(const std::vector<FfnWork>& ffns, const std::vector<int32_t>& order, int64_t r_begin,
                               int64_t r_end, int n_threads) {
  using cpu::Matmul;
  const int64_t n_rows = r_end - r_begin;
  const int64_t total = n_rows * int64_t(ffns.size());
  int64_t chunk = std::max<int64_t>(16, total / (kTasksPerThread * int64_t(n_threads)) / 16 * 16);
  chunk = std::min(chunk, (n_rows + 15) / 16 * 16);
  const bool any_tiled = std::any_of(ffns.begin(), ffns.end(), [](const FfnWork& f) {
    return int64_t(f.tokens.size()) >= Matmul::kTileMinTokens;
  });
  if (!any_tiled) {
    // few tokens (decode): guided over the FFNs' rows one after another (FFNs without tokens have
    // no block, as below)
    std::vector<int32_t> live;
    size_t bytes = 0;
    for (int32_t e : order)
      if (!ffns[size_t(e)].tokens.empty()) {
        live.push_back(e);
        bytes += ffns[size_t(e)].gate.row_bytes + ffns[size_t(e)].up.row_bytes;
      }
    const int64_t min_rows = Matmul::min_task_rows(bytes / std::max<size_t>(live.size(), 1));
    const std::vector<int64_t> parts(live.size(), n_rows);
    std::vector<RowTask> tasks;
    for (const Matmul::RowRange& r : Matmul::guided_ranges(parts, n_threads, min_rows)) {
      const int32_t e = live[size_t(r.part)];
      tasks.push_back({e, int32_t(r.part), r_begin + r.r0, r_begin + r.r1, 0, int64_t(ffns[size_t(e)].tokens.size())});
    }
    return tasks;
  }
  return Matmul::tiled_tasks(n_threads, any_tiled, [&](int64_t tile_rows) {
    std::vector<RowTask> tasks;
    int32_t block = 0;
    for (int32_t e : order) {
      const int64_t n_tok = int64_t(ffns[size_t(e)].tokens.size());
      const bool tiled = n_tok >= Matmul::kTileMinTokens;
      const int64_t rows = tiled ? tile_rows : chunk;
      const int64_t toks = tiled ? Matmul::kTileTokens : n_tok;
      for (int64_t t0 = 0; t0 < n_tok; t0 += toks, ++block)
        for (int64_t r0 = r_begin; r0 < r_end; r0 += rows)
          tasks.push_back({e, block, r0, std::min(r_end, r0 + rows), t0, std::min(n_tok, t0 + toks)});
    }
    return tasks;
  });
}

// Waits until v holds `value`, stored (then notified) by another pool thread, which is running the
// task that stores it: spins, then yields (that thread may have been descheduled), then sleeps (it
// may be waiting for an NVMe read: milliseconds).
void wait_for(const std::atomic<int32_t>& v, int32_t value) {
  for (int spins = 0;; ++spins) {
    const int32_t now = v.load(std::memory_order_acquire);
    if (now == value) return;
    if (spins < 4096) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    } else if (spins < 4096 + 256) {
      std::this_thread::yield();
    } else {
      v.wait(now, std::memory_order_acquire);
    }
  }
}

}  // namespace

// Runs every FFN of the batch on compute_pool(): one dispatch for gate, up, GLU and down of all
// FFNs (their row chunks taken from one counter; with `numa` sharded, each NUMA group's rows
// (NumaLayout::rows) from its group's counter, run by its threads alone). The gate/up task that
// finishes the last rows of a token block quantizes that block's GLU output for down. A down
// task is a chunk of out's columns for every FFN in batch order: each FFN's down rows of the
// chunk for its tokens (waiting for their quantized rows), scaled and added into out at once, so
// each token's FFNs sum in batch order (the sum's order is fixed) and no [tokens x E] buffer of
// expert outputs goes to DRAM and back (in pp512 of the 30B-A3B synthetic model, 33.5 MB a layer
// written, then read by a separate summing pass). Down tasks come after every gate/up task in the
// counter's order, so no thread idles at a barrier between the halves. h: [*][E] rows, quantized
// once for the whole batch; every FFN's matrices share one type per role (the stacks of a layer).
void run_ffns(const cpu::Matmul& be, const std::vector<FfnWork>& ffns, const float* h,
              int64_t n_h, const GluParams& glu_p, float* out, const cpu::NumaLayout* numa) {
  if (ffns.empty()) return;
  cpu::ThreadPool& pool = cpu::compute_pool();
  const Weight& g0 = ffns[0].gate;
  const Weight& u0 = ffns[0].up;
  const Weight& d0 = ffns[0].down;
  const int64_t E = g0.n_in, F = g0.n_out;
  for (const FfnWork& f : ffns)
    STRATA_CHECK(f.gate.type == g0.type && f.up.type == u0.type && f.down.type == d0.type &&
                 f.gate.n_out == F && f.down.n_out == E && f.tokens.size() == f.scale.size());

  // The caller's scratch, reused across layers (large in prefill). A local reference: the tasks on
  // other threads must see these buffers, not their own thread's.
  struct Scratch {
    std::vector<uint8_t> hg, hu, xg, xu, ya;  // prepared activations
    std::vector<float> act;
  };
  thread_local Scratch tl_scratch;
  Scratch& sc = tl_scratch;
  std::vector<uint8_t> &xg = sc.xg, &xu = sc.xu, &ya = sc.ya;
  std::vector<float>& act = sc.act;

  // h prepared once for gate (and for up when its activation format differs)
  const cpu::ActRows hg = be.prepare(g0.type, h, n_h, E, sc.hg);
  const bool same_act = be.act_type(u0.type) == be.act_type(g0.type);
  const cpu::ActRows hu = same_act ? hg : be.prepare(u0.type, h, n_h, E, sc.hu);

  // each FFN's rows gathered: x (for gate), xu (for up); act: [n][F] float; ya: act prepared for
  // down
  const size_t n_ffn = ffns.size();
  std::vector<size_t> first(n_ffn + 1, 0);  // first row of FFN e in the batch-wide buffers
  for (size_t e = 0; e < n_ffn; ++e) first[e + 1] = first[e] + ffns[e].tokens.size();
  const size_t n_rows = first[n_ffn];
  xg.resize(n_rows * hg.row_bytes);
  if (!same_act) xu.resize(n_rows * hu.row_bytes);
  act.resize(n_rows * size_t(F));
  auto gather = [&](int64_t e) {
    for (size_t i = 0; i < ffns[size_t(e)].tokens.size(); ++i) {
      const int64_t t = ffns[size_t(e)].tokens[i];
      std::memcpy(&xg[(first[size_t(e)] + i) * hg.row_bytes], hg.row(t), hg.row_bytes);
      if (!same_act) std::memcpy(&xu[(first[size_t(e)] + i) * hu.row_bytes], hu.row(t), hu.row_bytes);
    }
  };
  // a prefill's gather (9.6 MB a layer in pp512 of qwen3-30b-a3b) on the pool, one task per FFN
  // (their token counts differ), by the size rule of for_row_chunks; decode's on the caller
  if (n_rows * hg.row_bytes >= size_t(kPooledRowFloats) * sizeof(float)) {
    pool.run(int64_t(n_ffn), [&](int64_t e, int) { gather(e); });
  } else {
    for (size_t e = 0; e < n_ffn; ++e) gather(int64_t(e));
  }
  const size_t ya_row = be.act_row_bytes(d0.type, F);
  ya.resize(n_rows * ya_row);

  // gate/up tasks, then down tasks; per token block, the gate/up tasks still to finish, then
  // kQuantized once its GLU output is quantized for down (value-initialised: 0)
  // FFNs whose weights are still being read (NVMe tier) go last, so the others run meanwhile
  std::vector<int32_t> order(n_ffn);
  std::iota(order.begin(), order.end(), 0);
  std::stable_partition(order.begin(), order.end(), [&](int32_t e) {
    const PendingWeights* p = ffns[size_t(e)].pending;
    return p == nullptr || p->arrived();
  });
  // per group: its gate/up tasks, then its down tasks
  // (a nested run is serial, in index order: a group's down tasks would wait for a later group's
  // gate/up tasks forever, so it is not cut by group)
  const bool sharded = numa != nullptr && numa->sharded() && !cpu::ThreadPool::in_pool();
  STRATA_CHECK(!sharded || numa->n_groups() == pool.n_groups(), "the compute pool's groups are the NUMA layout's");
  const int n_groups = sharded ? numa->n_groups() : 1;
  std::vector<RowTask> tasks;
  std::vector<int64_t> starts{0};
  const bool few_tokens = std::none_of(ffns.begin(), ffns.end(), [](const FfnWork& f) {
    return int64_t(f.tokens.size()) >= cpu::Matmul::kTileMinTokens;
  });
  size_t down_col_bytes = 0;  // a down task's bytes per column of out
  for (const FfnWork& f : ffns) down_col_bytes += f.down.row_bytes;
  for (int g = 0; g < n_groups; ++g) {
    const auto [f0, f1] = sharded ? numa->rows(g, F) : std::pair<int64_t, int64_t>{0, F};
    const auto [e0, e1] = sharded ? numa->rows(g, E) : std::pair<int64_t, int64_t>{0, E};
    const int threads = sharded ? numa->threads_in_group(g) : pool.size();
    if (f0 < f1) {
      const std::vector<RowTask> part = row_tasks(ffns, order, f0, f1, threads);
      tasks.insert(tasks.end(), part.begin(), part.end());
    }
    // down: chunks of out's columns, each over every FFN (the tasks are even: every one runs all
    // the FFNs' tokens). Many tokens: one chunk a thread; smaller chunks cost each FFN's down a cold
    // start more often (two or four a thread ran pp512's experts 2-4% slower). Few tokens
    // (decode): guided, long chunks first (Matmul::guided_rows, at least 64 KB of the FFNs' down
    // rows): with one chunk a thread, the thread that finished gate/up first waited 2-5 ms a token
    // at the end of the layers' expert dispatches (30B-A3B, tg128), 0.4-0.7 ms with these.
    if (few_tokens) {
      int64_t r0 = e0;
      for (int64_t n : cpu::Matmul::guided_rows(e1 - e0, threads, cpu::Matmul::min_task_rows(down_col_bytes))) {
        tasks.push_back({-1, -1, r0, r0 + n, 0, 0, true});
        r0 += n;
      }
    } else {
      const int64_t chunk = std::max<int64_t>(16, (e1 - e0) / threads / 16 * 16);
      for (int64_t r0 = e0; r0 < e1; r0 += chunk) tasks.push_back({-1, -1, r0, std::min(e1, r0 + chunk), 0, 0, true});
    }
    starts.push_back(int64_t(tasks.size()));
  }
  int32_t n_blocks = 0;
  for (const RowTask& t : tasks) n_blocks = std::max(n_blocks, t.block + 1);
  constexpr int32_t kQuantized = -1;
  const auto left = std::make_unique<std::atomic<int32_t>[]>(size_t(n_blocks));
  // each FFN's token blocks in token order (block, t0, t1), for the down tasks
  std::vector<std::vector<RowTask>> blocks_of(n_ffn);
  std::vector<bool> seen(size_t(n_blocks), false);
  for (const RowTask& t : tasks) {
    if (t.down) continue;
    left[size_t(t.block)].fetch_add(1, std::memory_order_relaxed);
    if (!seen[size_t(t.block)]) blocks_of[size_t(t.ffn)].push_back(t);
    seen[size_t(t.block)] = true;
  }
  for (std::vector<RowTask>& b : blocks_of)
    std::sort(b.begin(), b.end(), [](const RowTask& x, const RowTask& y) { return x.t0 < y.t0; });
  // routed-expert weight bytes each group's threads read (strata bench prints them per node)
  const size_t gu_row = g0.row_bytes + u0.row_bytes, d_row = d0.row_bytes;

  // down (+ bias) of columns [r0, r1) for every FFN in batch order, each block's rows (in L2)
  // scaled and added into its tokens' rows of out
  const cpu::AxpyFn axpy = cpu::cpu_kernels().axpy;
  auto run_down = [&](const RowTask& task, int thread) {
    const int64_t w = task.r1 - task.r0;
    thread_local std::vector<float> yd;
    for (size_t e = 0; e < n_ffn; ++e) {
      const FfnWork& f = ffns[e];
      if (numa != nullptr && !blocks_of[e].empty())  // routed experts only (moe_ffn passes the layout)
        prof::count_node_bytes(pool.group_of(thread), int64_t(size_t(w) * d_row));
      for (const RowTask& b : blocks_of[e]) {
        wait_for(left[size_t(b.block)], kQuantized);
        const int64_t n = b.t1 - b.t0;
        const size_t row0 = first[e] + size_t(b.t0);  // batch row of token t0
        yd.resize(size_t(n * w));
        if (f.pending == nullptr || f.pending->wait()) {
          be.tile(f.down, task.r0, task.r1, cpu::ActRows{ya.data() + row0 * ya_row, ya_row, n}, yd.data(), w);
        } else {
          std::fill(yd.begin(), yd.end(), 0.0f);
        }
        for (int64_t t = 0; t < n; ++t) {
          const float* yt = &yd[size_t(t * w)];
          if (f.down_b) cpu::add(&yd[size_t(t * w)], f.down_b + task.r0, w);
          float* o = out + f.tokens[size_t(b.t0 + t)] * E + task.r0;
          const float s = f.scale[size_t(b.t0 + t)];
          axpy(o, yt, s, w);
        }
      }
    }
  };

  auto run_task = [&](int64_t i, int thread) {
    const RowTask& task = tasks[size_t(i)];
    if (task.down) return run_down(task, thread);
    const FfnWork& f = ffns[size_t(task.ffn)];
    const size_t row0 = first[size_t(task.ffn)] + size_t(task.t0);  // batch row of token t0
    const int64_t n = task.t1 - task.t0;
    if (numa != nullptr)  // routed experts only (moe_ffn passes the layout; dense FFNs do not)
      prof::count_node_bytes(pool.group_of(thread), int64_t(size_t(task.r1 - task.r0) * gu_row));
    // gate, up, GLU
    const cpu::ActRows xe{xg.data() + row0 * hg.row_bytes, hg.row_bytes, n};
    const cpu::ActRows xue = same_act ? xe : cpu::ActRows{xu.data() + row0 * hu.row_bytes, hu.row_bytes, n};
    const int64_t w = task.r1 - task.r0;
    thread_local std::vector<float> g, u;
    g.resize(size_t(n * w));
    u.resize(size_t(n * w));
    if (f.pending == nullptr || f.pending->wait()) {
      be.tile(f.gate, task.r0, task.r1, xe, g.data(), w);
      be.tile(f.up, task.r0, task.r1, xue, u.data(), w);
    } else {  // its read failed: zeros, and the forward pass reports the store's error
      std::fill(g.begin(), g.end(), 0.0f);
      std::fill(u.begin(), u.end(), 0.0f);
    }
    for (int64_t t = 0; t < n; ++t) {
      float* gt = &g[size_t(t * w)];
      float* ut = &u[size_t(t * w)];
      if (f.gate_b) cpu::add(gt, f.gate_b + task.r0, w);
      if (f.up_b) cpu::add(ut, f.up_b + task.r0, w);
      glu(glu_p, gt, ut, w);
      std::copy_n(gt, w, &act[(row0 + size_t(t)) * size_t(F) + size_t(task.r0)]);
    }
    // the block's last gate/up task (acq_rel: it sees the others' act rows) quantizes it for down
    if (left[size_t(task.block)].fetch_sub(1, std::memory_order_acq_rel) == 1) {
      for (int64_t t = 0; t < n; ++t)
        be.prepare_row(d0.type, &act[(row0 + size_t(t)) * size_t(F)], F, &ya[(row0 + size_t(t)) * ya_row]);
      left[size_t(task.block)].store(kQuantized, std::memory_order_release);
      left[size_t(task.block)].notify_all();
    }
  };
  if (sharded) pool.run_grouped(starts, run_task);
  else pool.run(int64_t(tasks.size()), run_task);
}

void swiglu_ffn(const cpu::Matmul& mm, const Weight& gate, const Weight& up, const Weight& down, const float* h,
                int64_t n_tok, const float* scale, bool accumulate, float* out, const SwigluOptions& opt) {
  if (!accumulate) std::fill(out, out + n_tok * down.n_out, 0.0f);
  std::vector<FfnWork> ffns(1);
  FfnWork& f = ffns[0];
  f.gate = gate;
  f.up = up;
  f.down = down;
  f.gate_b = opt.gate_b;
  f.up_b = opt.up_b;
  f.down_b = opt.down_b;
  f.tokens.resize(size_t(n_tok));
  std::iota(f.tokens.begin(), f.tokens.end(), int64_t(0));
  f.scale.assign(size_t(n_tok), 1.0f);
  if (scale) f.scale.assign(scale, scale + n_tok);
  run_ffns(mm, ffns, h, n_tok, opt.glu, out);
}

ExpertBatch group_by_expert(const LayerWeights& l, const Routing& r, int64_t n_tok, int64_t n_embd) {
  const int64_t n_exp = l.gate_exps.n_mat;
  // the active experts in id order, each with its tokens in token order
  std::vector<int32_t> slot(size_t(n_exp), -1);
  std::vector<FfnWork> ffns;
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int j = 0; j < r.k; ++j) {
      const int e = r.ids[size_t(t * r.k + j)];
      STRATA_CHECK(e >= 0 && e < n_exp, "routed to an expert the layer does not have");
      if (slot[size_t(e)] < 0) {
        slot[size_t(e)] = int32_t(ffns.size());
        ffns.emplace_back();
      }
      FfnWork& f = ffns[size_t(slot[size_t(e)])];
      f.tokens.push_back(t);
      f.scale.push_back(r.weights[size_t(t * r.k + j)]);
    }
  }
  ExpertBatch batch;
  for (int64_t e = 0; e < n_exp; ++e)
    if (slot[size_t(e)] >= 0) batch.ids.push_back(int32_t(e));
  prof::count_experts(int64_t(batch.ids.size()),
                      int64_t(batch.ids.size() * (l.gate_exps.mat_bytes() + l.up_exps.mat_bytes() +
                                                  l.down_exps.mat_bytes())));
  const int64_t F = l.gate_exps.n_out;
  // expert e's bias: row e of a stacked [n_expert][width] bias (null when the layer has none)
  auto bias = [](const Weight& b, int64_t e, int64_t width) { return b ? f32(b) + e * width : nullptr; };
  batch.work.reserve(batch.ids.size());
  for (int32_t e : batch.ids) {
    FfnWork f = std::move(ffns[size_t(slot[size_t(e)])]);
    f.gate_b = bias(l.gate_exps_b, e, F);
    f.up_b = bias(l.up_exps_b, e, F);
    f.down_b = bias(l.down_exps_b, e, n_embd);
    batch.work.push_back(std::move(f));
  }
  return batch;
}

void moe_ffn(const cpu::Matmul& mm, const LayerWeights& l, const Routing& r, const float* h, int64_t n_tok,
             int64_t n_embd, float* out, const GluParams& glu) {
  std::fill(out, out + n_tok * n_embd, 0.0f);
  ExpertBatch batch = group_by_expert(l, r, n_tok, n_embd);
  for (size_t i = 0; i < batch.ids.size(); ++i) {
    batch.work[i].gate = l.gate_exps.slice(batch.ids[i]);
    batch.work[i].up = l.up_exps.slice(batch.ids[i]);
    batch.work[i].down = l.down_exps.slice(batch.ids[i]);
  }
  const std::shared_ptr<const cpu::NumaLayout> numa = cpu::numa_snapshot();
  run_ffns(mm, batch.work, h, n_tok, glu, out, numa.get());
}

void ResidentExperts::run(const cpu::Matmul& mm, const LayerWeights& l, int, const Routing& r, const float* h,
                          int64_t n_tok, int64_t n_embd, const GluParams& glu, float* out) {
  moe_ffn(mm, l, r, h, n_tok, n_embd, out, glu);
}

RoutedExperts& resident_experts() {
  static ResidentExperts experts;
  return experts;
}

void look_ahead(const Exec& ex, const Model& m, int il, const float* x, int64_t n_tok) {
  const int depth = ex.experts.lookahead_depth();
  if (depth <= 0 || n_tok > kPrefetchMaxTokens) return;
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_embd;
  std::vector<float> h(size_t(n_tok * E));
  for (int d = 1; d <= depth && il + d < hp.n_layer; ++d) {
    const LayerWeights& l = m.layers[size_t(il + d)];
    if (!l.is_moe() || l.tid2eid) continue;  // hash-routed layers: exact, look_ahead_hashed
    if (ex.routing != nullptr) {
      ex.experts.prefetch(il + d, d, ex.routing->peek(il + d, n_tok));
      continue;
    }
    rms_norm_rows(x, l.ffn_norm, n_tok, E, hp.eps, h.data());
    const Routing r = route(ex.be, hp, l, h.data(), n_tok);
    ex.experts.prefetch(il + d, d, experts_by_rank(r.ids, n_tok, r.k));
  }
}

void look_ahead_hashed(const Exec& ex, const Model& m, const int32_t* tokens, int64_t n_tok) {
  const int depth = ex.experts.lookahead_depth();
  if (depth <= 0) return;
  const HParams& hp = m.hparams();
  const int k = hp.n_expert_used;
  std::vector<int32_t> ids(size_t(n_tok * k));
  for (int il = 0; il < hp.n_hash_layers; ++il) {
    const int distance = std::min(il + 1, depth);
    if (ex.routing != nullptr) {  // benchmarks: the override decides
      ex.experts.prefetch(il, distance, ex.routing->peek(il, n_tok));
      continue;
    }
    const Weight& table = m.layers[size_t(il)].tid2eid;
    for (int64_t t = 0; t < n_tok; ++t)
      std::copy_n(reinterpret_cast<const int32_t*>(table.row(tokens[t])), k, &ids[size_t(t * k)]);
    ex.experts.prefetch(il, distance, experts_by_rank(ids, n_tok, k));
  }
}

void moe_block(const Exec& ex, const Model& m, const LayerWeights& l, int il, const float* x, int64_t n_tok,
               const int32_t* tokens, const GluParams& glu, float* h, float* y, bool host_norm) {
  const HParams& hp = m.hparams();
  const int64_t E = hp.n_embd;
  const bool main_layer = il < hp.n_layer;  // not the nextn layer
  Routing routing;
  {
    prof::Span span(prof::Part::router, il);
    if (main_layer) look_ahead(ex, m, il, x, n_tok);
    if (host_norm) rms_norm_rows(x, l.ffn_norm, n_tok, E, hp.eps, h);
    else ex.be.rms_norm_rows(x, l.ffn_norm, n_tok, E, hp.eps, h);
    routing = route(ex.be, hp, l, h, n_tok, tokens);
    if (ex.routing != nullptr && main_layer) ex.routing->choose(il, n_tok, routing);
  }
  prof::Span span(prof::Part::experts, il);
  if (main_layer) ex.experts.run(ex.be.host(), l, il, routing, h, n_tok, E, glu, y);
  else moe_ffn(ex.be.host(), l, routing, h, n_tok, E, y, glu);
}

std::vector<int32_t> experts_by_rank(std::span<const int32_t> ids, int64_t n_tok, int k) {
  std::vector<int32_t> out;
  for (int j = 0; j < k; ++j)
    for (int64_t t = 0; t < n_tok; ++t) {
      const int32_t e = ids[size_t(t * k + j)];
      if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
    }
  return out;
}

namespace {

// Decode and verification batches (up to kBatchInvariantTokens tokens) over f16 / q8_0 caches:
// each token's keys split into chunks of whole key blocks, one task per (token, kv head, chunk),
// each the cpu attend kernel over its keys for the group's query rows (the online softmax: a
// running max, sum and unnormalised output per row); the last task of a (token, kv head) to finish
// merges its chunks. Both threads work on one head's keys, the cache is read once per token at
// the memory's pace, and a token's chunks depend on its position (and the pool's size) alone, so a
// token's result is the same in any batch.
void attention_decode(const AttentionParams& p, KvCache& cache, int layer, const float* q, int64_t n_tok,
                      int64_t pos0, float* out) {
  const int group = p.n_head / p.n_head_kv;
  const int64_t HKV = p.n_head_kv, DK = p.head_dim_k, DV = p.head_dim_v, kb = KvCache::kKeyBlock;
  struct Token {
    int64_t first, lo, hi, chunk, n_chunks, task0;
  };
  // the caller's buffers (named through references: a thread_local named inside the tasks would be
  // each worker's own)
  thread_local std::vector<Token> tl_toks;
  thread_local std::vector<float> tl_qs, tl_m, tl_l, tl_o;
  thread_local std::vector<std::atomic<int64_t>> tl_left;
  std::vector<Token>& toks = tl_toks;
  std::vector<float>& qs = tl_qs;
  std::vector<float>& ms = tl_m;  // [task][group]: each chunk's running max, sum and output
  std::vector<float>& ls = tl_l;
  std::vector<float>& o = tl_o;
  toks.resize(size_t(n_tok));
  const int64_t pool_threads = cpu::compute_pool().size();
  int64_t n_tasks = 0;
  for (int64_t t = 0; t < n_tok; ++t) {
    Token& k = toks[size_t(t)];
    const int64_t pos = pos0 + t;
    k.first = p.n_swa > 0 ? std::max<int64_t>(0, pos - p.n_swa + 1) : 0;
    k.lo = k.first / kb * kb;
    k.hi = pos + 1;
    // about four chunks a thread over the kv heads (each chunk's first key block is read
    // before any prefetch can run ahead of it), at most 16 chunks a head, at least 8 key blocks
    const int64_t nk = k.hi - k.lo;
    const int64_t per_head = std::clamp<int64_t>((4 * pool_threads + HKV - 1) / HKV, 1, 16);
    k.chunk = std::max<int64_t>(8 * kb, ((nk + per_head - 1) / per_head + kb - 1) / kb * kb);
    k.n_chunks = (nk + k.chunk - 1) / k.chunk;
    k.task0 = n_tasks;
    n_tasks += k.n_chunks * HKV;
  }
  qs.resize(size_t(n_tok * p.n_head * DK));
  for (size_t i = 0; i < qs.size(); ++i) qs[i] = q[i] * p.scale;
  ms.assign(size_t(n_tasks * group), -INFINITY);
  ls.assign(size_t(n_tasks * group), 0.0f);
  o.assign(size_t(n_tasks * group * DV), 0.0f);
  if (tl_left.size() < size_t(n_tok * HKV)) tl_left = std::vector<std::atomic<int64_t>>(size_t(n_tok * HKV));
  std::vector<std::atomic<int64_t>>& left = tl_left;  // chunks of each (token, kv head) still running
  for (int64_t t = 0; t < n_tok; ++t)
    for (int64_t hk = 0; hk < HKV; ++hk) left[size_t(t * HKV + hk)].store(toks[size_t(t)].n_chunks);
  const cpu::AttendFn attend = cpu::cpu_kernels().attend[size_t(cache.type)];
  auto merge = [&](int64_t t, int64_t hk) {
    const Token& k = toks[size_t(t)];
    for (int g = 0; g < group; ++g) {
      const int64_t head = hk * group + g;
      float mx = p.sinks ? p.sinks[head] : -INFINITY;
      for (int64_t c = 0; c < k.n_chunks; ++c)
        mx = std::max(mx, ms[size_t((k.task0 + hk * k.n_chunks + c) * group + g)]);
      float* dst = out + (t * p.n_head + head) * DV;
      std::fill(dst, dst + DV, 0.0f);
      float sum = p.sinks ? std::exp(p.sinks[head] - mx) : 0.0f;
      for (int64_t c = 0; c < k.n_chunks; ++c) {
        const int64_t task = k.task0 + hk * k.n_chunks + c;
        const float m = ms[size_t(task * group + g)], l = ls[size_t(task * group + g)];
        if (m == -INFINITY) continue;
        const float w = std::exp(m - mx);
        sum += l * w;
        const float* src = &o[size_t((task * group + g) * DV)];
        for (int64_t i = 0; i < DV; ++i) dst[i] += w * src[i];
      }
      const float inv = 1.0f / sum;
      for (int64_t i = 0; i < DV; ++i) dst[i] *= inv;
    }
  };
  cpu::compute_pool().run(n_tasks, [&](int64_t task, int) {
    int64_t t = 0;
    while (t + 1 < n_tok && toks[size_t(t + 1)].task0 <= task) ++t;
    const Token& k = toks[size_t(t)];
    const int64_t hk = (task - k.task0) / k.n_chunks, c = (task - k.task0) % k.n_chunks;
    const int64_t j0 = k.lo + c * k.chunk, j1 = std::min(k.hi, j0 + k.chunk);
    cpu::AttendArgs a;
    a.rows = group;
    a.dk = DK;
    a.dv = DV;
    a.q = &qs[size_t((t * p.n_head + hk * group) * DK)];
    a.k = cache.k_block_bytes(layer, int(hk), j0 / kb);
    a.k_block_stride = cache.k_block_stride();
    a.v = cache.v_row_bytes(layer, int(hk), j0);
    a.v_row_stride = cache.v_row_stride();
    a.first = std::max<int64_t>(k.first - j0, 0);
    a.n = j1 - j0;
    a.m = &ms[size_t(task * group)];
    a.l = &ls[size_t(task * group)];
    a.o = &o[size_t(task * group * DV)];
    attend(a);
    if (left[size_t(t * HKV + hk)].fetch_sub(1, std::memory_order_acq_rel) == 1) merge(t, hk);
  });
}

// Prefill (more tokens than a verification batch) over f16 / q8_0 caches, through the same attend
// kernel as decode: one task per kv head and block of T = kAttendMaxRows / group tokens, whose
// rows (token, head in group) first take the keys all T tokens see in one call (the block's keys
// and values read once for all T tokens), then each token's rows take the keys only it sees (the
// causal diagonal, and under a sliding window the keys the later tokens no longer see), continuing
// the same running max, sum and output; then the sink and the normalisation. Against scores of
// all keys, a softmax over them and a GEMM with the values, the scores never leave L1 and the
// values are multiplied as the kernel does (q8_0: in integers).
void attention_prefill(const AttentionParams& p, KvCache& cache, int layer, const float* q, int64_t n_tok,
                       int64_t pos0, float* out) {
  const int group = p.n_head / p.n_head_kv;
  const int64_t HKV = p.n_head_kv, DK = p.head_dim_k, DV = p.head_dim_v, kb = KvCache::kKeyBlock;
  const int64_t T = std::max<int64_t>(1, cpu::kAttendMaxRows / group), n_blocks = (n_tok + T - 1) / T;
  const cpu::AttendFn attend = cpu::cpu_kernels().attend[size_t(cache.type)];
  const cpu::ScaleFn scale = cpu::cpu_kernels().scale;
  // keys [first, end) of the token at t
  auto first = [&](int64_t t) { return p.n_swa > 0 ? std::max<int64_t>(0, pos0 + t - p.n_swa + 1) : int64_t(0); };
  cpu::compute_pool().run(n_blocks * HKV, [&](int64_t task, int) {
    const int64_t hk = task % HKV, t0 = (task / HKV) * T, t1 = std::min(n_tok, t0 + T);
    const int rows = int((t1 - t0) * group);
    thread_local std::vector<float> qb, m, l, o;
    qb.resize(size_t(rows * DK));
    m.assign(size_t(rows), -INFINITY);
    l.assign(size_t(rows), 0.0f);
    o.assign(size_t(rows * DV), 0.0f);
    for (int64_t t = t0; t < t1; ++t)
      for (int g = 0; g < group; ++g) {
        const float* src = q + (t * p.n_head + hk * group + g) * DK;
        float* dst = &qb[size_t(((t - t0) * group + g) * DK)];
        scale(dst, src, p.scale, DK);
      }
    // rows [r0, r0 + nr) over keys [lo, hi)
    auto run = [&](int r0, int nr, int64_t lo, int64_t hi) {
      if (lo >= hi) return;
      const int64_t j0 = lo / kb * kb;
      cpu::AttendArgs a;
      a.rows = nr;
      a.dk = DK;
      a.dv = DV;
      a.q = &qb[size_t(r0 * DK)];
      a.k = cache.k_block_bytes(layer, int(hk), j0 / kb);
      a.k_block_stride = cache.k_block_stride();
      a.v = cache.v_row_bytes(layer, int(hk), j0);
      a.v_row_stride = cache.v_row_stride();
      a.first = lo - j0;
      a.n = hi - j0;
      a.m = &m[size_t(r0)];
      a.l = &l[size_t(r0)];
      a.o = &o[size_t(r0 * DV)];
      attend(a);
    };
    // the keys every token of the block sees: from the last token's window start to the first
    // token's position (none when the window is shorter than the block: then c_lo = c_hi, and
    // each token's two ranges below still split its keys)
    const int64_t c_hi = pos0 + t0 + 1, c_lo = std::min(first(t1 - 1), c_hi);
    run(0, rows, c_lo, c_hi);
    for (int64_t t = t0; t < t1; ++t) {
      const int r0 = int((t - t0) * group);
      const int64_t f = first(t), e = pos0 + t + 1;
      run(r0, group, f, std::min(c_lo, e));
      run(r0, group, std::max(c_hi, f), e);
    }
    for (int r = 0; r < rows; ++r) {
      const int64_t t = t0 + r / group, head = hk * group + r % group;
      float keep = 1.0f, sum = l[size_t(r)];  // o and l are relative to m: the sink joins them there
      if (p.sinks) {
        const float mx = std::max(m[size_t(r)], p.sinks[head]);
        keep = std::exp(m[size_t(r)] - mx);
        sum = sum * keep + std::exp(p.sinks[head] - mx);
      }
      const float w = keep / sum;
      float* dst = out + (t * p.n_head + head) * DV;
      scale(dst, &o[size_t(r * DV)], w, DV);
    }
  });
}

}  // namespace

void attention_gqa(const AttentionParams& p, KvCache& cache, int layer, const float* q,
                   int64_t n_tok, int64_t pos0, float* out) {
  const int group = p.n_head / p.n_head_kv;
  if (cache.type != KvType::f32 && group <= cpu::kAttendMaxRows && p.head_dim_v % 16 == 0) {
    if (n_tok <= cpu::kBatchInvariantTokens) attention_decode(p, cache, layer, q, n_tok, pos0, out);
    else attention_prefill(p, cache, layer, q, n_tok, pos0, out);
    return;
  }
  const int64_t DK = p.head_dim_k, DV = p.head_dim_v;
  // The f32 cache (the exact path) and shapes the attend kernels do not take (a GQA group of more
  // than kAttendMaxRows heads, value heads not a multiple of 16 wide).
  // A task: one kv head and a block of query tokens; its queries are the `group` heads that share
  // the kv head, for every token of the block: rows (token, head in group). Two float GEMMs:
  // scores = Q K^T over the keys any of its tokens sees, then out = softmax(scores) V; keys a row
  // must not see (the future, or outside its window) are masked before the softmax.
  // Up to kTokBlock tokens per task; one when the batch is a speculative verification's size, so
  // that each token's scores and sums run exactly as in one-token decoding (same key range, same
  // GEMM shapes: the batch's logits are bit-identical, and greedy output with drafts is that of
  // plain decoding).
  const int64_t kTokBlock = n_tok <= cpu::kBatchInvariantTokens ? 1 : 16;
  const int64_t n_blocks = (n_tok + kTokBlock - 1) / kTokBlock;
  const cpu::SgemmFn sgemm = cpu::cpu_kernels().sgemm;
  const cpu::ScaleFn scale = cpu::cpu_kernels().scale;
  // q8_0 keys meet the query in q8_0, as in decode (cpu/kernels.h AttendFn): in integers where
  // the ISA has the kernel, else the keys widened against the query widened back
  const bool q8 = cache.type == KvType::q8_0;
  const cpu::ScoresQ8Fn scores_q8 = q8 ? cpu::cpu_kernels().scores_q8 : nullptr;
  cpu::compute_pool().run(n_blocks * p.n_head_kv, [&](int64_t task, int) {
    const int hk = int(task % p.n_head_kv);
    const int64_t t0 = (task / p.n_head_kv) * kTokBlock, t1 = std::min(n_tok, t0 + kTokBlock);
    const int64_t rows = (t1 - t0) * group;
    // keys: from the first one the block's first token sees to the last one its last token sees
    // (rounded down to a key block; the keys before the window are masked below)
    const int64_t kb = KvCache::kKeyBlock;
    const int64_t j_lo = p.n_swa > 0 ? std::max<int64_t>(0, pos0 + t0 - p.n_swa + 1) / kb * kb : 0;
    const int64_t j_hi = pos0 + t1;  // exclusive
    const int64_t nk = j_hi - j_lo;
    thread_local std::vector<float> qb, score, ob, kv32;
    qb.resize(size_t(rows * DK));
    score.resize(size_t(rows * nk));
    ob.resize(size_t(rows * DV));
    const bool half = cache.type != KvType::f32;  // entries widened to float a block at a time
    if (half) kv32.resize(size_t(std::max(DK, DV) * kb));
    // the softmax scale is applied to q once (DK products per row instead of one per key)
    for (int64_t t = t0; t < t1; ++t)
      for (int g = 0; g < group; ++g) {
        const float* src = q + (t * p.n_head + hk * group + g) * DK;
        float* dst = &qb[size_t(((t - t0) * group + g) * DK)];
        scale(dst, src, p.scale, DK);
      }
    thread_local std::vector<int8_t> qi;
    thread_local std::vector<float> qd;
    thread_local std::vector<int32_t> qoff;
    if (scores_q8) {
      qi.resize(size_t(rows * DK));
      qd.resize(size_t(rows * DK / 32));
      qoff.resize(qd.size());
      cpu::kv_quantize_query(qb.data(), int(rows), DK, qi.data(), qd.data(), qoff.data());
    } else if (q8) {
      cpu::kv_query(KvType::q8_0, qb.data(), int(rows), DK, qb.data());
    }
    const cpu::QueryQ8View qv{qi.data(), qd.data(), qoff.data(), DK};
    // K is stored transposed in blocks of kKeyBlock keys (KvCache::k_block): one GEMM per block
    // (f16 / q8_0 entries: each block widened to float in L1 first, the same GEMM then; q8_0 with
    // the integer kernel: its scores straight from the block)
    for (int64_t j = j_lo; j < j_hi; j += kb) {
      const int64_t w = std::min(kb, j_hi - j);
      if (scores_q8) {
        scores_q8(qv, int(rows), cache.k_block_bytes(layer, hk, j / kb), w, &score[size_t(j - j_lo)], nk);
        continue;
      }
      const float* kblk = half ? kv32.data() : cache.k_block(layer, hk, j / kb);
      if (half) cpu::kv_widen_keys(cache.type, cache.k_block_bytes(layer, hk, j / kb), DK, kv32.data());
      sgemm(rows, w, DK, qb.data(), DK, kblk, kb, &score[size_t(j - j_lo)], nk, false);
    }
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t pos = pos0 + t;
      const int64_t first = p.n_swa > 0 ? std::max<int64_t>(0, pos - p.n_swa + 1) : 0;
      for (int g = 0; g < group; ++g) {
        float* srow = &score[size_t(((t - t0) * group + g) * nk)];
        // keys before the window and after the token are masked; the rest are already scaled
        std::fill(srow, srow + std::clamp<int64_t>(first - j_lo, 0, nk), -INFINITY);
        std::fill(srow + std::clamp<int64_t>(pos + 1 - j_lo, 0, nk), srow + nk, -INFINITY);
        if (p.sinks) softmax_with_sink(srow, nk, p.sinks[hk * group + g]);
        else cpu::softmax(srow, nk);
      }
    }
    if (!half) {
      sgemm(rows, DV, nk, score.data(), nk, cache.v_head(layer, hk) + j_lo * DV, DV, ob.data(), DV, false);
    } else {
      for (int64_t j = j_lo; j < j_hi; j += kb) {  // V in key blocks, widened, accumulated
        const int64_t w = std::min(kb, j_hi - j);
        cpu::kv_widen_values(cache.type, cache.v_row_bytes(layer, hk, j), cache.v_row_stride(), w, DV, kv32.data());
        // 32-column panels: the block is in L1, and the 8-row kernel does twice the work per load
        // of the 128-column one
        for (int64_t c = 0; c < DV; c += 32)
          sgemm(rows, std::min<int64_t>(32, DV - c), w, &score[size_t(j - j_lo)], nk, kv32.data() + c, DV, ob.data() + c,
                DV, j > j_lo);
      }
    }
    for (int64_t t = t0; t < t1; ++t)
      for (int g = 0; g < group; ++g)
        std::copy_n(&ob[size_t(((t - t0) * group + g) * DV)], DV, out + (t * p.n_head + hk * group + g) * DV);
  });
}

void attention_mla(int n_head, int kv_lora, int rope, float scale, KvCache& cache, int layer, const float* q,
                   int64_t n_tok, int64_t pos0, float* out) {
  const int64_t R = kv_lora, W = kv_lora + rope;
  cpu::compute_pool().run(n_tok * n_head, [&](int64_t task, int) {
    const int64_t t = task / n_head, h = task % n_head, pos = pos0 + t;
    thread_local std::vector<float> score;
    score.resize(size_t(pos + 1));
    const float* qt = q + (t * n_head + h) * W;
    for (int64_t j = 0; j <= pos; ++j) {
      const float* row = cache.k_row(layer, j);  // [c (R) | k_pe (rope)]
      const float s = cpu::dot_f32(qt, row, R), s_pe = cpu::dot_f32(qt + R, row + R, rope);
      score[size_t(j)] = (s + s_pe) * scale;
    }
    cpu::softmax(score.data(), pos + 1);
    float* c = out + (t * n_head + h) * R;
    std::fill(c, c + R, 0.0f);
    for (int64_t j = 0; j <= pos; ++j) {
      const float* row = cache.k_row(layer, j);
      const float w = score[size_t(j)];
      for (int64_t i = 0; i < R; ++i) c[i] += w * row[i];
    }
  });
}

void embed(const Model& m, const int32_t* tokens, int64_t n_tok, float* x) {
  prof::Span span(prof::Part::embed);
  const int64_t E = m.hparams().n_embd;
  for (int64_t t = 0; t < n_tok; ++t) cpu::get_row(m.tok_embd, tokens[t], x + t * E);
}

void for_row_chunks(int64_t n_rows, int64_t width, const std::function<void(int64_t, int64_t)>& fn) {
  cpu::ThreadPool& pool = cpu::compute_pool();
  if (n_rows * width < kPooledRowFloats || pool.size() == 1 || cpu::ThreadPool::in_pool()) {
    fn(0, n_rows);
    return;
  }
  const int64_t n_chunks = std::min<int64_t>(n_rows, 4 * int64_t(pool.size()));
  pool.run(n_chunks, [&](int64_t c, int) { fn(n_rows * c / n_chunks, n_rows * (c + 1) / n_chunks); });
}

void rms_norm_rows(const float* x, const Weight& w, int64_t n_tok, int64_t n, float eps, float* out) {
  for_row_chunks(n_tok, n, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) cpu::rms_norm(x + t * n, f32(w), n, eps, out + t * n);
  });
}

void gqa_attention(const Backend& be, const HParams& hp, const LayerWeights& l,
                   std::span<const SeqSpan> seqs, int il, const float* h, int64_t n_tok, float* y) {
  const int64_t E = hp.n_embd, H = hp.n_head, HKV = hp.n_head_kv, DK = hp.head_dim_k,
                DV = hp.head_dim_v;
  // the layer's scratch, reused: allocated per layer (18 MB in pp512 of the 30B-A3B) it cost a
  // memset and the pages' return to the kernel at every layer (1.3% of a pp512 profile); every
  // element is written below before it is read. Local references: the pool's tasks must see the
  // caller's buffers, not their own thread's.
  struct Scratch {
    std::vector<float> q, k, v, attn;
  };
  thread_local Scratch tl_scratch;
  std::vector<float>&q = tl_scratch.q, &k = tl_scratch.k, &v = tl_scratch.v, &attn = tl_scratch.attn;
  q.resize(size_t(n_tok * H * DK));
  k.resize(size_t(n_tok * HKV * DK));
  v.resize(size_t(n_tok * HKV * DV));
  attn.resize(size_t(n_tok * H * DV));
  const cpu::Matmul::MatmulOut qkv[] = {{&l.wq, q.data()}, {&l.wk, k.data()}, {&l.wv, v.data()}};
  be.matmul_batch(qkv, h, n_tok);
  add_bias(q.data(), l.bq, n_tok, H * DK);
  add_bias(k.data(), l.bk, n_tok, HKV * DK);
  add_bias(v.data(), l.bv, n_tok, HKV * DV);
  if (l.q_norm) {  // per head (qwen3moe)
    be.rms_norm_rows(q.data(), l.q_norm, n_tok * H, DK, hp.eps, q.data());
    be.rms_norm_rows(k.data(), l.k_norm, n_tok * HKV, DK, hp.eps, k.data());
  }
  int64_t t0 = 0;
  for (const SeqSpan& seq : seqs) {
    be.rope(&q[size_t(t0 * H * DK)], seq.n_tok, int(H), int(DK), seq.pos0, hp.rope);
    be.rope(&k[size_t(t0 * HKV * DK)], seq.n_tok, int(HKV), int(DK), seq.pos0, hp.rope);
    KvCache& cache = *seq.cache;
    // by kv head (each head's key blocks and value rows are its own memory)
    const int64_t ts = t0;
    for_row_chunks(HKV, seq.n_tok * (DK + DV), [&](int64_t h0, int64_t h1) {
      for (int64_t hk = h0; hk < h1; ++hk)
        for (int64_t i = 0; i < seq.n_tok; ++i) {
          const int64_t t = ts + i, pos = seq.pos0 + i, kb = KvCache::kKeyBlock;
          cpu::kv_store_key(cache.type, &k[size_t((t * HKV + hk) * DK)], DK, cache.k_block_bytes(il, int(hk), pos / kb),
                            pos % kb);
          cpu::kv_store_value(cache.type, &v[size_t((t * HKV + hk) * DV)], DV, cache.v_row_bytes(il, int(hk), pos));
        }
    });
    t0 += seq.n_tok;
  }
  const AttentionParams ap{.n_head = hp.n_head,
                           .n_head_kv = hp.n_head_kv,
                           .head_dim_k = hp.head_dim_k,
                           .head_dim_v = hp.head_dim_v,
                           .scale = hp.attn_scale,
                           .n_swa = hp.window(il),
                           .sinks = f32(l.attn_sinks)};
  {
    prof::Span span(prof::Part::attention_core);
    t0 = 0;
    for (const SeqSpan& seq : seqs) {  // each sequence over its own cache
      be.attention_gqa(ap, *seq.cache, il, &q[size_t(t0 * H * DK)], seq.n_tok, seq.pos0, &attn[size_t(t0 * H * DV)]);
      t0 += seq.n_tok;
    }
  }
  be.matmul(l.wo, attn.data(), n_tok, y);
  add_bias(y, l.bo, n_tok, E);
}

void add_bias(float* x, const Weight& b, int64_t n_tok, int64_t n) {
  if (!b) return;
  for (int64_t t = 0; t < n_tok; ++t) cpu::add(x + t * n, f32(b), n);
}

}  // namespace strata
