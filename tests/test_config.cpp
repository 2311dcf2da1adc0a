// Config files, overrides, sizes, budgets and the calibration cache (src/engine/config.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/config.h"
#include "test_support.h"

namespace strata {
namespace {

std::string error_of(const Result<Config>& r) { return r ? std::string("(no error)") : r.error().message; }

TEST(Config, DefaultsWithoutAFile) {
  auto c = parse_config("", "none");
  ASSERT_TRUE(c) << error_of(c);
  EXPECT_FALSE(c->ram_budget.has_value());
  EXPECT_EQ(c->vram_budget, 0u);
  EXPECT_EQ(c->threads, 0);
  EXPECT_EQ(c->load, MappedFile::Mode::automatic);
  EXPECT_EQ(c->queue_depth, 32);
}

TEST(Config, ReadsEveryTable) {
  auto c = parse_config(R"(
[model]
path = "/models/x.gguf"
ctx = 4096
load = "mmap"
[budgets]
ram = "22GiB"
vram = 8589934592
[cpu]
threads = 6
pin = false
[storage]
queue_depth = 64
prefetch_depth = 3
cache_policy = "lfu"
[hardware]
dram_gbps = 51.5
nvme_gbps = 7
ram = "64GiB"
gpu = "test gpu"
)", "t.toml");
  ASSERT_TRUE(c) << error_of(c);
  EXPECT_EQ(c->model_path, "/models/x.gguf");
  EXPECT_EQ(c->ctx, 4096);
  EXPECT_EQ(c->load, MappedFile::Mode::mmap);
  EXPECT_EQ(*c->ram_budget, 22ull << 30);
  EXPECT_EQ(c->vram_budget, 8ull << 30);
  EXPECT_EQ(c->threads, 6);
  EXPECT_FALSE(c->pin);
  EXPECT_EQ(c->queue_depth, 64);
  EXPECT_EQ(c->prefetch_depth, 3);
  EXPECT_EQ(c->cache_policy, "lfu");
  EXPECT_DOUBLE_EQ(c->hardware.dram_gbps, 51.5);
  EXPECT_DOUBLE_EQ(c->hardware.nvme_gbps, 7.0);
  EXPECT_EQ(c->hardware.ram_bytes, 64ull << 30);
  EXPECT_EQ(c->hardware.gpu_name, "test gpu");
}

TEST(Config, ErrorsNameTheKeyAndTheFile) {
  struct Case {
    const char* text;
    const char* expect;  // substring of the message
  };
  const Case cases[] = {
      {"[budgets]\nrma = 3\n", "unknown key 'budgets.rma'"},
      {"[budget]\nram = 3\n", "unknown table [budget]"},
      {"threads = 3\n", "'threads' must be a table"},
      {"[cpu]\nthreads = \"four\"\n", "cpu.threads must be an integer"},
      {"[cpu]\nthreads = -1\n", "cpu.threads must be an integer from 0"},
      {"[cpu]\npin = 1\n", "cpu.pin must be true or false"},
      {"[budgets]\nram = \"12XB\"\n", "budgets.ram size '12XB'"},
      {"[budgets]\nram = 0\n", "budgets.ram must be more than 0"},
      {"[budgets]\nvram = -5\n", "budgets.vram must be a size >= 0"},
      {"[budgets]\nvram = true\n", "budgets.vram must be a size"},
      {"[model]\nload = \"disk\"\n", "model.load must be one of auto, ram, mmap"},
      {"[storage]\ncache_policy = \"fifo\"\n", "storage.cache_policy must be one of"},
      {"[storage]\nqueue_depth = 0\n", "storage.queue_depth must be an integer from 1"},
      {"[hardware]\ndram_gbps = -3\n", "hardware.dram_gbps must be a number >= 0"},
      {"[cpu\nthreads = 1\n", "bad.toml:1:"},  // TOML syntax error with line and column
  };
  for (const Case& k : cases) {
    auto c = parse_config(k.text, "bad.toml");
    ASSERT_FALSE(c) << k.text;
    EXPECT_NE(c.error().message.find(k.expect), std::string::npos) << c.error().message;
    EXPECT_NE(c.error().message.find("bad.toml"), std::string::npos) << c.error().message;
  }
}

TEST(Config, OverridesReplaceFileValuesAndAreValidatedAlike) {
  const char* text = "[cpu]\nthreads = 2\n[budgets]\nram = \"8GiB\"\n";
  auto o1 = parse_override("cpu.threads=5");
  auto o2 = parse_override("budgets.ram = 16GiB");  // a bare word is a string
  auto o3 = parse_override("model.load=ram");
  ASSERT_TRUE(o1 && o2 && o3);
  auto c = parse_config(text, "t.toml", {*o1, *o2, *o3});
  ASSERT_TRUE(c) << error_of(c);
  EXPECT_EQ(c->threads, 5);
  EXPECT_EQ(*c->ram_budget, 16ull << 30);
  EXPECT_EQ(c->load, MappedFile::Mode::ram);
  // a later override of the same key wins
  auto o4 = parse_override("cpu.threads=7");
  ASSERT_TRUE(o4);
  c = parse_config(text, "t.toml", {*o1, *o4});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->threads, 7);
  // unknown keys and bad values are caught the same way as in the file
  auto bad = parse_override("cpu.thread=3");
  ASSERT_TRUE(bad);
  c = parse_config(text, "t.toml", {*bad});
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("unknown key 'cpu.thread'"), std::string::npos) << c.error().message;
  EXPECT_FALSE(parse_override("threads=3"));  // needs its table
  EXPECT_FALSE(parse_override("cpu.threads"));
  EXPECT_FALSE(parse_override("=3"));
  auto into_value = parse_override("cpu.threads.x=1");  // cpu.threads is not a table
  ASSERT_TRUE(into_value);
  c = parse_config(text, "t.toml", {*into_value});
  EXPECT_FALSE(c);
  // a float where an integer goes, far beyond int64 (fuzz_config: toml++ converted it, undefined)
  for (const char* f : {"cpu.threads=22222221122222221110.2", "cpu.threads=2.0", "storage.queue_depth=-1e300"}) {
    auto o = parse_override(f);
    ASSERT_TRUE(o) << f;
    c = parse_config("", "t.toml", {*o});
    ASSERT_FALSE(c) << f;
    EXPECT_NE(c.error().message.find("must be an integer"), std::string::npos) << c.error().message;
  }
}

