// The machine as hwloc sees it: NUMA nodes, their cores and PUs, the caches. Either this machine
// or a stand-in for tests and planning: an hwloc synthetic description ("pack:2 numa:1 core:8
// pu:2") or an XML file written by `lstopo file.xml`. A stand-in is not this system: nothing is
// bound on it (threads and memory stay where the OS puts them) and it says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"

struct hwloc_topology;

namespace strata::cpu {

struct NumaNodeInfo {
  int os_index = 0;            // the kernel's node number (numactl's)
  uint64_t memory_bytes = 0;   // local memory hwloc reports (0 when unknown)
  std::vector<int> cores;      // logical indices of its cores (hwloc's order)
  int n_pus = 0;               // hardware threads
};

struct CacheInfo {
  int level = 0;  // 1, 2, 3
  bool instruction = false;
  uint64_t bytes = 0;  // one cache's size
  int count = 0;       // how many of them
};

class Topology {
 public:
  // "" : this machine. A path to an existing file: hwloc XML. Anything else: an hwloc synthetic
  // description. An Error says what hwloc refused.
  static Result<Topology> load(const std::string& source);
  // This machine's topology, loaded once (for pinning); null where hwloc cannot load it.
  static const Topology* machine();

  Topology(Topology&&) noexcept;
  Topology& operator=(Topology&&) noexcept;
  ~Topology();

  // Whether binding threads and memory means anything (false for a synthetic or XML stand-in).
  bool is_this_system() const { return this_system_; }
  const std::string& source() const { return source_; }
  int n_nodes() const { return int(nodes_.size()); }
  const std::vector<NumaNodeInfo>& nodes() const { return nodes_; }
  int n_cores() const { return n_cores_; }
  int n_pus() const { return n_pus_; }
  const std::vector<CacheInfo>& caches() const { return caches_; }
  // The node (index into nodes()) of logical core `core`.
  int node_of_core(int core) const;
  // A few lines for `strata info --hw`.
  std::string describe() const;

  // Binds the calling thread to logical core `core`; false where that fails or on a stand-in.
  bool bind_thread_to_core(int core) const;
  // Binds the pages of [p, p + n) to node `node` (index into nodes()), moving the ones already
  // elsewhere; or interleaves them over `nodes` when node < 0. A page goes with the range that
  // holds its first byte (ranges that meet split their pages exactly once), so the range's last
  // page may reach past p + n. False where the kernel refused (or on a stand-in).
  bool bind_memory(const void* p, size_t n, int node, const std::vector<int>& nodes = {}) const;
  // The nodes (indices into nodes()) holding the pages [p, p + n) touches now, from the kernel
  // (move_pages query); empty where it cannot say. Pages never touched are on no node.
  std::vector<int> memory_nodes(const void* p, size_t n) const;
  // The node the pages [p, p + n) touches are bound to, or -1 when they are not bound to exactly one node.
  int bound_node(const void* p, size_t n) const;

 private:
  Topology() = default;
  void read();

  hwloc_topology* topo_ = nullptr;
  std::string source_;
  bool this_system_ = false;
  std::vector<NumaNodeInfo> nodes_;
  std::vector<int> core_node_;  // node of each logical core
  int n_cores_ = 0, n_pus_ = 0;
  std::vector<CacheInfo> caches_;
};

// The page size the kernel binds memory in.
size_t page_bytes();

}  // namespace strata::cpu
