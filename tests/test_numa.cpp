// NUMA placement (cpu/topology.h, cpu/numa.h): topologies of 2 and 4 nodes from hwloc synthetic
// descriptions; threads spread over the nodes; every routed expert's rows split over the groups
// exactly once, each range bound to its group's node; every row task of a sharded MoE layer runs
// on a thread of its group; and the logits of a sharded model equal the one-node logits bit for
// bit (rows are independent dot products and no partial sum crosses nodes, so the order of every
// sum is the one-node order). On this machine (one node) binding is checked for real on node 0:
// the kernel's own record of the pages' policy and location.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>

#include "base/profiler.h"
#include "cpu/numa.h"
#include "cpu/thread_pool.h"
#include "engine/numa_plan.h"
#include "engine/session.h"
#include "model/model.h"
#include "test_support.h"

namespace strata {
namespace {

using cpu::NumaLayout;
using cpu::NumaOptions;
using cpu::NumaPolicy;
using cpu::Topology;

Topology load_topology(const std::string& source) {
  auto t = Topology::load(source);
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  return std::move(t).value();
}

NumaLayout layout(const std::string& source, int threads, NumaOptions o = {}) {
  auto l = NumaLayout::make(o, load_topology(source), threads);
  EXPECT_TRUE(l.ok()) << (l.ok() ? "" : l.error().message);
  return std::move(l).value();
}

TEST(Topology, SyntheticTwoAndFourNodes) {
  const Topology two = load_topology("numa:2 core:2 pu:1");
  EXPECT_FALSE(two.is_this_system());
  ASSERT_EQ(two.n_nodes(), 2);
  EXPECT_EQ(two.n_cores(), 4);
  EXPECT_EQ(two.nodes()[0].cores, (std::vector<int>{0, 1}));
  EXPECT_EQ(two.nodes()[1].cores, (std::vector<int>{2, 3}));
  EXPECT_EQ(two.node_of_core(3), 1);

  const Topology four = load_topology("pack:2 numa:2 core:2 pu:2");
  ASSERT_EQ(four.n_nodes(), 4);
  EXPECT_EQ(four.n_cores(), 8);
  EXPECT_EQ(four.n_pus(), 16);
  for (int c = 0; c < 8; ++c) EXPECT_EQ(four.node_of_core(c), c / 2);
  EXPECT_NE(four.describe().find("4 NUMA nodes, 8 cores, 16 hardware threads"), std::string::npos) << four.describe();
  // nothing binds on a stand-in
  std::vector<uint8_t> buf(1 << 16, 1);
  EXPECT_FALSE(four.bind_memory(buf.data(), buf.size(), 1));
  EXPECT_FALSE(four.bind_thread_to_core(0));
}

TEST(Topology, BadSourcesAreClearErrors) {
  auto bad = Topology::load("numa:two core:1");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("synthetic description"), std::string::npos) << bad.error().message;
  const auto dir = test::scratch_dir("numa-topology");
  const auto xml = dir / "broken.xml";
  test::write_file(xml, std::vector<uint8_t>{'<', 't', 'o', 'p'});
  auto broken = Topology::load(xml.string());
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.error().message.find("XML"), std::string::npos) << broken.error().message;
}

TEST(Topology, ThisMachine) {
  const Topology t = load_topology("");
  EXPECT_TRUE(t.is_this_system());
  EXPECT_GE(t.n_nodes(), 1);
  EXPECT_GE(t.n_cores(), 1);
  size_t cores = 0;
  for (const auto& n : t.nodes()) cores += n.cores.size();
  EXPECT_EQ(int(cores), t.n_cores());  // every core on exactly one node
}

