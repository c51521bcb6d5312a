// Sampling: the distribution a draw uses against a float64 reference written here, the draws'
// frequencies against that distribution, determinism, logprobs, and argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "dcp/error.h"
#include "dcp/sampling.h"
#include "test_util.h"

namespace dcp {
namespace {

// The reference: softmax(logits / T); keep the top_k most likely (ties by lower id); of those,
// the shortest most-likely prefix whose mass reaches top_p; of those, every token whose
// probability is at least min_p times the largest. Renormalised.
std::vector<double> reference_distribution(const std::vector<float>& logits,
                                           const SamplingParams& p) {
  const int n = static_cast<int>(logits.size());
  std::vector<int> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<double> prob(static_cast<std::size_t>(n), 0.0);
  if (p.temperature == 0) {
    prob[static_cast<std::size_t>(order[0])] = 1;
    return prob;
  }
  double z = 0;
  for (int i = 0; i < n; ++i) {
    prob[static_cast<std::size_t>(i)] = std::exp(static_cast<double>(logits[i]) / p.temperature);
    z += prob[static_cast<std::size_t>(i)];
  }
  for (double& x : prob) x /= z;
  std::vector<bool> keep(static_cast<std::size_t>(n), true);
  const int k = p.top_k > 0 ? std::min(p.top_k, n) : n;
  for (int r = k; r < n; ++r) keep[static_cast<std::size_t>(order[r])] = false;
  double kept_mass = 0;
  for (int r = 0; r < k; ++r) kept_mass += prob[static_cast<std::size_t>(order[r])];
  double mass = 0;
  for (int r = 0; r < k; ++r) {
    if (r > 0 && mass >= p.top_p * kept_mass) keep[static_cast<std::size_t>(order[r])] = false;
    mass += prob[static_cast<std::size_t>(order[r])];
  }
  const double top = prob[static_cast<std::size_t>(order[0])];
  for (int i = 0; i < n; ++i) {
    if (prob[static_cast<std::size_t>(i)] < p.min_p * top)
      keep[static_cast<std::size_t>(i)] = false;
  }
  double total = 0;
  for (int i = 0; i < n; ++i)
    total += keep[static_cast<std::size_t>(i)] ? prob[static_cast<std::size_t>(i)] : 0;
  for (int i = 0; i < n; ++i)
    prob[static_cast<std::size_t>(i)] =
        keep[static_cast<std::size_t>(i)] ? prob[static_cast<std::size_t>(i)] / total : 0;
  return prob;
}

std::vector<float> random_logits(test::Rng& rng, int n, float scale) {
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) v = rng.normal(scale);
  return x;
}

std::vector<SamplingParams> parameter_grid() {
  std::vector<SamplingParams> grid;
  for (double t : {0.0, 0.3, 1.0, 1.7}) {
    for (int k : {0, 1, 5, 40}) {
      for (double top_p : {1.0, 0.9, 0.5}) {
        for (double min_p : {0.0, 0.05, 0.3}) grid.push_back({t, top_p, k, min_p, 7});
      }
    }
  }
  return grid;
}

TEST(Sampling, DistributionEqualsTheFloat64Reference) {
  auto rng = test::make_rng();
  for (int vocab : {1, 2, 7, 100, 1000}) {
    const std::vector<float> logits = random_logits(rng, vocab, 2.0f);
    for (const SamplingParams& p : parameter_grid()) {
      const std::vector<double> want = reference_distribution(logits, p);
      const std::vector<double> got = sampling_distribution(logits.data(), vocab, p);
      for (int i = 0; i < vocab; ++i) {
        ASSERT_NEAR(got[static_cast<std::size_t>(i)], want[static_cast<std::size_t>(i)], 1e-12)
            << "vocab " << vocab << " token " << i << " T " << p.temperature << " k " << p.top_k
            << " p " << p.top_p << " min_p " << p.min_p;
      }
    }
  }
}

TEST(Sampling, DrawsFollowTheDistributionAndNeverPickATruncatedToken) {
  auto rng = test::make_rng();
  const int vocab = 12;
  const std::vector<float> logits = random_logits(rng, vocab, 1.0f);
  for (const SamplingParams& base :
       {SamplingParams{1.0, 1.0, 0, 0.0, 0}, SamplingParams{0.7, 0.8, 0, 0.0, 0},
        SamplingParams{1.3, 1.0, 4, 0.0, 0}, SamplingParams{1.0, 1.0, 0, 0.2, 0}}) {
    SamplingParams p = base;
    p.seed = test::test_seed();
    const std::vector<double> want = reference_distribution(logits, p);
    const int draws = 40000;
    std::vector<int> count(static_cast<std::size_t>(vocab), 0);
    for (int s = 0; s < draws; ++s)
      ++count[static_cast<std::size_t>(
          sample_token(logits.data(), vocab, p, static_cast<std::uint64_t>(s)))];
    for (int i = 0; i < vocab; ++i) {
      const double q = want[static_cast<std::size_t>(i)];
      if (q == 0) {
        EXPECT_EQ(count[static_cast<std::size_t>(i)], 0) << "token " << i << " was truncated";
        continue;
      }
      const double sigma = std::sqrt(draws * q * (1 - q));
      EXPECT_NEAR(count[static_cast<std::size_t>(i)], draws * q, 5 * sigma + 1)
          << "token " << i << " T " << p.temperature << " k " << p.top_k << " p " << p.top_p;
    }
  }
}

TEST(Sampling, GreedyIsTheFirstMaximumAndDrawsAreDeterministic) {
  const std::vector<float> tie = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(sample_token(tie.data(), 4, SamplingParams{}, 0), 1);
  auto rng = test::make_rng();
  const std::vector<float> logits = random_logits(rng, 500, 1.0f);
  SamplingParams p{1.0, 0.95, 0, 0.0, 42};
  std::vector<std::int32_t> a, b, c;
  for (std::uint64_t s = 0; s < 64; ++s) {
    a.push_back(sample_token(logits.data(), 500, p, s));
    b.push_back(sample_token(logits.data(), 500, p, s));
  }
  p.seed = 43;
  for (std::uint64_t s = 0; s < 64; ++s) c.push_back(sample_token(logits.data(), 500, p, s));
  EXPECT_EQ(a, b) << "same seed and step must draw the same token";
  EXPECT_NE(a, c) << "another seed should draw another sequence";
}

TEST(Sampling, LogprobsAreTheFloat64LogSoftmax) {
  auto rng = test::make_rng();
  const int vocab = 300;
  const std::vector<float> logits = random_logits(rng, vocab, 3.0f);
  double m = *std::max_element(logits.begin(), logits.end()), z = 0;
  for (float x : logits) z += std::exp(x - m);
  const double lse = m + std::log(z);
  const StepLogprobs lp = step_logprobs(logits.data(), vocab, 17, 5);
  EXPECT_EQ(lp.chosen.token, 17);
  EXPECT_NEAR(lp.chosen.logprob, logits[17] - lse, 1e-5);
  ASSERT_EQ(lp.top.size(), 5u);
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(lp.top[static_cast<std::size_t>(i)].token, order[static_cast<std::size_t>(i)]);
    EXPECT_NEAR(lp.top[static_cast<std::size_t>(i)].logprob, logits[order[i]] - lse, 1e-5);
  }
  EXPECT_TRUE(step_logprobs(logits.data(), vocab, 0, 0).top.empty());
}

TEST(Sampling, RefusesParametersOutsideTheirRanges) {
  const auto refused = [](SamplingParams p, const char* what) {
    return test::throws_error([&] { validate(p); }, ErrorCategory::invalid_argument, what);
  };
  EXPECT_TRUE(refused({-0.1, 1, 0, 0, 0}, "temperature = -0.1 must be in [0, 100]"));
  EXPECT_TRUE(refused({NAN, 1, 0, 0, 0}, "temperature"));
  EXPECT_TRUE(refused({1, 0, 0, 0, 0}, "top_p = 0 must be in (0, 1]"));
  EXPECT_TRUE(refused({1, 1.5, 0, 0, 0}, "top_p"));
  EXPECT_TRUE(refused({1, 1, -2, 0, 0}, "top_k = -2 must be >= 0"));
  EXPECT_TRUE(refused({1, 1, 0, 2, 0}, "min_p = 2 must be in [0, 1]"));
  validate(SamplingParams{0.5, 0.9, 10, 0.1, 3});
}

}  // namespace
}  // namespace dcp
