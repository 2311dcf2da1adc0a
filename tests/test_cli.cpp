// The strata executable as a user meets it: the main commands on the bundled model, and the
// one-line errors of issue #3's done-when (missing model, unsupported architecture, prompt longer
// than the context).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cpu/kernels.h"
#include "gguf_builder.h"
#include "test_support.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

int lines(const std::string& s) { return int(std::count(s.begin(), s.end(), '\n')); }

TEST(Cli, RunOnBundledModelStreamsAndReportsSpeed) {
  std::string out;
  ASSERT_EQ(test::run_cli("run -n 6 --temp 0 -p \"Hello world\"", &out, true), 0) << out;
  EXPECT_EQ(out.rfind("Hello world", 0), 0u) << out;  // stdout: the prompt, then the generated text
  ASSERT_EQ(test::run_cli("run -n 6 --temp 0 -p \"Hello world\"", &out), 0) << out;
  EXPECT_NE(out.find("prefill"), std::string::npos) << out;
  EXPECT_NE(out.find("decode 6 tokens"), std::string::npos) << out;
  EXPECT_NE(out.find("time to first token"), std::string::npos) << out;
}

TEST(Cli, RunIsReproducibleWithASeed) {
  std::string a, b;
  ASSERT_EQ(test::run_cli("run -n 12 --seed 5 --temp 1", &a, true), 0);
  ASSERT_EQ(test::run_cli("run -n 12 --seed 5 --temp 1", &b, true), 0);
  EXPECT_EQ(a, b);
}

// --draft ngram: the same greedy text as without drafts, and a line with the drafts' count; MTP
// drafts on a model without an MTP layer are a one-line error.
TEST(Cli, RunWithDraftsGivesTheSameGreedyText) {
  std::string plain, drafted, log;
  const std::string args = "run -n 24 --temp 0 -p \"one two three one two three one two\"";
  ASSERT_EQ(test::run_cli(args, &plain, true), 0) << plain;
  ASSERT_EQ(test::run_cli(args + " --draft ngram --draft-max 4", &drafted, true), 0) << drafted;
  EXPECT_EQ(drafted, plain);
  ASSERT_EQ(test::run_cli(args + " --draft ngram", &log), 0) << log;
  EXPECT_NE(log.find("speculative (ngram)"), std::string::npos) << log;
  EXPECT_EQ(test::run_cli("run -n 4 --draft mtp", &log), 1);
  EXPECT_EQ(lines(log), 2) << log;  // the load line, then the error
  EXPECT_NE(log.find("no multi-token-prediction"), std::string::npos) << log;
}

// --draft mtp on a model synthesized with a nextn layer (synth --mtp 1): the same greedy text as
// without drafts, and the load line says the layer is there.
TEST(Cli, RunWithMtpDraftsGivesTheSameGreedyText) {
  const auto dir = test::scratch_dir("cli_mtp");
  const std::string path = (dir / "tiny-mtp.gguf").string();
  std::string out, plain, drafted, log;
  ASSERT_EQ(test::run_cli("synth --shape tiny --quant q8_0 --mtp 1 -o " + path, &out), 0) << out;
  const std::string args = "run -m " + path + " -n 24 --temp 0 -p \"one two three\"";
  ASSERT_EQ(test::run_cli(args, &plain, true), 0) << plain;
  ASSERT_EQ(test::run_cli(args + " --draft mtp --draft-max 3", &drafted, true), 0) << drafted;
  EXPECT_EQ(drafted, plain);
  ASSERT_EQ(test::run_cli(args + " --draft mtp", &log), 0) << log;
  EXPECT_NE(log.find("multi-token-prediction (nextn) layer; the first drafts with --draft mtp"), std::string::npos)
      << log;
  EXPECT_NE(log.find("speculative (mtp)"), std::string::npos) << log;
}

// bench compares every repetition with the limit probed around it; the table's fraction is the
// median repetition's (this VM's bandwidth moves within seconds: the last one alone misled)
TEST(Cli, BenchGivesEachRepetitionsFractionAndTheMedian) {
  std::string out;
  ASSERT_EQ(test::run_cli("bench -p 0 -n 2 -r 3 --json", &out, true), 0) << out;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 1u);
  std::vector<double> f = j[0]["limit_fractions"].get<std::vector<double>>();
  ASSERT_EQ(f.size(), 3u);
  for (double x : f) EXPECT_GT(x, 0.0);
  std::sort(f.begin(), f.end());
  EXPECT_DOUBLE_EQ(j[0]["limit_fraction"].get<double>(), f[1]);
  EXPECT_NE(j[0]["limit"].get<std::string>().find(strata::strfmt("= %.2f of DRAM", f[1])), std::string::npos)
      << j[0]["limit"];
}