TEST(NumaLayout, ThreadsSpreadOverTheNodes) {
  const NumaLayout all = layout("numa:2 core:2 pu:1", 0);
  EXPECT_EQ(all.n_threads(), 4);
  EXPECT_EQ(all.thread_groups(), (std::vector<int>{0, 0, 1, 1}));
  for (int t = 0; t < 4; ++t) EXPECT_EQ(all.topology().node_of_core(all.core_of_thread(t)), all.node_of_group(all.group_of_thread(t)));
  EXPECT_TRUE(all.sharded());

  const NumaLayout three = layout("numa:2 core:2 pu:1", 3);
  EXPECT_EQ(three.threads_in_group(0) + three.threads_in_group(1), 3);
  EXPECT_GE(std::min(three.threads_in_group(0), three.threads_in_group(1)), 1);

  const NumaLayout one = layout("numa:2 core:2 pu:1", 1);  // fewer threads than nodes
  EXPECT_EQ(one.n_groups(), 1);
  EXPECT_FALSE(one.sharded());

  const NumaLayout many = layout("pack:2 numa:2 core:2 pu:2", 12);  // more threads than cores
  EXPECT_EQ(many.n_groups(), 4);
  for (int g = 0; g < 4; ++g) EXPECT_EQ(many.threads_in_group(g), 3);

  NumaOptions n1;
  ASSERT_TRUE(cpu::parse_numa_policy("node:1", n1).ok());
  const NumaLayout pinned = layout("numa:2 core:2 pu:1", 0, n1);
  EXPECT_EQ(pinned.n_threads(), 2);  // node 1's cores
  ASSERT_EQ(pinned.n_groups(), 1);
  EXPECT_EQ(pinned.node_of_group(0), 1);
  for (int t = 0; t < 2; ++t) EXPECT_EQ(pinned.topology().node_of_core(pinned.core_of_thread(t)), 1);

  NumaOptions n5;
  ASSERT_TRUE(cpu::parse_numa_policy("node:5", n5).ok());
  auto none = NumaLayout::make(n5, load_topology("numa:2 core:2 pu:1"), 0);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("nodes 0-1"), std::string::npos) << none.error().message;
}

TEST(NumaLayout, PolicyNames) {
  NumaOptions o;
  for (const char* bad : {"", "numa", "node:", "node:-1", "node:x", "shard "}) EXPECT_FALSE(cpu::parse_numa_policy(bad, o).ok()) << bad;
  ASSERT_TRUE(cpu::parse_numa_policy("interleave", o).ok());
  EXPECT_EQ(o.policy, NumaPolicy::interleave);
  ASSERT_TRUE(cpu::parse_numa_policy("node:1", o).ok());
  EXPECT_EQ(o.policy, NumaPolicy::node);
  EXPECT_EQ(cpu::numa_policy_name(o), "node:1");
  EXPECT_FALSE(layout("numa:2 core:2 pu:1", 0, o).sharded());
}

// Every matrix's rows are cut once: consecutive groups' ranges meet, start at 0, end at n_out, in
// whole 16-row groups, in proportion to the groups' threads.
TEST(NumaLayout, ShardRowsCoverEveryMatrixOnce) {
  for (const auto& [source, threads] : std::vector<std::pair<std::string, int>>{
           {"numa:2 core:2 pu:1", 0}, {"numa:2 core:2 pu:1", 3}, {"pack:2 numa:2 core:2 pu:2", 0}, {"pack:2 numa:2 core:2 pu:2", 5}}) {
    const NumaLayout l = layout(source, threads);
    for (int64_t n_out : {1, 16, 40, 64, 100, 768, 2048, 7168}) {
      int64_t at = 0;
      for (int g = 0; g < l.n_groups(); ++g) {
        const auto [r0, r1] = l.rows(g, n_out);
        EXPECT_EQ(r0, at) << source << " n_out " << n_out << " group " << g;
        EXPECT_LE(r0, r1);
        EXPECT_TRUE(r1 % 16 == 0 || r1 == n_out);
        at = r1;
        if (n_out >= 64 * l.n_threads()) {  // big enough: the share follows the threads, within a row group
          const double want = double(n_out) * l.threads_in_group(g) / l.n_threads();
          EXPECT_NEAR(double(r1 - r0), want, 16.0) << source << " n_out " << n_out << " group " << g;
        }
      }
      EXPECT_EQ(at, n_out) << source;
    }
  }
}

