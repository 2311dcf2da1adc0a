// strata bench: prefill and decode speed, as a table like llama-bench's. Without -p / -n it runs
// the standard sweep: prompt 512 and 4096 (pp), decode 128 (tg) with 1 and 4 sequences decoded
// together (the server's continuous batching). Each test runs at each --depth (tokens of context,
// evaluated once) in a fresh session on random tokens: an untimed warm-up pass (unless
// --no-warmup), then --reps timed ones, the depths' repetitions taken in turn (so that a ratio
// between depths compares passes of the same minute); the table gives the median and standard
// deviation of tok/s and compares each test with the machine's limit probed just before and after
// each repetition (DRAM roofline for decode, int8 peak for prefill: shared machines drift), giving
// every repetition's fraction and the median's.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>

#include "base/profiler.h"
#include "cli/bench_speculative.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cpu/calibrate.h"
#include "cpu/kernels.h"
#include "cpu/numa.h"
#include "cpu/thread_pool.h"
#include "engine/engram_tier.h"
#include "engine/numa_plan.h"
#include "engine/session.h"
#include "engine/trace_routing.h"
#include "storage/disk_probe.h"
#include "gpu/cuda_backend.h"
#include "engine/gpu_tier.h"
#include "storage/expert_store.h"
#include "storage/row_store.h"

