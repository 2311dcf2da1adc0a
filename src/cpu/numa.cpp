#include "cpu/numa.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>

#include "cpu/thread_pool.h"
#include "cpu/weights.h"

namespace strata::cpu {

Status parse_numa_policy(std::string_view text, NumaOptions& o) {
  if (text == "shard") {
    o.policy = NumaPolicy::shard;
  } else if (text == "interleave") {
    o.policy = NumaPolicy::interleave;
  } else if (text.starts_with("node:")) {
    const std::string_view n = text.substr(5);
    int v = -1;
    const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), v);
    if (ec != std::errc() || end != n.data() + n.size() || v < 0)
      return Error{strfmt("\"%.*s\": node:N wants a node number (0, 1, ...)", int(text.size()), text.data())};
    o.policy = NumaPolicy::node;
    o.node = v;
  } else {
    return Error{strfmt("\"%.*s\" is not a NUMA policy: shard, interleave or node:N", int(text.size()), text.data())};
  }
  return {};
}

std::string numa_policy_name(const NumaOptions& o) {
  switch (o.policy) {
    case NumaPolicy::shard: return "shard";
    case NumaPolicy::interleave: return "interleave";
    case NumaPolicy::node: return strfmt("node:%d", o.node);
  }
  return "?";
}

Result<NumaLayout> NumaLayout::make(const NumaOptions& o, Topology topo, int n_threads) {
  NumaLayout l(std::move(topo));
  l.opt_ = o;
  const std::vector<NumaNodeInfo>& nodes = l.topo_.nodes();
  // the nodes threads may go to, and how many each gets
  std::vector<int> cand;
  if (o.policy == NumaPolicy::node) {
    if (o.node < 0 || o.node >= int(nodes.size()))
      return Error{strfmt("numa.policy node:%d: the topology (%s) has nodes 0-%d", o.node, l.topo_.source().c_str(),
                          int(nodes.size()) - 1)};
    if (nodes[size_t(o.node)].cores.empty())
      return Error{strfmt("numa.policy node:%d: that node has no cores (memory only)", o.node)};
    cand.push_back(o.node);
  } else {
    for (int i = 0; i < int(nodes.size()); ++i)
      if (!nodes[size_t(i)].cores.empty()) cand.push_back(i);
  }
  int cores = 0;
  for (int i : cand) cores += int(nodes[size_t(i)].cores.size());
  const int n = n_threads > 0 ? n_threads : cores;
  // largest remainder in proportion to cores; a node gets at least one thread while there are
  // threads enough for every node
  std::vector<int> count(cand.size(), 0);
  std::vector<std::pair<double, size_t>> rest;
  int given = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    const double share = double(n) * double(nodes[size_t(cand[i])].cores.size()) / double(cores);
    count[i] = int(share);
    given += count[i];
    rest.push_back({share - double(count[i]), i});
  }
  std::stable_sort(rest.begin(), rest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; given < n; ++k, ++given) ++count[rest[k % rest.size()].second];
  if (n >= int(cand.size())) {
    for (size_t i = 0; i < cand.size(); ++i) {
      if (count[i] > 0) continue;
      const auto most = std::max_element(count.begin(), count.end());
      --*most;
      ++count[i];
    }
  }
  for (size_t i = 0; i < cand.size(); ++i) {
    if (count[i] == 0) continue;
    const int g = int(l.group_node_.size());
    l.group_node_.push_back(cand[i]);
    const std::vector<int>& node_cores = nodes[size_t(cand[i])].cores;
    for (int k = 0; k < count[i]; ++k) {
      l.thread_group_.push_back(g);
      l.thread_core_.push_back(node_cores[size_t(k) % node_cores.size()]);
    }
  }
  return l;
}

int NumaLayout::threads_in_group(int g) const {
  return int(std::count(thread_group_.begin(), thread_group_.end(), g));
}

std::pair<int64_t, int64_t> NumaLayout::rows(int group, int64_t n_out) const {
  if (!sharded()) return group == 0 ? std::pair<int64_t, int64_t>{0, n_out} : std::pair<int64_t, int64_t>{n_out, n_out};
  const int64_t total = n_threads();
  auto boundary = [&](int g) -> int64_t {  // start of group g's rows
    if (g >= n_groups()) return n_out;
    int64_t before = 0;
    for (int h = 0; h < g; ++h) before += threads_in_group(h);
    const int64_t r = (n_out * before + total / 2) / total;
    return std::min(n_out, (r + 8) / 16 * 16);
  };
  return {boundary(group), boundary(group + 1)};
}