// bench --speculative prints the cost curve (k = 0 and 1 here), the speed-up by acceptance rate
// and the end-to-end comparison; --json has the same fields.
TEST(Cli, BenchSpeculativeCostCurve) {
  std::string out;
  ASSERT_EQ(test::run_cli("bench --speculative --draft-max 1 -n 2 -d 8 --spec-gen 4 --json", &out, true), 0) << out;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j["curve"].size(), 2u);
  EXPECT_EQ(j["curve"][0]["k"], 0);
  EXPECT_DOUBLE_EQ(j["curve"][0]["vs_plain"].get<double>(), 1.0);
  // the bundled model has 8 experts, top-4: one token computes 4 per layer, two between 4 and 8
  EXPECT_DOUBLE_EQ(j["curve"][0]["experts_per_layer"].get<double>(), 4.0);
  EXPECT_GE(j["curve"][1]["experts_per_layer"].get<double>(), 4.0);
  EXPECT_LE(j["curve"][1]["experts_per_layer"].get<double>(), 8.0);
  EXPECT_GT(j["curve"][1]["roofline_s"].get<double>(), 0.0);
  for (const auto& c : j["curve"]) {
    // where the step's time went: the parts are timed inside the step, one after the other
    const auto& parts = c["parts_s"];
    EXPECT_GT(parts["experts"].get<double>(), 0.0);
    EXPECT_GT(parts["attention"].get<double>(), 0.0);
    EXPECT_GT(parts["output head"].get<double>(), 0.0);
    double sum = 0;
    for (const auto& [name, v] : parts.items())
      if (name != "QK/softmax/V") sum += v.get<double>();  // nested in attention
    EXPECT_LE(sum, c["step_s"].get<double>() * 1.001);
    // the per-part bound (each part's larger of reads and int8 work, summed) is never below the
    // step's memory / compute roofline (the larger of the summed reads and the summed work): true
    // of the formulas, checked so that a change to either keeps it
    const double per_part = c["experts_bound_s"].get<double>() + c["rest_bound_s"].get<double>();
    EXPECT_GE(per_part, c["roofline_s"].get<double>() * (1 - 1e-9));
    EXPECT_NEAR(c["of_per_part_bound"].get<double>(), per_part / c["step_s"].get<double>(), 1e-9);
  }
  EXPECT_EQ(j["speedup"].size(), 6u);
  ASSERT_EQ(j["end_to_end"].size(), 7u);
  EXPECT_EQ(j["end_to_end"][0]["run"], "greedy, plain");
  EXPECT_EQ(j["end_to_end"][0]["drafted"], 0);
}

TEST(Cli, MissingModelIsAOneLineError) {
  std::string out;
  EXPECT_EQ(test::run_cli("run -m /nonexistent/model.gguf", &out), 1);
  EXPECT_EQ(lines(out), 1) << out;
  EXPECT_NE(out.find("/nonexistent/model.gguf: cannot open"), std::string::npos) << out;
}

TEST(Cli, UnsupportedArchitectureIsAOneLineError) {
  test::RawGguf g;
  g.header(3, 1, 2).kv_str("general.architecture", "rwkv7").kv_u32("rwkv7.block_count", 1);
  g.tensor("token_embd.weight", {32, 4}, 0, 0).data(512);
  auto path = test::scratch_dir("cli") / "rwkv.gguf";
  test::write_file(path, g.bytes);
  std::string out;
  EXPECT_EQ(test::run_cli("run -m \"" + path.string() + "\"", &out), 1);
  EXPECT_EQ(lines(out), 1) << out;
  EXPECT_NE(out.find("architecture 'rwkv7' is not supported"), std::string::npos) << out;
}

TEST(Cli, PromptLongerThanContextIsAOneLineError) {
  std::string out;
  EXPECT_EQ(test::run_cli("run --ctx 4 -p \"one two three four five six seven\"", &out), 1);
  EXPECT_NE(out.find("more than the context of 4"), std::string::npos) << out;
  // one error line after the load line
  EXPECT_EQ(lines(out), 2) << out;
}

