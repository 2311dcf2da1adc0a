// Subcommands of the `strata` executable. Each registers its options on the CLI11 app and returns
// the process exit code when run.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace strata::cli {

using Runner = std::function<int()>;

Runner add_info_command(CLI::App& app);
Runner add_synth_command(CLI::App& app);
Runner add_run_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
Runner add_logits_command(CLI::App& app);
Runner add_chat_command(CLI::App& app);
Runner add_tokenize_command(CLI::App& app);
Runner add_replay_command(CLI::App& app);
Runner add_profile_command(CLI::App& app);
Runner add_plan_command(CLI::App& app);
Runner add_calibrate_command(CLI::App& app);
Runner add_serve_command(CLI::App& app);
Runner add_template_command(CLI::App& app);
Runner add_quantize_command(CLI::App& app);
Runner add_perplexity_command(CLI::App& app);

}  // namespace strata::cli
