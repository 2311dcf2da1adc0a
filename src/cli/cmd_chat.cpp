// strata chat: interactive multi-turn chat on stdin / stdout. Each line is a user turn; the model's
// reply streams back. The conversation is re-formatted with the chat template every turn and only
// the tokens past what the KV cache already holds are evaluated.

#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/chat_template.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace strata::cli {
namespace {

struct ChatCliOptions {
  CommonOptions common;
  std::string system;
  std::string template_name;
  std::string template_file;  // overrides the GGUF's template
  bool raw = false;
  bool no_think = false;
  DraftOptions draft;
  GenerateOptions gen{.n_predict = 512};
  SamplerParams sampling{.temperature = 0.7f, .top_k = 20, .top_p = 0.8f, .min_p = 0.0f,
                         .repeat_penalty = 1.0f, .penalty_last_n = 64, .seed = 0};
};

int fail(const std::string& m) {
  std::fprintf(stderr, "strata chat: %s\n", m.c_str());
  return 1;
}

int run_chat(ChatCliOptions o) {
  if (Status s = check_drafter_name(o.draft.drafter); !s) return fail(s.error().message);
  auto loaded = load_model(o.common, "strata chat");
  if (!loaded) return fail(loaded.error().message);
  const Engine& engine = **loaded;
  const Model& m = engine.model();
  auto tok = Tokenizer::from_gguf(m.file());
  if (!tok) return fail(tok.error().message);

  auto tmpl = load_chat_template(m.file(), *tok, o.template_file, o.raw ? "raw" : o.template_name);
  if (!tmpl) return fail(tmpl.error().message);
  if (!o.raw && o.template_file.empty() && o.template_name.empty() && !tmpl->is_jinja())
    std::fprintf(stderr, "strata chat: the model has no chat template; turns are concatenated as raw text\n");
  const bool raw = !tmpl->is_jinja() && tmpl->name() == "raw";
  // a chat allocates its whole context up front: 4096 positions unless model.ctx says otherwise
  const int ctx = int(context_limit(m, engine.config(), 4096));
  Session session(engine, ctx, cpu::MatmulPath::quantized, engine.config().kv_type);
  o.sampling.seed = std::random_device{}();
  Sampler sampler(o.sampling);
  auto drafter = make_drafter(o.draft.drafter, &session);
  if (!drafter) return fail(drafter.error().message);
  o.gen.drafter = drafter->get();
  o.gen.max_draft = o.draft.max;
  std::fprintf(stderr, "strata chat: %s, template %s, context %d; an empty line or end of input ends the chat\n",
               engine.config().model_path.c_str(), tmpl->name().c_str(), ctx);

  ChatInput in;
  if (!o.system.empty()) in.messages.push_back({{"role", "system"}, {"content", o.system}});
  if (o.no_think) in.kwargs["enable_thinking"] = false;
  std::vector<TokenId> cached;  // the tokens the session holds, in order
  std::string line;
  while (true) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    in.messages.push_back({{"role", "user"}, {"content", line}});
    const auto prompt = tmpl->render(in);
    if (!prompt) return fail("the chat template: " + prompt.error().message);
    // the template spells out BOS where it wants one; raw text gets the vocab's own BOS
    std::vector<TokenId> ids = tok->tokenize(*prompt, raw, true);
    size_t common = 0;
    while (common < cached.size() && common < ids.size() && cached[common] == ids[common]) ++common;
    if (int64_t(ids.size()) + o.gen.n_predict > ctx) {
      std::fprintf(stderr, "strata chat: the conversation (%zu tokens) no longer fits the context of %d\n",
                   ids.size(), ctx);
      return 1;
    }
    common = size_t(session.truncate(int64_t(common)));
    cached.resize(common);
    std::vector<TokenId> history = cached;
    auto r = generate(session, *tok, sampler, std::span<const TokenId>(ids).subspan(common), history,
                      o.gen, [](std::string_view text) {
                        std::fwrite(text.data(), 1, text.size(), stdout);
                        std::fflush(stdout);
                      });
    std::printf("\n");
    if (!r) return fail(r.error().message);
    // the cache now holds the prompt and the generated tokens except the last one sampled
    cached = history;
    if (int64_t(cached.size()) > session.n_past()) cached.resize(size_t(session.n_past()));
    // the reply goes back as the template expects it: reasoning apart from the answer
    const Reply reply = parse_reply(tmpl->reply_syntax(), r->text, prompt_opens_reasoning(tmpl->reply_syntax(), *prompt));
    jinja::Json turn = {{"role", "assistant"}, {"content", reply.content}};
    if (!reply.reasoning.empty()) turn["reasoning_content"] = reply.reasoning;
    in.messages.push_back(turn);
    std::fprintf(stderr, "[%d tokens, %.2f tok/s", r->n_generated,
                 r->n_generated > 1 ? (r->n_generated - 1) / r->decode_seconds : 0.0);
    if (r->n_drafted > 0) std::fprintf(stderr, ", %d of %d drafts accepted", r->n_accepted, r->n_drafted);
    std::fprintf(stderr, "]\n");
  }
  return 0;
}

}  // namespace

Runner add_chat_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("chat", "interactive multi-turn chat with the model's chat template");
  auto o = std::make_shared<ChatCliOptions>();
  add_common(sub, o->common);
  add_draft_options(sub, o->draft);
  sub->add_option("-s,--system", o->system, "system message");
  sub->add_option("--chat-template-file", o->template_file, "a Jinja chat template to use instead of the GGUF's");
  sub->add_option("--template", o->template_name,
                  "a built-in chat format for GGUFs without a template: qwen3, chatml, deepseek3, harmony, raw");
  sub->add_flag("--raw", o->raw, "no template: turns are concatenated as raw text");
  sub->add_flag("--no-think", o->no_think, "qwen3: answer without a thinking block");
  sub->add_option("-n,--n-predict", o->gen.n_predict, "most tokens per reply")->check(CLI::PositiveNumber);
  sub->add_option("--temp", o->sampling.temperature, "temperature (0: greedy)")->check(CLI::NonNegativeNumber);
  sub->add_option("--top-k", o->sampling.top_k, "top-k (0: off)");
  sub->add_option("--top-p", o->sampling.top_p, "top-p (1: off)")->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--min-p", o->sampling.min_p, "min-p (0: off)")->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--repeat-penalty", o->sampling.repeat_penalty, "repetition penalty (1: off)");
  return [o] { return run_chat(*o); };
}

}  // namespace strata::cli