// The bytes of a stacked expert weight: every byte in exactly one range, each range the rows its
// group computes.
TEST(NumaLayout, EveryExpertByteIsOwnedOnce) {
  for (const char* source : {"numa:2 core:2 pu:1", "pack:2 numa:2 core:2 pu:2"}) {
    const NumaLayout l = layout(source, 0);
    for (const int64_t n_out : {48, 768}) {
      Weight w;
      w.type = GgmlType::q8_0;
      w.n_in = 256;
      w.n_out = n_out;
      w.n_mat = 5;
      w.row_bytes = 8 * 34;
      std::vector<uint8_t> bytes(w.mat_bytes() * size_t(w.n_mat));
      w.data = bytes.data();
      std::vector<int> owner(bytes.size(), -1);
      for (const cpu::RowRange& r : cpu::expert_row_ranges(l, w)) {
        const size_t off = size_t(r.p - bytes.data());
        ASSERT_LE(off + r.n, bytes.size());
        const size_t e = off / w.mat_bytes();
        const auto [r0, r1] = l.rows(r.group, n_out);
        EXPECT_EQ(off, e * w.mat_bytes() + size_t(r0) * w.row_bytes);
        EXPECT_EQ(r.n, size_t(r1 - r0) * w.row_bytes);
        for (size_t i = off; i < off + r.n; ++i) {
          ASSERT_EQ(owner[i], -1) << "byte " << i << " placed twice";
          owner[i] = r.group;
        }
      }
      EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0) << source << ": bytes on no node";
    }
  }
}

// A model read into RAM (and so repacked into the interleaved layout, where one exists).
std::unique_ptr<Model> load_in_ram(const std::filesystem::path& path) {
  auto m = Model::load(path.string(), MappedFile::Mode::ram);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  return m.ok() ? std::move(*m) : nullptr;
}

std::filesystem::path synth_file(const char* shape) {
  std::vector<uint8_t> bytes;
  EXPECT_TRUE(test::synth_q8_model(shape, bytes));
  const auto path = test::scratch_dir(std::string("numa-") + shape) / "model.gguf";
  test::write_file(path, bytes);
  return path;
}

// Logits of a 64-token prefill (experts with many tokens take the tiled path) and 12 decoded tokens.
std::vector<float> logits(const Model& m) {
  const std::vector<int32_t> ids = test::random_ids(76, 11, m.hparams().n_vocab);
  Session s(m, 96);
  std::vector<float> all;
  auto first = s.eval(std::span<const int32_t>(ids.data(), 64));
  EXPECT_TRUE(first.ok());
  if (first.ok()) all.insert(all.end(), first->begin(), first->end());
  for (size_t i = 64; i < ids.size(); ++i) {
    auto l = s.eval(std::span<const int32_t>(&ids[i], 1));
    EXPECT_TRUE(l.ok());
    if (l.ok()) all.insert(all.end(), l->begin(), l->end());
  }
  return all;
}

NumaOptions stand_in(const std::string& topology) {
  NumaOptions o;
  o.topology = topology;
  return o;
}