namespace strata::cli {
namespace {

struct BenchOptions {
  CommonOptions common;
  std::vector<int> n_prompt;  // empty (with n_gen empty): the standard sweep
  std::vector<int> n_gen;
  std::vector<int> streams;  // decode tests: sequences decoded together; empty: 1 (sweep: 1 and 4)
  std::vector<int> depths;  // tokens of context before each test; empty: 0
  int reps = 3;
  bool no_warmup = false;  // no untimed pass before each test's repetitions
  bool profile = false;
  bool json = false;
  std::string routing = "model";
  bool speculative = false;
  int draft_max = 8;
  int spec_gen = 128;
  std::vector<int> numa_compare;  // node counts: compare expert placements on routing, then stop
  bool engram_reads = false;      // deepseek41: Engram row reads against the disk probe, then stop
};

struct Test {
  bool prefill = true;
  int n = 0;
  int streams = 1;  // decode: sequences stepped together; tok/s is their sum
  std::string name() const {
    return strfmt("%s%d", prefill ? "pp" : "tg", n) + (streams > 1 ? strfmt(" x%d", streams) : std::string());
  }
};

struct TestResult {
  Test test;
  int64_t depth = 0;
  std::vector<double> tok_per_s;
  double warmup_tok_per_s = 0;  // the untimed pass before the repetitions (0: --no-warmup)
  // each repetition's rate against the mean of the probes taken just before and after it; the
  // table gives the median repetition's (the lower of two middles)
  std::vector<double> limit_fractions;
  std::vector<std::string> limit_texts;
  size_t median_limit() const {
    std::vector<size_t> order(limit_fractions.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return limit_fractions[a] < limit_fractions[b]; });
    return order[(order.size() - 1) / 2];
  }
  std::string profile_text;
  // NVMe tier (streamed experts), last repetition
  double ram_hit_rate = 1, nvme_bytes_per_token = 0, nvme_gbps = 0, nvme_wait_per_token = 0;
  std::string nvme_text;
  // Routed-expert weight bytes each NUMA group's threads read per token, and that over the test's
  // wall time (cpu/numa.h; last repetition)
  std::vector<double> node_bytes_per_token, node_gbps;
  std::string node_text;
  // The simulated GPU tier's split of this test's expert uses and its modelled times (last rep)
  double gpu_vram_share = 0, gpu_ship_share = 0, gpu_cpu_share = 0;
  double gpu_model_cpu_ms = 0, gpu_model_gpu_ms = 0, gpu_model_copy_ms = 0;  // per token
  std::string gpu_text;
  // The CUDA backend's ops of this test (last rep): on the device / left to the host, and the
  // activation bytes copied each way per token
  int64_t cuda_device_ops = 0, cuda_host_ops = 0;
  double cuda_h2d_per_token = 0, cuda_d2h_per_token = 0;
  std::string cuda_text;
  // deepseek41's streamed Engram rows (last rep): per token, the row cache's hit rate, the time
  // the forward pass waited for them
  double engram_rows_per_token = 0, engram_bytes_per_token = 0, engram_hit_rate = 0, engram_wait_per_token = 0;
  std::string engram_text;
};

void engram_figures(const RowStoreStats& st, double tokens, TestResult& r) {
  r.engram_rows_per_token = double(st.rows) / tokens;
  r.engram_bytes_per_token = double(st.bytes_read) / tokens;
  r.engram_hit_rate = st.hit_rate();
  r.engram_wait_per_token = st.wait_seconds / tokens;
  r.engram_text = strfmt("Engram: %.1f rows per token (%.1f distinct), row-cache hit rate %.3f; %s read per token in %.1f "
                         "reads (%.1f rows prefetched, %.1f on demand), %.2f GB/s while reading; the forward pass waited "
                         "%.2f ms per token",
                         r.engram_rows_per_token, double(st.lookups) / tokens, r.engram_hit_rate,
                         format_bytes(r.engram_bytes_per_token).c_str(), double(st.reads) / tokens,
                         double(st.prefetched) / tokens, double(st.demand) / tokens, st.read_gbps(),
                         1e3 * r.engram_wait_per_token);
}

void cuda_figures(const CudaBackend::Stats& a, const CudaBackend::Stats& b, double tokens, TestResult& r) {
  r.cuda_device_ops = b.device_ops - a.device_ops;
  r.cuda_host_ops = b.host_ops - a.host_ops;
  r.cuda_h2d_per_token = double(b.h2d_bytes - a.h2d_bytes) / tokens;
  r.cuda_d2h_per_token = double(b.d2h_bytes - a.d2h_bytes) / tokens;
  r.cuda_text = strfmt("CUDA backend: %" PRId64 " ops on the device, %" PRId64 " on the host; %s of weights on the device; "
                       "per token %s copied in (weights on first use included), %s out%s%s",
                       r.cuda_device_ops, r.cuda_host_ops, format_bytes(double(b.weight_bytes)).c_str(),
                       format_bytes(r.cuda_h2d_per_token).c_str(), format_bytes(r.cuda_d2h_per_token).c_str(),
                       b.error.empty() ? "" : "; stopped: ", b.error.c_str());
}

// The GPU tier's figures of one run: where the expert uses went, and the modelled expert time per
// token of each side.
void gpu_figures(const GpuTier::Stats& a, const GpuTier::Stats& b, double tokens, TestResult& r) {
  const double gpu = double(b.gpu_uses - a.gpu_uses), ship = double(b.ship_uses - a.ship_uses),
               cpu = double(b.cpu_uses - a.cpu_uses), uses = gpu + ship + cpu;
  if (uses <= 0) return;
  r.gpu_vram_share = gpu / uses;
  r.gpu_ship_share = ship / uses;
  r.gpu_cpu_share = cpu / uses;
  r.gpu_model_cpu_ms = 1e3 * (b.model_cpu_s - a.model_cpu_s) / tokens;
  r.gpu_model_gpu_ms = 1e3 * (b.model_gpu_s - a.model_gpu_s) / tokens;
  r.gpu_model_copy_ms = 1e3 * (b.model_copy_s - a.model_copy_s) / tokens;
  r.gpu_text = strfmt("simulated GPU: expert uses %.1f%% from VRAM, %.1f%% shipped, %.1f%% on the CPU (%" PRId64
                      " of %" PRId64 " experts resident); modelled expert time per token: CPU %.2f ms, GPU %.2f ms "
                      "(of which PCIe %.2f ms)",
                      100 * r.gpu_vram_share, 100 * r.gpu_ship_share, 100 * r.gpu_cpu_share, b.resident, b.n_experts,
                      r.gpu_model_cpu_ms, r.gpu_model_gpu_ms, r.gpu_model_copy_ms);
}

// Per NUMA group: the expert bytes its threads read per token and their rate over `sec`.
void node_figures(double tokens, double sec, TestResult& r) {
  const cpu::NumaLayout& l = cpu::numa_layout();
  r.node_bytes_per_token.clear();
  r.node_gbps.clear();
  r.node_text = strfmt("numa %s, routed-expert bytes per token by the threads of", cpu::numa_policy_name(l.options()).c_str());
  for (int g = 0; g < l.n_groups() && g < prof::kMaxNodes; ++g) {
    const double bytes = double(prof::g_totals.node_bytes[size_t(g)].v.load());
    r.node_bytes_per_token.push_back(bytes / tokens);
    r.node_gbps.push_back(bytes / sec / 1e9);
    r.node_text += strfmt("%s node %d: %s at %.1f GB/s", g ? ";" : "", l.node_of_group(g),
                          format_bytes(bytes / tokens).c_str(), bytes / sec / 1e9);
  }
}

// The NVMe tier's figures of one run: hit rate, bytes read per token, achieved read rate against
// the probe, time the compute threads waited, and the look-ahead's precision and recall.
void nvme_figures(const ExpertStoreStats& st, double tokens, double probe_gbps, TestResult& r) {
  r.ram_hit_rate = st.hit_rate();
  r.nvme_bytes_per_token = double(st.bytes_read) / tokens;
  r.nvme_gbps = st.read_gbps();
  r.nvme_wait_per_token = st.wait_seconds / tokens;
  r.nvme_text = strfmt("NVMe: RAM hit rate %.3f, %.0f%% of misses prefetched; %s read per token (%.1f experts: %.1f "
                       "on demand, %.1f prefetched, %.0f%% of those used), %.2f GB/s while reading = %.2f of the "
                       "probe's %.2f GB/s; compute threads waited %.1f ms per token",
                       r.ram_hit_rate, 100.0 * st.prefetch_coverage(), format_bytes(r.nvme_bytes_per_token).c_str(),
                       double(st.demand_reads + st.prefetch_reads) / tokens, double(st.demand_reads) / tokens,
                       double(st.prefetch_reads) / tokens,
                       st.prefetch_reads ? 100.0 * double(st.prefetch_used) / double(st.prefetch_reads) : 0.0,
                       r.nvme_gbps, probe_gbps > 0 ? r.nvme_gbps / probe_gbps : 0.0, probe_gbps,
                       1e3 * r.nvme_wait_per_token);
  for (size_t d = 0; d < st.predicted.size(); ++d) {
    if (st.predicted[d] == 0) continue;
    r.nvme_text += strfmt("; look-ahead %zu: precision %.2f recall %.2f", d + 1,
                          double(st.predicted_right[d]) / double(st.predicted[d]),
                          double(st.predicted_right[d]) / double(std::max<int64_t>(1, st.chosen[d])));
  }
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}
double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1));
}

