#include "engine/config.h"

#include <toml++/toml.h>

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

namespace strata {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string describe(const toml::node& n) {
  std::ostringstream os;
  if (n.is_string()) {
    os << '"' << n.as_string()->get() << '"';
  } else if (n.is_table()) {
    os << "a table";
  } else if (n.is_array()) {
    os << "an array";
  } else {
    n.visit([&](const auto& v) { os << v; });
  }
  return os.str();
}

// One accepted key: how to read it into a Config.
struct KeySpec {
  std::string_view table;
  std::string_view key;
  std::string_view what;
  // Reads the node into the config; an Error message (without the key's name) on a bad value.
  std::function<std::optional<std::string>(const toml::node&, Config&)> read;
};

std::optional<std::string> read_int(const toml::node& n, int lo, int hi, int& out) {
  // value<int64_t>() of a float node converts it, undefined beyond int64's range (fuzz_config)
  const auto v = n.is_integer() ? n.value<int64_t>() : std::nullopt;
  if (!v || *v < lo || *v > hi)
    return "must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " + describe(n);
  out = int(*v);
  return std::nullopt;
}

std::optional<std::string> read_bool(const toml::node& n, bool& out) {
  if (!n.is_boolean()) return "must be true or false, got " + describe(n);
  out = *n.value<bool>();
  return std::nullopt;
}

std::optional<std::string> read_number(const toml::node& n, double& out) {
  const auto v = n.value<double>();
  if (!(n.is_integer() || n.is_floating_point()) || !v || !std::isfinite(*v) || *v < 0)
    return "must be a number >= 0, got " + describe(n);
  out = *v;
  return std::nullopt;
}

std::optional<std::string> read_size(const toml::node& n, uint64_t& out) {
  if (n.is_integer()) {
    const int64_t v = *n.value<int64_t>();
    if (v < 0) return "must be a size >= 0, got " + describe(n);
    out = uint64_t(v);
    return std::nullopt;
  }
  if (n.is_string()) {
    auto s = parse_size(n.as_string()->get());
    if (!s) return s.error().message;
    out = *s;
    return std::nullopt;
  }
  return "must be a size such as \"22GiB\" or a byte count, got " + describe(n);
}

std::optional<std::string> read_string(const toml::node& n, std::string& out) {
  if (!n.is_string()) return "must be a string, got " + describe(n);
  out = n.as_string()->get();
  return std::nullopt;
}

std::optional<std::string> read_choice(const toml::node& n, std::initializer_list<std::string_view> choices,
                                       std::string& out) {
  std::string list;
  for (std::string_view c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
  if (!n.is_string()) return "must be one of " + list + ", got " + describe(n);
  const std::string v = lower(n.as_string()->get());
  for (std::string_view c : choices) {
    if (v == c) {
      out = v;
      return std::nullopt;
    }
  }
  return "must be one of " + list + ", got " + describe(n);
}

#define NUMBER_KEY(name, field, what)                                                                  \
  KeySpec {                                                                                            \
    "hardware", name, what, [](const toml::node& n, Config& c) { return read_number(n, c.hardware.field); } \
  }

const std::vector<KeySpec>& key_specs() {
  static const std::vector<KeySpec> specs = {
      {"model", "path", "GGUF file to run (the -m flag overrides it; empty: the bundled model)",
       [](const toml::node& n, Config& c) { return read_string(n, c.model_path); }},
      {"model", "ctx", "context length cap in tokens (0: the model's training context)",
       [](const toml::node& n, Config& c) { return read_int(n, 0, 1 << 24, c.ctx); }},
      {"model", "load", "how weights come into memory: auto, ram (read into huge pages) or mmap",
       [](const toml::node& n, Config& c) -> std::optional<std::string> {
         std::string v;
         if (auto e = read_choice(n, {"auto", "ram", "mmap"}, v)) return e;
         c.load = v == "ram" ? MappedFile::Mode::ram : v == "mmap" ? MappedFile::Mode::mmap : MappedFile::Mode::automatic;
         return std::nullopt;
       }},
      {"model", "kv_type",
       "KV cache entries: f16 (default: half the memory and bytes per token of f32), q8_0 (about half of f16's; "
       "heads of dims that are multiples of 32, else f16) or f32",
       [](const toml::node& n, Config& c) -> std::optional<std::string> {
         std::string v;
         if (auto e = read_choice(n, {"f16", "q8_0", "f32"}, v)) return e;
         c.kv_type = v == "f32" ? KvType::f32 : v == "q8_0" ? KvType::q8_0 : KvType::f16;
         return std::nullopt;
       }},
      {"budgets", "ram", "host memory for weights, KV cache and expert cache (a size, or \"auto\")",
       [](const toml::node& n, Config& c) -> std::optional<std::string> {
         if (n.is_string() && lower(n.as_string()->get()) == "auto") {
           c.ram_budget.reset();
           return std::nullopt;
         }
         uint64_t v = 0;
         if (auto e = read_size(n, v)) return e;
         if (v == 0) return std::string("must be more than 0 (or \"auto\")");
         c.ram_budget = v;
         return std::nullopt;
       }},
      {"budgets", "vram", "GPU memory strata may use (0: no GPU tier)",
       [](const toml::node& n, Config& c) { return read_size(n, c.vram_budget); }},
      {"gpu", "simulate", "run the GPU tier's expert cache on the simulated device (host memory under budgets.vram)",
       [](const toml::node& n, Config& c) { return read_bool(n, c.gpu_simulate); }},
      {"gpu", "max_promotions", "hot experts copied into the VRAM cache per decode step at most (PCIe it may take)",
       [](const toml::node& n, Config& c) { return read_int(n, 0, 4096, c.gpu_max_promotions); }},
      {"gpu", "heat_file", "routing statistics: read at start to fill the VRAM cache at once, written at exit (\"\": none)",
       [](const toml::node& n, Config& c) { return read_string(n, c.gpu_heat_file); }},
      {"cpu", "threads", "compute threads (0: one per physical core)",
       [](const toml::node& n, Config& c) { return read_int(n, 0, 4096, c.threads); }},
      {"cpu", "pin", "pin compute threads to cores (hwloc)",
       [](const toml::node& n, Config& c) { return read_bool(n, c.pin); }},
      {"cpu", "repack", "rewrite weights read into RAM into the kernels' faster layouts",
       [](const toml::node& n, Config& c) { return read_bool(n, c.repack); }},
      {"numa", "policy", "where routed experts and compute threads go: shard, interleave or node:N (docs/numa.md)",
       [](const toml::node& n, Config& c) -> std::optional<std::string> {
         std::string v;
         if (auto e = read_string(n, v)) return e;
         if (auto r = cpu::parse_numa_policy(v, c.numa); !r) return r.error().message;
         return std::nullopt;
       }},
      {"numa", "topology", "plan on a stand-in topology: an hwloc synthetic description or XML file (\"\": this machine)",
       [](const toml::node& n, Config& c) { return read_string(n, c.numa.topology); }},
      {"storage", "queue_depth", "NVMe reads in flight (io_uring queue depth)",
       [](const toml::node& n, Config& c) { return read_int(n, 1, 4096, c.queue_depth); }},
      {"storage", "prefetch_depth", "layers of routing look-ahead for NVMe prefetch (0: none)",
       [](const toml::node& n, Config& c) { return read_int(n, 0, 16, c.prefetch_depth); }},
      {"storage", "cache_policy", "routed-expert cache policy: lru, lfu or layer-lru",
       [](const toml::node& n, Config& c) { return read_choice(n, {"lru", "lfu", "layer-lru"}, c.cache_policy); }},
      {"storage", "engram_cache", "RAM for deepseek41's Engram row cache when its tables are streamed (0: auto)",
       [](const toml::node& n, Config& c) { return read_size(n, c.engram_cache); }},
      {"storage", "engram_tables", "deepseek41's Engram tables when the model is streamed: stream (row by row) or ram",
       [](const toml::node& n, Config& c) { return read_choice(n, {"stream", "ram"}, c.engram_tables); }},
      {"server", "host", "address strata serve listens on (loopback by default)",
       [](const toml::node& n, Config& c) { return read_string(n, c.host); }},
      {"server", "port", "port of strata serve",
       [](const toml::node& n, Config& c) { return read_int(n, 0, 65535, c.port); }},
      {"server", "max_sequences", "sequences decoded together in one batched forward pass",
       [](const toml::node& n, Config& c) { return read_int(n, 1, 256, c.max_sequences); }},
      {"server", "max_queue", "requests waiting for a sequence slot before new ones are refused (429)",
       [](const toml::node& n, Config& c) { return read_int(n, 0, 100000, c.max_queue); }},
      {"server", "cache_prompt", "reuse the longest common token prefix a free slot holds (prompt cache)",
       [](const toml::node& n, Config& c) { return read_bool(n, c.cache_prompt); }},
      {"server", "prefill_chunk", "prompt tokens evaluated per step beside the other sequences' decodes (0: all at once)",
       [](const toml::node& n, Config& c) { return read_int(n, 0, 1 << 20, c.prefill_chunk); }},
      {"server", "max_body", "largest request body accepted (413 above)",
       [](const toml::node& n, Config& c) { return read_size(n, c.max_body); }},
      {"server", "api_key", "require Authorization: Bearer KEY (empty: no key)",
       [](const toml::node& n, Config& c) { return read_string(n, c.api_key); }},
      NUMBER_KEY("dram_gbps", dram_gbps, "RAM streaming read bandwidth of the compute threads, GB/s"),
      NUMBER_KEY("weights_gbps", weights_gbps, "GB/s the decode kernels reach reading expert weights from RAM"),
      NUMBER_KEY("nvme_gbps", nvme_gbps, "NVMe read bandwidth (O_DIRECT, queue depth as configured), GB/s"),
      NUMBER_KEY("nvme_4k_gbps", nvme_4k_gbps, "NVMe random 4 KiB reads (O_DIRECT, queue depth 64: Engram rows), GB/s"),
      NUMBER_KEY("repack_gbps", repack_gbps, "GB/s of experts read from NVMe that the CPU threads interleave into the kernels' layout"),
      NUMBER_KEY("pcie_h2d_gbps", pcie_h2d_gbps, "host-to-GPU copy bandwidth from pinned memory, GB/s"),
      NUMBER_KEY("pcie_d2h_gbps", pcie_d2h_gbps, "GPU-to-host copy bandwidth, GB/s"),
      NUMBER_KEY("cpu_int8_gops", cpu_int8_gops, "int8 GOP/s the prefill kernels reach on quantized weights (2 ops per multiply-add)"),
      NUMBER_KEY("cpu_bf16_gflops", cpu_bf16_gflops, "CPU bf16 (or f32 FMA) peak, GFLOP/s"),
      NUMBER_KEY("gpu_gbps", gpu_gbps, "GPU memory read bandwidth, GB/s"),
      NUMBER_KEY("gpu_tflops", gpu_tflops, "GPU throughput on quantized weights, TFLOP/s"),
      NUMBER_KEY("cpu_decode_efficiency", cpu_decode_efficiency, "measured CPU decode speed / the kernel-bound prediction (0..1)"),
      NUMBER_KEY("cpu_prefill_efficiency", cpu_prefill_efficiency, "measured CPU prefill speed / the kernel-bound prediction (0..1)"),
      {"hardware", "ram", "installed RAM of the machine",
       [](const toml::node& n, Config& c) { return read_size(n, c.hardware.ram_bytes); }},
      {"hardware", "vram", "memory of the GPU (0: none)",
       [](const toml::node& n, Config& c) { return read_size(n, c.hardware.vram_bytes); }},
      {"hardware", "cpu", "CPU name (informative)",
       [](const toml::node& n, Config& c) { return read_string(n, c.hardware.cpu_name); }},
      {"hardware", "gpu", "GPU name (informative)",
       [](const toml::node& n, Config& c) { return read_string(n, c.hardware.gpu_name); }},
  };
  return specs;
}
#undef NUMBER_KEY

std::string keys_of(std::string_view table) {
  std::string list;
  for (const KeySpec& k : key_specs())
    if (k.table == table) list += (list.empty() ? "" : ", ") + std::string(k.key);
  return list;
}

std::string tables() {
  std::string list;
  for (const KeySpec& k : key_specs())
    if (list.find(std::string(k.table)) == std::string::npos) list += (list.empty() ? "" : ", ") + std::string(k.table);
  return list;
}

// Sets `key` (dotted) of `root` to the value of `text` parsed as TOML; a bare word is a string.
Status apply_override(toml::table& root, const ConfigOverride& o) {
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + o.value);
  } catch (const toml::parse_error&) {
    parsed.insert_or_assign("v", o.value);
  }
  toml::table* t = &root;
  std::string_view rest = o.key;
  for (size_t dot; (dot = rest.find('.')) != std::string_view::npos; rest.remove_prefix(dot + 1)) {
    const std::string part(rest.substr(0, dot));
    toml::node* n = t->get(part);
    if (!n) {
      t->insert_or_assign(part, toml::table{});
      n = t->get(part);
    }
    if (!n->is_table()) return Error{"--set " + o.key + ": '" + part + "' is not a table"};
    t = n->as_table();
  }
  t->insert_or_assign(std::string(rest), *parsed.get("v"));
  return {};
}

