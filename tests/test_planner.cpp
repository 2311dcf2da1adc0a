// The tier planner's decisions and predictions on fixed inputs (engine/planner.h), and the model
// inventory it reads from GGUF headers, real or synthetic (header only).
#include <gtest/gtest.h>

#include "engine/planner.h"
#include "model/model_info.h"
#include "model/synth.h"
#include "test_support.h"

namespace strata {
namespace {

constexpr uint64_t MB = 1000000;

// 4 layers of 100 MB fixed weights and 16 experts of 10 MB (2 used), 50 MB of embeddings over
// 1000 rows, a 40 MB output head, 1000 bytes of KV cache per position and layer.
PlanModel toy_model() {
  PlanModel m;
  m.name = "toy";
  m.arch = "qwen3moe";
  m.n_embd = 1024;
  m.n_vocab = 1000;
  m.n_expert = 16;
  m.n_expert_used = 2;
  m.embd_bytes = 50 * MB;
  m.output_bytes = 40 * MB;
  m.output_params = 80 * MB;
  m.layers.assign(4, PlanModel::Layer{.fixed_bytes = 100 * MB, .fixed_params = 200 * MB, .expert_bytes = 10 * MB,
                                      .expert_params = 20 * MB, .kv_bytes_per_token = 1000});
  return m;
}

Config config(const char* text) {
  auto c = parse_config(text, "plan.toml");
  EXPECT_TRUE(c) << (c ? "" : c.error().message);
  return *c;
}

HardwareLimits cpu_box() {
  HardwareLimits h;
  h.dram_gbps = 50;
  h.weights_gbps = 40;
  h.cpu_int8_gops = 1000;
  h.nvme_gbps = 5;
  h.ram_bytes = 64ull << 30;
  return h;
}

// the same with a 24 GiB GPU: 800 GB/s, 50 TFLOP/s, PCIe 25 GB/s
HardwareLimits gpu_box() {
  HardwareLimits h = cpu_box();
  h.gpu_gbps = 800;
  h.gpu_tflops = 50;
  h.pcie_h2d_gbps = 25;
  h.vram_bytes = 24ull << 30;
  return h;
}

PlanOptions options() {
  PlanOptions o;
  o.ctx = 1000;
  o.prompt_tokens = 100;
  return o;
}

TEST(Planner, CpuOnlyWholeModelInRam) {
  const PlanModel m = toy_model();
  auto plan = make_plan(m, config("[budgets]\nram = \"8GiB\""), cpu_box(), options());
  ASSERT_TRUE(plan) << plan.error().message;
  const Placement& p = plan->placement;
  EXPECT_EQ(p.gpu_layers, 0);
  EXPECT_EQ(p.experts_total, 64);
  EXPECT_EQ(p.experts_in_ram, 64);
  EXPECT_EQ(p.experts_on_nvme, 0);
  EXPECT_EQ(p.ram_fixed, 50 * MB + 40 * MB + 400 * MB);
  EXPECT_EQ(p.ram_kv, 4 * 1000 * 1000u);
  EXPECT_DOUBLE_EQ(plan->hit_ram, 1.0);
  // decode reads one embedding row, the output head, the fixed parts, the KV cache of 100
  // positions and 2 experts per layer, at the decode kernels' 40 GB/s
  const double bytes = 50e6 / 1000 + 40e6 + 400e6 + 4 * 1000 * 100 + 4 * 2 * 10e6;
  EXPECT_NEAR(plan->decode.total_s, bytes / 40e9, 1e-9);
  EXPECT_NEAR(plan->decode.tok_per_s, 40e9 / bytes, 1e-6);
  EXPECT_DOUBLE_EQ(plan->decode.nvme_s, 0.0);
  EXPECT_DOUBLE_EQ(plan->decode.gpu_s, 0.0);
  EXPECT_EQ(plan->decode.ram_bytes, uint64_t(bytes));
  // prefill: compute-bound at 1000 GOP/s: fixed 2*200M*100 per layer, experts 2*20M per token-use
  const double ops = 4 * 2.0 * 200e6 * 100 + 4 * 100 * 2 * 2.0 * 20e6 + 2.0 * 80e6;
  EXPECT_NEAR(plan->prefill.total_s, ops / 1000e9, 1e-6);
}

TEST(Planner, RamBudgetSpillsExpertsToNvme) {
  const PlanModel m = toy_model();
  // 490 MB fixed + 4 MB KV leave 506 MB: about 79% of the 640 MB of experts
  const Config c = config("[budgets]\nram = 1000000000\n[storage]\nprefetch_depth = 0");
  auto plan = make_plan(m, c, cpu_box(), options());
  ASSERT_TRUE(plan) << plan.error().message;
  const double r = (1000e6 - 490e6 - 4e6) / 640e6;
  EXPECT_NEAR(plan->hit_ram, r, 1e-9);
  EXPECT_NEAR(plan->miss_nvme, 1 - r, 1e-9);
  const Placement& p = plan->placement;
  EXPECT_EQ(p.experts_in_ram + p.experts_on_nvme, 64);
  EXPECT_EQ(p.experts_in_ram, int64_t(r * 64));
  const double nvme_bytes = (1 - r) * 4 * 2 * 10e6;
  EXPECT_NEAR(plan->decode.nvme_s, nvme_bytes / 5e9, 1e-9);
  // no prefetch: the reads add to the compute
  EXPECT_NEAR(plan->decode.total_s, plan->decode.cpu_s + plan->decode.nvme_s, 1e-12);
  // with prefetch they overlap
  auto overlapped = make_plan(m, config("[budgets]\nram = 1000000000\n[storage]\nprefetch_depth = 2"), cpu_box(), options());
  ASSERT_TRUE(overlapped);
  EXPECT_NEAR(overlapped->decode.total_s, std::max(overlapped->decode.cpu_s, overlapped->decode.nvme_s), 1e-12);
  EXPECT_LT(overlapped->decode.total_s, plan->decode.total_s);
  // the CPU interleaves each expert it reads (cpu.repack) at hardware.repack_gbps: CPU time per
  // byte read, in decode and prefill; unknown, it is not counted and a note says so
  HardwareLimits h = cpu_box();
  h.repack_gbps = 10;
  auto repacked = make_plan(m, c, h, options());
  ASSERT_TRUE(repacked);
  EXPECT_NEAR(repacked->decode.cpu_s - plan->decode.cpu_s, nvme_bytes / 10e9, 1e-12);
  EXPECT_GT(repacked->prefill.cpu_s, plan->prefill.cpu_s);
  bool noted = false;
  for (const auto& n : plan->notes) noted |= n.find("hardware.repack_gbps unknown") != std::string::npos;
  EXPECT_TRUE(noted);
  auto file_layout = make_plan(m, config("[budgets]\nram = 1000000000\n[storage]\nprefetch_depth = 0\n[cpu]\nrepack = false"), h, options());
  ASSERT_TRUE(file_layout);
  EXPECT_NEAR(file_layout->decode.cpu_s, plan->decode.cpu_s, 1e-15);
}

TEST(Planner, GpuTakesOutputLayersThenExperts) {
  const PlanModel m = toy_model();
  const HardwareLimits h = gpu_box();
  PlanOptions o = options();
  o.vram_scratch = 100 * MB;
  // 1 GB: 100 MB scratch, 40 MB output, 4 x (100 MB + 1 MB KV) layers, 456 MB of experts
  auto plan = make_plan(m, config("[budgets]\nram = \"8GiB\"\nvram = 1000000000"), h, o);
  ASSERT_TRUE(plan) << plan.error().message;
  const Placement& p = plan->placement;
  EXPECT_TRUE(p.output_on_gpu);
  EXPECT_EQ(p.gpu_layers, 4);
  EXPECT_EQ(p.vram_kv, 4 * 1000 * 1000u);
  EXPECT_NEAR(plan->hit_vram, 456e6 / 640e6, 1e-9);
  EXPECT_NEAR(plan->hit_ram, 1 - 456e6 / 640e6, 1e-9);
  EXPECT_EQ(p.ram_fixed, 50 * MB);  // only the embeddings stay on the host
  EXPECT_GT(plan->decode.gpu_s, 0.0);
  EXPECT_GT(plan->decode.pcie_s, 0.0);  // hidden states cross for the CPU's experts
  // a smaller budget holds only some layers; the note says so
  auto small = make_plan(m, config("[budgets]\nram = \"8GiB\"\nvram = 350000000"), h, o);
  ASSERT_TRUE(small) << small.error().message;
  EXPECT_EQ(small->placement.gpu_layers, 2);
  EXPECT_NEAR(small->hit_vram, 8e6 / 640e6, 1e-9);  // what is left after 2 layers caches experts
  bool noted = false;
  for (const auto& n : small->notes) noted |= n.find("2 of 4 layers") != std::string::npos;
  EXPECT_TRUE(noted);
  // and a faster machine is never predicted slower
  auto cpu_only = make_plan(m, config("[budgets]\nram = \"8GiB\""), h, o);
  ASSERT_TRUE(cpu_only);
  EXPECT_GT(plan->decode.tok_per_s, cpu_only->decode.tok_per_s);
}

// Promotions into the VRAM cache are PCIe bytes beside compute: measured ones when given, else
// gpu.max_promotions a step while VRAM holds part of the experts, none when it holds them all.
TEST(Planner, PromotionsCrossPcieBesideCompute) {
  const PlanModel m = toy_model();
  const HardwareLimits h = gpu_box();
  PlanOptions o = options();
  o.vram_scratch = 100 * MB;
  const Config partial = config("[budgets]\nram = \"8GiB\"\nvram = 1000000000\n[gpu]\nmax_promotions = 3");
  o.promotions_per_token = 0.0;
  auto none = make_plan(m, partial, h, o);
  ASSERT_TRUE(none) << none.error().message;
  o.promotions_per_token = 2.5;
  auto measured = make_plan(m, partial, h, o);
  ASSERT_TRUE(measured) << measured.error().message;
  // 2.5 experts of 10 MB at 25 GB/s
  EXPECT_NEAR(measured->decode.pcie_s - none->decode.pcie_s, 2.5 * 10e6 / 25e9, 1e-12);
  EXPECT_EQ(measured->decode.pcie_bytes - none->decode.pcie_bytes, uint64_t(2.5 * 10e6));
  EXPECT_DOUBLE_EQ(measured->decode.total_s, none->decode.total_s);  // on the copy stream: compute is longer
  o.promotions_per_token.reset();
  auto cap = make_plan(m, partial, h, o);
  ASSERT_TRUE(cap) << cap.error().message;
  EXPECT_NEAR(cap->decode.pcie_s - none->decode.pcie_s, 3 * 10e6 / 25e9, 1e-12);
  // a VRAM that holds every expert promotes nothing
  auto all = make_plan(m, config("[budgets]\nram = \"8GiB\"\nvram = 2000000000\n[gpu]\nmax_promotions = 3"), h, o);
  ASSERT_TRUE(all) << all.error().message;
  EXPECT_DOUBLE_EQ(all->hit_vram, 1.0);
  EXPECT_EQ(all->decode.pcie_bytes, 0u);
}

TEST(Planner, ErrorsNameTheKey) {
  const PlanModel m = toy_model();
  struct Case {
    const char* config;
    HardwareLimits hw;
    const char* expect;
  };
  HardwareLimits no_dram = cpu_box();
  no_dram.dram_gbps = no_dram.weights_gbps = 0;
  HardwareLimits no_nvme = cpu_box();
  no_nvme.nvme_gbps = 0;
  HardwareLimits no_ram = cpu_box();
  no_ram.ram_bytes = 0;
  const Case cases[] = {
      {"[budgets]\nram = 400000000", cpu_box(), "budgets.ram is 381.5 MiB, less than the CPU-side fixed part"},
      {"[budgets]\nram = \"100GiB\"", cpu_box(), "budgets.ram is 100.0 GiB but the machine has 64.0 GiB"},
      {"[budgets]\nram = \"8GiB\"", no_dram, "hardware.dram_gbps is unknown"},
      {"[budgets]\nram = 600000000", no_nvme, "hardware.nvme_gbps is unknown"},
      {"", no_ram, "hardware.ram is unknown"},
      {"[budgets]\nram = \"8GiB\"\nvram = \"8GiB\"", cpu_box(), "hardware.gpu_gbps is unknown"},
  };
  for (const Case& k : cases) {
    auto plan = make_plan(m, config(k.config), k.hw, options());
    ASSERT_FALSE(plan) << k.config;
    EXPECT_NE(plan.error().message.find(k.expect), std::string::npos) << plan.error().message;
  }
}

TEST(Planner, InventoryOfARealFileAddsUp) {
  auto f = GgufFile::open((test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf").string());
  ASSERT_TRUE(f);
  auto m = plan_model_from_gguf(*f);
  ASSERT_TRUE(m) << m.error().message;
  auto s = summarize_model(*f);
  ASSERT_TRUE(s);
  EXPECT_EQ(m->expert_bytes_total(), s->expert_bytes_total);
  EXPECT_EQ(m->n_expert, int(s->n_expert));
  EXPECT_EQ(m->layers.size(), size_t(s->n_layer));
  // every tensor counted once (the tied output head, if any, counted again on purpose)
  const bool tied = f->find_tensor("output.weight") == nullptr;
  if (!tied) {
    EXPECT_EQ(m->total_bytes(), s->n_bytes);
  }
  for (const auto& l : m->layers) {
    EXPECT_GT(l.fixed_bytes, 0u);
    EXPECT_GT(l.expert_bytes, 0u);
    EXPECT_GT(l.kv_bytes_per_token, 0u);
  }
}

TEST(Planner, SyntheticShapeFromItsHeaderAlone) {
  const SynthShape* shape = find_synth_shape("qwen3-30b-a3b");
  ASSERT_NE(shape, nullptr);
  auto sp = build_synth_plan(*shape, SynthQuant::q4_k_m, {});
  ASSERT_TRUE(sp);
  const std::vector<uint8_t> header = sp->writer.header_bytes();
  auto f = GgufFile::parse_header(header, sp->writer.file_size(), "qwen3-30b-a3b");
  ASSERT_TRUE(f) << f.error().message;
  EXPECT_EQ(f->file_size(), sp->writer.file_size());
  EXPECT_EQ(f->tensors().size(), sp->writer.tensors().size());
  // the whole file parsed as a header must fail where its data is missing
  EXPECT_FALSE(GgufFile::parse(header, "header"));
  auto m = plan_model_from_gguf(*f);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->layers.size(), 48u);
  EXPECT_EQ(m->n_expert, 128);
  EXPECT_EQ(m->n_expert_used, 8);
  // 48 layers x 128 experts of 2048 x 768 x 3 matrices, Q4_K_M: about 16 GiB
  EXPECT_GT(m->expert_bytes_total(), 15ull << 30);
  EXPECT_LT(m->expert_bytes_total(), 18ull << 30);
  // a header that claims more data than its declared file size is an error
  EXPECT_FALSE(GgufFile::parse_header(header, header.size() + 10, "short"));
}

}  // namespace
}  // namespace strata