TEST(Config, Sizes) {
  EXPECT_EQ(*parse_size("22GiB"), 22ull << 30);
  EXPECT_EQ(*parse_size("22 gib"), 22ull << 30);
  EXPECT_EQ(*parse_size("16G"), 16ull << 30);
  EXPECT_EQ(*parse_size("512MiB"), 512ull << 20);
  EXPECT_EQ(*parse_size("1.5GB"), 1500000000ull);
  EXPECT_EQ(*parse_size("2TB"), 2000000000000ull);
  EXPECT_EQ(*parse_size("4096"), 4096ull);
  EXPECT_EQ(*parse_size("4096B"), 4096ull);
  EXPECT_EQ(*parse_size("0.5KiB"), 512ull);
  for (const char* bad : {"", "GiB", "1.2.3G", "12XB", "-1G", "1.5", "abc", "1e3", "99999999999TiB"})
    EXPECT_FALSE(parse_size(bad)) << bad;
  EXPECT_EQ(format_size(22ull << 30), "22.0 GiB");
  EXPECT_EQ(format_size(100), "100 B");
}

// Every preset parses, and states what its name promises.
TEST(Config, PresetsParse) {
  const auto dir = std::filesystem::path(STRATA_SOURCE_DIR) / "configs";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".toml") continue;
    auto c = load_config(e.path().string());
    ASSERT_TRUE(c) << error_of(c);
    ++n;
    const std::string name = e.path().stem().string();
    if (name == "cpu-only") {
      EXPECT_EQ(c->vram_budget, 0u);
    }
    if (name == "rtx3090") {
      EXPECT_EQ(c->hardware.vram_bytes, 24ull << 30);
      EXPECT_EQ(c->hardware.ram_bytes, 128ull << 30);
    }
    if (name == "rtx5060") {
      EXPECT_EQ(c->hardware.vram_bytes, 8ull << 30);
      EXPECT_EQ(c->hardware.ram_bytes, 64ull << 30);
    }
    if (name == "rtx5090") {
      EXPECT_EQ(c->hardware.vram_bytes, 32ull << 30);
      EXPECT_EQ(c->hardware.ram_bytes, 128ull << 30);
    }
    if (c->hardware.vram_bytes > 0) {
      EXPECT_GT(c->vram_budget, 0u) << name;
      EXPECT_LE(c->vram_budget, c->hardware.vram_bytes) << name;
      EXPECT_LE(*c->ram_budget, c->hardware.ram_bytes) << name;
    }
  }
  EXPECT_EQ(n, 4);
}

