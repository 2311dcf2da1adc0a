// strata calibrate: measure this machine's limits (RAM bandwidth, what the decode and prefill
// kernels reach, the int8 and bf16 peaks, NVMe read bandwidth at the configured queue depth; PCIe
// when a GPU tier exists) and cache them for `strata plan` and `strata profile`.

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "cpu/calibrate.h"
#include "cpu/kernel_probe.h"
#include "cpu/kernels.h"
#include "cpu/thread_pool.h"
#include "engine/planner.h"
#include "engine/session.h"
#include "gpu/gpu_devices.h"
#include "storage/disk_probe.h"

namespace strata::cli {
namespace {

struct CalibrateOptions {
  CommonOptions common;
  std::string disk;  // file or directory to read; empty: the model's directory, else "."
  std::string disk_size = "1GiB";
  bool no_disk = false;
  std::string out;  // cache file; empty: calibration_path()
  bool json = false;
};

int fail(const std::string& m) {
  std::fprintf(stderr, "strata calibrate: %s\n", m.c_str());
  return 1;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "";
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", std::localtime(&t));
  return buf;
}

// The CPU forward pass on a real model against the planner's kernel-bound prediction for it with the
// limits just measured: the efficiencies the planner applies. Best of two rounds (the first pass
// over cold weights is slow).
Status measure_engine(const Config& c, HardwareLimits& h, std::string& line) {
  auto m = Model::load(c.model_path, c.load);
  if (!m) return m.error();
  auto pm = plan_model_from_gguf((*m)->file(), c.kv_type);
  if (!pm) return pm.error();
  Config cpu_only = c;
  cpu_only.vram_budget = 0;
  cpu_only.ram_budget.reset();
  HardwareLimits kernel_bound = h;
  kernel_bound.cpu_decode_efficiency = kernel_bound.cpu_prefill_efficiency = 0;
  const int ctx = int(std::min<int64_t>(std::max((*m)->hparams().n_ctx_train, 64), 4096));
  const int n_prompt = std::min(512, ctx - 40), n_gen = 32;
  PlanOptions po;
  po.ctx = ctx;
  po.prompt_tokens = n_prompt;
  auto plan = make_plan(*pm, cpu_only, kernel_bound, po);
  if (!plan) return plan.error();
  if (plan->miss_nvme > 0) return Error{"the model does not fit in RAM: the CPU forward pass cannot be measured from RAM"};
  std::mt19937 rng(5);
  std::vector<int32_t> tokens(static_cast<size_t>(n_prompt));
  for (auto& t : tokens) t = int32_t(rng() % uint32_t((*m)->hparams().n_vocab));
  double best_p = 0, best_d = 0;
  for (int round = 0; round < 2; ++round) {
    Session s(**m, n_prompt + n_gen + 1, cpu::MatmulPath::quantized, c.kv_type);
    auto t0 = std::chrono::steady_clock::now();
    auto l = s.eval(tokens);
    if (!l) return l.error();
    best_p = std::max(best_p, n_prompt / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    int32_t next = argmax(*l);
    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n_gen; ++i) {
      auto d = s.eval(std::span<const int32_t>(&next, 1));
      if (!d) return d.error();
      next = argmax(*d);
    }
    best_d = std::max(best_d, n_gen / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  h.cpu_decode_efficiency = best_d / plan->decode.tok_per_s;
  h.cpu_prefill_efficiency = best_p / plan->prefill.tok_per_s;
  line = strfmt("decode %.2f tok/s = %.2f of the kernel bound %.2f; prefill %d tokens %.1f tok/s = %.2f of %.1f (%s)",
                best_d, h.cpu_decode_efficiency, plan->decode.tok_per_s, n_prompt, best_p, h.cpu_prefill_efficiency,
                plan->prefill.tok_per_s, c.model_path.c_str());
  return {};
}

int run_calibrate(const CalibrateOptions& o) {
  auto config = resolve_config(o.common);
  if (!config) return fail(config.error().message);
  const Config& c = *config;
  auto disk_bytes = parse_size(o.disk_size);
  if (!disk_bytes) return fail("--disk-size: " + disk_bytes.error().message);
  if (c.threads > 0) cpu::set_compute_threads(c.threads);
  cpu::set_compute_pin(c.pin);
  cpu::ThreadPool& pool = cpu::compute_pool();

  Calibration cal;
  HardwareLimits& h = cal.limits;
  cal.date = today();
  cal.isa = std::string(cpu::isa_name());
  cal.threads = pool.size();
  h.cpu_name = cpu_model_name();
  h.ram_bytes = system_memory().total;
  auto step = [&](const char* what) {
    if (!o.json) std::fprintf(stderr, "strata calibrate: %s ...\n", what);
  };

  step("DRAM read bandwidth");
  h.dram_gbps = cpu::measure_read_gbps(pool);
  step("decode kernels over expert matrices (Q4_K, 512 MiB)");
  h.weights_gbps = cpu::measure_weights_gbps(pool);
  step("interleave of experts read from NVMe (Q4_K, or MXFP4 where the kernels keep Q4_K in the file layout; 512 MiB)");
  GgmlType repack_type = GgmlType::q4_k;
  h.repack_gbps = cpu::measure_interleave_gbps(pool, size_t(512) << 20, 0.6, &repack_type);
  step("prefill kernels (Q4_K GEMM, 64 rows)");
  h.cpu_int8_gops = cpu::measure_gemm_gops(pool);
  step("int8 and bf16 register peaks");
  const double int8_peak = cpu::measure_int8_peak_gops(pool);
  h.cpu_bf16_gflops = cpu::measure_bf16_peak_gflops(pool);

  const std::string path = o.out.empty() ? calibration_path() : o.out;
  std::string disk_line = "skipped (--no-disk)";
  if (o.no_disk) {
    auto old = read_calibration(path);  // keep the disk figure of an earlier run
    if (old && old->has_value() && (*old)->limits.nvme_gbps > 0) {
      h.nvme_gbps = (*old)->limits.nvme_gbps;
      h.nvme_4k_gbps = (*old)->limits.nvme_4k_gbps;
      disk_line += strfmt("; keeping %.2f GB/s from the run of %s", h.nvme_gbps, (*old)->date.c_str());
    }
  } else {
    storage::DiskProbeOptions d;
    d.path = o.disk;
    if (d.path.empty()) {
      const size_t slash = c.model_path.rfind('/');
      d.path = slash == std::string::npos ? "." : c.model_path.substr(0, slash);
    }
    d.file_bytes = size_t(*disk_bytes);
    d.queue_depth = c.queue_depth;
    step(("disk reads in " + d.path + " (queue depth " + std::to_string(d.queue_depth) + ")").c_str());
    auto r = storage::measure_disk_read(d);
    if (!r) return fail(r.error().message);
    disk_line = strfmt("%.2f GB/s, %s, %s blocks, queue depth %d, %s read from %s", r->gbps, r->method.c_str(),
                       format_size(r->block_bytes).c_str(), r->queue_depth, format_size(r->bytes_read).c_str(),
                       d.path.c_str());
    if (r->direct && !r->memory_backed) {
      h.nvme_gbps = r->gbps;
    } else {
      disk_line += " (not cached: the reads were not O_DIRECT from a disk, so they measure memory)";
    }
    // random 4 KiB reads at a deep queue: what Engram rows cost (deepseek41)
    d.block_bytes = 4096;
    d.queue_depth = 64;
    d.access = storage::DiskAccess::random;
    d.seconds = 2;
    step(("random 4 KiB disk reads in " + d.path + " (queue depth 64)").c_str());
    auto r4 = storage::measure_disk_read(d);
    if (!r4) return fail(r4.error().message);
    disk_line += strfmt("; random 4 KiB reads at queue depth 64: %.3f GB/s (%.0f reads/s)", r4->gbps, r4->gbps * 1e9 / 4096);
    if (r4->direct && !r4->memory_backed) h.nvme_4k_gbps = r4->gbps;
  }

  std::string engine_line = "not measured (give -m MODEL to measure the CPU forward pass on it)";
  if (o.common.model) {
    step(("the CPU forward pass on " + c.model_path).c_str());
    if (Status st = measure_engine(c, h, engine_line); !st) return fail(st.error().message);
  } else {
    // keep the efficiencies of an earlier run on a model
    auto old = read_calibration(o.out.empty() ? calibration_path() : o.out);
    if (old && old->has_value() && (*old)->limits.cpu_decode_efficiency > 0) {
      h.cpu_decode_efficiency = (*old)->limits.cpu_decode_efficiency;
      h.cpu_prefill_efficiency = (*old)->limits.cpu_prefill_efficiency;
      engine_line = strfmt("not measured; keeping decode %.2f, prefill %.2f of the kernel bound from the run of %s",
                           h.cpu_decode_efficiency, h.cpu_prefill_efficiency, (*old)->date.c_str());
    }
  }

  const GpuDevices gpus = list_gpu_devices();
  std::string pcie_line = gpus.devices.empty()
                              ? "no GPU (" + (gpus.error.empty() ? std::string("none found") : gpus.error) + ")"
                              : "not measured: the GPU tier (#7) has no copy probe yet";
  if (!gpus.devices.empty()) {
    h.gpu_name = gpus.devices[0].name;
    h.vram_bytes = gpus.devices[0].total_bytes;
  }

  if (Status s = write_calibration(path, cal); !s) return fail(s.error().message);

  if (o.json) {
    nlohmann::json j = {{"cache", path},
                        {"date", cal.date},
                        {"isa", cal.isa},
                        {"threads", cal.threads},
                        {"cpu", h.cpu_name},
                        {"ram_bytes", h.ram_bytes},
                        {"dram_gbps", h.dram_gbps},
                        {"weights_gbps", h.weights_gbps},
                        {"repack_gbps", h.repack_gbps},
                        {"cpu_int8_gops", h.cpu_int8_gops},
                        {"int8_peak_gops", int8_peak},
                        {"cpu_bf16_gflops", h.cpu_bf16_gflops},
                        {"bf16_method", std::string(cpu::bf16_peak_method())},
                        {"nvme_gbps", h.nvme_gbps},
                        {"nvme_4k_gbps", h.nvme_4k_gbps},
                        {"disk", disk_line},
                        {"pcie", pcie_line},
                        {"cpu_decode_efficiency", h.cpu_decode_efficiency},
                        {"cpu_prefill_efficiency", h.cpu_prefill_efficiency},
                        {"engine", engine_line}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("machine        %s, %d threads, %s kernels, %s RAM\n", h.cpu_name.c_str(), cal.threads, cal.isa.c_str(),
              format_size(h.ram_bytes).c_str());
  std::printf("DRAM read      %8.1f GB/s   (streaming read, all threads)\n", h.dram_gbps);
  std::printf("decode kernels %8.1f GB/s   (Q4_K matrix-vector over expert matrices: %.2f of DRAM)\n", h.weights_gbps,
              h.dram_gbps > 0 ? h.weights_gbps / h.dram_gbps : 0.0);
  if (h.repack_gbps > 0)
    std::printf("interleave     %8.1f GB/s   (%s experts as the NVMe tier reads them, into the tile kernels' layout%s)\n",
                h.repack_gbps, std::string(ggml_type_name(repack_type)).c_str(),
                repack_type == GgmlType::q4_k ? "" : "; these kernels read Q4_K in the file's layout");
  else
    std::printf("interleave            -        (these kernels read the file's layout: streamed experts are not interleaved)\n");
  std::printf("prefill GEMM   %8.0f GOP/s  (Q4_K x 64 rows: %.2f of the int8 peak)\n", h.cpu_int8_gops,
              int8_peak > 0 ? h.cpu_int8_gops / int8_peak : 0.0);
  std::printf("int8 peak      %8.0f GOP/s  (register-only loop)\n", int8_peak);
  std::printf("bf16 peak      %8.0f GFLOP/s (%s)\n", h.cpu_bf16_gflops, std::string(cpu::bf16_peak_method()).c_str());
  std::printf("disk read      %s\n", disk_line.c_str());
  std::printf("PCIe           %s\n", pcie_line.c_str());
  std::printf("forward pass   %s\n", engine_line.c_str());
  std::printf("cached in %s\n", path.c_str());
  return 0;
}

}  // namespace

Runner add_calibrate_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("calibrate", "measure DRAM, kernel, NVMe (and PCIe) limits of this machine and cache them");
  auto o = std::make_shared<CalibrateOptions>();
  add_common(sub, o->common);
  sub->add_option("--disk", o->disk, "file to read, or directory for a temporary test file (default: the model's directory)");
  sub->add_option("--disk-size", o->disk_size, "size of the temporary test file (default 1GiB)");
  sub->add_flag("--no-disk", o->no_disk, "skip the disk measurement");
  sub->add_option("-o,--out", o->out, "cache file (default: $STRATA_CALIBRATION or ~/.cache/strata/calibration.toml)");
  sub->add_flag("--json", o->json, "print the figures as JSON");
  return [o] { return run_calibrate(*o); };
}

}  // namespace strata::cli
