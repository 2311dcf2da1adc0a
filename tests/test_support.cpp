#include "test_support.h"

#include <random>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include "model/synth.h"

namespace fs = std::filesystem;

namespace strata::test {

std::unique_ptr<Model> synth_q8_model(const char* name, std::vector<uint8_t>& bytes, uint32_t mtp_layers) {
  const SynthShape* shape = find_synth_shape(name);
  EXPECT_NE(shape, nullptr) << name;
  if (shape == nullptr) return nullptr;
  auto plan = build_synth_plan(*shape, SynthQuant::q8_0, {.mtp_layers = mtp_layers});
  EXPECT_TRUE(plan.ok());
  if (!plan.ok()) return nullptr;
  bytes = plan->write_memory();
  auto file = GgufFile::parse(bytes, name);
  EXPECT_TRUE(file.ok());
  if (!file.ok()) return nullptr;
  auto model = Model::load(std::move(*file));
  EXPECT_TRUE(model.ok()) << model.error().message;
  return model.ok() ? std::move(*model) : nullptr;
}

std::vector<int32_t> random_ids(int n, uint32_t seed, int vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& id : v) id = int32_t(rng() % uint32_t(vocab));
  return v;
}

fs::path data_dir() { return fs::path(STRATA_SOURCE_DIR) / "tests" / "data"; }

std::optional<fs::path> fixtures_dir() {
  if (const char* env = std::getenv("STRATA_FIXTURES")) {
    if (fs::is_directory(env)) return fs::path(env);
  }
  fs::path p = fs::path(STRATA_SOURCE_DIR).parent_path() / "shared" / "fixtures";
  if (fs::is_directory(p / "models")) return p;
  return std::nullopt;
}

std::vector<fs::path> fixture_models() {
  std::vector<fs::path> out;
  auto dir = fixtures_dir();
  if (!dir) return out;
  for (const auto& arch : fs::directory_iterator(*dir / "models")) {
    if (!arch.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(arch.path())) {
      const std::string n = f.path().filename().string();
      if (n.rfind("model-", 0) == 0 && f.path().extension() == ".gguf") out.push_back(f.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

fs::path scratch_dir(const std::string& name) {
  fs::path p = fs::path(STRATA_BINARY_DIR) / "test-scratch" / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

int run_cli(const std::string& args, std::string* output, bool stdout_only) {
  std::string cmd = std::string("\"") + STRATA_CLI_PATH + "\" " + args + (stdout_only ? " 2>/dev/null" : " 2>&1");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  int status = pclose(pipe);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

}  // namespace strata::test
