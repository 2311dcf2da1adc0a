// What the commands that run a model share: the config (-c FILE, --set KEY=VALUE) and the flags
// that override its keys (-m, -t, --ctx, --load), and opening the engine under that config.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/config.h"
#include "engine/engine.h"
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

// Resolves the config, then opens the engine on it (engine/engine.h: the budgets checked against
// this machine and the model, the compute pool started with its threads and NUMA layout, the
// model loaded and its tiers built). `cmd` prefixes the log lines ("strata run").
Result<std::unique_ptr<Engine>> load_model(const CommonOptions& o, const char* cmd);

// The model of a command given no -m and no model.path: $STRATA_MODEL when set, else the bundled
// demo model (tests/data/models/demo).
std::string default_model_path();

// The context a session may use: the model's training context, capped by model.ctx (--ctx);
// `fallback` replaces the training context when the config sets none (chat: 4096).
int64_t context_limit(const Model& m, const Config& c, int64_t fallback = 0);

}  // namespace strata::cli
