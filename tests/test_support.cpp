#include "test_support.h"

#include <random>
#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include "engine/session.h"
#include "model/synth.h"

namespace fs = std::filesystem;

namespace strata::test {

namespace {
// Commands the tests run without -m use the random-weight qwen3moe fixture (checked against
// llama.cpp's logits), not the trained demo model users get; the demo model's tests name it
// (test_demo_model.cpp). Set before main(), for every test and the strata processes it starts;
// an outer $STRATA_MODEL wins.
const bool kModelDefault = [] {
  const std::string fixture = std::string(STRATA_SOURCE_DIR) + "/tests/data/models/qwen3moe/model-Q4_K_M.gguf";
  return setenv("STRATA_MODEL", fixture.c_str(), /*overwrite=*/0) == 0;
}();
}  // namespace


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
    std::ifstream cfg(arch.path() / "config.json");
    if (!cfg || !nlohmann::json::parse(cfg, nullptr, false).contains("quants")) continue;
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

std::vector<float> read_f32(const fs::path& p) {
  auto bytes = read_file(p);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

LogitStats compare(const std::vector<float>& got, const std::vector<float>& ref, int V) {
  const size_t n = ref.size() / size_t(V);
  std::vector<double> rms_rel;
  int cos_ok = 0, top1 = 0, clear = 0, top1_clear = 0;
  for (size_t t = 0; t < n; ++t) {
    const float* g = got.data() + t * V;
    const float* r = ref.data() + t * V;
    double dd = 0, rr = 0, gg = 0, gr = 0, mean = 0;
    for (int i = 0; i < V; ++i) {
      dd += double(g[i] - r[i]) * (g[i] - r[i]);
      rr += double(r[i]) * r[i];
      gg += double(g[i]) * g[i];
      gr += double(g[i]) * r[i];
      mean += r[i];
    }
    rms_rel.push_back(std::sqrt(dd / rr));
    cos_ok += gr / std::sqrt(gg * rr) >= 0.99;
    const int32_t ta = argmax({g, size_t(V)}), tb = argmax({r, size_t(V)});
    top1 += ta == tb;
    // the reference's lead of top-1 over top-2, against 0.1 of the row's std
    mean /= V;
    double var = 0;
    float second = -INFINITY;
    for (int i = 0; i < V; ++i) {
      var += (r[i] - mean) * (r[i] - mean);
      if (i != tb) second = std::max(second, r[i]);
    }
    if (r[tb] - second > 0.1 * std::sqrt(var / V)) {
      ++clear;
      top1_clear += ta == tb;
    }
  }
  std::sort(rms_rel.begin(), rms_rel.end());
  LogitStats st;
  st.median_rms_rel = rms_rel[n / 2];
  st.frac_cos_099 = double(cos_ok) / double(n);
  st.top1 = double(top1) / double(n);
  st.top1_clear = clear ? double(top1_clear) / clear : 1.0;
  return st;
}

}  // namespace strata::test
