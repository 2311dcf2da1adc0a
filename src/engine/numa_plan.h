// Which way to split routed experts over NUMA nodes, measured on routing (docs/numa.md): each
// expert's rows over all nodes (`shard`), or whole experts per node balanced by expected load.
// A decode step's expert reads take as long as the busiest node's share (each node streams its
// own memory); the figure is that time over the perfectly balanced time (total / nodes), summed
// over the steps and layers of the routing. Pure: no I/O, no threads.
#pragma once

#include <cstdint>
#include <vector>

namespace strata {

struct NumaPlacementFigures {
  int n_nodes = 0;
  int64_t steps = 0;  // (step, layer) pairs measured
  // busiest-node time over balanced time, >= 1: whole experts per node at batch 1 and batch 8,
  // and rows split over the nodes (the same at any batch)
  double whole_decode = 0, whole_batch8 = 0, shard = 0;
};

// ids[layer]: that layer's routing, token-major, k experts per token. Whole experts are placed
// per layer from the first half of the tokens (experts by use, each to the node with the least
// expected load that still has room: at most ceil(n_expert / n_nodes) experts a node, so that no
// node holds more than its share of memory) and measured on the second half. `rows`: an expert
// matrix's rows; shard splits them in whole 16-row groups as NumaLayout::rows does for equal
// thread groups.
NumaPlacementFigures compare_numa_placements(const std::vector<std::vector<int32_t>>& ids, int k, int n_expert,
                                             int n_nodes, int64_t rows);

}  // namespace strata