Result<Config> from_table(const toml::table& root, const std::string& name) {
  Config c;
  c.source = name;
  const std::string where = "config " + name + ": ";
  for (const auto& [tkey, tnode] : root) {
    const std::string table(tkey.str());
    if (!tnode.is_table()) {
      return Error{where + "'" + table + "' must be a table ([" + table + "]); the tables are " + tables()};
    }
    if (keys_of(table).empty()) {
      return Error{where + "unknown table [" + table + "] (known: " + tables() + ")"};
    }
    for (const auto& [kkey, knode] : *tnode.as_table()) {
      const std::string key(kkey.str());
      const KeySpec* spec = nullptr;
      for (const KeySpec& k : key_specs())
        if (k.table == table && k.key == key) spec = &k;
      if (!spec) {
        return Error{where + "unknown key '" + table + "." + key + "' ([" + table + "] has: " + keys_of(table) + ")"};
      }
      if (auto e = spec->read(knode, c)) return Error{where + table + "." + key + " " + *e};
    }
  }
  return c;
}

}  // namespace

void fill_unknown(HardwareLimits& into, const HardwareLimits& from) {
  auto fill = [](auto& a, const auto& b) {
    if (a == 0) a = b;
  };
  fill(into.dram_gbps, from.dram_gbps);
  fill(into.weights_gbps, from.weights_gbps);
  fill(into.nvme_gbps, from.nvme_gbps);
  fill(into.nvme_4k_gbps, from.nvme_4k_gbps);
  fill(into.repack_gbps, from.repack_gbps);
  fill(into.pcie_h2d_gbps, from.pcie_h2d_gbps);
  fill(into.pcie_d2h_gbps, from.pcie_d2h_gbps);
  fill(into.cpu_int8_gops, from.cpu_int8_gops);
  fill(into.cpu_bf16_gflops, from.cpu_bf16_gflops);
  fill(into.gpu_gbps, from.gpu_gbps);
  fill(into.gpu_tflops, from.gpu_tflops);
  fill(into.cpu_decode_efficiency, from.cpu_decode_efficiency);
  fill(into.cpu_prefill_efficiency, from.cpu_prefill_efficiency);
  fill(into.ram_bytes, from.ram_bytes);
  fill(into.vram_bytes, from.vram_bytes);
  if (into.cpu_name.empty()) into.cpu_name = from.cpu_name;
  if (into.gpu_name.empty()) into.gpu_name = from.gpu_name;
}