// The compute pool regrouped as 2- and 4-node stand-ins: the same logits as one node, bit for bit,
// and each group's threads read that group's share of the expert bytes.
TEST(Numa, ShardedExpertsGiveTheOneNodeLogitsBitForBit) {
  if (cpu::compute_pool_threads() == 0) cpu::set_compute_threads(4);  // room for 4 groups
  // (run alone, as ctest does, the pool has 4 threads; after other tests in one process it may
  // have fewer: then only the 2-node stand-in runs)
  const int threads = cpu::compute_pool().size();
  ASSERT_GE(threads, 2);
  std::vector<const char*> topologies = {"numa:2 core:2 pu:1"};
  if (threads >= 4) topologies.push_back("pack:2 numa:2 core:1 pu:1");
  std::vector<std::filesystem::path> models = {test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf"};
  for (const char* shape : {"tiny-deepseek2", "tiny-gpt-oss", "tiny-mixtral", "tiny-deepseek4", "tiny-deepseek41"}) models.push_back(synth_file(shape));
  for (const auto& path : models) {
    auto m = load_in_ram(path);
    ASSERT_TRUE(m);
    ASSERT_TRUE(cpu::set_numa(stand_in("core:4 pu:1")).ok());  // one node
    ASSERT_EQ(cpu::compute_pool().n_groups(), 1);
    const std::vector<float> one = logits(*m);
    for (const char* topo : topologies) {
      ASSERT_TRUE(cpu::set_numa(stand_in(topo)).ok());
      ASSERT_TRUE(cpu::numa_layout().sharded());
      ASSERT_EQ(cpu::compute_pool().n_groups(), cpu::numa_layout().n_groups());
      prof::reset();
      EXPECT_EQ(logits(*m), one) << path << " on " << topo;
      // every group's threads read expert bytes; with rows in multiples of 16 per group (the
      // qwen3moe fixture), the same share each (equal threads, equal rows)
      std::vector<int64_t> read;
      for (int g = 0; g < cpu::numa_layout().n_groups(); ++g) read.push_back(prof::g_totals.node_bytes[size_t(g)].v.load());
      const auto [lo, hi] = std::minmax_element(read.begin(), read.end());
      EXPECT_GT(*lo, 0) << topo;
      if (path == models.front()) {
        EXPECT_EQ(*lo, *hi) << path << " on " << topo;
      }
    }
  }
  ASSERT_TRUE(cpu::set_numa(NumaOptions{}).ok());
}

// On this machine: node:0 binds every page of a model read into RAM to node 0, as the kernel
// reports (policy and location). Pages never bound report no node, so the check can fail.
TEST(Numa, PagesLandOnTheirNodeOnThisMachine) {
  NumaOptions o;
  ASSERT_TRUE(cpu::parse_numa_policy("node:0", o).ok());
  const NumaLayout l = layout("", 0, o);
  ASSERT_TRUE(l.topology().is_this_system());

  const size_t n = size_t(8) << 20;
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 0x5a, n);
  EXPECT_EQ(l.topology().bound_node(p, n), -1) << "an unbound mapping reports no binding";
  cpu::PlacementStats s;
  cpu::bind_spread(l, p, n, s);
  if (s.failures > 0) {
    munmap(p, n);
    GTEST_SKIP() << "the kernel refuses mbind here (a container without CAP_SYS_NICE?): nothing can be placed";
  }
  EXPECT_EQ(l.topology().bound_node(p, n), 0);
  EXPECT_EQ(l.topology().memory_nodes(p, n), std::vector<int>{0});
  munmap(p, n);

  auto m = load_in_ram(test::data_dir() / "models" / "qwen3moe" / "model-Q4_K_M.gguf");
  ASSERT_TRUE(m);
  std::string skipped;
  const cpu::PlacementStats placed = place_in_numa(*m, l, &skipped);
  EXPECT_TRUE(skipped.empty()) << skipped;
  EXPECT_EQ(placed.failures, 0);
  const std::span<const uint8_t> all = m->file().bytes_;
  EXPECT_EQ(placed.spread_bytes, all.size());
  EXPECT_EQ(l.topology().bound_node(all.data(), all.size()), 0);
  EXPECT_EQ(l.topology().memory_nodes(all.data(), all.size()), std::vector<int>{0});

  // shard on one node places nothing and says why
  const NumaLayout flat = layout("", 0);
  if (flat.topology().n_nodes() == 1) {
    place_in_numa(*m, flat, &skipped);
    EXPECT_NE(skipped.find("one NUMA node"), std::string::npos) << skipped;
  }
}

// The placement comparison: routing that a whole-expert placement can balance exactly (every
// token uses one expert of each pair, and the pairs split over the nodes) costs 1.00x; routing
// whose experts of a token sit on one node costs n_nodes x; shard is 1.00x whenever every node's
// rows are whole 16-row groups of an equal share, and more when they cannot be.
TEST(NumaPlan, WholeExpertsAgainstShard) {
  // 4 experts, top-2: tokens use {0, 1} and {2, 3} in turn; the first half fixes the placement
  std::vector<std::vector<int32_t>> ids(1);
  for (int t = 0; t < 200; ++t) {
    ids[0].push_back(t % 2 == 0 ? 0 : 2);
    ids[0].push_back(t % 2 == 0 ? 1 : 3);
  }
  const NumaPlacementFigures f = compare_numa_placements(ids, 2, 4, 2, 768);
  EXPECT_EQ(f.steps, 100);
  EXPECT_DOUBLE_EQ(f.whole_decode, 1.0);  // 0 and 1 on different nodes (their loads tie), as 2 and 3
  EXPECT_DOUBLE_EQ(f.shard, 1.0);
  // one expert a token over 2 nodes: each step reads from one node only
  std::vector<std::vector<int32_t>> single(1);
  for (int t = 0; t < 200; ++t) single[0].push_back(t % 4);
  EXPECT_DOUBLE_EQ(compare_numa_placements(single, 1, 4, 2, 768).whole_decode, 2.0);
  // 48 rows over 2 nodes: 16-row groups give 32 and 16, the busier node has 2/3 of the rows
  EXPECT_DOUBLE_EQ(compare_numa_placements(ids, 2, 4, 2, 48).shard, 64.0 / 48.0);
}

}  // namespace
}  // namespace strata