std::string NumaLayout::describe() const {
  std::string s = strfmt("numa %s over %d node%s (%s):", numa_policy_name(opt_).c_str(), n_groups(),
                         n_groups() == 1 ? "" : "s", topo_.source().c_str());
  for (int g = 0; g < n_groups(); ++g)
    s += strfmt("%s node %d %d thread%s", g ? "," : "", node_of_group(g), threads_in_group(g),
                threads_in_group(g) == 1 ? "" : "s");
  return s;
}

std::string PlacementStats::describe(const NumaLayout& l) const {
  std::string s;
  for (size_t g = 0; g < group_bytes.size(); ++g)
    s += strfmt("%snode %d %.2f GiB", g ? ", " : "", l.node_of_group(int(g)), double(group_bytes[g]) / double(1ull << 30));
  s += strfmt("%s%.2f GiB %s", s.empty() ? "" : ", ", double(spread_bytes) / double(1ull << 30),
              l.options().policy == NumaPolicy::node ? "other weights" : "interleaved");
  if (failures > 0) s += strfmt(" (the kernel refused %d range%s: those pages stay where they are)", failures, failures == 1 ? "" : "s");
  if (!note.empty()) s += "; " + note;
  return s;
}

void bind_spread(const NumaLayout& l, const void* p, size_t n, PlacementStats& s) {
  std::vector<int> nodes;
  for (int g = 0; g < l.n_groups(); ++g) nodes.push_back(l.node_of_group(g));
  const int node = l.options().policy == NumaPolicy::node || nodes.size() == 1 ? nodes.front() : -1;
  if (!l.topology().bind_memory(p, n, node, nodes)) ++s.failures;
  s.spread_bytes += n;
}

std::vector<RowRange> expert_row_ranges(const NumaLayout& l, const Weight& w) {
  std::vector<RowRange> out;
  if (!w || !l.sharded()) return out;
  for (int64_t e = 0; e < w.n_mat; ++e) {
    const uint8_t* m = w.data + size_t(e) * w.mat_bytes();
    for (int g = 0; g < l.n_groups(); ++g) {
      const auto [r0, r1] = l.rows(g, w.n_out);
      if (r1 > r0) out.push_back({m + size_t(r0) * w.row_bytes, size_t(r1 - r0) * w.row_bytes, g});
    }
  }
  return out;
}

int64_t mapping_headroom() {
  std::ifstream max_file("/proc/sys/vm/max_map_count");
  int64_t max_maps = -1;
  if (!(max_file >> max_maps) || max_maps <= 0) return -1;
  std::ifstream maps("/proc/self/maps");
  if (!maps) return -1;
  int64_t n = 0;
  for (std::string line; std::getline(maps, line);) ++n;
  return max_maps - n;
}

void bind_expert_rows(const NumaLayout& l, const Weight& w, PlacementStats& s) {
  if (!w) return;
  if (!l.sharded()) {
    bind_spread(l, w.data, w.mat_bytes() * size_t(w.n_mat), s);
    return;
  }
  s.group_bytes.resize(size_t(l.n_groups()), 0);
  for (const RowRange& r : expert_row_ranges(l, w)) {
    if (!l.topology().bind_memory(r.p, r.n, l.node_of_group(r.group))) ++s.failures;
    s.group_bytes[size_t(r.group)] += r.n;
  }
}

namespace {

std::mutex g_numa_mutex;
std::shared_ptr<const NumaLayout> g_layout;

// `source`'s topology; for this machine, a flat stand-in of its hardware threads where hwloc
// cannot load it.
Result<Topology> load_topology(const std::string& source) {
  auto t = Topology::load(source);
  if (t || !source.empty()) return t;
  return Topology::load(strfmt("core:%u pu:1", std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace

Status set_numa(const NumaOptions& o) {
  auto topo = load_topology(o.topology);
  if (!topo) return topo.error();
  const int running = compute_pool_threads();  // 0 before the pool starts
  auto l = NumaLayout::make(o, std::move(topo).value(), running > 0 ? running : requested_compute_threads());
  if (!l) return l.error();
  std::lock_guard lock(g_numa_mutex);
  g_layout = std::make_shared<const NumaLayout>(std::move(*l));
  if (running > 0) compute_pool().set_groups(g_layout->thread_groups());
  return {};
}

std::shared_ptr<const NumaLayout> numa_snapshot() {
  std::lock_guard lock(g_numa_mutex);
  if (g_layout == nullptr) {
    auto t = load_topology("");
    STRATA_CHECK(t.ok(), "no topology for this machine");
    auto l = NumaLayout::make(NumaOptions{}, std::move(t).value(), requested_compute_threads());
    STRATA_CHECK(l.ok(), "the default NUMA layout of this machine");
    g_layout = std::make_shared<const NumaLayout>(std::move(*l));
  }
  return g_layout;
}

const NumaLayout& numa_layout() { return *numa_snapshot(); }

}  // namespace strata::cpu
