#include "engine/planner.h"

#include <algorithm>
#include <cmath>

#include "base/mapped_file.h"
#include "model/model.h"
#include "model/model_info.h"
#include "model/synth.h"

namespace strata {

uint64_t PlanModel::total_bytes() const {
  uint64_t t = embd_bytes + output_bytes + engram_bytes;
  for (const Layer& l : layers) t += l.fixed_bytes + l.expert_bytes * uint64_t(n_expert);
  return t;
}

uint64_t PlanModel::expert_bytes_total() const {
  uint64_t t = 0;
  for (const Layer& l : layers) t += l.expert_bytes * uint64_t(n_expert);
  return t;
}

Result<PlanModel> plan_model_from_gguf(const GgufFile& f, KvType kv) {
  auto s = summarize_model(f);
  if (!s) return s.error();
  auto hp = hparams_from_gguf(f);
  if (!hp) return hp.error();
  PlanModel m;
  m.name = s->name;
  m.arch = s->arch;
  m.n_embd = hp->n_embd;
  m.n_vocab = int(s->n_vocab);
  m.n_expert = int(s->n_expert);
  m.n_expert_used = int(s->n_expert_used);
  m.engram_rows_per_token = s->engram_rows_per_token;
  m.engram_row_bytes = s->engram_rows_per_token > 0 ? s->engram_bytes_per_token / s->engram_rows_per_token : 0;
  m.layers.resize(size_t(hp->n_layer));
  const uint64_t kv_layer = kv_bytes_per_token(*hp, kv) / uint64_t(std::max(hp->n_layer, 1));
  for (auto& l : m.layers) l.kv_bytes_per_token = kv_layer;
  for (const GgufTensorInfo& t : f.tensors()) {
    const TensorRole role = classify_tensor(t.name);
    const int layer = tensor_layer(t.name);
    if (role == TensorRole::embedding) {
      m.embd_bytes += t.n_bytes;
      continue;
    }
    if (role == TensorRole::output || (layer < 0 && role == TensorRole::norm)) {
      m.output_bytes += t.n_bytes;
      m.output_params += t.n_elements();
      continue;
    }
    if (layer < 0 || layer >= hp->n_layer) continue;  // MTP (nextn) layers: not run in decode
    if (role == TensorRole::engram) {
      m.engram_bytes += t.n_bytes;
      continue;
    }
    PlanModel::Layer& l = m.layers[size_t(layer)];
    if (role == TensorRole::routed_expert) {
      const uint64_t n_exp = std::max<uint64_t>(t.ne[2], 1);
      l.expert_bytes += t.n_bytes / n_exp;
      l.expert_params += t.n_elements() / n_exp;
    } else {
      l.fixed_bytes += t.n_bytes;
      l.fixed_params += t.n_elements();
    }
  }
  if (m.output_params == 0 || m.output_bytes == 0) {  // tied output head: the embedding matrix again
    m.output_bytes += m.embd_bytes;
    m.output_params += uint64_t(m.n_embd) * uint64_t(m.n_vocab);
  }
  return m;
}

Result<PlanModel> plan_model_for_shape(std::string_view shape_name, std::string_view quant_name, KvType kv) {
  const SynthShape* shape = find_synth_shape(shape_name);
  if (!shape) return Error{"unknown shape '" + std::string(shape_name) + "' (strata synth --list shows the shapes)"};
  auto quant = synth_quant_from_name(quant_name);
  if (!quant) return Error{"unknown quant mix '" + std::string(quant_name) + "' (q8_0, q4_k, mxfp4)"};
  auto sp = build_synth_plan(*shape, *quant, {});
  if (!sp) return sp.error();
  const std::vector<uint8_t> header = sp->writer.header_bytes();
  auto f = GgufFile::parse_header(header, sp->writer.file_size(), std::string(shape->name));
  if (!f) return f.error();
  return plan_model_from_gguf(*f, kv);  // copies what it needs: the header may go
}

namespace {

std::string gib(uint64_t b) { return format_size(b); }

Error missing(const Config& c, const char* key, const char* why) {
  return Error{"config " + c.source + ": " + key + " is unknown; " + why +
               " (run strata calibrate on this machine, or set it in the config's [hardware] table)"};
}

}  // namespace

Result<Plan> make_plan(const PlanModel& m, const Config& c, const HardwareLimits& hw, const PlanOptions& o) {
  Plan plan;
  Placement& p = plan.placement;
  const bool has_gpu = c.vram_budget > 0;
  // gpu.simulate: the simulated device holds routed experts only; the dense part stays on the CPU
  // (its bytes are booked in the arena, as GpuTier books them), no hidden state crosses PCIe
  const bool simulated = has_gpu && c.gpu_simulate;
  const int L = int(m.layers.size());
  const int64_t ctx = std::max<int64_t>(o.ctx, 1);

  // ---- limits the prediction needs ----
  double ram_gbps = hw.weights_gbps;
  if (ram_gbps <= 0 && hw.dram_gbps > 0) {
    ram_gbps = 0.85 * hw.dram_gbps;
    plan.notes.push_back(strfmt("hardware.weights_gbps unknown: decode kernels assumed to reach 0.85 of DRAM (%.1f GB/s)", ram_gbps));
  }
  if (ram_gbps <= 0) return missing(c, "hardware.dram_gbps", "decode speed depends on it");
  if (hw.cpu_int8_gops <= 0) return missing(c, "hardware.cpu_int8_gops", "prefill speed depends on it");
  if (has_gpu) {
    if (hw.gpu_gbps <= 0) return missing(c, "hardware.gpu_gbps", "budgets.vram asks for a GPU tier");
    if (hw.gpu_tflops <= 0) return missing(c, "hardware.gpu_tflops", "budgets.vram asks for a GPU tier");
    if (hw.pcie_h2d_gbps <= 0) return missing(c, "hardware.pcie_h2d_gbps", "budgets.vram asks for a GPU tier");
    if (hw.vram_bytes > 0 && c.vram_budget > hw.vram_bytes) {
      return Error{"config " + c.source + ": budgets.vram is " + gib(c.vram_budget) + " but the GPU has " + gib(hw.vram_bytes)};
    }
  }
  uint64_t ram_budget = 0;
  if (c.ram_budget) {
    ram_budget = *c.ram_budget;
    if (hw.ram_bytes > 0 && ram_budget > hw.ram_bytes) {
      return Error{"config " + c.source + ": budgets.ram is " + gib(ram_budget) + " but the machine has " + gib(hw.ram_bytes)};
    }
  } else if (hw.ram_bytes > 0) {
    ram_budget = hw.ram_bytes / 10 * 9;
    plan.notes.push_back("budgets.ram is auto: planned with 90% of hardware.ram (" + gib(ram_budget) + ")");
  } else {
    return missing(c, "hardware.ram", "budgets.ram is auto");
  }

  // ---- VRAM: scratch, the output head, then whole layers' fixed parts with their KV cache ----
  uint64_t vram_left = 0;
  if (has_gpu) {
    if (c.vram_budget <= o.vram_scratch) {
      return Error{"config " + c.source + ": budgets.vram is " + gib(c.vram_budget) + ", not more than the " +
                   gib(o.vram_scratch) + " of GPU work buffers"};
    }
    p.vram_scratch = o.vram_scratch;
    vram_left = c.vram_budget - o.vram_scratch;
    if (simulated) {
      uint64_t booked = m.embd_bytes + m.output_bytes;
      for (const PlanModel::Layer& l : m.layers) booked += l.fixed_bytes + l.kv_bytes_per_token * uint64_t(ctx);
      vram_left -= std::min(vram_left, booked);
      plan.notes.push_back("gpu.simulate: the simulated device holds routed experts only (the dense part runs on the CPU)");
    }
    if (!simulated && m.output_bytes <= vram_left) {
      p.output_on_gpu = true;
      p.vram_fixed += m.output_bytes;
      vram_left -= m.output_bytes;
    }
    for (const PlanModel::Layer& l : m.layers) {
      const uint64_t need = l.fixed_bytes + l.kv_bytes_per_token * uint64_t(ctx);
      if (simulated || need > vram_left) break;
      vram_left -= need;
      p.vram_fixed += l.fixed_bytes;
      p.vram_kv += l.kv_bytes_per_token * uint64_t(ctx);
      ++p.gpu_layers;
    }
    if (p.gpu_layers < L && !simulated) {
      plan.notes.push_back(strfmt("budgets.vram holds the attention and dense weights of %d of %d layers; the rest run on the CPU",
                                  p.gpu_layers, L));
    }
  }

  // ---- RAM: embeddings and the CPU layers' fixed parts must fit ----
  p.ram_fixed = m.embd_bytes + (p.output_on_gpu ? 0 : m.output_bytes);
  for (int i = p.gpu_layers; i < L; ++i) {
    p.ram_fixed += m.layers[size_t(i)].fixed_bytes;
    p.ram_kv += m.layers[size_t(i)].kv_bytes_per_token * uint64_t(ctx);
  }
  if (p.ram_fixed + p.ram_kv > ram_budget) {
    return Error{"config " + c.source + ": budgets.ram is " + gib(ram_budget) + ", less than the CPU-side fixed part: " +
                 gib(p.ram_fixed) + " of weights every token reads + " + gib(p.ram_kv) + " of KV cache (" +
                 std::to_string(ctx) + " positions)"};
  }
  uint64_t ram_left = ram_budget - p.ram_fixed - p.ram_kv;
  const uint64_t experts_bytes = m.expert_bytes_total();

  // ---- Engram tables: in RAM when everything fits, else on NVMe with a row cache (as the engine
  // decides: config.h check_budgets) ----
  if (m.engram_bytes > 0) {
    const uint64_t vram_experts = std::min<uint64_t>(vram_left, experts_bytes);
    if (c.engram_tables == "ram" || m.engram_bytes + experts_bytes - vram_experts <= ram_left) {
      if (m.engram_bytes > ram_left)
        return Error{"config " + c.source + ": storage.engram_tables = \"ram\" but budgets.ram leaves " + gib(ram_left) +
                     " for the " + gib(m.engram_bytes) + " of Engram tables"};
      p.ram_engram = m.engram_bytes;
      ram_left -= m.engram_bytes;
    } else {
      p.engram_cache = std::min(c.engram_cache > 0 ? c.engram_cache : ram_left / 8, m.engram_bytes);
      ram_left -= std::min(ram_left, p.engram_cache);
      p.nvme_engram = m.engram_bytes;
      plan.engram_hit = double(p.engram_cache) / double(m.engram_bytes);
      plan.notes.push_back(strfmt("Engram tables on NVMe with a %s row cache: rows assumed uniform (%.1f%% found in RAM; "
                                  "real n-grams recur, so more)", gib(p.engram_cache).c_str(), 100 * plan.engram_hit));
      if (hw.nvme_4k_gbps <= 0 && hw.nvme_gbps <= 0)
        return missing(c, "hardware.nvme_4k_gbps", "the Engram tables must be read row by row from NVMe");
      if (hw.nvme_4k_gbps <= 0)
        plan.notes.push_back("hardware.nvme_4k_gbps unknown: random 4 KiB reads assumed at a quarter of hardware.nvme_gbps");
    }
  }
  const double nvme_4k = hw.nvme_4k_gbps > 0 ? hw.nvme_4k_gbps : hw.nvme_gbps / 4;
  // a missed row costs its 4 KiB block
  const double engram_miss_bytes = double(m.engram_rows_per_token) * (1.0 - plan.engram_hit) * 4096.0;

  // ---- routed experts: VRAM, then RAM, then NVMe, the same share of every layer ----
  p.experts_total = int64_t(m.n_expert) * int64_t(std::count_if(m.layers.begin(), m.layers.end(),
                                                                [](const PlanModel::Layer& l) { return l.expert_bytes > 0; }));
  double v = 0, r = 0;
  if (experts_bytes > 0) {
    v = std::min(1.0, double(vram_left) / double(experts_bytes));
    r = std::min(1.0 - v, double(ram_left) / double(experts_bytes));
  }
  const double miss = std::max(0.0, 1.0 - v - r);
  const double total = double(p.experts_total);
  p.experts_in_vram = int64_t(std::floor(v * total + 1e-9));
  p.experts_on_nvme = std::min<int64_t>(p.experts_total - p.experts_in_vram, int64_t(std::ceil(miss * total - 1e-9)));
  p.experts_in_ram = p.experts_total - p.experts_in_vram - p.experts_on_nvme;
  p.vram_experts = uint64_t(v * double(experts_bytes));
  p.ram_experts = uint64_t(r * double(experts_bytes));
  p.nvme_experts = experts_bytes - p.vram_experts - p.ram_experts;
  // decode: the share of expert uses each tier serves
  double hv = v, hr = r;
  if (o.hit_vram && o.hit_ram) {
    hv = std::clamp(*o.hit_vram, 0.0, 1.0);
    hr = std::clamp(*o.hit_ram, 0.0, 1.0 - hv);
  }
  const double hm = std::max(0.0, 1.0 - hv - hr);
  plan.hit_vram = hv;
  plan.hit_ram = hr;
  plan.miss_nvme = hm;
  if (experts_bytes > 0 && (miss > 0 || hm > 0)) {
    if (hw.nvme_gbps <= 0) return missing(c, "hardware.nvme_gbps", "part of the routed experts must stream from NVMe");
    if (!o.hit_vram)
      plan.notes.push_back("routing assumed uniform: each tier serves the share of experts it holds (real routing is "
                           "skewed, so the caches hit more: measure with strata replay)");
  }

  // ---- decode, one token at context position prompt_tokens ----
  const int k = m.n_expert_used;
  const double pos = double(std::min<int64_t>(o.prompt_tokens, ctx));
  double gpu_fixed = 0, cpu_fixed = double(m.embd_bytes) / std::max(m.n_vocab, 1);  // one embedding row
  (p.output_on_gpu ? gpu_fixed : cpu_fixed) += double(m.output_bytes);
  double expert_use = 0;  // bytes of routed experts one token uses
  int moe_layers = 0;
  for (int i = 0; i < L; ++i) {
    const PlanModel::Layer& l = m.layers[size_t(i)];
    const double fixed = double(l.fixed_bytes) + double(l.kv_bytes_per_token) * pos;
    (i < p.gpu_layers ? gpu_fixed : cpu_fixed) += fixed;
    expert_use += double(k) * double(l.expert_bytes);
    if (l.expert_bytes > 0) ++moe_layers;
  }
  StepTime& d = plan.decode;
  const double gpu_exp = expert_use * hv, ram_exp = expert_use * hr, nvme_exp = expert_use * hm;
  const double gpu_launches = has_gpu ? double(k) * double(moe_layers) * hv * o.expert_launch_us * 1e-6 : 0.0;
  const double t_gpu = (gpu_fixed + gpu_exp) / (hw.gpu_gbps > 0 ? hw.gpu_gbps * 1e9 : 1.0) + gpu_launches;
  // the CPU forward pass reaches a measured share of the kernels' speed (1: the kernel bound)
  const double eff_d = hw.cpu_decode_efficiency > 0 ? std::min(hw.cpu_decode_efficiency, 1.0) : 1.0;
  const double eff_p = hw.cpu_prefill_efficiency > 0 ? std::min(hw.cpu_prefill_efficiency, 1.0) : 1.0;
  if (hw.cpu_decode_efficiency <= 0 || hw.cpu_prefill_efficiency <= 0)
    plan.notes.push_back("CPU times are the kernel-bound upper bound: hardware.cpu_decode_efficiency / "
                         "cpu_prefill_efficiency unknown (strata calibrate -m MODEL measures them)");
  const double t_cpu_fixed = cpu_fixed / (ram_gbps * 1e9) / eff_d;
  // NVMe experts are computed from RAM once read, after the CPU threads interleave them for the
  // kernels (cpu.repack, where the kernels have such a layout: hardware.repack_gbps > 0)
  const double repack_s_per_byte = c.repack && hw.repack_gbps > 0 ? 1.0 / (hw.repack_gbps * 1e9) : 0.0;
  if (c.repack && hw.repack_gbps <= 0 && experts_bytes > 0 && (miss > 0 || hm > 0))
    plan.notes.push_back("hardware.repack_gbps unknown: the CPU's interleave of each expert read from NVMe is not "
                         "counted (strata calibrate measures it; 0 where the kernels read the file's layout)");
  const double t_cpu_exp = (ram_exp + nvme_exp) / (ram_gbps * 1e9) / eff_d + nvme_exp * repack_s_per_byte;
  // the Engram rows share the disk; their reads are submitted before layer 0, so they overlap compute
  const double t_nvme = (nvme_exp > 0 ? nvme_exp / (hw.nvme_gbps * 1e9) : 0.0) +
                        (engram_miss_bytes > 0 ? engram_miss_bytes / (nvme_4k * 1e9) : 0.0);
  // hand-overs of the hidden state: around every MoE layer whose experts are split between GPU and
  // CPU, and at the boundary between GPU and CPU layers
  int handovers = 0;
  if (has_gpu && !simulated) {
    if (hv < 1.0 && p.gpu_layers > 0) handovers += 2 * std::min(moe_layers, p.gpu_layers);
    if (p.gpu_layers < L && p.gpu_layers > 0) handovers += 2;
    if (!p.output_on_gpu && p.gpu_layers == L) handovers += 1;
  }
  const double handover_bytes = double(m.n_embd) * 4.0;
  const double t_handover = has_gpu ? handovers * (o.handover_us * 1e-6 + handover_bytes / (hw.pcie_h2d_gbps * 1e9)) : 0.0;
  // promotions into the VRAM cache: on the copy stream, beside compute (they never stall it)
  double promotions = 0;
  if (has_gpu && experts_bytes > 0) {
    if (o.promotions_per_token) {
      promotions = std::max(0.0, *o.promotions_per_token);
    } else if (v < 1.0) {
      promotions = double(c.gpu_max_promotions);
      if (promotions > 0)
        plan.notes.push_back(strfmt("gpu.max_promotions = %d experts promoted into VRAM every step (measured rates: strata profile)",
                                    c.gpu_max_promotions));
    }
  }
  const double promoted_bytes = moe_layers > 0 ? promotions * expert_use / double(std::max(k, 1)) / double(moe_layers) : 0.0;
  const double t_promote = promoted_bytes > 0 ? promoted_bytes / (hw.pcie_h2d_gbps * 1e9) : 0.0;
  // the GPU's and the CPU's experts of a layer run side by side
  const double gpu_fixed_t = gpu_fixed / (hw.gpu_gbps > 0 ? hw.gpu_gbps * 1e9 : 1.0);
  const double compute =
      std::max(gpu_fixed_t + t_cpu_fixed + std::max(t_gpu - gpu_fixed_t, t_cpu_exp) + t_handover, t_promote);
  d.total_s = c.prefetch_depth > 0 ? std::max(compute, t_nvme) : compute + t_nvme;
  d.cpu_s = t_cpu_fixed + t_cpu_exp;
  d.gpu_s = has_gpu ? t_gpu : 0.0;
  d.pcie_s = t_handover + t_promote;
  d.nvme_s = t_nvme;
  d.tok_per_s = d.total_s > 0 ? 1.0 / d.total_s : 0.0;
  d.ram_bytes = uint64_t(cpu_fixed + ram_exp + nvme_exp);
  d.vram_bytes = uint64_t(gpu_fixed + gpu_exp);
  d.pcie_bytes = uint64_t(handovers * handover_bytes + promoted_bytes);
  d.nvme_bytes = uint64_t(nvme_exp + engram_miss_bytes);
  if (c.prefetch_depth > 0 && t_nvme > 0)
    plan.notes.push_back(strfmt("storage.prefetch_depth = %d: NVMe reads counted as overlapped with compute (a perfect predictor)", c.prefetch_depth));

  // ---- prefill of prompt_tokens in one batch ----
  StepTime& pf = plan.prefill;
  const double n = std::max(o.prompt_tokens, 1);
  const double f_cpu = hw.cpu_int8_gops * 1e9 * eff_p;  // what the CPU forward pass reaches
  const double cpu_bw = ram_gbps * 1e9 * eff_p;
  const double f_gpu = has_gpu ? hw.gpu_tflops * 1e12 : 0.0;
  double t_pf_gpu = 0, t_pf_cpu = 0, t_pf_pcie = 0, t_pf_nvme = 0;
  double pf_pcie_bytes = 0, pf_nvme_bytes = 0;
  const double out_ops = 2.0 * double(m.output_params);  // the last token only
  (p.output_on_gpu ? t_pf_gpu : t_pf_cpu) += out_ops / (p.output_on_gpu ? f_gpu : f_cpu);
  const double E = std::max(m.n_expert, 1);
  const double touched = m.n_expert > 0 ? 1.0 - std::pow(1.0 - double(k) / E, n) : 0.0;  // share of experts with a token
  const double tok_per_expert = touched > 0 ? n * double(k) / E / touched : 0.0;
  for (int i = 0; i < L; ++i) {
    const PlanModel::Layer& l = m.layers[size_t(i)];
    const double fixed_ops = 2.0 * double(l.fixed_params) * n;
    if (i < p.gpu_layers) {
      t_pf_gpu += std::max(fixed_ops / f_gpu, double(l.fixed_bytes) / (hw.gpu_gbps * 1e9));
    } else {
      t_pf_cpu += std::max(fixed_ops / f_cpu, double(l.fixed_bytes) / cpu_bw);
    }
    if (l.expert_bytes == 0) continue;
    const double used = E * touched;  // experts of this layer with at least one token
    const double S = double(l.expert_bytes), ops = 2.0 * double(l.expert_params) * tok_per_expert;
    t_pf_gpu += used * v * ops / (f_gpu > 0 ? f_gpu : 1.0);
    // experts outside VRAM: on the CPU where they lie, or shipped to the GPU when that is faster
    const double cpu_t = std::max(S / cpu_bw, ops / f_cpu);
    const double ship_t = has_gpu ? S / (hw.pcie_h2d_gbps * 1e9) : 1e30;
    const double ship_gpu_t = has_gpu ? ops / f_gpu : 0.0;
    const double host_experts = used * (r + miss);
    if (ship_t + ship_gpu_t < cpu_t) {
      t_pf_pcie += host_experts * ship_t;
      t_pf_gpu += host_experts * ship_gpu_t;
      pf_pcie_bytes += host_experts * S;
    } else {
      t_pf_cpu += host_experts * cpu_t;
    }
    if (miss > 0) {
      t_pf_cpu += used * miss * S * repack_s_per_byte;
      t_pf_nvme += used * miss * S / (hw.nvme_gbps * 1e9);
      pf_nvme_bytes += used * miss * S;
    }
  }
  // a prompt's Engram rows are read in one sorted batch before the first layer
  if (engram_miss_bytes > 0) {
    t_pf_nvme += n * engram_miss_bytes / (nvme_4k * 1e9);
    pf_nvme_bytes += n * engram_miss_bytes;
  }
  const double pf_compute = std::max(t_pf_cpu, t_pf_gpu + t_pf_pcie);
  pf.total_s = c.prefetch_depth > 0 ? std::max(pf_compute, t_pf_nvme) : pf_compute + t_pf_nvme;
  pf.cpu_s = t_pf_cpu;
  pf.gpu_s = t_pf_gpu;
  pf.pcie_s = t_pf_pcie;
  pf.nvme_s = t_pf_nvme;
  pf.tok_per_s = pf.total_s > 0 ? n / pf.total_s : 0.0;
  pf.pcie_bytes = uint64_t(pf_pcie_bytes);
  pf.nvme_bytes = uint64_t(pf_nvme_bytes);
  return plan;
}

}  // namespace strata