Result<ConfigOverride> parse_override(std::string_view text) {
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == text.size()) {
    return Error{"--set '" + std::string(text) + "': expected KEY=VALUE, e.g. budgets.ram=16GiB"};
  }
  std::string key(text.substr(0, eq));
  while (!key.empty() && key.back() == ' ') key.pop_back();
  std::string value(text.substr(eq + 1));
  while (!value.empty() && value.front() == ' ') value.erase(value.begin());
  if (key.find('.') == std::string::npos) {
    return Error{"--set " + key + ": the key needs its table, e.g. cpu.threads or budgets.ram"};
  }
  return ConfigOverride{std::move(key), std::move(value)};
}

Result<Config> parse_config(std::string_view text, std::string name, const std::vector<ConfigOverride>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    return Error{"config " + name + ":" + std::to_string(where.line) + ":" + std::to_string(where.column) + ": " +
                 std::string(e.description())};
  }
  for (const ConfigOverride& o : overrides) {
    if (Status s = apply_override(root, o); !s) return s.error();
  }
  return from_table(root, name);
}

Result<Config> load_config(const std::string& path, const std::vector<ConfigOverride>& overrides) {
  if (path.empty()) return parse_config("", "defaults", overrides);
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{"config " + path + ": cannot open (" + std::string(std::strerror(errno)) + ")"};
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Error{"config " + path + ": read failed"};
  return parse_config(text.str(), path, overrides);
}

