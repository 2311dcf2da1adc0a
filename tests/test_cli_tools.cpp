// The measuring and planning commands end to end, on the bundled model: profile, plan, calibrate,
// bench's table and JSON, and config errors on the command line.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(CliTools, ProfileWritesTraceChartAndJson) {
  const fs::path dir = test::scratch_dir("cli_profile");
  const fs::path trace = dir / "t.json", svg = dir / "c.svg";
  std::string out;
  ASSERT_EQ(test::run_cli("profile -p 16 -n 8 --trace \"" + trace.string() + "\" --svg \"" + svg.string() + "\"", &out), 0) << out;
  EXPECT_NE(out.find("split of decode time: CPU"), std::string::npos) << out;
  EXPECT_NE(out.find("per layer"), std::string::npos) << out;
  const auto t = nlohmann::json::parse(read_text(trace));
  EXPECT_GT(t["traceEvents"].size(), 8u);
  EXPECT_NE(read_text(svg).find("</svg>"), std::string::npos);

  std::string js;
  ASSERT_EQ(test::run_cli("profile -p 16 -n 8 --trace \"\" --svg \"\" --json", &js, /*stdout_only=*/true), 0) << js;
  const auto j = nlohmann::json::parse(js);
  EXPECT_EQ(j["decode"]["tokens"], 8);
  const double total = j["split"]["cpu"].get<double>() + j["split"]["idle"].get<double>();
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_GT(j["bytes_per_token"]["weights"].get<double>(), 0.0);
}

TEST(CliTools, PlanForAShapeAndForAFile) {
  std::string out;
  ASSERT_EQ(test::run_cli("plan --shape qwen3-30b-a3b -c \"" STRATA_SOURCE_DIR "/configs/rtx3090.toml\" --json", &out, true), 0) << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_GT(j["decode"]["tok_per_s"].get<double>(), 0.0);
  EXPECT_EQ(j["placement"]["gpu_layers"], 48);
  // a file with the machine's limits given on the command line (no calibration needed)
  const std::string limits =
      " --set hardware.dram_gbps=30 --set hardware.cpu_int8_gops=300 --set hardware.ram=16GiB";
  ASSERT_EQ(test::run_cli("plan" + limits, &out), 0) << out;
  EXPECT_NE(out.find("predicted decode"), std::string::npos) << out;
  // without limits nor a calibration cache: an error that says how to get them
  setenv("STRATA_CALIBRATION", (test::scratch_dir("cli_plan") / "none.toml").c_str(), 1);
  const int rc = test::run_cli("plan", &out);
  unsetenv("STRATA_CALIBRATION");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("strata calibrate"), std::string::npos) << out;
  EXPECT_EQ(test::run_cli("plan --shape no-such-model", &out), 1);
}

TEST(CliTools, CalibrateCachesWhatPlanReads) {
  const fs::path cache = test::scratch_dir("cli_calibrate") / "cal.toml";
  setenv("STRATA_CALIBRATION", cache.c_str(), 1);
  std::string out;
  const int rc = test::run_cli("calibrate --no-disk", &out);
  std::string plan;
  const int rc_plan = test::run_cli("plan", &plan);
  unsetenv("STRATA_CALIBRATION");
  ASSERT_EQ(rc, 0) << out;
  const std::string text = read_text(cache);
  EXPECT_NE(text.find("dram_gbps = "), std::string::npos) << text;
  EXPECT_NE(text.find("cpu_int8_gops = "), std::string::npos) << text;
  EXPECT_EQ(rc_plan, 0) << plan;
  EXPECT_NE(plan.find("calibration"), std::string::npos) << plan;
}