// strata logits writes the fixtures' format; --exact reproduces llama.cpp's exact logits.
TEST(Cli, LogitsExactMatchesVendoredReference) {
  const fs::path dir = test::data_dir() / "models" / "qwen3moe";
  const fs::path out_path = test::scratch_dir("cli-logits") / "out.f32";
  std::string out;
  ASSERT_EQ(test::run_cli("logits -m \"" + (dir / "model-Q4_K_M.gguf").string() + "\" --tokens \"" +
                              (dir / "tokens.json").string() + "\" -o \"" + out_path.string() +
                              "\" --exact --sequential --greedy 4",
                          &out, true),
            0)
      << out;
  auto got = test::read_file(out_path);
  auto want = test::read_file(dir / "logits-Q4_K_M.exact.f32");
  ASSERT_EQ(got.size(), want.size());
  const float* g = reinterpret_cast<const float*>(got.data());
  const float* w = reinterpret_cast<const float*>(want.data());
  float max_diff = 0;
  for (size_t i = 0; i < got.size() / 4; ++i) max_diff = std::max(max_diff, std::abs(g[i] - w[i]));
  EXPECT_LT(max_diff, 1e-3f);
  // one line of 4 greedy ids
  const std::string first = out.substr(0, out.find('\n'));
  EXPECT_EQ(std::count(first.begin(), first.end(), ' '), 3) << out;
}

TEST(Cli, TokenizeMatchesFixtureIds) {
  const fs::path dir = test::data_dir() / "models" / "qwen3moe";
  std::ifstream in(dir / "tokens.json");
  auto j = nlohmann::json::parse(in);
  const fs::path text = test::scratch_dir("cli-tok") / "text.txt";
  const std::string s = j["text"].get<std::string>();
  test::write_file(text, std::vector<uint8_t>(s.begin(), s.end()));
  std::string out;
  ASSERT_EQ(test::run_cli("tokenize -m \"" + (dir / "model-Q4_K_M.gguf").string() + "\" -f \"" +
                              text.string() + "\"",
                          &out, true),
            0);
  std::string want;
  for (int id : j["text_ids"].get<std::vector<int>>()) {
    if (!want.empty()) want += ' ';
    want += std::to_string(id);
  }
  EXPECT_EQ(out, want + "\n");
}

TEST(Cli, ChatReadsTurnsFromStdin) {
  std::string out;
  ASSERT_EQ(test::run_cli("chat -n 4 --temp 0 < /dev/null", &out), 0) << out;
  const fs::path turns = test::scratch_dir("cli-chat") / "turns.txt";
  const std::string t = "Hello\nAnd then?\n";
  test::write_file(turns, std::vector<uint8_t>(t.begin(), t.end()));
  ASSERT_EQ(test::run_cli("chat -n 4 --temp 0 --template qwen3 < \"" + turns.string() + "\"", &out), 0) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '['), 2) << out;  // one "[N tokens, ...]" per turn
}

// STRATA_ISA forces a kernel variant in a fresh process: strata bench names the variant it runs,
// and the logits of the bundled model from every variant agree with the scalar reference's. The
// integer sums are the same and only float rounding differs, but a router near a tie can pick
// another expert for a token, so the bound is the statistical one the fixtures use for the
// quantized path (rms of the difference / rms of the logits < 0.02), not an element-wise one.
TEST(Cli, ForcedIsaRunsThatVariant) {
  const fs::path dir = test::scratch_dir("cli_isa");
  const std::string tokens = (test::data_dir() / "models" / "qwen3moe" / "tokens.json").string();
  auto read_f32 = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<float> out(bytes.size() / sizeof(float));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
    return out;
  };
  std::vector<float> ref;
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    if (!cpu::isa_supported(*cpu::parse_isa(isa))) {
      std::printf("[ SKIPPED ] this CPU lacks %s\n", isa);
      continue;
    }
    setenv("STRATA_ISA", isa, 1);
    std::string out;
    const int rc_bench = test::run_cli("bench -p 4 -n 2 -r 1", &out);
    const fs::path logits = dir / (std::string(isa) + ".f32");
    std::string lout;
    const int rc_logits = test::run_cli("logits --tokens \"" + tokens + "\" -o \"" + logits.string() + "\"", &lout);
    unsetenv("STRATA_ISA");
    ASSERT_EQ(rc_bench, 0) << out;
    EXPECT_NE(out.find(std::string("CPU ") + isa + " "), std::string::npos) << out;
    ASSERT_EQ(rc_logits, 0) << lout;
    // the scalar file is the reference; read it from the file of the first variant run
    std::vector<float> got = read_f32(logits);
    ASSERT_FALSE(got.empty());
    if (ref.empty()) {
      ref = got;
      continue;
    }
    ASSERT_EQ(got.size(), ref.size());
    double err = 0, norm = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      err += double(got[i] - ref[i]) * double(got[i] - ref[i]);
      norm += double(ref[i]) * double(ref[i]);
    }
    const double rms_rel = std::sqrt(err / norm);
    std::printf("%s vs scalar: rms_rel %.2e\n", isa, rms_rel);
    EXPECT_LT(rms_rel, 0.02) << isa << " vs scalar";
  }
}

}  // namespace
}  // namespace strata