// The last run's time by part of the forward pass, per token, on one line.
std::string profile_line(int n_tokens) {
  int64_t total = 0;
  for (size_t p = 0; p < size_t(prof::Part::count); ++p)
    if (!prof::nested(prof::Part(p))) total += prof::g_totals.ns[p].load();
  if (total == 0) return "";
  std::vector<std::string> fields;
  for (size_t p = 0; p < size_t(prof::Part::count); ++p) {
    const int64_t ns = prof::g_totals.ns[p].load();
    if (ns == 0) continue;
    const std::string name(prof::kPartNames[p]);
    const double ms = double(ns) / 1e6 / n_tokens;
    if (prof::nested(prof::Part(p)) && !fields.empty())
      fields.back() += strfmt(" (of which %s %.2f ms)", name.c_str(), ms);
    else
      fields.push_back(strfmt("%s %.2f ms (%.0f%%)", name.c_str(), ms, 100.0 * double(ns) / double(total)));
  }
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) line += (i ? " | " : "") + fields[i];
  return line + " per token";
}

int fail(const std::string& m) {
  std::fprintf(stderr, "strata bench: %s\n", m.c_str());
  return 1;
}

// --numa-compare: whole experts per node against rows split over the nodes, on the --routing
// source (synthetic where the routers would decide). Reads the file's header only: no weight is
// loaded and no forward pass runs.
int numa_compare(const BenchOptions& o) {
  auto config = resolve_config(o.common);
  if (!config) return fail(config.error().message);
  auto f = GgufFile::open(config->model_path, MappedFile::Mode::mmap);
  if (!f) return fail(f.error().message);
  auto hp = hparams_from_gguf(*f);
  if (!hp) return fail(hp.error().message);
  const std::string mode = o.routing == "model" ? "synthetic" : o.routing;
  auto routing = make_routing_override(mode, *hp);
  if (!routing) return fail(routing.error().message);
  std::vector<int> moe_layers;
  int64_t rows = 0;
  for (int il = 0; il < hp->n_layer; ++il)
    if (const GgufTensorInfo* t = f->find_tensor(strfmt("blk.%d.ffn_gate_exps.weight", il)); t != nullptr && t->n_dims == 3) {
      moe_layers.push_back(il);
      rows = int64_t(t->ne[1]);
    }
  if (moe_layers.empty()) return fail("--numa-compare: the model has no routed-expert layers");
  const int64_t n_tok = std::min<int64_t>((*routing)->n_tokens(), 4096);
  std::vector<std::vector<int32_t>> ids(moe_layers.size());
  Routing r;
  r.k = hp->n_expert_used;
  r.ids.resize(size_t(r.k));
  for (int64_t t = 0; t < n_tok; ++t)
    for (size_t i = 0; i < moe_layers.size(); ++i) {
      (*routing)->choose(moe_layers[i], 1, r);
      ids[i].insert(ids[i].end(), r.ids.begin(), r.ids.end());
    }
  std::printf("expert placement over NUMA nodes, %s, on %s routing (%lld tokens, %zu MoE layers, %d of %d experts "
              "a token, %lld rows an expert matrix): the busiest node's expert reads over the balanced time (1.00x: "
              "every node busy all along)\n",
              f->name().c_str(), mode.c_str(), static_cast<long long>(n_tok), moe_layers.size(), hp->n_expert_used,
              hp->n_expert, static_cast<long long>(rows));
  std::printf("| nodes | whole experts, decode | whole experts, 8 tokens | shard (rows split) |\n");
  std::printf("|-------|-----------------------|-------------------------|--------------------|\n");
  for (int n : o.numa_compare) {
    const NumaPlacementFigures fig = compare_numa_placements(ids, hp->n_expert_used, hp->n_expert, n, rows);
    std::printf("| %5d | %20.2fx | %22.2fx | %17.2fx |\n", n, fig.whole_decode, fig.whole_batch8, fig.shard);
  }
  return 0;
}

