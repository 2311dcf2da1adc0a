#include "cpu/topology.h"

#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>

namespace strata::cpu {

namespace {

// Cores, or PUs where hwloc finds no core objects (some VMs).
hwloc_obj_type_t core_type(hwloc_topology_t t) {
  return hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
}

}  // namespace

Result<Topology> Topology::load(const std::string& source) {
  Topology topo;
  topo.source_ = source.empty() ? "this machine" : source;
  if (hwloc_topology_init(&topo.topo_) != 0) return Error{"hwloc: cannot initialise a topology"};
  std::error_code ec;
  const bool xml = !source.empty() && std::filesystem::is_regular_file(source, ec);
  if (xml) {
    if (hwloc_topology_set_xml(topo.topo_, source.c_str()) != 0)
      return Error{"topology " + source + ": hwloc cannot read it as an XML topology (lstopo file.xml writes one)"};
  } else if (!source.empty()) {
    if (hwloc_topology_set_synthetic(topo.topo_, source.c_str()) != 0)
      return Error{"topology \"" + source +
                   "\": not a file, and hwloc refuses it as a synthetic description (for example "
                   "\"pack:2 numa:1 core:8 pu:2\")"};
  }
  if (hwloc_topology_load(topo.topo_) != 0)
    return Error{"topology " + topo.source_ +
                 (xml ? ": hwloc cannot load it as an XML topology (lstopo file.xml writes one)" : ": hwloc cannot load it")};
  topo.this_system_ = hwloc_topology_is_thissystem(topo.topo_) != 0;
  topo.read();
  if (topo.nodes_.empty() || topo.n_cores_ == 0) return Error{"topology " + topo.source_ + ": no NUMA node or no core"};
  return topo;
}

const Topology* Topology::machine() {
  static const std::unique_ptr<Topology> topo = [] {
    auto t = Topology::load("");
    return t ? std::make_unique<Topology>(std::move(*t)) : nullptr;
  }();
  return topo.get();
}

Topology::Topology(Topology&& o) noexcept { *this = std::move(o); }

Topology& Topology::operator=(Topology&& o) noexcept {
  if (this != &o) {
    if (topo_ != nullptr) hwloc_topology_destroy(topo_);
    topo_ = std::exchange(o.topo_, nullptr);
    source_ = std::move(o.source_);
    this_system_ = o.this_system_;
    nodes_ = std::move(o.nodes_);
    core_node_ = std::move(o.core_node_);
    n_cores_ = o.n_cores_;
    n_pus_ = o.n_pus_;
    caches_ = std::move(o.caches_);
  }
  return *this;
}

Topology::~Topology() {
  if (topo_ != nullptr) hwloc_topology_destroy(topo_);
}

void Topology::read() {
  const hwloc_obj_type_t ct = core_type(topo_);
  n_cores_ = hwloc_get_nbobjs_by_type(topo_, ct);
  n_pus_ = hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_PU);
  const int n_nodes = hwloc_get_nbobjs_by_type(topo_, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n_nodes; ++i) {
    hwloc_obj_t n = hwloc_get_obj_by_type(topo_, HWLOC_OBJ_NUMANODE, unsigned(i));
    NumaNodeInfo info;
    info.os_index = int(n->os_index);
    info.memory_bytes = n->attr != nullptr ? n->attr->numanode.local_memory : 0;
    if (n->cpuset != nullptr) info.n_pus = hwloc_get_nbobjs_inside_cpuset_by_type(topo_, n->cpuset, HWLOC_OBJ_PU);
    nodes_.push_back(info);
  }
  // each core to the closest node whose cpuset holds it: the one with the fewest hardware threads
  // (a memory-only node attached high in the tree, CXL or HBM, spans many cores but is no core's
  // own); node 0 when none holds it
  core_node_.assign(size_t(n_cores_), 0);
  for (int c = 0; c < n_cores_; ++c) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo_, ct, unsigned(c));
    int best = -1;
    for (int i = 0; i < n_nodes; ++i) {
      hwloc_obj_t n = hwloc_get_obj_by_type(topo_, HWLOC_OBJ_NUMANODE, unsigned(i));
      if (core->cpuset != nullptr && n->cpuset != nullptr && hwloc_bitmap_isincluded(core->cpuset, n->cpuset) &&
          (best < 0 || nodes_[size_t(i)].n_pus < nodes_[size_t(best)].n_pus))
        best = i;
    }
    core_node_[size_t(c)] = std::max(best, 0);
    nodes_[size_t(core_node_[size_t(c)])].cores.push_back(c);
  }
  // caches: count and size per (level, kind)
  std::map<std::pair<int, bool>, CacheInfo> caches;
  for (hwloc_obj_type_t type : {HWLOC_OBJ_L1CACHE, HWLOC_OBJ_L1ICACHE, HWLOC_OBJ_L2CACHE, HWLOC_OBJ_L3CACHE}) {
    const int n = hwloc_get_nbobjs_by_type(topo_, type);
    for (int i = 0; i < n; ++i) {
      hwloc_obj_t o = hwloc_get_obj_by_type(topo_, type, unsigned(i));
      const bool instr = type == HWLOC_OBJ_L1ICACHE;
      CacheInfo& c = caches[{int(o->attr->cache.depth), instr}];
      c.level = int(o->attr->cache.depth);
      c.instruction = instr;
      c.bytes = std::max<uint64_t>(c.bytes, o->attr->cache.size);
      ++c.count;
    }
  }
  for (const auto& [key, c] : caches) caches_.push_back(c);
}

