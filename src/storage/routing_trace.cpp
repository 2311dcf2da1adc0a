#include "storage/routing_trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace strata {
namespace {

using json = nlohmann::json;

// The non-negative integer field `key` of one record, below `limit`; `where` is "FILE:LINE".
Result<int64_t> read_index(const json& j, const char* key, int64_t limit, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) return Error{strfmt("%s: missing field \"%s\"", where.c_str(), key)};
  if (!it->is_number_integer())
    return Error{strfmt("%s: \"%s\" is %s, expected an integer", where.c_str(), key,
                        it->type_name())};
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (u >= uint64_t(limit))
      return Error{strfmt("%s: \"%s\" is %llu, above the limit of %lld", where.c_str(), key,
                          (unsigned long long)u, (long long)limit - 1)};
    return int64_t(u);
  }
  const int64_t v = it->get<int64_t>();
  if (v < 0) return Error{strfmt("%s: \"%s\" is %lld, must be >= 0", where.c_str(), key, (long long)v)};
  if (v >= limit)
    return Error{strfmt("%s: \"%s\" is %lld, above the limit of %lld", where.c_str(), key,
                        (long long)v, (long long)limit - 1)};
  return v;
}

// Parses one non-blank line into `trace`.
Status parse_line(std::string_view line, const std::string& where, RoutingTrace& trace) {
  json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Error{where + ": malformed JSON"};
  if (!j.is_object()) return Error{strfmt("%s: expected a JSON object, got %s", where.c_str(), j.type_name())};

  auto layer = read_index(j, "layer", kMaxTraceLayers, where);
  if (!layer) return layer.error();
  auto pos = read_index(j, "token_pos", int64_t(INT32_MAX) + 1, where);
  if (!pos) return pos.error();

  auto it = j.find("experts");
  if (it == j.end()) return Error{where + ": missing field \"experts\""};
  if (!it->is_array() || it->empty())
    return Error{strfmt("%s: \"experts\" is %s, expected a non-empty array of expert ids",
                        where.c_str(), it->is_array() ? "an empty array" : it->type_name())};
  RoutingStep step{.layer = int32_t(*layer), .token_pos = int32_t(*pos),
                   .first = uint32_t(trace.experts.size()), .count = uint32_t(it->size())};
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string what = strfmt("%s: \"experts\"[%zu]", where.c_str(), i);
    if (!e.is_number_integer())
      return Error{strfmt("%s is %s, expected an integer", what.c_str(), e.type_name())};
    if (!e.is_number_unsigned() && e.get<int64_t>() < 0)
      return Error{strfmt("%s is %lld, must be >= 0", what.c_str(), (long long)e.get<int64_t>())};
    const uint64_t id = e.get<uint64_t>();
    if (id >= uint64_t(kMaxTraceExperts))
      return Error{strfmt("%s is %llu, above the limit of %d", what.c_str(), (unsigned long long)id,
                          kMaxTraceExperts - 1)};
    for (uint32_t k = step.first; k < trace.experts.size(); ++k) {
      if (trace.experts[k] == int32_t(id))
        return Error{strfmt("%s: expert %llu listed twice", where.c_str(), (unsigned long long)id)};
    }
    trace.experts.push_back(int32_t(id));
    trace.n_expert = std::max(trace.n_expert, int32_t(id) + 1);
  }
  trace.n_layer = std::max(trace.n_layer, step.layer + 1);
  trace.top_k = std::max(trace.top_k, int32_t(step.count));
  trace.steps.push_back(step);
  return {};
}

// splitmix64: a small, seeded, platform-independent generator (the standard distributions are not
// reproducible across library versions).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint32_t below(uint32_t n) { return uint32_t((next() >> 32) * n >> 32); }
};

}  // namespace

