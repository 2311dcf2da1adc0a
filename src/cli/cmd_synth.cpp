#include "cli/commands.h"

namespace strata::cli {

Runner add_synth_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("synth", "write a synthetic GGUF of a real architecture's shape");
  sub->allow_extras();
  return [] {
    std::fprintf(stderr, "strata synth: not built yet\n");
    return 2;
  };
}

}  // namespace strata::cli
