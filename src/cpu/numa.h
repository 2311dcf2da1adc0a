// NUMA placement of the compute threads and the routed experts (docs/numa.md).
//
// The compute threads are spread over the NUMA nodes in proportion to their cores; the nodes that
// get threads are the layout's groups. Under the policies:
//   shard       (default) every routed expert's rows are split over the groups, in whole 16-row
//               groups and in proportion to the groups' threads: each group's rows lie in its
//               node's memory and only its threads compute them, so every memory channel works on
//               every expert and no weight is copied. Rows are independent dot products: the
//               outputs are the single-node outputs bit for bit. Other weights are interleaved.
//   interleave  every weight's pages are spread round-robin over the groups' nodes; any thread
//               computes any row.
//   node:N      weights on node N, threads on node N's cores.
// On one node every policy is the plain pool (one group).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"
#include "cpu/topology.h"

namespace strata {
struct Weight;
}

namespace strata::cpu {

enum class NumaPolicy { shard, interleave, node };

struct NumaOptions {
  NumaPolicy policy = NumaPolicy::shard;
  int node = 0;          // node:N: hwloc's logical node index, as `strata info --hw` lists them
  std::string topology;  // "": this machine; else a stand-in (Topology::load)
};

// "shard", "interleave", "node:N" into `o` (topology untouched); an Error lists the choices.
Status parse_numa_policy(std::string_view text, NumaOptions& o);
std::string numa_policy_name(const NumaOptions& o);

class NumaLayout {
 public:
  // n_threads 0: one per core (of node N under node:N). An Error when node:N names no node.
  static Result<NumaLayout> make(const NumaOptions& o, Topology topo, int n_threads);

  const Topology& topology() const { return topo_; }
  const NumaOptions& options() const { return opt_; }
  int n_threads() const { return int(thread_group_.size()); }
  // Thread groups: the nodes that have compute threads, in node order.
  int n_groups() const { return int(group_node_.size()); }
  int group_of_thread(int t) const { return thread_group_[size_t(t)]; }
  const std::vector<int>& thread_groups() const { return thread_group_; }
  int core_of_thread(int t) const { return thread_core_[size_t(t)]; }
  int node_of_group(int g) const { return group_node_[size_t(g)]; }
  int threads_in_group(int g) const;
  // Whether routed-expert rows are cut by group (shard over 2+ groups).
  bool sharded() const { return opt_.policy == NumaPolicy::shard && n_groups() > 1; }
  // Rows [first, last) of an n_out-row expert matrix that group g holds and computes: whole
  // 16-row groups in proportion to the groups' threads (the last group ends at n_out). Without
  // sharding group 0 has them all. Consecutive groups' ranges meet.
  std::pair<int64_t, int64_t> rows(int group, int64_t n_out) const;
  // One line: policy, groups, threads per group.
  std::string describe() const;

 private:
  NumaLayout(Topology t) : topo_(std::move(t)) {}
  Topology topo_;
  NumaOptions opt_;
  std::vector<int> thread_group_, thread_core_, group_node_;
};

// What placing weights did: bytes bound to each group's node, bytes interleaved (or bound to
// node N), whether the kernel refused any range, and a fallback taken.
struct PlacementStats {
  std::vector<uint64_t> group_bytes;
  uint64_t spread_bytes = 0;
  int failures = 0;
  std::string note;  // a fallback taken, and why
  std::string describe(const NumaLayout& l) const;
};

// Where a stacked expert weight goes under shard: for every matrix and group, the bytes of the
// matrix's rows(g). The ranges of one weight are disjoint and cover it (empty without sharding).
struct RowRange {
  const uint8_t* p = nullptr;
  size_t n = 0;
  int group = 0;
};
std::vector<RowRange> expert_row_ranges(const NumaLayout& l, const Weight& w);

// How many more memory mappings this process may make: vm.max_map_count less the mappings it
// has now (/proc); -1 when unknown. Every bound range can become its own mapping.
int64_t mapping_headroom();

// Binds a stacked expert weight: under shard each expert_row_ranges() range to its group's node;
// otherwise as bind_spread.
void bind_expert_rows(const NumaLayout& l, const Weight& w, PlacementStats& s);
// Binds [p, p + n) by the policy for shared weights: interleaved over the groups' nodes (node N
// under node:N).
void bind_spread(const NumaLayout& l, const void* p, size_t n, PlacementStats& s);

// The process-wide layout of the compute pool. set_numa() before the pool starts fixes its
// threads' placement (pinning, cores); after, it regroups the running pool's threads (tests and
// planning on stand-in topologies; nothing is re-pinned), and must not run during a forward pass.
// Where hwloc cannot load this machine, a flat stand-in of its hardware threads takes its place.
Status set_numa(const NumaOptions& o);
// The current layout; numa_layout()'s reference lasts until the next set_numa(), a snapshot as
// long as it is held (what a forward pass keeps).
const NumaLayout& numa_layout();
std::shared_ptr<const NumaLayout> numa_snapshot();

}  // namespace strata::cpu
