// strata run: generate text from a prompt. strata bench: prefill and decode speed.
// Both run the bundled default model when -m is not given.

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <memory>
#include <random>

#include "base/profiler.h"
#include "cli/commands.h"
#include "cpu/calibrate.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/model.h"
#include "model/model_info.h"
#include "model/tokenizer.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct CommonOptions {
  std::string model = STRATA_DEFAULT_MODEL;
  int threads = 0;  // 0: one per physical core
  int ctx = 0;      // 0: the model's training context
  MappedFile::Mode load = MappedFile::Mode::automatic;
};

void add_common(CLI::App* sub, CommonOptions& o) {
  sub->add_option("-m,--model", o.model, "GGUF model (default: the bundled tiny qwen3moe)");
  sub->add_option("-t,--threads", o.threads, "CPU threads (default: all cores)")->check(CLI::NonNegativeNumber);
  sub->add_option("-c,--ctx", o.ctx, "context length cap (default: the model's)")->check(CLI::PositiveNumber);
  sub->add_option("--load", o.load,
                  "weights into memory: ram (read into huge pages: faster decode), mmap (page cache: "
                  "instant start), auto (default: ram when the file fits in 80% of available memory)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, MappedFile::Mode>{
          {"mmap", MappedFile::Mode::mmap}, {"ram", MappedFile::Mode::ram}, {"auto", MappedFile::Mode::automatic}}));
}

struct Loaded {
  std::unique_ptr<Model> model;
  ModelSummary summary;
};

Result<Loaded> load(const CommonOptions& o, const char* cmd) {
  if (o.threads > 0) cpu::set_compute_threads(o.threads);
  const auto t0 = Clock::now();
  auto m = Model::load(o.model, o.load);
  if (!m) return m.error();
  auto s = summarize_model((*m)->file());
  if (!s) return s.error();
  std::fprintf(stderr, "%s: loaded %s (%s, %s) in %.2f s (%s), %d threads\n", cmd, o.model.c_str(),
               s->arch.c_str(), format_bytes(double(s->n_bytes)).c_str(), seconds_since(t0),
               (*m)->file().load_mode() == MappedFile::Mode::ram ? "read into RAM" : "mapped",
               cpu::compute_pool().size());
  return Loaded{std::move(*m), std::move(*s)};
}

struct RunOptions {
  CommonOptions common;
  std::string prompt = "The quick brown fox";
  GenerateOptions gen{.n_predict = 64};
  SamplerParams sampling{.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                         .repeat_penalty = 1.0f, .penalty_last_n = 64, .seed = 0};
  bool seed_given = false;
};

// Context of a session: the model's, capped by --ctx; only what this run needs is allocated.
int64_t context_limit(const Model& m, const CommonOptions& o) {
  int64_t ctx = m.hparams().n_ctx_train > 0 ? m.hparams().n_ctx_train : 4096;
  if (o.ctx > 0) ctx = std::min<int64_t>(ctx, o.ctx);
  return ctx;
}