Result<RoutingTrace> parse_routing_trace(const std::string& text, const std::string& name) {
  RoutingTrace trace;
  trace.source = name;
  size_t begin = 0;
  int64_t line_no = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    if (trace.steps.size() >= UINT32_MAX || trace.experts.size() + 1024 >= UINT32_MAX)
      return Error{strfmt("%s:%lld: trace too long (more than 4 billion records)", name.c_str(),
                          (long long)line_no)};
    STRATA_TRY(parse_line(line, strfmt("%s:%lld", name.c_str(), (long long)line_no), trace));
  }
  if (trace.steps.empty()) return Error{name + ": no routing records"};
  return trace;
}

Result<RoutingTrace> read_routing_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{"cannot open routing trace " + path};
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Error{"cannot read routing trace " + path};
  return parse_routing_trace(text.str(), path);
}

RoutingTrace token_major_order(const RoutingTrace& trace) {
  std::vector<std::vector<uint32_t>> by_layer(size_t(trace.n_layer));  // step indices per layer
  for (uint32_t i = 0; i < trace.steps.size(); ++i) by_layer[size_t(trace.steps[i].layer)].push_back(i);
  size_t n_tokens = 0;
  for (const auto& l : by_layer) n_tokens = std::max(n_tokens, l.size());

  RoutingTrace out;
  out.source = trace.source + " (token-major)";
  out.n_layer = trace.n_layer;
  out.n_expert = trace.n_expert;
  out.top_k = trace.top_k;
  out.steps.reserve(trace.steps.size());
  out.experts.reserve(trace.experts.size());
  for (size_t t = 0; t < n_tokens; ++t) {
    for (const auto& l : by_layer) {
      if (t >= l.size()) continue;
      RoutingStep s = trace.steps[l[t]];
      const auto ex = trace.experts_of(s);
      s.first = uint32_t(out.experts.size());
      out.experts.insert(out.experts.end(), ex.begin(), ex.end());
      out.steps.push_back(s);
    }
  }
  return out;
}