Result<uint64_t> parse_size(std::string_view text) {
  const std::string s = lower(text);
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  const size_t start = i;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  const std::string number = s.substr(start, i - start);
  while (i < s.size() && s[i] == ' ') ++i;
  const std::string unit = s.substr(i);
  const auto bad = [&] {
    return Error{"size '" + std::string(text) + "' is not a size such as 22GiB, 512MiB, 1.5GB or 4096"};
  };
  if (number.empty() || number == "." || number.find('.') != number.rfind('.')) return bad();
  static const std::map<std::string, double> units = {
      {"", 1.0},       {"b", 1.0},
      {"k", 0x1p10},   {"kib", 0x1p10}, {"kb", 1e3},
      {"m", 0x1p20},   {"mib", 0x1p20}, {"mb", 1e6},
      {"g", 0x1p30},   {"gib", 0x1p30}, {"gb", 1e9},
      {"t", 0x1p40},   {"tib", 0x1p40}, {"tb", 1e12},
  };
  const auto u = units.find(unit);
  if (u == units.end()) return bad();
  const double v = std::strtod(number.c_str(), nullptr) * u->second;
  if (!std::isfinite(v) || v >= 0x1p63) return bad();
  if (u->second == 1.0 && number.find('.') != std::string::npos) return bad();  // fractional bytes
  return uint64_t(std::llround(v));
}