// docs/config.md documents every key the parser accepts.
TEST(Config, EveryKeyIsDocumented) {
  std::ifstream in(std::filesystem::path(STRATA_SOURCE_DIR) / "docs" / "config.md");
  ASSERT_TRUE(in) << "docs/config.md is missing";
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  for (const ConfigKey& k : config_keys()) {
    std::string quoted = "`";
    quoted += k.key;
    quoted += '`';
    EXPECT_NE(doc.find(quoted), std::string::npos) << k.key << " is not in docs/config.md";
  }
}

ModelSummary summary_of(uint64_t total, uint64_t experts) {
  ModelSummary s;
  s.n_bytes = total;
  s.expert_bytes_total = experts;
  return s;
}

TEST(Config, BudgetsAgainstTheMachineAndTheModel) {
  const SystemMemory mem{.total = 64ull << 30, .available = 60ull << 30};
  const ModelSummary s = summary_of(20ull << 30, 18ull << 30);  // 2 GiB fixed part
  const uint64_t kv = 1ull << 30;
  auto config = [](const char* text) { return *parse_config(text, "b.toml"); };

  // automatic budget: model.load = "auto" reads the file when it, the KV cache and kLoadMargin
  // fit in the memory available, else maps it (and says so); ram / mmap stay as configured
  auto r = check_budgets(config(""), s, kv, mem, 0);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->load, MappedFile::Mode::ram);
  EXPECT_TRUE(r->notes.empty());
  // 18.6 GB and 0.4 GB of KV in 23 GiB available (the issue's 24 GiB box): read, where 80% of
  // the available memory (the old rule) would have mapped it
  const SystemMemory box{.total = 24ull << 30, .available = 23ull << 30};
  r = check_budgets(config(""), summary_of(18600000000ull, 17000000000ull), 400000000ull, box, 0);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->load, MappedFile::Mode::ram);
  // less than the margin left: mapped, with a note
  r = check_budgets(config(""), summary_of((22ull << 30) + (512ull << 20), 20ull << 30), 256ull << 20, box, 0);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->load, MappedFile::Mode::mmap);
  ASSERT_EQ(r->notes.size(), 1u);
  EXPECT_NE(r->notes[0].find("mapped"), std::string::npos) << r->notes[0];
  r = check_budgets(config("[model]\nload = \"mmap\""), s, kv, mem, 0);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->load, MappedFile::Mode::mmap);
  // the whole model fits: read into RAM
  r = check_budgets(config("[budgets]\nram = \"32GiB\""), s, kv, mem, 0);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->load, MappedFile::Mode::ram);
  // only part of the experts fit: the NVMe tier streams them (the file is mapped for the header),
  // with a cache of what the budget leaves, and a note that says so
  r = check_budgets(config("[budgets]\nram = \"8GiB\""), s, kv, mem, 0);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->load, MappedFile::Mode::mmap);
  EXPECT_EQ(r->expert_cache_bytes, (8ull << 30) - (2ull << 30) - kv - kRamOverhead);
  ASSERT_EQ(r->notes.size(), 1u);
  EXPECT_NE(r->notes[0].find("NVMe tier"), std::string::npos) << r->notes[0];
  // ... unless the config insists on ram
  r = check_budgets(config("[budgets]\nram = \"8GiB\"\n[model]\nload = \"ram\""), s, kv, mem, 0);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("budgets.ram"), std::string::npos);
  // the fixed part and the KV cache do not fit
  r = check_budgets(config("[budgets]\nram = \"2GiB\""), s, kv, mem, 0);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("budgets.ram is 2.0 GiB, less than the fixed part"), std::string::npos)
      << r.error().message;
  // more than the machine has
  r = check_budgets(config("[budgets]\nram = \"100GiB\""), s, kv, mem, 0);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("this machine has 64.0 GiB"), std::string::npos) << r.error().message;
  // a GPU budget without a GPU: one note, everything on the CPU (a GPU preset runs anywhere)
  r = check_budgets(config("[budgets]\nvram = \"8GiB\""), s, kv, mem, 0);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->notes.size(), 1u);
  EXPECT_NE(r->notes[0].find("no usable GPU"), std::string::npos) << r->notes[0];
  EXPECT_NE(r->notes[0].find("everything runs on the CPU"), std::string::npos) << r->notes[0];
  // with a GPU: the note says what runs where
  r = check_budgets(config("[budgets]\nvram = \"8GiB\""), s, kv, mem, 1);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->notes.size(), 1u);
  EXPECT_NE(r->notes[0].find("CUDA backend"), std::string::npos) << r->notes[0];
  EXPECT_NE(r->notes[0].find("hottest routed experts in a VRAM cache"), std::string::npos) << r->notes[0];
}

