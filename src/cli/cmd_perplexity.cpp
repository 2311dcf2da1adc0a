// strata perplexity: llama-perplexity's measure of a model on a text, and its divergence from a
// reference (engine/perplexity.h).
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/perplexity.h"
#include "model/tokenizer.h"

namespace strata::cli {

namespace {

struct PerplexityArgs {
  CommonOptions common;  // --ctx is the chunk length here
  std::string text_path;
  int chunks = 0;
  bool exact = false;
  bool kl_exact = false;
  std::string kl_base;
  bool json = false;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "strata perplexity: %s\n", message.c_str());
  return 1;
}

int run_perplexity(const PerplexityArgs& a) {
  std::ifstream in(a.text_path, std::ios::binary);
  if (!in) return fail(a.text_path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return fail(a.text_path + ": read failed");

  // The chunk length is --ctx, not a cap of the sessions: take it out of the engine's config.
  CommonOptions common = a.common;
  const int n_ctx = common.ctx.value_or(512);
  common.ctx.reset();
  auto loaded = load_model(common, "strata perplexity");
  if (!loaded) return fail(loaded.error().message);
  const Engine& engine = **loaded;
  const Model& m = engine.model();
  auto tok = Tokenizer::from_gguf(m.file());
  if (!tok) return fail(tok.error().message);
  const std::vector<TokenId> ids = tok->tokenize(ss.str(), /*add_special=*/false, /*parse_special=*/false);

  PerplexityOptions o;
  o.n_ctx = n_ctx;
  if (!a.common.ctx && m.hparams().n_ctx_train > 0) o.n_ctx = std::min(n_ctx, m.hparams().n_ctx_train);
  o.max_chunks = a.chunks;
  o.path = a.exact ? cpu::MatmulPath::exact : cpu::MatmulPath::quantized;
  o.kl_exact = a.kl_exact;
  o.kl_base = a.kl_base;
  o.bos = tok->add_bos() ? tok->bos() : -1;
  const char* path_name = a.exact ? "exact" : "quantized";
  std::fprintf(stderr, "strata perplexity: %s, %zu tokens, chunks of %d scored on their last %d, %s path%s\n",
               a.text_path.c_str(), ids.size(), o.n_ctx, o.n_ctx - 1 - o.n_ctx / 2, path_name,
               a.kl_exact ? ", against the exact path" : "");

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const bool tty = isatty(STDERR_FILENO);
  auto progress = [&](int chunk, int n, double ppl) {
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    const int width = 24, filled = width * chunk / n;
    const std::string bar = std::string(size_t(filled), '=') + std::string(size_t(width - filled), ' ');
    const std::string line = strfmt("[%s] %d/%d  ppl %.4f  %.2f s/chunk  eta %.0f s", bar.c_str(), chunk, n, ppl,
                                    s / chunk, s / chunk * (n - chunk));
    if (tty)
      std::fprintf(stderr, "\r%s ", line.c_str());
    else if (chunk == n || chunk % std::max(1, n / 10) == 0)
      std::fprintf(stderr, "%s\n", line.c_str());
  };
  auto r = perplexity(engine, ids, o, progress);
  if (tty) std::fprintf(stderr, "\n");
  if (!r) return fail(r.error().message);
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();

  if (a.json) {
    nlohmann::json j = {{"model", engine.config().model_path},
                        {"text", a.text_path},
                        {"path", path_name},
                        {"n_ctx", o.n_ctx},
                        {"chunks", r->n_chunks},
                        {"tokens_scored", r->n_scored},
                        {"perplexity", r->ppl},
                        {"perplexity_err", r->ppl_err},
                        {"kv_type", cpu::kv_type_name(engine.config().kv_type)},
                        {"seconds", secs}};
    if (r->kl) {
      j["reference"] = a.kl_exact ? "exact" : a.kl_base;
      j["perplexity_ref"] = r->kl->ppl_ref;
      j["kl_mean"] = r->kl->mean;
      j["kl_mean_err"] = r->kl->mean_err;
      j["kl_median"] = r->kl->median;
      j["kl_p90"] = r->kl->p90;
      j["kl_p99"] = r->kl->p99;
      j["kl_max"] = r->kl->max;
      j["top1_agreement"] = r->kl->top1;
      j["rms_dp"] = r->kl->rms_dp;
    }
    if (r->wrote_base) j["wrote_base"] = a.kl_base;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%d chunks of %d tokens, %" PRId64 " scored, in %.1f s\n", r->n_chunks, o.n_ctx, r->n_scored, secs);
  std::printf("PPL = %.4f +/- %.4f\n", r->ppl, r->ppl_err);
  if (r->wrote_base)
    std::printf("wrote base log-probabilities to %s (compare another model or path with --kl-base %s)\n",
                a.kl_base.c_str(), a.kl_base.c_str());
  if (r->kl) {
    const KlStats& k = *r->kl;
    std::printf("against %s:\n", a.kl_exact ? "the exact path (same run)" : a.kl_base.c_str());
    std::printf("  PPL(ref)          %.4f   ln(PPL / PPL(ref)) %+.5f\n", k.ppl_ref, std::log(r->ppl / k.ppl_ref));
    std::printf("  KL divergence     mean %.6f +/- %.6f, median %.6f, p90 %.6f, p99 %.6f, max %.6f\n", k.mean,
                k.mean_err, k.median, k.p90, k.p99, k.max);
    std::printf("  top-1 agreement   %.3f%%\n", 100 * k.top1);
    std::printf("  RMS delta-p       %.3f%%\n", 100 * k.rms_dp);
  }
  return 0;
}

}  // namespace

Runner add_perplexity_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "perplexity", "perplexity of a text (llama-perplexity's chunks), KL divergence and top-1 against a reference");
  auto a = std::make_shared<PerplexityArgs>();
  add_common(sub, a->common);
  sub->add_option("-f,--file", a->text_path, "text to score")->required();
  sub->add_option("--chunks", a->chunks, "score at most this many chunks (0: all)")->check(CLI::NonNegativeNumber);
  sub->add_flag("--exact", a->exact, "score the exact float path instead of the quantized one");
  sub->add_flag("--kl-exact", a->kl_exact, "compare with strata's exact float path in the same run");
  sub->add_option("--kl-base", a->kl_base,
                  "base log-probabilities: written when FILE does not exist (run it on the reference model), "
                  "compared with when it does");
  sub->add_flag("--json", a->json, "print the figures as JSON (perplexity, kl_mean, top1_agreement, ...)");
  return [a] { return run_perplexity(*a); };
}

}  // namespace strata::cli
