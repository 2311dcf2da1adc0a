// strata quantize: rewrite a GGUF in another quant mix (model/quantize_model.h), as llama-quantize
// does without an importance matrix.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "model/quantize_model.h"

namespace strata::cli {

namespace {

struct QuantizeArgs {
  std::string input, output, mix;
};

int run_quantize(const QuantizeArgs& a) {
  const auto mix = quant_mix_from_name(a.mix);
  if (!mix) {
    std::fprintf(stderr, "strata quantize: unknown type '%s' (one of %s)\n", a.mix.c_str(),
                 std::string(quant_mix_names()).c_str());
    return 2;
  }
  std::error_code ec;
  if (std::filesystem::equivalent(a.input, a.output, ec)) {
    std::fprintf(stderr, "strata quantize: the output %s is the input; write another file\n", a.output.c_str());
    return 2;
  }
  auto in = GgufFile::open(a.input);
  if (!in) {
    std::fprintf(stderr, "strata quantize: %s\n", in.error().message.c_str());
    return 1;
  }
  std::map<std::string, int> counts;  // "f32 -> q4_K": tensors
  bool requantized = false;
  for (const GgufTensorInfo& t : in->tensors()) {
    const GgmlType to = quantized_type(*in, t, *mix);
    if (to != t.type && t.type != GgmlType::f32 && t.type != GgmlType::f16 && t.type != GgmlType::bf16)
      requantized = true;
    ++counts[std::string(ggml_type_name(t.type)) + " -> " + std::string(ggml_type_name(to))];
  }
  if (requantized)
    std::fprintf(stderr, "strata quantize: warning: %s holds quantized tensors; quantizing them again adds their "
                 "errors (quantize from the F32/F16/BF16 file for the best result)\n", a.input.c_str());

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  const bool tty = isatty(STDERR_FILENO);
  int reported_tenth = 0;
  auto progress = [&](uint64_t done, uint64_t total) {
    const double pct = 100.0 * double(done) / double(std::max<uint64_t>(total, 1));
    const std::string line = strfmt("strata quantize: %3.0f%%  %s / %s read", pct, format_bytes(double(done)).c_str(),
                                    format_bytes(double(total)).c_str());
    if (tty) {
      std::fprintf(stderr, "\r%s ", line.c_str());
    } else if (int(pct / 10) > reported_tenth) {
      reported_tenth = int(pct / 10);
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  };
  Status st = quantize_gguf(*in, a.output, *mix, progress);
  if (tty) std::fprintf(stderr, "\n");
  if (!st) {
    std::fprintf(stderr, "strata quantize: %s\n", st.error().message.c_str());
    std::filesystem::remove(a.output, ec);
    return 1;
  }
  const auto out_size = std::filesystem::file_size(a.output, ec);
  std::printf("wrote %s: %s, %s (from %s) in %.1f s\n", a.output.c_str(), std::string(quant_mix_name(*mix)).c_str(),
              format_bytes(double(ec ? 0 : out_size)).c_str(), format_bytes(double(in->file_size())).c_str(),
              seconds());
  for (const auto& [what, n] : counts) std::printf("  %3d tensors %s\n", n, what.c_str());
  return 0;
}

}  // namespace

Runner add_quantize_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "quantize", "rewrite a GGUF's weights in another quant mix (llama-quantize's rules, no importance matrix)");
  auto args = std::make_shared<QuantizeArgs>();
  sub->add_option("input", args->input, "GGUF to read (best: the F32, F16 or BF16 file)")->required();
  sub->add_option("output", args->output, "GGUF to write")->required();
  sub->add_option("type", args->mix, "F32, F16, Q8_0, Q6_K, Q4_K_M, Q4_0 or MXFP4_MOE")->required();
  return [args] { return run_quantize(*args); };
}

}  // namespace strata::cli
