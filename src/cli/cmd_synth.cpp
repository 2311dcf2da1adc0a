// strata synth: write a synthetic GGUF with the exact layout of a real MoE model (model/synth.h).
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "model/synth.h"

namespace strata::cli {

namespace {

struct SynthArgs {
  std::string shape;
  std::string quant;
  std::string output;
  std::string vocab;
  uint64_t seed = 1;
  uint32_t layers = 0;  // 0: the shape's
  uint32_t mtp = 0;     // multi-token-prediction layers after the main ones
  uint64_t engram_rows = 0;  // deepseek41: rows of each Engram table (0: the shape's)
  bool list = false;
};

constexpr SynthQuant kQuants[] = {SynthQuant::q8_0, SynthQuant::q4_k_m, SynthQuant::mxfp4_moe};

int list_shapes() {
  std::printf("%-18s %-10s %6s %6s %9s %8s  %9s %9s %9s\n", "shape", "arch", "layers", "n_embd",
              "experts", "params", "Q8_0", "Q4_K_M", "MXFP4_MOE");
  for (const SynthShape& s : synth_shapes()) {
    std::string sizes;
    uint64_t n_params = 0;
    for (SynthQuant q : kQuants) {
      auto plan = build_synth_plan(s, q, {});
      STRATA_CHECK(plan.ok(), "a generated vocabulary cannot fail");
      uint64_t bytes = 0;
      n_params = 0;
      for (const GgufTensorInfo& t : plan->writer.tensors()) {
        bytes += t.n_bytes;
        n_params += t.n_elements();
      }
      sizes += strfmt(" %9s", format_bytes(double(bytes)).c_str());
    }
    std::printf("%-18s %-10s %6u %6u %4u top-%-2u %7.2fB %s\n", std::string(s.name).c_str(),
                std::string(synth_arch_name(s.arch)).c_str(), s.n_layer, s.n_embd, s.n_expert,
                s.n_expert_used, double(n_params) / 1e9, sizes.c_str());
  }
  std::printf("quant mixes: q8_0, q4_k (Q4_K_M), mxfp4 (MXFP4_MOE); sizes are tensor data\n");
  return 0;
}

int run_synth(const SynthArgs& a) {
  if (a.list) return list_shapes();
  if (a.shape.empty() || a.quant.empty() || a.output.empty()) {
    std::fprintf(stderr, "strata synth: --shape, --quant and -o are required (or --list)\n");
    return 2;
  }
  const SynthShape* found = find_synth_shape(a.shape);
  if (!found) {
    std::fprintf(stderr, "strata synth: unknown shape '%s' (strata synth --list shows them)\n",
                 a.shape.c_str());
    return 2;
  }
  SynthShape cut = *found;  // --layers: the first N layers (quick benchmarks of a big shape)
  if (a.layers > 0) {
    if (a.layers > found->n_layer || a.layers <= found->n_layer_dense) {
      std::fprintf(stderr, "strata synth: --layers %u is outside %u..%u for %s\n", a.layers,
                   found->n_layer_dense + 1, found->n_layer, a.shape.c_str());
      return 2;
    }
    cut.n_layer = a.layers;
  }
  const SynthShape* shape = &cut;
  const auto quant = synth_quant_from_name(a.quant);
  if (!quant) {
    std::fprintf(stderr, "strata synth: unknown quant '%s' (q8_0, q4_k or mxfp4)\n",
                 a.quant.c_str());
    return 2;
  }
  if (a.engram_rows > 0 && shape->arch != SynthArch::deepseek41) {
    std::fprintf(stderr, "strata synth: --engram-rows is for deepseek41 shapes (%s has no Engram)\n",
                 a.shape.c_str());
    return 2;
  }
  auto plan = build_synth_plan(*shape, *quant,
                               {.seed = a.seed, .vocab_path = a.vocab, .mtp_layers = a.mtp, .engram_rows = a.engram_rows});
  if (!plan) {
    std::fprintf(stderr, "strata synth: %s\n", plan.error().message.c_str());
    return 1;
  }

  const uint64_t total = plan->writer.file_size();

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  const bool tty = isatty(STDERR_FILENO);
  int reported_tenth = 0;  // without a terminal, one line per 10%
  auto progress = [&](uint64_t done, uint64_t all) {
    const double pct = 100.0 * double(done) / double(all);
    const std::string line =
        strfmt("strata synth: %3.0f%%  %s / %s  %.0f MB/s", pct, format_bytes(double(done)).c_str(),
               format_bytes(double(all)).c_str(), double(done) / 1e6 / std::max(seconds(), 1e-3));
    if (tty) {
      std::fprintf(stderr, "\r%s ", line.c_str());
    } else if (int(pct / 10) > reported_tenth) {
      reported_tenth = int(pct / 10);
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  };
  Status st = plan->write_file(a.output, progress);
  if (tty) std::fprintf(stderr, "\n");
  if (!st) {
    std::fprintf(stderr, "strata synth: %s\n", st.error().message.c_str());
    return 1;
  }
  const double secs = seconds();
  std::printf(
      "wrote %s: %s %s, %zu tensors, %u tokens, %s (%" PRIu64 " bytes) in %.1f s, %.0f MB/s\n",
      a.output.c_str(), std::string(shape->name).c_str(),
      std::string(synth_quant_name(*quant)).c_str(), plan->writer.tensors().size(), plan->n_vocab,
      format_bytes(double(total)).c_str(), total, secs, double(total) / 1e6 / secs);
  return 0;
}

}  // namespace

Runner add_synth_command(CLI::App& app) {
  CLI::App* sub =
      app.add_subcommand("synth", "write a synthetic GGUF of a real architecture's shape");
  auto args = std::make_shared<SynthArgs>();
  sub->add_option("--shape", args->shape, "model shape (see --list)");
  sub->add_option("--quant", args->quant, "quant mix: q8_0, q4_k (Q4_K_M) or mxfp4 (MXFP4_MOE)");
  sub->add_option("-o,--output", args->output, "GGUF file to write");
  sub->add_option("--seed", args->seed, "seed of the random weights")->capture_default_str();
  sub->add_option("--mtp", args->mtp,
                  "multi-token-prediction (nextn) layers to add after the main ones, as DeepSeek-V3 ships one "
                  "(for --draft mtp; not deepseek4 or deepseek41)")
      ->check(CLI::Range(0, 4));
  sub->add_option("--vocab", args->vocab,
                  "copy the tokenizer from this GGUF (n_vocab follows it; default: a generated "
                  "byte-level BPE vocabulary of the shape's size)");
  sub->add_option("--layers", args->layers,
                  "keep only the first N layers of the shape (a smaller file of the same layer "
                  "shapes, for quick benchmarks)");
  sub->add_option("--engram-rows", args->engram_rows,
                  "deepseek41: about N rows in each Engram table instead of the shape's (DeepSeek-V4.1-Flash: "
                  "384M, 98 GiB a table at Q8_0), so a test file fits the disk")
      ->check(CLI::Range(uint64_t(64), uint64_t(1) << 40));
  sub->add_flag("--list", args->list, "list the shapes and their file sizes");
  return [args] { return run_synth(*args); };
}

}  // namespace strata::cli
