#include "engine/numa_plan.h"

#include <algorithm>
#include <numeric>

#include "base/error.h"
#include "cpu/numa.h"

namespace strata {

NumaPlacementFigures compare_numa_placements(const std::vector<std::vector<int32_t>>& ids, int k, int n_expert,
                                             int n_nodes, int64_t rows) {
  STRATA_CHECK(k > 0 && n_expert > 0 && n_nodes > 0 && rows > 0);
  NumaPlacementFigures f;
  f.n_nodes = n_nodes;
  // shard: each active expert's rows as an equal-thread layout of n_nodes groups cuts them
  auto topo = cpu::Topology::load(strfmt("numa:%d core:1 pu:1", n_nodes));
  STRATA_CHECK(topo.ok(), "a stand-in of n_nodes nodes");
  auto layout = cpu::NumaLayout::make(cpu::NumaOptions{}, std::move(topo).value(), n_nodes);
  STRATA_CHECK(layout.ok());
  int64_t widest = 0;
  for (int g = 0; g < layout->n_groups(); ++g) widest = std::max(widest, layout->rows(g, rows).second - layout->rows(g, rows).first);
  f.shard = double(widest) * n_nodes / double(rows);

  double sum_max1 = 0, sum_ideal1 = 0, sum_max8 = 0, sum_ideal8 = 0;
  const int per_node = (n_expert + n_nodes - 1) / n_nodes;
  for (const std::vector<int32_t>& layer : ids) {
    const int64_t n_tok = int64_t(layer.size()) / k;
    const int64_t half = n_tok / 2;
    if (half == 0) continue;
    // expected load from the first half; heaviest first, each to the least loaded node with room
    std::vector<int64_t> uses(size_t(n_expert), 0);
    for (int64_t i = 0; i < half * k; ++i) ++uses[size_t(layer[size_t(i)])];
    std::vector<int> order(static_cast<size_t>(n_expert));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return uses[size_t(a)] > uses[size_t(b)]; });
    std::vector<int64_t> load(size_t(n_nodes), 0);
    std::vector<int> held(size_t(n_nodes), 0), node_of(size_t(n_expert), 0);
    for (int e : order) {
      int best = -1;
      for (int n = 0; n < n_nodes; ++n)
        if (held[size_t(n)] < per_node && (best < 0 || load[size_t(n)] < load[size_t(best)])) best = n;
      node_of[size_t(e)] = best;
      load[size_t(best)] += uses[size_t(e)];
      ++held[size_t(best)];
    }
    // measured on the second half: per step, the distinct experts each node reads
    for (const int64_t batch : {int64_t(1), int64_t(8)}) {
      for (int64_t t0 = half; t0 + batch <= n_tok; t0 += batch) {
        std::vector<char> active(size_t(n_expert), 0);
        for (int64_t i = t0 * k; i < (t0 + batch) * k; ++i) active[size_t(layer[size_t(i)])] = 1;
        std::vector<int64_t> on(size_t(n_nodes), 0);
        int64_t total = 0;
        for (int e = 0; e < n_expert; ++e)
          if (active[size_t(e)]) {
            ++on[size_t(node_of[size_t(e)])];
            ++total;
          }
        const double mx = double(*std::max_element(on.begin(), on.end()));
        (batch == 1 ? sum_max1 : sum_max8) += mx;
        (batch == 1 ? sum_ideal1 : sum_ideal8) += double(total) / n_nodes;
        if (batch == 1) ++f.steps;
      }
    }
  }
  f.whole_decode = sum_ideal1 > 0 ? sum_max1 / sum_ideal1 : 0;
  f.whole_batch8 = sum_ideal8 > 0 ? sum_max8 / sum_ideal8 : 0;
  return f;
}

}  // namespace strata