int Topology::node_of_core(int core) const {
  STRATA_CHECK(core >= 0 && core < n_cores_, "core index out of range");
  return core_node_[size_t(core)];
}

std::string Topology::describe() const {
  std::string s = strfmt("topology    %s%s\n", source_.c_str(), this_system_ ? "" : " (a stand-in: nothing is bound)");
  s += strfmt("cpu         %d NUMA node%s, %d cores, %d hardware threads\n", n_nodes(), n_nodes() == 1 ? "" : "s",
              n_cores_, n_pus_);
  for (int i = 0; i < n_nodes(); ++i) {
    const NumaNodeInfo& n = nodes_[size_t(i)];
    std::string cores;
    if (!n.cores.empty())
      cores = n.cores.size() == 1 ? strfmt("core %d", n.cores.front())
                                  : strfmt("cores %d-%d", n.cores.front(), n.cores.back());
    s += strfmt("node %-7d os index %d, %s (%d threads), %.1f GiB local memory\n", i, n.os_index,
                cores.empty() ? "no cores" : cores.c_str(), n.n_pus, double(n.memory_bytes) / double(1ull << 30));
  }
  for (const CacheInfo& c : caches_) {
    const double kib = double(c.bytes) / 1024;
    s += strfmt("cache       L%d%s %s x %d\n", c.level, c.level == 1 ? (c.instruction ? "i" : "d") : "",
                kib >= 1024 ? strfmt("%.0f MiB", kib / 1024).c_str() : strfmt("%.0f KiB", kib).c_str(), c.count);
  }
  return s;
}

bool Topology::bind_thread_to_core(int core) const {
  if (!this_system_ || core < 0 || core >= n_cores_) return false;
  hwloc_obj_t c = hwloc_get_obj_by_type(topo_, core_type(topo_), unsigned(core));
  if (c == nullptr || c->cpuset == nullptr) return false;
  return hwloc_set_cpubind(topo_, c->cpuset, HWLOC_CPUBIND_THREAD) == 0;
}

size_t page_bytes() {
  static const size_t n = [] {
    const long v = sysconf(_SC_PAGESIZE);
    return v > 0 ? size_t(v) : size_t(4096);
  }();
  return n;
}

namespace {

// The pages a bind of [p, p + n) takes: those whose first byte is in the range, so that ranges
// that meet split their pages between them exactly once. False when there is none.
bool bind_pages(const void* p, size_t n, uintptr_t& b, uintptr_t& e) {
  const uintptr_t pg = page_bytes();
  b = (reinterpret_cast<uintptr_t>(p) + pg - 1) / pg * pg;
  e = (reinterpret_cast<uintptr_t>(p) + n + pg - 1) / pg * pg;
  return e > b;
}

// The pages a query of [p, p + n) looks at: every page it touches.
bool touched_pages(const void* p, size_t n, uintptr_t& b, uintptr_t& e) {
  const uintptr_t pg = page_bytes();
  b = reinterpret_cast<uintptr_t>(p) / pg * pg;
  e = (reinterpret_cast<uintptr_t>(p) + n + pg - 1) / pg * pg;
  return n > 0;
}

}  // namespace

bool Topology::bind_memory(const void* p, size_t n, int node, const std::vector<int>& nodes) const {
  if (!this_system_) return false;
  uintptr_t b = 0, e = 0;
  if (!bind_pages(p, n, b, e)) return true;  // no page starts inside
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  for (int i : node >= 0 ? std::vector<int>{node} : nodes) {
    STRATA_CHECK(i >= 0 && i < n_nodes(), "node index out of range");
    hwloc_bitmap_set(set, unsigned(nodes_[size_t(i)].os_index));
  }
  const int rc = hwloc_set_area_membind(topo_, reinterpret_cast<const void*>(b), e - b, set,
                                        node >= 0 ? HWLOC_MEMBIND_BIND : HWLOC_MEMBIND_INTERLEAVE,
                                        HWLOC_MEMBIND_MIGRATE | HWLOC_MEMBIND_BYNODESET);
  hwloc_bitmap_free(set);
  return rc == 0;
}

namespace {

std::vector<int> nodes_in(const std::vector<NumaNodeInfo>& nodes, hwloc_const_bitmap_t set) {
  std::vector<int> out;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (hwloc_bitmap_isset(set, unsigned(nodes[i].os_index))) out.push_back(int(i));
  return out;
}

}  // namespace

std::vector<int> Topology::memory_nodes(const void* p, size_t n) const {
  if (!this_system_) return {};
  uintptr_t b = 0, e = 0;
  if (!touched_pages(p, n, b, e)) return {};
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  const int rc = hwloc_get_area_memlocation(topo_, reinterpret_cast<const void*>(b), e - b, set, HWLOC_MEMBIND_BYNODESET);
  std::vector<int> out = rc == 0 ? nodes_in(nodes_, set) : std::vector<int>{};
  hwloc_bitmap_free(set);
  return out;
}

int Topology::bound_node(const void* p, size_t n) const {
  if (!this_system_) return -1;
  uintptr_t b = 0, e = 0;
  if (!touched_pages(p, n, b, e)) return -1;
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  hwloc_membind_policy_t policy{};
  const int rc = hwloc_get_area_membind(topo_, reinterpret_cast<const void*>(b), e - b, set, &policy, HWLOC_MEMBIND_BYNODESET);
  const std::vector<int> in = rc == 0 ? nodes_in(nodes_, set) : std::vector<int>{};
  hwloc_bitmap_free(set);
  return rc == 0 && policy == HWLOC_MEMBIND_BIND && in.size() == 1 ? in.front() : -1;
}

}  // namespace strata::cpu