TEST(Config, CalibrationCacheRoundTrip) {
  const auto dir = test::scratch_dir("calibration");
  const std::string path = (dir / "sub" / "calibration.toml").string();
  auto none = read_calibration(path);
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->has_value());
  Calibration c;
  c.limits.dram_gbps = 30.25;
  c.limits.nvme_gbps = 1.5;
  c.limits.cpu_int8_gops = 812;
  c.limits.ram_bytes = 24ull << 30;
  c.limits.cpu_name = "test cpu";
  c.date = "2026-11-30";
  c.isa = "avx512";
  c.threads = 2;
  ASSERT_TRUE(write_calibration(path, c));
  auto back = read_calibration(path);
  ASSERT_TRUE(back) << back.error().message;
  ASSERT_TRUE(back->has_value());
  const Calibration& b = **back;
  EXPECT_DOUBLE_EQ(b.limits.dram_gbps, 30.25);
  EXPECT_DOUBLE_EQ(b.limits.nvme_gbps, 1.5);
  EXPECT_DOUBLE_EQ(b.limits.cpu_int8_gops, 812);
  EXPECT_EQ(b.limits.ram_bytes, 24ull << 30);
  EXPECT_EQ(b.limits.cpu_name, "test cpu");
  EXPECT_EQ(b.date, "2026-11-30");
  EXPECT_EQ(b.isa, "avx512");
  EXPECT_EQ(b.threads, 2);
  // a config's stated figures win over the cache; the cache fills the rest
  HardwareLimits stated;
  stated.dram_gbps = 99;
  fill_unknown(stated, b.limits);
  EXPECT_DOUBLE_EQ(stated.dram_gbps, 99);
  EXPECT_DOUBLE_EQ(stated.nvme_gbps, 1.5);
  // a damaged cache is an error that says what to do
  test::write_file(path, {'[', 'x'});
  auto damaged = read_calibration(path);
  ASSERT_FALSE(damaged);
  EXPECT_NE(damaged.error().message.find("calibrate"), std::string::npos);
}

}  // namespace
}  // namespace strata