std::vector<ConfigKey> config_keys() {
  static const std::vector<std::string> names = [] {  // "table.key", built once
    std::vector<std::string> v;
    for (const KeySpec& k : key_specs()) v.push_back(std::string(k.table) + "." + std::string(k.key));
    return v;
  }();
  std::vector<ConfigKey> out;
  for (size_t i = 0; i < names.size(); ++i) out.push_back({names[i], key_specs()[i].what});
  return out;
}

Result<BudgetCheck> check_budgets(const Config& c, const ModelSummary& s, uint64_t kv_bytes,
                                  const SystemMemory& mem, int n_gpus) {
  BudgetCheck out;
  out.load = c.load;
  const std::string where = "config " + c.source + ": ";
  if (c.gpu_simulate && c.vram_budget == 0)
    return Error{where + "gpu.simulate is on but budgets.vram is 0; give the simulated GPU a budget"};
  if (c.vram_budget > 0 && c.gpu_simulate) {
    out.notes.push_back("budgets.vram: " + format_size(c.vram_budget) +
                        " on the simulated device (gpu.simulate): routed experts cached there are computed by the "
                        "CPU kernels from their VRAM copy; attention and dense weights stay on the CPU (docs/gpu.md)");
  } else if (c.vram_budget > 0) {
    if (n_gpus == 0) {
      out.notes.push_back("budgets.vram is " + format_size(c.vram_budget) +
                          " but this machine has no usable GPU (no device, no driver, or a build without CUDA): "
                          "everything runs on the CPU");
    } else {
      out.notes.push_back("budgets.vram: " + format_size(c.vram_budget) +
                          " on the GPU: the dense part (attention, norms, routers, dense and shared FFNs, lm head) "
                          "runs on the CUDA backend, and the hottest routed experts in a VRAM cache beside it; the "
                          "rest of the experts run on the CPU at the same time (docs/gpu.md)");
    }
  }
  // streamable: the routed experts and the Engram tables; the rest is read by every token
  const uint64_t engram = c.engram_tables == "stream" ? s.engram_bytes_total : 0;
  const uint64_t streamable = s.expert_bytes_total + engram;
  const uint64_t fixed = s.n_bytes - streamable;
  uint64_t budget = 0;
  if (c.ram_budget) {
    budget = *c.ram_budget;
    if (mem.total > 0 && budget > mem.total) {
      return Error{where + "budgets.ram is " + format_size(budget) + " but this machine has " +
                   format_size(mem.total) + " of RAM"};
    }
    if (fixed + kv_bytes > budget) {
      return Error{where + "budgets.ram is " + format_size(budget) + ", less than the fixed part: " +
                   format_size(fixed) + " of weights every token reads + " + format_size(kv_bytes) +
                   " of KV cache = " + format_size(fixed + kv_bytes) + " (raise budgets.ram or lower model.ctx)"};
    }
  } else {
    // "auto": the memory available now; the NVMe tier takes over only when the model does not fit
    // in it at all (a model that merely crowds the page cache is still read or mapped whole)
    if (mem.available == 0 || s.n_bytes + kv_bytes <= mem.available || streamable == 0) {
      // model.load = "auto": read into RAM when the weights, the KV cache and kLoadMargin fit in the
      // memory available (the first request then pays for no page fault), else map the file
      if (out.load == MappedFile::Mode::automatic && mem.available > 0) {
        const bool fits = s.n_bytes + kv_bytes + kLoadMargin <= mem.available;
        out.load = fits ? MappedFile::Mode::ram : MappedFile::Mode::mmap;
        if (!fits)
          out.notes.push_back("model.load = \"auto\": the " + format_size(s.n_bytes) + " of weights and " +
                              format_size(kv_bytes) + " of KV cache leave less than " + format_size(kLoadMargin) +
                              " of the " + format_size(mem.available) +
                              " available: the file is mapped (its pages read into memory on a background thread after start)");
      }
      return out;
    }
    budget = mem.available / 10 * 8;
    if (fixed + kv_bytes + kRamOverhead > budget) return out;  // too little to stream: map it
  }
  if (s.n_bytes + kv_bytes <= budget) {
    if (out.load == MappedFile::Mode::automatic) out.load = MappedFile::Mode::ram;
    return out;
  }
  if (c.load == MappedFile::Mode::ram) {
    return Error{where + "model.load = \"ram\" needs the whole model (" + format_size(s.n_bytes) + ") and " +
                 format_size(kv_bytes) + " of KV cache in RAM, more than budgets.ram (" + format_size(budget) + ")"};
  }
  out.load = MappedFile::Mode::mmap;
  if (c.load == MappedFile::Mode::mmap || s.expert_bytes_total == 0) {  // (Engram alone is not streamed)
    out.notes.push_back("budgets.ram holds " + format_size(budget - std::min(budget, fixed + kv_bytes)) + " of the " +
                        format_size(s.expert_bytes_total) +
                        " of routed experts; model.load = \"mmap\": the file is mapped and the kernel's page cache keeps "
                        "what it can (model.load = \"auto\" streams the experts from disk instead)");
    return out;
  }
  if (fixed + kv_bytes + kRamOverhead >= budget) {
    return Error{where + "budgets.ram is " + format_size(budget) + ": after the fixed part (" + format_size(fixed + kv_bytes) +
                 " with the KV cache) and " + format_size(kRamOverhead) +
                 " for buffers nothing is left for routed experts (raise budgets.ram or lower model.ctx)"};
  }
  out.expert_cache_bytes = budget - fixed - kv_bytes - kRamOverhead;
  if (engram > 0) {
    const uint64_t want = c.engram_cache > 0 ? c.engram_cache : std::min(engram, out.expert_cache_bytes / 8);
    if (want >= out.expert_cache_bytes)
      return Error{where + "storage.engram_cache is " + format_size(want) + " but budgets.ram leaves " +
                   format_size(out.expert_cache_bytes) + " for the streamed routed experts and Engram rows together"};
    out.engram_cache_bytes = want;
    out.expert_cache_bytes -= want;
    out.notes.push_back("budgets.ram " + format_size(budget) + ": " + format_size(want) + " of RAM caches rows of the " +
                        format_size(engram) + " of Engram tables, read from disk as tokens need them");
  }
  out.notes.push_back("budgets.ram " + format_size(budget) + ": " + format_size(out.expert_cache_bytes) +
                      " of RAM caches the " + format_size(s.expert_bytes_total) +
                      " of routed experts; the rest is streamed from disk (NVMe tier)");
  return out;
}

