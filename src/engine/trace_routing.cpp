#include "engine/trace_routing.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "base/hash.h"

namespace strata {

Result<std::unique_ptr<TraceRouting>> TraceRouting::make(const RoutingTrace& trace, const HParams& hp) {
  const int L = hp.n_layer, E = hp.n_expert, K = hp.n_expert_used;
  if (E <= 0 || K <= 0) return Error{"routing override: the model has no routed experts"};
  if (trace.n_layer <= 0 || trace.n_expert <= 0 || trace.top_k <= 0)
    return Error{"routing override: the trace " + trace.source + " is empty"};
  const bool same = trace.n_expert == E && trace.top_k == K;
  const int group = E / trace.n_expert, per = K / trace.top_k;
  if (!same && (E % trace.n_expert != 0 || K % trace.top_k != 0 || per > group)) {
    return Error{strfmt("routing override: a trace of %d experts, top-%d, does not map onto %d experts, top-%d",
                        trace.n_expert, trace.top_k, E, K)};
  }
  // each trace layer's records in order
  std::vector<std::vector<const RoutingStep*>> by_layer(size_t(trace.n_layer));
  for (const RoutingStep& s : trace.steps) {
    if (int(s.count) != trace.top_k)
      return Error{strfmt("routing override: %s has a step with %u experts, not %d", trace.source.c_str(), s.count, trace.top_k)};
    by_layer[size_t(s.layer)].push_back(&s);
  }
  size_t n_tok = SIZE_MAX;
  for (const auto& v : by_layer) n_tok = std::min(n_tok, v.size());
  if (n_tok == 0 || n_tok == SIZE_MAX) return Error{"routing override: " + trace.source + " has a layer without tokens"};

  auto out = std::make_unique<TraceRouting>();
  out->n_tokens_ = int64_t(n_tok);
  out->n_layer_ = L;
  out->k_ = K;
  out->pos_.assign(size_t(L), 0);
  out->ids_.resize(n_tok * size_t(L) * size_t(K));
  for (size_t t = 0; t < n_tok; ++t) {
    for (int l = 0; l < L; ++l) {
      const RoutingStep& s = *by_layer[size_t(l % trace.n_layer)][t];
      const std::span<const int32_t> src = trace.experts_of(s);
      int32_t* dst = &out->ids_[(t * size_t(L) + size_t(l)) * size_t(K)];
      if (same) {
        std::copy(src.begin(), src.end(), dst);
        continue;
      }
      // which `per` of the group: a window at a position hashed from (token, model layer, trace
      // expert), so the model's experts are all used while the groups keep the trace's skew
      for (size_t j = 0; j < src.size(); ++j) {
        const uint64_t h = splitmix64(splitmix64(splitmix64(uint64_t(t)) + uint64_t(l)) + uint64_t(src[j]));
        const int start = int(h % uint64_t(group));
        for (int i = 0; i < per; ++i) dst[j * size_t(per) + size_t(i)] = src[j] * group + (start + i) % group;
      }
    }
  }
  return out;
}

void TraceRouting::choose(int il, int64_t n_tok, Routing& r) {
  STRATA_CHECK(r.k == k_ && il >= 0 && il < n_layer_ && r.ids.size() == size_t(n_tok * k_));
  for (int64_t t = 0; t < n_tok; ++t) std::copy_n(token(il, pos_[size_t(il)] + t), k_, &r.ids[size_t(t * k_)]);
  pos_[size_t(il)] += n_tok;
}

std::vector<int32_t> TraceRouting::peek(int il, int64_t n_tok) const {
  std::vector<int32_t> ids(size_t(n_tok * k_));
  for (int64_t t = 0; t < n_tok; ++t) std::copy_n(token(il, pos_[size_t(il)] + t), k_, &ids[size_t(t * k_)]);
  return experts_by_rank(ids, n_tok, k_);  // the order the look-ahead gives the routers' picks
}

Result<std::unique_ptr<TraceRouting>> make_routing_override(const std::string& mode, const HParams& hp) {
  if (mode == "model") return std::unique_ptr<TraceRouting>();
  if (mode.rfind("trace:", 0) == 0) {
    auto trace = read_routing_trace(mode.substr(6));
    if (!trace) return trace.error();
    return TraceRouting::make(token_major_order(*trace), hp);
  }
  if (mode == "synthetic" || mode.rfind("synthetic:", 0) == 0) {
    SyntheticTraceParams p;
    p.n_layer = hp.n_layer;
    p.n_expert = hp.n_expert;
    p.top_k = hp.n_expert_used;
    p.n_tokens = 4096;
    if (mode.size() > 10) {
      std::istringstream in(mode.substr(10));
      char c1 = 0, c2 = 0;
      if (!(in >> p.zipf_s >> c1 >> p.repeat >> c2 >> p.drift) || c1 != ',' || c2 != ',' || !in.eof())
        return Error{"--routing " + mode + ": expected synthetic:ZIPF,REPEAT,DRIFT (e.g. synthetic:0.8,0.15,0.05)"};
    }
    auto trace = synthetic_routing_trace(p);
    if (!trace) return Error{"--routing " + mode + ": " + trace.error().message};
    return TraceRouting::make(*trace, hp);
  }
  return Error{"--routing " + mode + ": expected model, trace:FILE or synthetic[:ZIPF,REPEAT,DRIFT]"};
}

}  // namespace strata
