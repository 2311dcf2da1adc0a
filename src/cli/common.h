// What the commands that run a model share: the config (-c FILE, --set KEY=VALUE) and the flags
// that override its keys (-m, -t, --ctx, --load), and loading the model under that config with
// its budgets checked.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/config.h"
#include "model/model.h"
#include "model/model_info.h"

namespace strata::cli {

struct CommonOptions {
  std::string config_path;
  std::vector<std::string> sets;  // --set KEY=VALUE, in order
  // Flags that name config keys; applied after --set when given.
  std::optional<std::string> model;
  std::optional<int> threads;
  std::optional<int> ctx;
  std::optional<std::string> load;
};

void add_common(CLI::App* sub, CommonOptions& o);

// Speculative decoding (run, chat): --draft NAME, --draft-max K.
struct DraftOptions {
  std::string drafter = "none";
  int max = 8;
};
void add_draft_options(CLI::App* sub, DraftOptions& o);

// The config file, then --set, then the flags.
Result<Config> resolve_config(const CommonOptions& o);

struct Loaded {
  std::unique_ptr<Model> model;
  ModelSummary summary;
  Config config;
};

// Resolves the config, checks its budgets against this machine and the model, starts the compute
// pool with its threads, and loads the model. `cmd` prefixes the log line ("strata run").
// Sets the compute pool's NUMA layout from the config's [numa] (STRATA_TOPOLOGY in the
// environment stands in for numa.topology when that is empty).
Status configure_numa(const Config& c);
Result<Loaded> load_model(const CommonOptions& o, const char* cmd);

// The context a session may use: the model's training context, capped by model.ctx (--ctx);
// `fallback` replaces the training context when the config sets none (chat: 4096).
int64_t context_limit(const Model& m, const Config& c, int64_t fallback = 0);

}  // namespace strata::cli