int run_generate(RunOptions o) {
  auto loaded = load(o.common, "strata run");
  if (!loaded) {
    std::fprintf(stderr, "strata run: %s\n", loaded.error().message.c_str());
    return 1;
  }
  const Model& m = *loaded->model;
  auto tok = Tokenizer::from_gguf(m.file());
  if (!tok) {
    std::fprintf(stderr, "strata run: %s\n", tok.error().message.c_str());
    return 1;
  }
  std::vector<TokenId> ids = tok->tokenize(o.prompt, /*add_special=*/true, /*parse_special=*/true);
  if (ids.empty()) {
    std::fprintf(stderr, "strata run: the prompt is empty\n");
    return 1;
  }
  const int64_t limit = context_limit(m, o.common);
  if (int64_t(ids.size()) >= limit) {
    std::fprintf(stderr, "strata run: the prompt has %zu tokens, more than the context of %" PRId64
                 " leaves room for (raise --ctx, up to the model's %d)\n",
                 ids.size(), limit, m.hparams().n_ctx_train);
    return 1;
  }
  const int ctx = int(std::min<int64_t>(limit, int64_t(ids.size()) + o.gen.n_predict));
  if (!o.seed_given) o.sampling.seed = std::random_device{}();
  Session session(m, ctx);
  Sampler sampler(o.sampling);

  std::printf("%s", o.prompt.c_str());
  std::fflush(stdout);
  std::vector<TokenId> history;
  auto r = generate(session, *tok, sampler, ids, history, o.gen, [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  std::printf("\n");
  if (!r) {
    std::fprintf(stderr, "strata run: %s\n", r.error().message.c_str());
    return 1;
  }
  std::fprintf(stderr,
               "strata run: prefill %d tokens in %.2f s (%.1f tok/s), time to first token %.2f s; "
               "decode %d tokens in %.2f s (%.2f tok/s); stopped by %s; seed %" PRIu64 "\n",
               r->n_prompt, r->prefill_seconds, r->n_prompt / r->prefill_seconds, r->prefill_seconds,
               r->n_generated, r->decode_seconds,
               r->n_generated > 1 ? (r->n_generated - 1) / r->decode_seconds : 0.0, r->stop_reason,
               o.sampling.seed);
  return 0;
}

struct BenchOptions {
  CommonOptions common;
  int n_prompt = 128;
  int n_gen = 32;
  int reps = 1;
  bool profile = false;
};

// The time of the last test by part of the forward pass (prof::Span), per token.
void print_profile(int n_tokens) {
  int64_t total = 0;
  for (size_t p = 0; p < size_t(prof::Part::count); ++p)
    if (!prof::nested(prof::Part(p))) total += prof::g_totals.ns[p].load();
  if (total == 0) return;
  // one field per part; a nested part goes inside the field of the part it belongs to
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
  std::string line = "           ";
  for (size_t i = 0; i < fields.size(); ++i) {
    line += i ? " | " : " ";
    line += fields[i];
  }
  std::printf("%s per token\n", line.c_str());
  prof::reset();
}

int run_bench(const BenchOptions& o) {
  auto loaded = load(o.common, "strata bench");
  if (!loaded) {
    std::fprintf(stderr, "strata bench: %s\n", loaded.error().message.c_str());
    return 1;
  }
  const Model& m = *loaded->model;
  const int V = m.hparams().n_vocab;
  std::mt19937 rng(1234);
  std::vector<int32_t> prompt(size_t(o.n_prompt));
  for (auto& id : prompt) id = int32_t(rng() % uint32_t(V));
  // The machine's limits: decode is held to the DRAM roofline, prefill to the int8 dot-product
  // peak. Shared (virtual) machines drift by tens of percent within minutes, so each test is
  // compared with a probe taken just before it.
  cpu::ThreadPool& pool = cpu::compute_pool();
  double dram_gbps = cpu::measure_read_gbps(pool);
  double peak_gops = cpu::measure_int8_peak_gops(pool);
  const ModelSummary& sm = loaded->summary;
  const double roofline_tps = dram_gbps * 1e9 / double(sm.active_bytes_per_token);
  std::printf("machine: %d threads, DRAM read %.1f GB/s, int8 peak %.0f GOP/s (%s)\n", pool.size(),
              dram_gbps, peak_gops, std::string(cpu::isa_name()).c_str());
  std::printf("model: %s read and %.2f G weights per token; decode roofline %.2f tok/s\n",
              format_bytes(double(sm.active_bytes_per_token)).c_str(),
              double(sm.active_params_per_token) / 1e9, roofline_tps);
  std::printf("%-10s %7s %8s %9s %-28s\n", "test", "tokens", "seconds", "tok/s", "of the machine's limit");
  for (int rep = 0; rep < o.reps; ++rep) {
    const int64_t need = o.n_prompt + o.n_gen + 1;
    if (need > context_limit(m, o.common)) {
      std::fprintf(stderr, "strata bench: %" PRId64 " tokens exceed the context of %" PRId64 "\n", need,
                   context_limit(m, o.common));
      return 1;
    }
    Session s(m, int(need));
    prof::enable(o.profile);
    if (o.n_prompt > 0) {
      if (rep > 0) peak_gops = cpu::measure_int8_peak_gops(pool);
      prof::reset();
      const auto t0 = Clock::now();
      auto l = s.eval(prompt);
      if (!l) {
        std::fprintf(stderr, "strata bench: %s\n", l.error().message.c_str());
        return 1;
      }
      const double t = seconds_since(t0);
      // 2 ops per weight per token; the output head runs for the last token only
      const double params = double(sm.active_params_per_token - sm.roles[int(TensorRole::output)].n_params);
      const double gops = (2.0 * params * o.n_prompt + 2.0 * double(sm.roles[int(TensorRole::output)].n_params)) / t / 1e9;
      std::printf("%-10s %7d %8.2f %9.2f %.0f GOP/s = %.2f of int8 peak (%.0f)\n", strfmt("pp%d", o.n_prompt).c_str(),
                  o.n_prompt, t, o.n_prompt / t, gops, peak_gops > 0 ? gops / peak_gops : 0.0, peak_gops);
      if (o.profile) print_profile(o.n_prompt);
    }
    if (o.n_gen > 0) {
      int32_t next = prompt.empty() ? 0 : prompt.back();
      if (rep > 0 || o.n_prompt > 0) dram_gbps = cpu::measure_read_gbps(pool);
      prof::reset();
      const auto t0 = Clock::now();
      for (int i = 0; i < o.n_gen; ++i) {
        auto l = s.eval(std::span<const int32_t>(&next, 1));
        if (!l) {
          std::fprintf(stderr, "strata bench: %s\n", l.error().message.c_str());
          return 1;
        }
        next = argmax(*l);
      }
      const double t = seconds_since(t0);
      // what a decode step must read, per second: the weight-bandwidth a decoder achieves
      const double gbs = double(sm.active_bytes_per_token) * o.n_gen / t / 1e9;
      std::printf("%-10s %7d %8.2f %9.2f %.1f GB/s = %.2f of roofline (DRAM %.1f GB/s)\n",
                  strfmt("tg%d", o.n_gen).c_str(), o.n_gen, t, o.n_gen / t, gbs, gbs / dram_gbps, dram_gbps);
      if (o.profile) print_profile(o.n_gen);
    }
  }
  return 0;
}

}  // namespace

Runner add_run_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("run", "generate text from a prompt (CPU, exact float path)");
  auto o = std::make_shared<RunOptions>();
  add_common(sub, o->common);
  sub->add_option("-p,--prompt", o->prompt, "prompt text");
  sub->add_option("-n,--n-predict", o->gen.n_predict, "tokens to generate")->check(CLI::PositiveNumber);
  sub->add_option("--temp", o->sampling.temperature, "temperature (0: greedy)")->check(CLI::NonNegativeNumber);
  sub->add_option("--top-k", o->sampling.top_k, "top-k (0: off)");
  sub->add_option("--top-p", o->sampling.top_p, "top-p (1: off)")->check(CLI::Range(0.0f, 1.0f));
  sub->add_option_function<uint64_t>("--seed", [o](uint64_t s) { o->sampling.seed = s; o->seed_given = true; },
                                     "sampling seed (default: random, printed at the end)");
  sub->add_option("--min-p", o->sampling.min_p, "min-p (0: off)")->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--repeat-penalty", o->sampling.repeat_penalty, "repetition penalty (1: off)")->check(CLI::PositiveNumber);
  sub->add_option("--repeat-last-n", o->sampling.penalty_last_n, "tokens the penalty looks back (-1: all)");
  sub->add_option("--stop", o->gen.stop, "stop when the output contains this string (repeatable)");
  sub->add_flag("--ignore-eos", o->gen.ignore_eos, "keep generating past end-of-generation tokens");
  return [o] { return run_generate(*o); };
}

Runner add_bench_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("bench", "prefill and decode speed on random tokens");
  auto o = std::make_shared<BenchOptions>();
  add_common(sub, o->common);
  sub->add_option("-p,--n-prompt", o->n_prompt, "prompt tokens, prefilled in one batch")->check(CLI::NonNegativeNumber);
  sub->add_option("-n,--n-gen", o->n_gen, "decoded tokens")->check(CLI::NonNegativeNumber);
  sub->add_option("-r,--reps", o->reps, "repetitions")->check(CLI::PositiveNumber);
  sub->add_flag("--profile", o->profile, "print each test's time per token by part of the layer");
  return [o] { return run_bench(*o); };
}

}  // namespace strata::cli