// --engram-reads: the rate of Engram row reads against the disk probe's for the same request size
// (random 4 KiB blocks of the model file, O_DIRECT) at each queue depth. The rows are drawn at random
// over the tables (each its own block: the worst case, no merging, no cache hits) and read in
// batches of a prompt's worth through a fresh row store of that depth; a block read per row.
int engram_reads(const Engine& engine, bool json) {
  const Model& m = engine.model();
  if (m.hparams().engram.layers.empty()) return fail("--engram-reads: the model has no Engram tables");
  const std::vector<RowTable> tables = engram_tables(m);
  const std::string& path = engine.config().model_path;
  std::mt19937_64 rng(7);
  nlohmann::json arr = nlohmann::json::array();
  if (!json) {
    std::printf("Engram row reads of %s against the disk probe (random 4 KiB O_DIRECT reads of the file), CPU %s\n",
                path.c_str(), std::string(cpu::isa_name()).c_str());
    std::printf("| queue depth | probe GB/s | probe reads/s | Engram rows/s | Engram GB/s (blocks) | of the probe |\n");
    std::printf("|------------:|-----------:|--------------:|--------------:|---------------------:|-------------:|\n");
  }
  double best_probe = 0, best_rows = 0;
  for (int qd : {1, 4, 16, 32, 64, 128}) {
    storage::DiskProbeOptions po;
    po.path = path;
    po.block_bytes = storage::kDirectAlign;
    po.queue_depth = qd;
    po.access = storage::DiskAccess::random;
    po.seconds = 2;
    auto probe = storage::measure_disk_read(po);
    if (!probe) return fail(probe.error().message);
    RowStoreOptions ro;
    ro.cache_bytes = uint64_t(RowStore::kMinRows) * 4 * 4096;
    ro.queue_depth = qd;
    auto store = RowStore::open(tables, path, ro);
    if (!store) return fail(store.error().message);
    const auto t0 = std::chrono::steady_clock::now();
    double sec = 0;
    int64_t rows = 0;
    std::vector<int64_t> batch(2048);
    std::vector<uint8_t> out;
    while (sec < 2) {
      const int t = int(rng() % tables.size());
      for (int64_t& r : batch) r = int64_t(rng() % tables[size_t(t)].n_rows);
      out.resize(batch.size() * tables[size_t(t)].row_bytes);
      (*store)->prefetch(t, batch);
      if (!(*store)->gather(t, batch, out.data())) return fail((*store)->take_error().error().message);
      rows += int64_t(batch.size());
      sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const RowStoreStats st = (*store)->stats();
    const double gbps = double(st.bytes_read) / sec / 1e9, probe_reads = probe->gbps * 1e9 / 4096.0;
    best_probe = std::max(best_probe, probe->gbps);
    best_rows = std::max(best_rows, gbps);
    if (json) {
      arr.push_back({{"queue_depth", qd}, {"probe_gbps", probe->gbps}, {"probe_method", probe->method},
                     {"engram_rows_per_s", double(rows) / sec}, {"engram_gbps", gbps}, {"engram_reads", st.reads}});
    } else {
      std::printf("| %11d | %10.3f | %13.0f | %13.0f | %20.3f | %12.2f |\n", qd, probe->gbps, probe_reads,
                  double(rows) / sec, gbps, probe->gbps > 0 ? gbps / probe->gbps : 0.0);
    }
  }
  if (json) {
    std::printf("%s\n", nlohmann::json{{"engram_reads", arr}, {"best_probe_gbps", best_probe}, {"best_engram_gbps", best_rows}}
                             .dump(2).c_str());
  } else {
    std::printf("\nbest: Engram rows %.3f GB/s against the probe's %.3f GB/s = %.2f\n", best_rows, best_probe,
                best_probe > 0 ? best_rows / best_probe : 0.0);
  }
  return 0;
}

int run_bench(const BenchOptions& o) {
  if (!o.numa_compare.empty()) return numa_compare(o);
  auto loaded = load_model(o.common, "strata bench");
  if (!loaded) return fail(loaded.error().message);
  if (o.engram_reads) return engram_reads(**loaded, o.json);
  auto routing = make_routing_override(o.routing, (*loaded)->model().hparams());
  if (!routing) return fail(routing.error().message);
  (*loaded)->set_routing_override(routing->get());
  if (*routing) {
    std::fprintf(stderr, "strata bench: routing replayed from --routing %s (%lld tokens, repeated as needed); "
                 "the NVMe look-ahead reads it ahead (an oracle: storage.prefetch_depth=0 gives the other bound)\n",
                 o.routing.c_str(), static_cast<long long>((*routing)->n_tokens()));
  }
  const Engine& engine = **loaded;
  const Model& m = engine.model();
  const ModelSummary& sm = engine.summary();
  const int64_t ctx_limit = context_limit(m, engine.config());
  std::vector<Test> tests;
  const bool sweep = o.n_prompt.empty() && o.n_gen.empty();
  for (int n : sweep ? std::vector<int>{512, 4096} : o.n_prompt)
    if (n > 0) tests.push_back({true, n});
  const std::vector<int> streams = !o.streams.empty() ? o.streams : sweep ? std::vector<int>{1, 4} : std::vector<int>{1};
  for (int n : sweep ? std::vector<int>{128} : o.n_gen)
    for (int st : streams)
      if (n > 0 && st > 0) tests.push_back({false, n, st});

  cpu::ThreadPool& pool = cpu::compute_pool();
  const auto* cuda = dynamic_cast<const CudaBackend*>(engine.backend());
  const std::string backend = "CPU " + std::string(cpu::isa_name()) + (cuda != nullptr ? " + CUDA" : "");
  const std::string model_name = sm.name.empty() ? sm.arch : sm.name;
  const double params = double(sm.n_params) / 1e9;
  std::mt19937 rng(1234);
  std::vector<TestResult> results;
  // NVMe tier: the disk's rate for reads like the store's (O_DIRECT, random 1 MiB blocks of the
  // model file, same queue depth), the yardstick of its achieved rate
  ExpertStore* store = engine.expert_store();
  double nvme_probe_gbps = 0;
  if (store != nullptr) {
    storage::DiskProbeOptions po;
    po.path = engine.config().model_path;
    po.queue_depth = engine.config().queue_depth;
    po.access = storage::DiskAccess::random;
    po.seconds = 3;
    auto probe = storage::measure_disk_read(po);
    if (!probe) return fail(probe.error().message);
    nvme_probe_gbps = probe->gbps;
    std::fprintf(stderr, "strata bench: disk probe of the model file: %.2f GB/s (%s, random 1 MiB reads, queue depth %d)%s%s\n",
                 probe->gbps, probe->method.c_str(), po.queue_depth, probe->note.empty() ? "" : "; ", probe->note.c_str());
  }
  if (o.speculative) {
    SpeculativeBenchOptions so;
    if (o.depths.size() > 1) return fail("bench --speculative: one --depth, not a list");
    so.depth = !o.depths.empty() && o.depths[0] > 0 ? o.depths[0] : so.depth;
    so.steps = o.n_gen.empty() ? so.steps : std::max(1, o.n_gen[0]);
    so.max_k = o.draft_max;
    so.gen_tokens = o.spec_gen;
    so.json = o.json;
    so.nvme_probe_gbps = nvme_probe_gbps;
    return bench_speculative(engine, so);
  }
  if (!o.json) {
    std::printf("| %-28s | %10s | %8s | %-10s | %7s | %8s | %20s | %-34s |\n", "model", "size", "params", "backend",
                "threads", "test", "t/s", "of the machine's limit");
    std::printf("|%s|%s|%s|%s|%s|%s|%s|%s|\n", std::string(30, '-').c_str(), std::string(12, '-').c_str(),
                std::string(10, '-').c_str(), std::string(12, '-').c_str(), std::string(9, '-').c_str(),
                std::string(10, '-').c_str(), std::string(22, '-').c_str(), std::string(36, '-').c_str());
  }
  // decode's roofline counts the KV cache's bytes where attention reads every cached position
  // (GQA without a window, MLA); windowed and compressed attention (gpt-oss, deepseek4/41) read
  // less than the cache holds, and the roofline is the weights' alone
  const Arch arch = m.hparams().arch;
  const bool kv_read_counted = m.hparams().n_swa == 0 && arch != Arch::deepseek4 && arch != Arch::deepseek41;
  double kv_read_per_token = 0;  // the last decode test's
  const std::vector<int> depths = o.depths.empty() ? std::vector<int>{0} : o.depths;
  // one test at one depth: its sessions (decode tests step `streams` sequences together; prefill
  // tests use the first only), each evaluated to the depth once, and its random tokens
  struct DepthRun {
    int64_t depth = 0;
    std::vector<int32_t> tokens;
    std::vector<std::unique_ptr<Session>> seqs;
    TestResult r;
  };
  for (const Test& t : tests) {
    std::vector<DepthRun> runs;
    for (int d : depths) {
      const int64_t need = int64_t(d) + t.n + 1;
      if (need > ctx_limit) {
        std::fprintf(stderr, "strata bench: %s at depth %d skipped: %lld tokens exceed the context of %lld\n",
                     t.name().c_str(), d, static_cast<long long>(need), static_cast<long long>(ctx_limit));
        continue;
      }
      DepthRun& run = runs.emplace_back();
      run.depth = d;
      run.r.test = t;
      run.r.depth = d;
      run.tokens.resize(size_t(need - 1));
      for (auto& id : run.tokens) id = int32_t(rng() % uint32_t(m.hparams().n_vocab));
      for (int i = 0; i < (t.prefill ? 1 : t.streams); ++i)
        run.seqs.push_back(std::make_unique<Session>(engine, int(need), cpu::MatmulPath::quantized, engine.config().kv_type));
    }
    // each pass starts again from the depth's context (truncate, or the part a compressor ring
    // cannot resume evaluated again)
    auto back_to_depth = [&](DepthRun& run) -> Status {
      for (auto& q : run.seqs) {
        const int64_t kept = q->n_past() > run.depth ? q->truncate(run.depth) : q->n_past();
        if (kept < run.depth) {
          auto l = q->eval(std::span<const int32_t>(run.tokens.data() + kept, size_t(run.depth - kept)));
          if (!l) return l.error();
          q->checkpoint();
        }
      }
      return Status::success();
    };
    // one pass of the test (n tokens: the prompt, or decode steps); seconds
    auto run_pass = [&](DepthRun& run, int pass, int n) -> Result<double> {
      STRATA_TRY(back_to_depth(run));
      Session& s = *run.seqs[0];
      const auto t0 = std::chrono::steady_clock::now();
      if (t.prefill) {
        auto l = s.eval(std::span<const int32_t>(run.tokens.data() + run.depth, size_t(n)));
        if (!l) return l.error();
      } else {
        std::vector<Session*> batch;
        std::vector<std::vector<int32_t>> next;
        for (size_t i = 0; i < run.seqs.size(); ++i) {
          batch.push_back(run.seqs[i].get());
          // each pass starts from another token: the same greedy walk again would find every
          // Engram row (and more experts) cached from the last one
          next.push_back({run.tokens[(size_t(run.depth) + i + size_t(pass + 1) * 7919) % run.tokens.size()]});
        }
        const size_t V = size_t(m.hparams().n_vocab);
        for (int i = 0; i < n; ++i) {
          auto l = Session::eval_batch(batch, next);
          if (!l) return l.error();
          for (size_t q = 0; q < batch.size(); ++q) next[q] = {argmax(std::span<const float>(l->data() + q * V, V))};
        }
      }
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    // the warm-up pass, untimed as llama-bench's: the first pass after loading pays for pages
    // and buffers touched for the first time (a prefill's whole length; decode: a few steps)
    if (!o.no_warmup) {
      for (DepthRun& run : runs) {
        const int n = t.prefill ? t.n : std::min(t.n, 4);
        auto sec = run_pass(run, -1, n);
        if (!sec) return fail(sec.error().message);
        run.r.warmup_tok_per_s = double(n) * (t.prefill ? 1 : t.streams) / *sec;
      }
    }
    for (int rep = 0; rep < o.reps; ++rep) {
      for (DepthRun& run : runs) {
        TestResult& r = run.r;
        // the machine's limit around the timed part: probed just before and just after, the mean
        // taken (this VM's bandwidth moves by 2x within minutes; one probe before a run that lasts
        // seconds missed phase changes in both directions)
        if (auto st = back_to_depth(run); !st.ok()) return fail(st.error().message);
        auto probe = [&] { return t.prefill ? cpu::measure_int8_peak_gops(pool) : cpu::measure_read_gbps(pool); };
        const double limit_before = probe();
        if (store != nullptr) store->reset_stats();
        if (engine.engram_store() != nullptr) engine.engram_store()->reset_stats();
        prof::reset();
        const GpuTier::Stats gpu_before = engine.gpu_tier() ? engine.gpu_tier()->stats() : GpuTier::Stats{};
        const CudaBackend::Stats cuda_before = cuda != nullptr ? cuda->stats() : CudaBackend::Stats{};
        prof::enable(o.profile);
        auto timed = run_pass(run, rep, t.n);
        prof::enable(false);
        if (!timed) return fail(timed.error().message);
        const double sec = *timed;
        const double limit = 0.5 * (limit_before + probe());
        r.tok_per_s.push_back(double(t.n) * (t.prefill ? 1 : t.streams) / sec);
        if (t.prefill) {
          // 2 ops per weight per token; the output head runs for the last token only
          const double out = double(sm.roles[int(TensorRole::output)].n_params);
          const double gops = (2.0 * (double(sm.active_params_per_token) - out) * t.n + 2.0 * out) / sec / 1e9;
          r.limit_fractions.push_back(limit > 0 ? gops / limit : 0);
          r.limit_texts.push_back(strfmt("%.0f GOP/s = %.2f of int8 peak %.0f", gops, r.limit_fractions.back(), limit));
        } else {
          // bytes one sequence's token needs, over all tokens produced (streams share the weights'
          // reads: above 1 of the roofline means batching paid): the active weights, and the KV
          // cache each token attends to (the depth and half the test's tokens on average) where
          // attention reads every cached position
          const double kv = kv_read_counted ? double(kv_bytes_per_token(m.hparams(), run.seqs[0]->kv_type())) *
                                                  (double(run.depth) + 0.5 * double(t.n))
                                            : 0.0;
          kv_read_per_token = kv;
          const double gbs = (double(sm.active_bytes_per_token) + kv) * t.n * t.streams / sec / 1e9;
          r.limit_fractions.push_back(limit > 0 ? gbs / limit : 0);
          r.limit_texts.push_back(strfmt("%.1f GB/s = %.2f of DRAM %.1f GB/s", gbs, r.limit_fractions.back(), limit));
        }
        if (o.profile) r.profile_text = profile_line(t.n);
        node_figures(double(t.n) * (t.prefill ? 1 : t.streams), sec, r);
        if (engine.gpu_tier()) gpu_figures(gpu_before, engine.gpu_tier()->stats(), double(t.n) * (t.prefill ? 1 : t.streams), r);
        if (cuda != nullptr) cuda_figures(cuda_before, cuda->stats(), double(t.n) * (t.prefill ? 1 : t.streams), r);
        if (store != nullptr) nvme_figures(store->stats(), double(t.n) * (t.prefill ? 1 : t.streams), nvme_probe_gbps, r);
        if (engine.engram_store() != nullptr)
          engram_figures(engine.engram_store()->stats(), double(t.n) * (t.prefill ? 1 : t.streams), r);
      }
    }
    for (const DepthRun& run : runs) {
      const TestResult& r = run.r;
      if (!o.json) {
        const std::string name = t.name() + (run.depth > 0 ? strfmt(" @ d%lld", static_cast<long long>(run.depth)) : "");
        std::printf("| %-28s | %10s | %6.2f B | %-10s | %7d | %8s | %10.2f ± %7.2f | %-34s |\n", model_name.substr(0, 28).c_str(),
                    format_size(sm.n_bytes).c_str(), params, backend.c_str(), pool.size(), name.c_str(), median(r.tok_per_s),
                    stddev(r.tok_per_s), r.limit_texts[r.median_limit()].c_str());
        std::string samples, fractions;
        for (double x : r.tok_per_s) samples += strfmt("%s%.2f", samples.empty() ? "" : ", ", x);
        for (double x : r.limit_fractions) fractions += strfmt("%s%.2f", fractions.empty() ? "" : ", ", x);
        std::printf("    tok/s: median of %s (of the limit: %s; the table gives the median); %s\n", samples.c_str(),
                    fractions.c_str(),
                    o.no_warmup ? "no warm-up pass (--no-warmup): the first is the first pass after loading"
                                : strfmt("warm-up pass before them %.2f (untimed)", r.warmup_tok_per_s).c_str());
        if (&run != &runs[0]) {
          // against the first depth, repetition by repetition (taken in turn, minutes apart at most)
          const TestResult& r0 = runs[0].r;
          std::string ratios;
          for (size_t i = 0; i < r.tok_per_s.size() && i < r0.tok_per_s.size(); ++i)
            ratios += strfmt("%s%.2f", ratios.empty() ? "" : ", ", r.tok_per_s[i] / r0.tok_per_s[i]);
          std::printf("    %.2fx of depth %lld's tok/s (medians); repetition by repetition %s\n",
                      median(r.tok_per_s) / median(r0.tok_per_s), static_cast<long long>(runs[0].depth), ratios.c_str());
        }
        if (o.profile) std::printf("    %s\n", r.profile_text.c_str());
        if (store != nullptr) std::printf("    %s\n", r.nvme_text.c_str());
        if (!r.engram_text.empty()) std::printf("    %s\n", r.engram_text.c_str());
        std::printf("    %s\n", r.node_text.c_str());
        if (!r.gpu_text.empty()) std::printf("    %s\n", r.gpu_text.c_str());
        if (!r.cuda_text.empty()) std::printf("    %s\n", r.cuda_text.c_str());
        std::fflush(stdout);
      }
    }
    for (DepthRun& run : runs) results.push_back(std::move(run.r));
  }
  if (o.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const TestResult& r : results) {
      arr.push_back({{"model", model_name},
                     {"model_path", engine.config().model_path},
                     {"size", sm.n_bytes},
                     {"params", sm.n_params},
                     {"backend", backend},
                     {"threads", pool.size()},
                     {"test", r.test.name()},
                     {"n_prompt", r.test.prefill ? r.test.n : 0},
                     {"n_gen", r.test.prefill ? 0 : r.test.n},
                     {"n_depth", r.depth},
                     {"streams", r.test.prefill ? 1 : r.test.streams},
                     {"avg_ts", mean(r.tok_per_s)},
                     {"median_ts", median(r.tok_per_s)},
                     {"warmup_ts", r.warmup_tok_per_s},
                     {"stddev_ts", stddev(r.tok_per_s)},
                     {"samples_ts", r.tok_per_s},
                     {"limit_fraction", r.limit_fractions[r.median_limit()]},
                     {"limit_fractions", r.limit_fractions},
                     {"limit", r.limit_texts[r.median_limit()]},
                     {"prefill_tps", r.test.prefill ? median(r.tok_per_s) : 0.0},
                     {"decode_tps", r.test.prefill ? 0.0 : median(r.tok_per_s)},
                     {"ram_hit_rate", r.ram_hit_rate},
                     {"nvme_bytes_per_token", r.nvme_bytes_per_token},
                     {"nvme_gbps", r.nvme_gbps},
                     {"nvme_probe_gbps", nvme_probe_gbps},
                     {"nvme_wait_s_per_token", r.nvme_wait_per_token},
                     {"engram_rows_per_token", r.engram_rows_per_token},
                     {"engram_bytes_per_token", r.engram_bytes_per_token},
                     {"engram_hit_rate", r.engram_hit_rate},
                     {"engram_wait_s_per_token", r.engram_wait_per_token},
                     {"numa_policy", cpu::numa_policy_name(cpu::numa_layout().options())},
                     {"node_expert_bytes_per_token", r.node_bytes_per_token},
                     {"node_expert_gbps", r.node_gbps},
                     {"gpu_vram_share", r.gpu_vram_share},
                     {"gpu_ship_share", r.gpu_ship_share},
                     {"gpu_cpu_share", r.gpu_cpu_share},
                     {"gpu_model_cpu_ms_per_token", r.gpu_model_cpu_ms},
                     {"gpu_model_gpu_ms_per_token", r.gpu_model_gpu_ms},
                     {"gpu_model_copy_ms_per_token", r.gpu_model_copy_ms},
                     {"cuda_device_ops", r.cuda_device_ops},
                     {"cuda_host_ops", r.cuda_host_ops},
                     {"cuda_h2d_bytes_per_token", r.cuda_h2d_per_token},
                     {"cuda_d2h_bytes_per_token", r.cuda_d2h_per_token},
                     {"routing", o.routing}});
    }
    std::printf("%s\n", arr.dump(2).c_str());
  } else {
    std::printf("\ndecode roofline of this model: %s read per token", format_bytes(double(sm.active_bytes_per_token)).c_str());
    if (kv_read_per_token > 0)
      std::printf(", and the KV cache: %s per token in the last decode test (counted)", format_bytes(kv_read_per_token).c_str());
    else if (!kv_read_counted && *std::max_element(depths.begin(), depths.end()) > 0)
      std::printf(" (the KV cache's reads not counted: windowed or compressed attention)");
    std::printf("\n");
  }
  if (engine.gpu_tier()) std::fprintf(stderr, "strata bench: %s\n", engine.gpu_tier()->summary().c_str());
  return 0;
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("bench", "prefill and decode speed (llama-bench style table); default sweep pp512, pp4096, tg128 x1 and x4");
  auto o = std::make_shared<BenchOptions>();
  add_common(sub, o->common);
  sub->add_option("-p,--n-prompt", o->n_prompt, "prompt lengths, prefilled in one batch (comma list)")
      ->delimiter(',')->check(CLI::NonNegativeNumber);
  sub->add_option("-n,--n-gen", o->n_gen, "decoded token counts (comma list)")->delimiter(',')->check(CLI::NonNegativeNumber);
  sub->add_option("-s,--streams", o->streams, "decode tests: sequences decoded together, tok/s summed (comma list, e.g. 1,2,4)")
      ->delimiter(',')->check(CLI::PositiveNumber);
  sub->add_option("-d,--depth", o->depths,
                  "tokens of context before each test (comma list: each test at each depth, their repetitions in "
                  "turn, with each depth's tok/s against the first's)")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  sub->add_option("-r,--reps", o->reps, "timed repetitions of each test (default 3; the table gives their median)")
      ->check(CLI::PositiveNumber);
  sub->add_flag("--no-warmup", o->no_warmup,
                "no untimed warm-up pass before each test's repetitions (a prefill's whole prompt, 4 decode steps), "
                "so the first repetition is the first pass after loading");
  sub->add_option("--numa-compare", o->numa_compare,
                  "compare splitting routed experts by rows (shard) with whole experts per node, on --routing "
                  "(synthetic by default), for these node counts (comma list), and stop")
      ->delimiter(',')
      ->check(CLI::Range(2, 64));
  sub->add_flag("--engram-reads", o->engram_reads,
                "deepseek41: the rate of Engram row reads (random rows, 4 KiB blocks) against the disk probe's at "
                "queue depths 1 to 128, then stop");
  sub->add_flag("--profile", o->profile, "print each test's time per token by part of the layer");
  sub->add_flag("--json", o->json, "print the results as JSON");
  sub->add_option("--routing", o->routing,
                  "whose expert choices: model (the routers', default), trace:FILE (a recorded trace, "
                  "../shared/traces format, mapped onto the model), synthetic[:ZIPF,REPEAT,DRIFT] (skewed, "
                  "fitted to the Mixtral trace by default)");
  sub->add_flag("--speculative", o->speculative,
                "speculative decoding's cost curve instead of the tests: a verification step of k = 0 .. "
                "--draft-max drafted tokens against a plain step and its roofline (-n: steps per k, default 16; "
                "-d: depth, default 64), and the speed-up by acceptance rate");
  sub->add_option("--spec-gen", o->spec_gen, "--speculative: tokens generated end to end, plain and drafted (default 128, 0: skip)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--draft-max", o->draft_max, "--speculative: the largest k (default 8)")->check(CLI::Range(1, 32));
  return [o] { return run_bench(*o); };
}

}  // namespace strata::cli
