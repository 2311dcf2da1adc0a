// strata bench --speculative: the cost curve of speculative decoding's verification step
// (docs/speculative.md).
#pragma once

#include "cli/common.h"
#include "storage/expert_store.h"

namespace strata::cli {

struct SpeculativeBenchOptions {
  int depth = 64;     // tokens of context before the steps
  int steps = 16;     // steps timed per k
  int max_k = 8;      // drafted tokens: 0 (a plain decode step) .. max_k
  int gen_tokens = 128;  // end to end: tokens generated plain and with the n-gram drafter (0: skip)
  bool json = false;
  double nvme_probe_gbps = 0;  // the disk's measured rate (streamed experts), 0: all in RAM
};

// Times a verification step of k drafted tokens (one eval of k + 1 tokens, rewound to one kept
// token so the context stays put) for k = 0 .. max_k; prints, per k, the step time against a
// plain step, the routed experts the step computed (against independent routing's expectation),
// its bytes and its bounds (the bytes over the measured DRAM rate, the multiply-adds over the
// measured int8 peak, the experts read from disk over the disk's rate: the roofline is the largest); then, per acceptance rate, the best k and the
// speed-up it gives; then generation end to end with the n-gram drafter against plain decoding,
// greedy and at temperature 1. Routing is whatever the engine's routing_override (--routing) makes it.
int bench_speculative(const Engine& engine, const SpeculativeBenchOptions& o);

}  // namespace strata::cli