std::string calibration_path() {
  if (const char* p = std::getenv("STRATA_CALIBRATION"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/strata/calibration.toml";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/strata/calibration.toml";
  return ".strata-calibration.toml";
}

Result<std::optional<Calibration>> read_calibration(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::optional<Calibration>{};
  std::ostringstream text;
  text << in.rdbuf();
  toml::table root;
  try {
    root = toml::parse(text.str(), path);
  } catch (const toml::parse_error& e) {
    return Error{"calibration cache " + path + ": " + std::string(e.description()) +
                 " (delete it or run strata calibrate again)"};
  }
  toml::table hw;
  if (const toml::table* h = root["hardware"].as_table()) hw = *h;
  toml::table only_hw;
  only_hw.insert("hardware", hw);
  auto c = from_table(only_hw, "calibration cache " + path);
  if (!c) return c.error();
  Calibration cal;
  cal.limits = c->hardware;
  cal.date = root["measured"]["date"].value_or(std::string());
  cal.isa = root["measured"]["isa"].value_or(std::string());
  cal.threads = int(root["measured"]["threads"].value_or(int64_t(0)));
  return std::optional<Calibration>(std::move(cal));
}

Result<ResolvedLimits> resolve_limits(const Config& c) {
  ResolvedLimits r{c.hardware, c.hardware.dram_gbps > 0 ? "config " + c.source : ""};
  auto cal = read_calibration(calibration_path());
  if (!cal) return cal.error();
  if (cal->has_value()) {
    fill_unknown(r.limits, (*cal)->limits);
    r.source += (r.source.empty() ? "" : ", ") + std::string("calibration ") + (*cal)->date;
  }
  if (r.source.empty()) r.source = "none";
  return r;
}

Status write_calibration(const std::string& path, const Calibration& c) {
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    // create the directory chain (mkdir -p)
    for (size_t p = 1; p <= dir.size(); ++p) {
      if (p == dir.size() || dir[p] == '/') {
        const std::string part = dir.substr(0, p);
        if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
          return Error{"calibration cache: cannot create " + part + " (" + std::strerror(errno) + ")"};
      }
    }
  }
  // written by hand: two decimals, and keys in the order docs/config.md lists them
  const HardwareLimits& h = c.limits;
  auto quoted = [](const std::string& v) {
    std::string q = "\"";
    for (char ch : v) {
      if (ch == '"' || ch == '\\') q += '\\';
      if (static_cast<unsigned char>(ch) >= 0x20) q += ch;
    }
    return q + "\"";
  };
  std::string text = "# written by strata calibrate; the [hardware] keys are those of a config's [hardware] table\n";
  text += "[measured]\ndate = " + quoted(c.date) + "\nisa = " + quoted(c.isa) + "\nthreads = " + std::to_string(c.threads) + "\n";
  text += "\n[hardware]\n";
  auto put = [&](const char* key, double v) {
    if (v > 0) text += strfmt("%s = %.2f\n", key, v);
  };
  put("dram_gbps", h.dram_gbps);
  put("weights_gbps", h.weights_gbps);
  put("nvme_gbps", h.nvme_gbps);
  put("nvme_4k_gbps", h.nvme_4k_gbps);
  put("repack_gbps", h.repack_gbps);
  put("pcie_h2d_gbps", h.pcie_h2d_gbps);
  put("pcie_d2h_gbps", h.pcie_d2h_gbps);
  put("cpu_int8_gops", h.cpu_int8_gops);
  put("cpu_bf16_gflops", h.cpu_bf16_gflops);
  put("gpu_gbps", h.gpu_gbps);
  put("gpu_tflops", h.gpu_tflops);
  put("cpu_decode_efficiency", h.cpu_decode_efficiency);
  put("cpu_prefill_efficiency", h.cpu_prefill_efficiency);
  if (h.ram_bytes) text += "ram = " + std::to_string(h.ram_bytes) + "  # " + format_size(h.ram_bytes) + "\n";
  if (h.vram_bytes) text += "vram = " + std::to_string(h.vram_bytes) + "  # " + format_size(h.vram_bytes) + "\n";
  if (!h.cpu_name.empty()) text += "cpu = " + quoted(h.cpu_name) + "\n";
  if (!h.gpu_name.empty()) text += "gpu = " + quoted(h.gpu_name) + "\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Error{"calibration cache: cannot write " + tmp + " (" + std::strerror(errno) + ")"};
    out << text;
    if (!out) return Error{"calibration cache: write to " + tmp + " failed"};
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Error{"calibration cache: cannot rename " + tmp + " to " + path + " (" + std::strerror(errno) + ")"};
  return {};
}

}  // namespace strata
