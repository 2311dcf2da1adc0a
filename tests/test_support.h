// Helpers shared by the tests: where vendored data and the shared fixtures are.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"

namespace strata::test {

// tests/data in the source tree (vendored, always present).
std::filesystem::path data_dir();
// ../shared/fixtures beside the checkout, or $STRATA_FIXTURES; nullopt when absent (tests over
// the full set then GTEST_SKIP with a message saying so).
std::optional<std::filesystem::path> fixtures_dir();
// Every model-*.gguf of the llama.cpp-written fixtures under fixtures/models (sorted; a folder
// whose config.json lists its "quants" with llama.cpp's logits), empty when the fixtures are
// absent. Folders of another kind (deepseek41: an independent float reference of an
// architecture strata does not run yet, issue #32) are left to their own tests.
std::vector<std::filesystem::path> fixture_models();

// The synthetic model of shape `name` (model/synth.h: "tiny", "tiny-deepseek2", ...) at Q8_0,
// written into `bytes` (which must outlive it) and loaded from there, with `mtp_layers`
// multi-token-prediction layers after the main ones.
std::unique_ptr<Model> synth_q8_model(const char* name, std::vector<uint8_t>& bytes, uint32_t mtp_layers = 0);

// n token ids in [0, vocab) from a seeded generator.
std::vector<int32_t> random_ids(int n, uint32_t seed, int vocab);

std::vector<uint8_t> read_file(const std::filesystem::path& p);
// A file of float32 values (the fixtures' logits-*.f32).
std::vector<float> read_f32(const std::filesystem::path& p);

// Statistics of logits `got` against `ref` ([n_pos][V]) as the fixtures README defines them:
// the median over positions of the relative RMS error, the fraction of positions with cosine
// >= 0.99, top-1 agreement, and top-1 agreement where the reference's lead is clear.
struct LogitStats {
  double median_rms_rel = 0, frac_cos_099 = 0, top1 = 0, top1_clear = 0;
};
LogitStats compare(const std::vector<float>& got, const std::vector<float>& ref, int V);
void write_file(const std::filesystem::path& p, const std::vector<uint8_t>& bytes);
// A fresh empty directory under the build tree for one test.
std::filesystem::path scratch_dir(const std::string& name);

// Runs the strata executable with `args`, returns its exit code; stdout (and stderr unless
// stdout_only) into `output`.
int run_cli(const std::string& args, std::string* output, bool stdout_only = false);

}  // namespace strata::test
