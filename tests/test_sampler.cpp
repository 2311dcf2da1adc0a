#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "engine/sampler.h"
#include "engine/session.h"

namespace strata {
namespace {

TEST(Sampler, GreedyTakesArgmaxLowestIdOnTies) {
  Sampler s({.temperature = 0});
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(l), 1);
}

// argmax against the one-pass definition (the first index of the largest value) on random rows of
// every length mod 8, with ties, NaN (never wins) and all -inf (index 0).
TEST(Sampler, ArgmaxMatchesFirstLargest) {
  std::mt19937 rng(std::random_device{}());
  for (int n = 1; n < 40; ++n) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = float(int(rng() % 7)) - 3.0f;  // few values: many ties
      if (rep % 5 == 0) v[rng() % v.size()] = NAN;
      int32_t want = -1;
      for (int i = 0; i < n; ++i)
        if (!std::isnan(v[size_t(i)]) && (want < 0 || v[size_t(i)] > v[size_t(want)])) want = i;
      EXPECT_EQ(argmax(v), want < 0 ? 0 : want) << "n " << n;
    }
  }
  EXPECT_EQ(argmax(std::vector<float>(9, -INFINITY)), 0);
  EXPECT_EQ(argmax(std::vector<float>{}), 0);
}

TEST(Sampler, SameSeedSameDraws) {
  std::vector<float> l(100);
  for (int i = 0; i < 100; ++i) l[size_t(i)] = std::sin(float(i));
  Sampler a({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0, .seed = 42});
  Sampler b({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0, .seed = 42});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(l), b.sample(l));
}

// Draw frequencies follow softmax(logits / T) within a binomial tolerance (5 sigma).
TEST(Sampler, TemperatureDistribution) {
  std::vector<float> l = {1.0f, 0.0f, -1.0f, 0.5f};
  const float T = 0.7f;
  Sampler s({.temperature = T, .top_k = 0, .top_p = 1.0f, .min_p = 0, .seed = 7});
  const int n = 20000;
  std::map<int, int> count;
  for (int i = 0; i < n; ++i) ++count[s.sample(l)];
  double z = 0;
  for (float v : l) z += std::exp(v / T);
  for (int i = 0; i < 4; ++i) {
    const double p = std::exp(l[size_t(i)] / T) / z;
    const double sigma = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(count[i], n * p, 5 * sigma) << i;
  }
}

TEST(Sampler, TopKTopPMinPCut) {
  std::vector<float> l = {5.0f, 4.9f, 0.0f, -3.0f};
  Sampler k1({.temperature = 1.0f, .top_k = 1, .top_p = 1.0f, .min_p = 0, .seed = 1});
  for (int i = 0; i < 100; ++i) EXPECT_EQ(k1.sample(l), 0);
  // the two top tokens hold > 99% of the mass: top-p 0.9 keeps only them
  Sampler p({.temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .min_p = 0, .seed = 1});
  for (int i = 0; i < 500; ++i) EXPECT_LT(p.sample(l), 2);
  // min-p 0.5: token 1 (p ratio 0.9) survives, token 2 (ratio e^-5) does not
  Sampler m({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.5f, .seed = 1});
  std::map<int, int> c;
  for (int i = 0; i < 500; ++i) ++c[m.sample(l)];
  EXPECT_GT(c[1], 0);
  EXPECT_EQ(c[2] + c[3], 0);
}

TEST(Sampler, RepetitionPenalty) {
  std::vector<float> l = {2.0f, 1.5f, -1.0f};
  Sampler s({.temperature = 0, .repeat_penalty = 1.5f});
  const int32_t hist[] = {0};
  EXPECT_EQ(s.sample(l), 0);
  EXPECT_EQ(s.sample(l, hist), 1);  // 2.0 / 1.5 < 1.5
}

}  // namespace
}  // namespace strata