TEST(CliTools, BenchJsonAndConfigErrors) {
  std::string out;
  ASSERT_EQ(test::run_cli("bench -p 8,16 -n 4 -r 2 --json", &out, true), 0) << out;
  const auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_EQ(j[0]["test"], "pp8");
  EXPECT_EQ(j[1]["test"], "pp16");
  EXPECT_EQ(j[2]["test"], "tg4");
  EXPECT_EQ(j[2]["samples_ts"].size(), 2u);
  // a list of depths: each test at each, in order, and in the table each depth against the first
  ASSERT_EQ(test::run_cli("bench -p 0 -n 2 -d 0,8 -r 2 --json", &out, true), 0) << out;
  const auto jd = nlohmann::json::parse(out);
  ASSERT_EQ(jd.size(), 2u);
  EXPECT_EQ(jd[0]["n_depth"], 0);
  EXPECT_EQ(jd[1]["n_depth"], 8);
  EXPECT_EQ(jd[1]["samples_ts"].size(), 2u);
  ASSERT_EQ(test::run_cli("bench -p 0 -n 2 -d 0,8 -r 2", &out, true), 0) << out;
  EXPECT_NE(out.find("tg2 @ d8"), std::string::npos) << out;
  EXPECT_NE(out.find("x of depth 0's tok/s"), std::string::npos) << out;
  EXPECT_EQ(test::run_cli("bench --speculative -d 0,8", &out), 1);
  EXPECT_NE(out.find("one --depth"), std::string::npos) << out;
  // config errors: one line naming the key, exit 1
  EXPECT_EQ(test::run_cli("run -n 2 --set budgets.rma=1", &out), 1);
  EXPECT_NE(out.find("unknown key 'budgets.rma'"), std::string::npos) << out;
  EXPECT_EQ(test::run_cli("run -n 2 -c /no/such/config.toml", &out), 1);
  EXPECT_NE(out.find("/no/such/config.toml"), std::string::npos) << out;
}

// info --hw on a stand-in of 2 nodes; bench on it prints each node's expert bytes (equal halves of
// the one-node figure); a bad policy or topology is one clear line.
TEST(CliTools, InfoHwAndNumaStandIns) {
  std::string out;
  ASSERT_EQ(test::run_cli("info --hw --topology \"pack:2 numa:1 core:2 pu:2\"", &out, true), 0) << out;
  EXPECT_NE(out.find("2 NUMA nodes, 4 cores, 8 hardware threads"), std::string::npos) << out;
  EXPECT_NE(out.find("group 1      node 1, threads on cores 2 3"), std::string::npos) << out;
  ASSERT_EQ(test::run_cli("info --hw", &out, true), 0) << out;
  EXPECT_NE(out.find("topology    this machine"), std::string::npos) << out;

  ASSERT_EQ(test::run_cli("bench -p 0 -n 8 -r 1 --json", &out, true), 0) << out;
  const auto one = nlohmann::json::parse(out)[0]["node_expert_bytes_per_token"];
  ASSERT_EQ(one.size(), 1u) << out;
  ASSERT_EQ(test::run_cli("bench -p 0 -n 8 -r 1 --json -t 2 --set 'numa.topology=\"numa:2 core:1 pu:1\"'", &out, true), 0) << out;
  const auto two = nlohmann::json::parse(out)[0]["node_expert_bytes_per_token"];
  ASSERT_EQ(two.size(), 2u) << out;
  EXPECT_GT(two[0].get<double>(), 0.0);
  EXPECT_NEAR(two[0].get<double>() + two[1].get<double>(), one[0].get<double>(), 1e-6 * one[0].get<double>());

  EXPECT_EQ(test::run_cli("run -n 2 --set numa.policy=spread", &out), 1);
  EXPECT_NE(out.find("shard, interleave or node:N"), std::string::npos) << out;
  EXPECT_EQ(test::run_cli("run -n 2 --set numa.policy=node:7", &out), 1);
  EXPECT_NE(out.find("node:7"), std::string::npos) << out;
  EXPECT_EQ(test::run_cli("info --hw --topology \"numa:x\"", &out), 1);
  EXPECT_NE(out.find("synthetic description"), std::string::npos) << out;
}

// serve's drafter flags are checked before it listens: an unknown name, and MTP on a model
// without an MTP layer (the bundled one), are errors that say so.
TEST(CliTools, ServeDraftErrors) {
  std::string out;
  EXPECT_NE(test::run_cli("serve --port 0 --draft bogus", &out), 0);
  EXPECT_NE(out.find("unknown drafter \"bogus\""), std::string::npos) << out;
  EXPECT_NE(test::run_cli("serve --port 0 --draft mtp", &out), 0);
  EXPECT_NE(out.find("--draft mtp: the model has no multi-token-prediction"), std::string::npos) << out;
}

}  // namespace
}  // namespace strata
