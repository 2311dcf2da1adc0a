// strata bench --routing: traces replayed as the routers' choices (engine/trace_routing.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "engine/trace_routing.h"

namespace strata {
namespace {

HParams shape(int n_layer, int n_expert, int k) {
  HParams hp;
  hp.n_layer = n_layer;
  hp.n_expert = n_expert;
  hp.n_expert_used = k;
  return hp;
}

// A trace of 3 layers, 8 experts, top-2, 5 tokens, token-major, with distinct experts per step.
RoutingTrace small_trace() {
  RoutingTrace t;
  t.source = "test";
  t.n_layer = 3;
  t.n_expert = 8;
  t.top_k = 2;
  for (int tok = 0; tok < 5; ++tok)
    for (int l = 0; l < 3; ++l) {
      t.steps.push_back({l, tok, uint32_t(t.experts.size()), 2});
      t.experts.push_back((tok + l) % 8);
      t.experts.push_back((tok + l + 3) % 8);
    }
  return t;
}

TEST(TraceRouting, SameShapeReplaysTheTraceAndPeekMatchesChoose) {
  auto r = TraceRouting::make(small_trace(), shape(3, 8, 2));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)->n_tokens(), 5);
  for (int tok = 0; tok < 7; ++tok) {  // wraps after 5 tokens
    for (int l = 0; l < 3; ++l) {
      const std::vector<int32_t> ahead = (*r)->peek(l, 1);
      Routing routing{2, std::vector<int32_t>(2, -1), std::vector<float>(2, 0.5f)};
      (*r)->choose(l, 1, routing);
      EXPECT_EQ(routing.ids, (std::vector<int32_t>{(tok % 5 + l) % 8, (tok % 5 + l + 3) % 8}));
      EXPECT_EQ(ahead, routing.ids);
      EXPECT_EQ(routing.weights, std::vector<float>(2, 0.5f));  // the router's stay
    }
  }
}

TEST(TraceRouting, MapsEightTopTwoOntoOneHundredTwentyEightTopEight) {
  const RoutingTrace t = small_trace();
  auto r = TraceRouting::make(t, shape(7, 128, 8));
  ASSERT_TRUE(r.ok()) << r.error().message;
  for (int l = 0; l < 7; ++l) {
    Routing routing{8, std::vector<int32_t>(8, -1), std::vector<float>(8, 0.0f)};
    (*r)->choose(l, 1, routing);
    const std::set<int32_t> distinct(routing.ids.begin(), routing.ids.end());
    EXPECT_EQ(distinct.size(), 8u);
    // each model expert lies in the group of 16 of a trace expert of that step
    const std::span<const int32_t> src = t.experts_of(t.steps[size_t(l % 3)]);
    for (int32_t e : routing.ids) {
      ASSERT_GE(e, 0);
      ASSERT_LT(e, 128);
      EXPECT_TRUE(std::find(src.begin(), src.end(), e / 16) != src.end()) << "layer " << l << " expert " << e;
    }
  }
}

TEST(TraceRouting, ErrorsAndModes) {
  EXPECT_FALSE(TraceRouting::make(small_trace(), shape(3, 12, 3)).ok());  // 12 % 8 != 0
  auto none = make_routing_override("model", shape(4, 16, 4));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->get(), nullptr);
  auto synth = make_routing_override("synthetic:0.8,0.15,0.05", shape(4, 16, 4));
  ASSERT_TRUE(synth.ok()) << synth.error().message;
  EXPECT_EQ((*synth)->n_tokens(), 4096);
  for (const char* bad : {"synthetic:0.8", "synthetic:a,b,c", "trace:/nonexistent.jsonl", "routers"}) {
    auto r = make_routing_override(bad, shape(4, 16, 4));
    EXPECT_FALSE(r.ok()) << bad;
  }
}

}  // namespace
}  // namespace strata