Result<RoutingTrace> synthetic_routing_trace(const SyntheticTraceParams& p) {
  if (p.n_layer < 1 || p.n_layer > kMaxTraceLayers || p.n_expert < 1 ||
      p.n_expert > kMaxTraceExperts || p.top_k < 1 || p.top_k > p.n_expert || p.n_tokens < 1)
    return Error{strfmt("synthetic trace: bad shape %d layers x %d experts, top-%d, %lld tokens "
                        "(need 1 <= top_k <= n_expert <= %d, 1 <= n_layer <= %d, n_tokens >= 1)",
                        p.n_layer, p.n_expert, p.top_k, (long long)p.n_tokens, kMaxTraceExperts,
                        kMaxTraceLayers)};
  if (!(p.repeat >= 0.0 && p.repeat <= 1.0))
    return Error{strfmt("synthetic trace: repeat probability %g outside [0, 1]", p.repeat)};
  if (!(p.drift >= 0.0 && p.drift <= 1.0))
    return Error{strfmt("synthetic trace: drift %g outside [0, 1]", p.drift)};
  if (!(p.zipf_s >= 0.0 && p.zipf_s <= 8.0))
    return Error{strfmt("synthetic trace: zipf exponent %g outside [0, 8]", p.zipf_s)};
  const uint64_t n_access = uint64_t(p.n_tokens) * uint64_t(p.n_layer) * uint64_t(p.top_k);
  if (uint64_t(p.n_tokens) * uint64_t(p.n_layer) >= UINT32_MAX || n_access >= UINT32_MAX)
    return Error{strfmt("synthetic trace: %lld tokens x %d layers x top-%d is more than 4 billion "
                        "accesses", (long long)p.n_tokens, p.n_layer, p.top_k)};

  RoutingTrace trace;
  trace.source = strfmt("synthetic %dx%d top-%d, %lld tokens, zipf %g, repeat %g, drift %g, seed %llu",
                        p.n_layer, p.n_expert, p.top_k, (long long)p.n_tokens, p.zipf_s, p.repeat,
                        p.drift, (unsigned long long)p.seed);
  trace.n_layer = p.n_layer;
  trace.n_expert = p.n_expert;
  trace.top_k = p.top_k;
  trace.steps.reserve(size_t(p.n_tokens) * size_t(p.n_layer));
  trace.experts.reserve(size_t(n_access));

  Rng rng{p.seed * 0x2545F4914F6CDD1Dull + 1};
  // Popularity by rank: cdf[r] = P(rank <= r).
  std::vector<double> cdf(size_t(p.n_expert));
  double sum = 0;
  for (int32_t r = 0; r < p.n_expert; ++r) cdf[size_t(r)] = sum += std::pow(double(r + 1), -p.zipf_s);
  for (double& c : cdf) c /= sum;
  // Each layer's expert of rank r: a seeded permutation.
  std::vector<std::vector<int32_t>> by_rank(size_t(p.n_layer), std::vector<int32_t>(size_t(p.n_expert)));
  for (auto& perm : by_rank) {
    for (int32_t e = 0; e < p.n_expert; ++e) perm[size_t(e)] = e;
    for (int32_t e = p.n_expert - 1; e > 0; --e) std::swap(perm[size_t(e)], perm[rng.below(uint32_t(e) + 1)]);
  }
  std::vector<int32_t> previous(size_t(p.n_layer) * size_t(p.top_k), -1);  // [layer][top_k]
  std::vector<uint8_t> chosen(size_t(p.n_expert), 0);
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    for (int32_t l = 0; l < p.n_layer; ++l) {
      std::vector<int32_t>& rank = by_rank[size_t(l)];
      if (t > 0 && p.drift > 0 && p.n_expert > 1) {
        const double mean = p.drift * p.n_expert / 2, whole = std::floor(mean);
        const int64_t swaps = int64_t(whole) + (rng.uniform() < mean - whole ? 1 : 0);
        for (int64_t i = 0; i < swaps; ++i)
          std::swap(rank[rng.below(uint32_t(p.n_expert))], rank[rng.below(uint32_t(p.n_expert))]);
      }
      RoutingStep s{.layer = l, .token_pos = int32_t(std::min<int64_t>(t, INT32_MAX)),
                    .first = uint32_t(trace.experts.size()), .count = uint32_t(p.top_k)};
      int32_t* prev = previous.data() + size_t(l) * size_t(p.top_k);
      for (int32_t k = 0; k < p.top_k; ++k) {
        int32_t e = -1;
        if (prev[0] >= 0 && p.repeat > 0 && rng.uniform() < p.repeat) {
          // Repeat one of the previous token's experts not chosen yet (there is one: the previous
          // step had top_k distinct experts and this one has fewer than top_k so far).
          do e = prev[rng.below(uint32_t(p.top_k))];
          while (chosen[size_t(e)]);
        } else {
          for (int tries = 0; tries < 32; ++tries) {  // rejection: cheap while the hot ones are free
            const double u = rng.uniform();
            const size_t r = size_t(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
            e = rank[std::min(r, size_t(p.n_expert) - 1)];
            if (!chosen[size_t(e)]) break;
            e = -1;
          }
          if (e < 0) {  // very skewed: draw exactly among the experts still free
            double free_mass = 0;
            for (int32_t r = 0; r < p.n_expert; ++r)
              if (!chosen[size_t(rank[size_t(r)])]) free_mass += cdf[size_t(r)] - (r ? cdf[size_t(r) - 1] : 0.0);
            double u = rng.uniform() * free_mass;
            for (int32_t r = 0; r < p.n_expert; ++r) {
              if (chosen[size_t(rank[size_t(r)])]) continue;
              e = rank[size_t(r)];
              u -= cdf[size_t(r)] - (r ? cdf[size_t(r) - 1] : 0.0);
              if (u < 0) break;
            }
          }
        }
        chosen[size_t(e)] = 1;
        trace.experts.push_back(e);
      }
      for (int32_t k = 0; k < p.top_k; ++k) {
        prev[k] = trace.experts[s.first + uint32_t(k)];
        chosen[size_t(prev[k])] = 0;
      }
      trace.steps.push_back(s);
    }
  }
  return trace;
}

}  // namespace strata
