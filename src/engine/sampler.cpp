#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "base/profiler.h"
#include "engine/session.h"

namespace strata {

int32_t Sampler::distribution(std::span<const float> logits, std::span<const int32_t> history, size_t& keep,
                              double& total) {
  if (p_.repeat_penalty != 1.0f && !history.empty() && p_.penalty_last_n != 0) {
    penalized_.assign(logits.begin(), logits.end());
    const size_t n = p_.penalty_last_n < 0 ? history.size()
                                           : std::min(history.size(), size_t(p_.penalty_last_n));
    std::vector<int32_t> seen(history.end() - long(n), history.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t id : seen) {
      if (id < 0 || size_t(id) >= penalized_.size()) continue;
      float& l = penalized_[size_t(id)];
      l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
    }
    logits = penalized_;
  }
  if (p_.temperature <= 0.0f) return argmax(logits);
  const int n = int(logits.size());
  cand_.resize(size_t(n));
  for (int i = 0; i < n; ++i) cand_[size_t(i)] = {logits[size_t(i)], i};
  const int k = p_.top_k > 0 ? std::min(p_.top_k, n) : n;
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(), by_logit);
  cand_.resize(size_t(k));
  // softmax at temperature over the top k
  const float mx = cand_[0].first;
  double sum = 0;
  for (auto& c : cand_) {
    c.first = std::exp((c.first - mx) / p_.temperature);
    sum += c.first;
  }
  // nucleus: the smallest prefix whose probability reaches top_p
  keep = cand_.size();
  if (p_.top_p < 1.0f) {
    double acc = 0;
    for (size_t i = 0; i < cand_.size(); ++i) {
      acc += cand_[i].first / sum;
      if (acc >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p_.min_p > 0.0f) {
    const double floor = p_.min_p * cand_[0].first;  // cand_ is sorted: [0] is the most likely
    size_t k_min = 1;
    while (k_min < keep && cand_[k_min].first >= floor) ++k_min;
    keep = k_min;
  }
  total = 0;
  for (size_t i = 0; i < keep; ++i) total += cand_[i].first;
  return -1;
}

int32_t Sampler::draw(size_t keep, double total, int32_t skip) {
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double acc = 0;
  size_t last = keep;
  for (size_t i = 0; i < keep; ++i) {
    if (cand_[i].second == skip) continue;
    acc += cand_[i].first;
    last = i;
    if (u < acc) return cand_[i].second;
  }
  STRATA_CHECK(last < keep, "sampler: nothing to draw");
  return cand_[last].second;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  prof::Span span(prof::Part::sample);
  size_t keep = 0;
  double total = 0;
  if (const int32_t greedy = distribution(logits, history, keep, total); greedy >= 0) return greedy;
  return draw(keep, total, -1);
}

int32_t Sampler::verify(std::span<const float> logits, std::span<const int32_t> history, int32_t draft,
                        bool& accepted) {
  prof::Span span(prof::Part::sample);
  size_t keep = 0;
  double total = 0;
  if (const int32_t greedy = distribution(logits, history, keep, total); greedy >= 0) {
    accepted = greedy == draft;
    return greedy;
  }
  double p_draft = 0;
  for (size_t i = 0; i < keep; ++i)
    if (cand_[i].second == draft) p_draft = cand_[i].first;
  accepted = p_draft > 0 && std::uniform_real_distribution<double>(0.0, total)(rng_) < p_draft;
  if (accepted) return draft;
  return draw(keep, total - p_draft, p_draft > 0 ? draft : -1);
}

}  // namespace strata
