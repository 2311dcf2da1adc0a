// strata info MODEL.gguf: architecture, hyperparameters, tokenizer, tensors by role, bytes per
// routed expert and per decoded token. strata info --hw: the machine's NUMA nodes, cores and
// caches (or a stand-in's), and where the compute threads would go.
#include <cinttypes>
#include <cstdlib>
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cpu/numa.h"
#include "model/gguf.h"
#include "model/model_info.h"

namespace strata::cli {
namespace {

struct InfoOptions {
  std::string path;
  bool all_tensors = false;
  bool all_keys = false;
  bool hw = false;
  std::string topology;            // --topology (else STRATA_TOPOLOGY)
  std::string policy = "shard";    // --numa
  int threads = 0;
};

int run_hw(const InfoOptions& o) {
  cpu::NumaOptions no;
  no.topology = o.topology;
  if (no.topology.empty())
    if (const char* env = std::getenv("STRATA_TOPOLOGY"); env != nullptr) no.topology = env;
  auto fail = [](const Error& e) {
    std::fprintf(stderr, "strata info: %s\n", e.message.c_str());
    return 1;
  };
  if (auto r = cpu::parse_numa_policy(o.policy, no); !r) return fail(r.error());
  auto topo = cpu::Topology::load(no.topology);
  if (!topo) return fail(topo.error());
  std::printf("%s", topo->describe().c_str());
  auto l = cpu::NumaLayout::make(no, std::move(*topo), o.threads);
  if (!l) return fail(l.error());
  std::printf("threads     %d compute threads, %s\n", l->n_threads(), l->describe().c_str());
  for (int g = 0; g < l->n_groups(); ++g) {
    std::string cores;
    for (int t = 0; t < l->n_threads(); ++t)
      if (l->group_of_thread(t) == g) cores += strfmt("%s%d", cores.empty() ? "" : " ", l->core_of_thread(t));
    std::printf("group %-6d node %d, threads on cores %s\n", g, l->node_of_group(g), cores.c_str());
  }
  if (l->sharded() && l->rows(0, 768).second > l->rows(0, 768).first)
    std::printf("experts     each routed expert's rows split over the %d groups (of 768 rows, group 0 computes "
                "rows %" PRId64 "-%" PRId64 ", held in node %d's memory)\n",
                l->n_groups(), l->rows(0, 768).first, l->rows(0, 768).second - 1, l->node_of_group(0));
  return 0;
}

std::string params_string(uint64_t n) {
  if (n >= 1000000000ull) return strfmt("%.2f B", double(n) / 1e9);
  if (n >= 1000000ull) return strfmt("%.2f M", double(n) / 1e6);
  if (n >= 1000ull) return strfmt("%.1f K", double(n) / 1e3);
  return strfmt("%" PRIu64, n);
}

std::string types_string(const std::map<GgmlType, uint64_t>& m, bool counts) {
  std::string s;
  for (const auto& [type, v] : m) {
    if (!s.empty()) s += " ";
    s += std::string(ggml_type_name(type));
    if (m.size() > 1) s += counts ? strfmt("x%" PRIu64, v) : "";
  }
  return s;
}

void print_tokenizer(const GgufFile& f) {
  auto str = [&](const char* key) {
    const GgufValue* v = f.find(key);
    return v && v->type == GgufType::string ? v->str : std::string("-");
  };
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  const GgufValue* merges = f.find("tokenizer.ggml.merges");
  auto count = [](const GgufValue* v) { return v && v->type == GgufType::array ? v->elems.size() : 0; };
  auto token_text = [&](const char* key) -> std::string {
    const GgufValue* id = f.find(key);
    if (!id || !id->is_integer()) return "-";
    const uint64_t i = id->u ? id->u : uint64_t(id->i);
    if (tokens && tokens->type == GgufType::array && i < tokens->elems.size())
      return strfmt("%" PRIu64 " %s", i, tokens->elems[i].to_display_string(24).c_str());
    return strfmt("%" PRIu64 " (out of range)", i);
  };
  std::printf("tokenizer   %s, pre-tokenizer %s, %zu tokens, %zu merges\n",
              str("tokenizer.ggml.model").c_str(), str("tokenizer.ggml.pre").c_str(), count(tokens),
              count(merges));
  std::printf("            bos %s, eos %s", token_text("tokenizer.ggml.bos_token_id").c_str(),
              token_text("tokenizer.ggml.eos_token_id").c_str());
  if (const GgufValue* b = f.find("tokenizer.ggml.add_bos_token"))
    std::printf(", add_bos %s", b->to_display_string().c_str());
  const GgufValue* tmpl = f.find("tokenizer.chat_template");
  if (tmpl && tmpl->type == GgufType::string)
    std::printf(", chat template %zu chars\n", tmpl->str.size());
  else
    std::printf(", no chat template\n");
}

int run_info(const InfoOptions& o) {
  if (o.hw) return run_hw(o);
  if (o.path.empty()) {
    std::fprintf(stderr, "strata info: name a GGUF file, or --hw for the machine\n");
    return 1;
  }
  auto file = GgufFile::open(o.path);
  if (!file) {
    std::fprintf(stderr, "strata info: %s\n", file.error().message.c_str());
    return 1;
  }
  const GgufFile& f = *file;
  auto summary = summarize_model(f);
  if (!summary) {
    std::fprintf(stderr, "strata info: %s\n", summary.error().message.c_str());
    return 1;
  }
  const ModelSummary& s = *summary;

  std::printf("model       %s%s%s\n", s.arch.c_str(), s.name.empty() ? "" : ", ", s.name.c_str());
  std::printf("file        %s: GGUF v%u, %s, %zu metadata keys, %zu tensors, alignment %u\n",
              o.path.c_str(), f.version(), format_bytes(double(f.file_size())).c_str(),
              f.kvs().size(), f.tensors().size(), f.alignment());
  std::printf("parameters  %s in %s of tensor data\n", params_string(s.n_params).c_str(),
              format_bytes(double(s.n_bytes)).c_str());

  // hyperparameters: every key of the architecture's namespace, as stored
  std::printf("hparams\n");
  const std::string prefix = s.arch + ".";
  for (const GgufKv& kv : f.kvs()) {
    if (kv.key.rfind(prefix, 0) == 0)
      std::printf("  %-44s %s\n", kv.key.substr(prefix.size()).c_str(),
                  kv.value.to_display_string(60).c_str());
  }
  print_tokenizer(f);

  std::printf("\ntensors by role     tensors      params       bytes  types\n");
  for (int r = 0; r < kTensorRoleCount; ++r) {
    const RoleTotals& t = s.roles[r];
    if (t.n_tensors == 0) continue;
    std::printf("  %-16s %9" PRIu64 " %11s %11s  %s\n", tensor_role_name(TensorRole(r)).data(),
                t.n_tensors, params_string(t.n_params).c_str(), format_bytes(double(t.n_bytes)).c_str(),
                types_string(t.bytes_by_type, false).c_str());
  }

  std::printf("\ntensor table (layers folded into blk.*)\n");
  std::printf("  %-40s %-14s %5s  %-14s %-22s %10s\n", "name", "role", "count", "type", "shape (ne)",
              "bytes");
  for (int r = 0; r < kTensorRoleCount; ++r) {
    for (const TensorPattern& p : s.patterns) {
      if (int(p.role) != r) continue;
      std::printf("  %-40s %-14s %5" PRIu64 "  %-14s %-22s %10s\n", p.pattern.c_str(),
                  tensor_role_name(p.role).data(), p.n_tensors,
                  types_string(p.count_by_type, true).c_str(), p.shape.c_str(),
                  format_bytes(double(p.n_bytes)).c_str());
    }
  }

  if (o.all_tensors) {
    std::printf("\nall tensors\n");
    for (const GgufTensorInfo& t : f.tensors()) {
      std::printf("  %-44s %-7s %-22s %12" PRIu64 " bytes at +%" PRIu64 "\n", t.name.c_str(),
                  ggml_type_name(t.type).data(), t.shape_string().c_str(), t.n_bytes, t.offset);
    }
  }
  if (o.all_keys) {
    std::printf("\nall metadata\n");
    for (const GgufKv& kv : f.kvs())
      std::printf("  %-48s %s\n", kv.key.c_str(), kv.value.to_display_string(100).c_str());
  }

  std::printf("\n");
  if (s.n_expert > 0) {
    std::printf("experts     %" PRIu64 " MoE layers x %" PRIu64 " routed experts, %" PRIu64
                " used per token\n",
                s.n_moe_layers, s.n_expert, s.n_expert_used);
    if (s.expert_bytes_min == s.expert_bytes_max)
      std::printf("            one routed expert: %s\n", format_bytes(double(s.expert_bytes_min)).c_str());
    else
      std::printf("            one routed expert: %s to %s (types differ by layer)\n",
                  format_bytes(double(s.expert_bytes_min)).c_str(),
                  format_bytes(double(s.expert_bytes_max)).c_str());
    std::printf("            all routed experts: %s (%.1f%% of the file)\n",
                format_bytes(double(s.expert_bytes_total)).c_str(),
                100.0 * double(s.expert_bytes_total) / double(f.file_size()));
  } else {
    std::printf("experts     none (dense model)\n");
  }
  if (s.n_nextn_layers > 0)
    std::printf("mtp         %" PRIu64 " nextn layer(s), not read in decode\n", s.n_nextn_layers);
  std::printf("per token   a decode step reads %s (embedding row, all non-expert weights, %" PRIu64
              " experts per MoE layer)\n",
              format_bytes(double(s.active_bytes_per_token)).c_str(), s.n_expert_used);
  return 0;
}

}  // namespace

Runner add_info_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "info", "describe a GGUF model: architecture, tensors by role, bytes per decoded token");
  auto o = std::make_shared<InfoOptions>();
  sub->add_option("model", o->path, "GGUF file");
  sub->add_flag("--tensors", o->all_tensors, "also list every tensor with type, shape and offset");
  sub->add_flag("--kv", o->all_keys, "also list every metadata key");
  sub->add_flag("--hw", o->hw, "describe the machine instead: NUMA nodes, cores, caches, where compute threads go");
  sub->add_option("--topology", o->topology,
                  "with --hw: a stand-in machine, an hwloc synthetic description (\"pack:2 numa:1 core:8 pu:2\") or an "
                  "XML file (default: this machine, or STRATA_TOPOLOGY)");
  sub->add_option("--numa", o->policy, "with --hw: the NUMA policy to lay the threads out for (shard, interleave, node:N)");
  sub->add_option("-t,--threads", o->threads, "with --hw: compute threads (default: one per core)")->check(CLI::NonNegativeNumber);
  return [o] { return run_info(*o); };
}

}  // namespace strata::cli
