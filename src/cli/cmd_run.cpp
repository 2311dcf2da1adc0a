// strata run: generate text from a prompt (the bundled default model when -m is not given).

#include <cinttypes>
#include <cstdio>
#include <memory>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/gpu_tier.h"
#include "model/model.h"
#include "model/model_info.h"
#include "model/tokenizer.h"

namespace strata::cli {
namespace {

struct RunOptions {
  CommonOptions common;
  std::string prompt = "In the beginning";
  DraftOptions draft;
  GenerateOptions gen{.n_predict = 64};
  SamplerParams sampling{.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                         .repeat_penalty = 1.0f, .penalty_last_n = 64, .seed = 0};
  bool seed_given = false;
};

int run_generate(RunOptions o) {
  if (Status s = check_drafter_name(o.draft.drafter); !s) {
    std::fprintf(stderr, "strata run: %s\n", s.error().message.c_str());
    return 1;
  }
  auto loaded = load_model(o.common, "strata run");
  if (!loaded) {
    std::fprintf(stderr, "strata run: %s\n", loaded.error().message.c_str());
    return 1;
  }
  const Engine& engine = **loaded;
  const Model& m = engine.model();
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
  const int64_t limit = context_limit(m, engine.config());
  if (int64_t(ids.size()) >= limit) {
    std::fprintf(stderr, "strata run: the prompt has %zu tokens, more than the context of %" PRId64
                 " leaves room for (raise --ctx, up to the model's %d)\n",
                 ids.size(), limit, m.hparams().n_ctx_train);
    return 1;
  }
  const int ctx = int(std::min<int64_t>(limit, int64_t(ids.size()) + o.gen.n_predict));
  if (!o.seed_given) o.sampling.seed = std::random_device{}();
  Session session(engine, ctx, cpu::MatmulPath::quantized, engine.config().kv_type);
  Sampler sampler(o.sampling);
  auto drafter = make_drafter(o.draft.drafter, &session);
  if (!drafter) {
    std::fprintf(stderr, "strata run: %s\n", drafter.error().message.c_str());
    return 1;
  }
  o.gen.drafter = drafter->get();
  o.gen.max_draft = o.draft.max;

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
  if (engine.gpu_tier()) std::fprintf(stderr, "strata run: %s\n", engine.gpu_tier()->summary().c_str());
  if (o.gen.drafter != nullptr)
    std::fprintf(stderr, "strata run: speculative (%s): %d decode steps, %d tokens drafted, %d accepted (%.0f%%)\n",
                 o.gen.drafter->name().c_str(), r->n_steps, r->n_drafted, r->n_accepted,
                 r->n_drafted > 0 ? 100.0 * r->n_accepted / r->n_drafted : 0.0);
  return 0;
}

}  // namespace

Runner add_run_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("run", "generate text from a prompt");
  auto o = std::make_shared<RunOptions>();
  add_common(sub, o->common);
  add_draft_options(sub, o->draft);
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

}  // namespace strata::cli
