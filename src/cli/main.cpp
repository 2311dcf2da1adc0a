// strata: run Mixture-of-Experts models larger than one GPU on one workstation.
#include <malloc.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"


int main(int argc, char** argv) {
  // The forward pass allocates per-layer activation buffers of megabytes (prefill). glibc would
  // map and unmap each one, and every first touch of a fresh page is a fault (costly: in a VM with
  // shadow paging, faults were 11% of a 512-token prefill). Keep freed memory for reuse instead:
  // the buffers' peak is a few hundred MB at most.
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  CLI::App app{"strata: Mixture-of-Experts inference for one workstation (CPU-first hybrid)"};
  app.set_version_flag("--version", std::string("strata ") + STRATA_VERSION);
  app.require_subcommand(1);

  std::vector<std::pair<CLI::App*, strata::cli::Runner>> runners;
  using AddFn = strata::cli::Runner (*)(CLI::App&);
  const std::pair<const char*, AddFn> built[] = {
      {"info", strata::cli::add_info_command},
      {"synth", strata::cli::add_synth_command},
      {"run", strata::cli::add_run_command},
      {"bench", strata::cli::add_bench_command},
      {"logits", strata::cli::add_logits_command},
      {"chat", strata::cli::add_chat_command},
      {"tokenize", strata::cli::add_tokenize_command},
      {"replay", strata::cli::add_replay_command},
      {"profile", strata::cli::add_profile_command},
      {"plan", strata::cli::add_plan_command},
      {"calibrate", strata::cli::add_calibrate_command},
      {"serve", strata::cli::add_serve_command},
      {"template", strata::cli::add_template_command},
      {"quantize", strata::cli::add_quantize_command},
      {"perplexity", strata::cli::add_perplexity_command},
  };
  for (const auto& [name, add] : built) {
    strata::cli::Runner r = add(app);
    runners.emplace_back(app.get_subcommand(name), std::move(r));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : runners) {
    if (sub->parsed()) return run();
  }
  return 2;
}
