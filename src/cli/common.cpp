#include "cli/common.h"

#include <algorithm>
#include <cstdlib>


namespace strata::cli {

void add_common(CLI::App* sub, CommonOptions& o) {
  sub->add_option("-c,--config", o.config_path, "TOML config (presets in configs/; keys in docs/config.md)");
  sub->add_option("--set", o.sets, "override one config key, e.g. --set budgets.ram=16GiB (repeatable)");
  sub->add_option("-m,--model", o.model, "GGUF model (default: model.path, else $STRATA_MODEL, else the bundled demo model)");
  sub->add_option("-t,--threads", o.threads, "CPU threads (cpu.threads; default: all cores)")->check(CLI::NonNegativeNumber);
  sub->add_option("--ctx", o.ctx, "context length cap (model.ctx; default: the model's)")->check(CLI::PositiveNumber);
  sub->add_option("--load", o.load,
                  "weights into memory (model.load): ram (read into huge pages: faster decode), mmap (page "
                  "cache: instant start), auto (default: ram when the file, the KV cache and 1 GiB fit in the available memory, else mmap)")
      ->check(CLI::IsMember({"auto", "ram", "mmap"}));
}

void add_draft_options(CLI::App* sub, DraftOptions& o) {
  sub->add_option("--draft", o.drafter,
                  "speculative decoding: none (default), ngram (prompt lookup) or mtp (the model's own "
                  "multi-token-prediction layer, where the GGUF has one); drafts are verified in one batched "
                  "pass, and the number drafted adapts to what is accepted");
  sub->add_option("--draft-max", o.max, "most tokens drafted per step (default 8)")->check(CLI::Range(1, 32));
}

Result<Config> resolve_config(const CommonOptions& o) {
  std::vector<ConfigOverride> overrides;
  for (const std::string& s : o.sets) {
    auto ov = parse_override(s);
    if (!ov) return ov.error();
    overrides.push_back(std::move(*ov));
  }
  // flags name keys too; they come last, so they win
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char ch : s) {
      if (ch == '"' || ch == '\\') q += '\\';
      q += ch;
    }
    return q + "\"";
  };
  if (o.model) overrides.push_back({"model.path", quoted(*o.model)});
  if (o.threads) overrides.push_back({"cpu.threads", std::to_string(*o.threads)});
  if (o.ctx) overrides.push_back({"model.ctx", std::to_string(*o.ctx)});
  if (o.load) overrides.push_back({"model.load", quoted(*o.load)});
  auto c = load_config(o.config_path, overrides);
  if (!c) return c.error();
  if (c->model_path.empty()) c->model_path = default_model_path();
  return c;
}

std::string default_model_path() {
  if (const char* env = std::getenv("STRATA_MODEL"); env != nullptr && *env != 0) return env;
  return STRATA_DEFAULT_MODEL;
}

int64_t context_limit(const Model& m, const Config& c, int64_t fallback) {
  int64_t ctx = m.hparams().n_ctx_train > 0 ? m.hparams().n_ctx_train : 4096;
  if (c.ctx > 0) return std::min<int64_t>(ctx, c.ctx);
  if (fallback > 0) return std::min<int64_t>(ctx, fallback);
  return ctx;
}

Result<std::unique_ptr<Engine>> load_model(const CommonOptions& o, const char* cmd) {
  auto config = resolve_config(o);
  if (!config) return config.error();
  return Engine::open(*config, cmd);
}

}  // namespace strata::cli
