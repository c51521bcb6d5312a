// Sampling: the distribution a draw uses against a float64 reference written here, the draws'
// frequencies against that distribution, determinism, logprobs, and argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "dcp/error.h"
#include "dcp/kernel_path.h"
#include "dcp/sampling.h"
#include "kernels/cpu/exp_weights.h"
#include "test_util.h"

namespace dcp {
namespace {

SamplingParams params(double temperature, double top_p, int top_k, double min_p,
                      std::uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_p = top_p;
  p.top_k = top_k;
  p.min_p = min_p;
  p.seed = seed;
  return p;
}

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
        for (double min_p : {0.0, 0.05, 0.3}) grid.push_back(params(t, top_p, k, min_p, 7));
      }
    }
  }
  return grid;
}

TEST(Sampling, DistributionEqualsTheFloat64Reference) {
  auto rng = test::make_rng();
  // Past 1024 tokens top-p orders the most likely ones in passes; logits on a coarse grid tie.
  for (int vocab : {1, 2, 7, 100, 1000, 5000, -3000}) {
    std::vector<float> logits = random_logits(rng, std::abs(vocab), 2.0f);
    if (vocab < 0) {
      for (float& x : logits) x = std::round(x * 2) / 2;
      vocab = -vocab;
    }
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

// The weights a draw starts from, on every SIMD copy this CPU runs, against std::exp in double:
// within one unit in the last place, subnormal results included (one unit of the smallest
// subnormal there); 0 below exp's range, for -inf and for NaN. Rows of 0 to 40 logits cover the
// partial last vector of every width.
TEST(Sampling, ExpWeightsAreWithinAnUlpOfStdExpOnEveryPath) {
  auto rng = test::make_rng();
  std::vector<float> logits(70000);
  for (std::size_t i = 0; i < logits.size(); ++i)
    logits[i] = i % 2 ? rng.uniform(-800.0f, 0.0f) : rng.uniform(-3.0f, 0.0f);
  const float specials[] = {0.0f,
                            -0.0f,
                            -1e-30f,
                            -708.5f,
                            -745.1f,
                            -745.2f,
                            -746.5f,
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::ldexp(1.0f, -149)};
  std::copy(std::begin(specials), std::end(specials), logits.begin());
  for (const KernelPath path : available_kernel_paths()) {
    if (is_bf16_pair_path(path)) continue;  // attention-only paths
    for (const double inv_t : {1.0, 1.0 / 0.6, 1.0 / 1.3, 0.01, 100.0}) {
      for (const float top : {0.0f, 0.5f}) {  // the row's maximum, or a little more
        for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{7},
                                    std::size_t{9}, std::size_t{40}, logits.size()}) {
          std::vector<double> got(n + 1, -1.0);
          exp_weights(logits.data(), n, top, inv_t, got.data(), path);
          EXPECT_EQ(got[n], -1.0) << "wrote past the row";
          for (std::size_t i = 0; i < n; ++i) {
            const double x = (static_cast<double>(logits[i]) - top) * inv_t;
            const double want = std::isnan(x) ? 0.0 : std::exp(x);
            const auto ulps =
                std::abs(std::bit_cast<std::int64_t>(got[i]) - std::bit_cast<std::int64_t>(want));
            ASSERT_LE(ulps, 1) << to_string(path) << " logit " << logits[i] << " top " << top
                               << " inv_t " << inv_t << ": " << got[i] << " against " << want;
          }
        }
      }
    }
  }
}

TEST(Sampling, DrawsFollowTheDistributionAndNeverPickATruncatedToken) {
  auto rng = test::make_rng();
  const int vocab = 12;
  const std::vector<float> plain = random_logits(rng, vocab, 1.0f);
  // Masked logits (allowed_token_ids, bad_words) are -inf: never drawn, the last one included.
  std::vector<float> masked = plain;
  masked[3] = masked[vocab - 1] = -INFINITY;
  for (const auto& [logits, base] : {std::pair{plain, params(1.0, 1.0, 0, 0.0, 0)},
                                     std::pair{plain, params(0.7, 0.8, 0, 0.0, 0)},
                                     std::pair{plain, params(1.3, 1.0, 4, 0.0, 0)},
                                     std::pair{plain, params(1.0, 1.0, 0, 0.2, 0)},
                                     std::pair{masked, params(1.0, 1.0, 0, 0.0, 0)},
                                     std::pair{masked, params(1.3, 1.0, vocab, 0.0, 0)}}) {
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
  SamplingParams p = params(1.0, 0.95, 0, 0.0, 42);
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

// Speculative sampling: a draft drawn from q and verified against p leaves every emitted token
// distributed as p (the float64 reference), whatever q; it is kept at the rate sum(min(p, q)).
TEST(Sampling, VerifiedDraftsFollowTheTargetDistribution) {
  auto rng = test::make_rng();
  const int vocab = 10;
  const std::vector<float> target = random_logits(rng, vocab, 1.0f);
  std::vector<float> near = target;  // a good draft: the target with noise
  for (float& x : near) x += rng.normal(0.5f);
  const std::vector<float> far = random_logits(rng, vocab, 1.5f);  // an unrelated one
  std::vector<float> masked = target;                              // p with masked tokens
  masked[2] = masked[7] = -INFINITY;
  struct Case {
    std::vector<float> p_logits, q_logits;
    SamplingParams p, q;  // the engine gives both the request's parameters; here they may differ
  };
  const Case cases[] = {
      {target, near, params(1.0, 1.0, 0, 0.0, 0), params(1.0, 1.0, 0, 0.0, 0)},
      {target, far, params(1.0, 1.0, 0, 0.0, 0), params(1.0, 1.0, 0, 0.0, 0)},
      {target, near, params(0.8, 0.9, 0, 0.0, 0), params(0.8, 0.9, 0, 0.0, 0)},
      {target, far, params(1.3, 1.0, 4, 0.0, 0), params(1.3, 1.0, 4, 0.0, 0)},  // some disjoint
      {target, near, params(1.0, 1.0, 0, 0.1, 0), params(0.5, 1.0, 3, 0.0, 0)},
      {masked, target, params(1.0, 1.0, 0, 0.0, 0), params(1.0, 1.0, 0, 0.0, 0)},  // q covers more
      {target, far, params(1.0, 1.0, 0, 0.0, 0), params(0.0, 1.0, 0, 0.0, 0)},     // q one token
  };
  for (const Case& c : cases) {
    SamplingParams pp = c.p, qp = c.q;
    pp.seed = qp.seed = test::test_seed();
    const TokenDistribution p = token_distribution(c.p_logits.data(), vocab, pp);
    const TokenDistribution q = token_distribution(c.q_logits.data(), vocab, qp);
    const std::vector<double> want = reference_distribution(c.p_logits, pp);
    const std::vector<double> q_ref = reference_distribution(c.q_logits, qp);
    double overlap = 0;  // the acceptance rate
    for (int i = 0; i < vocab; ++i)
      overlap += std::min(want[static_cast<std::size_t>(i)], q_ref[static_cast<std::size_t>(i)]);
    const int draws = 40000;
    std::vector<int> count(static_cast<std::size_t>(vocab), 0);
    int accepted = 0;
    for (int s = 0; s < draws; ++s) {
      const auto step = static_cast<std::uint64_t>(s);
      const std::int32_t d = draw_token(q, draw_uniform(pp.seed, step, DrawPurpose::token));
      ASSERT_GT(q_ref[static_cast<std::size_t>(d)], 0) << "the draft drew outside q";
      const DraftVerdict v = verify_draft(p, q, d, pp.seed, step);
      if (v.accepted) {
        ASSERT_EQ(v.token, d);
        ++accepted;
      }
      ++count[static_cast<std::size_t>(v.token)];
    }
    const std::string what = "T " + std::to_string(pp.temperature) + "/" +
                             std::to_string(qp.temperature) + " k " + std::to_string(pp.top_k) +
                             "/" + std::to_string(qp.top_k);
    for (int i = 0; i < vocab; ++i) {
      const double w = want[static_cast<std::size_t>(i)];
      if (w == 0) {
        EXPECT_EQ(count[static_cast<std::size_t>(i)], 0) << what << ": token " << i;
        continue;
      }
      EXPECT_NEAR(count[static_cast<std::size_t>(i)], draws * w,
                  5 * std::sqrt(draws * w * (1 - w)) + 1)
          << what << ": token " << i;
    }
    EXPECT_NEAR(accepted, draws * overlap, 5 * std::sqrt(draws * overlap * (1 - overlap)) + 1)
        << what;
  }
}

// A draft that is the target is always kept, so the tokens are the plain draws; greedy keeps a
// draft exactly when it is the argmax and emits the argmax otherwise.
TEST(Sampling, AnExactDraftIsAlwaysKeptAndGreedyVerificationComparesArgmaxes) {
  auto rng = test::make_rng();
  const int vocab = 300;
  const std::vector<float> logits = random_logits(rng, vocab, 1.0f);
  for (const SamplingParams& base : parameter_grid()) {
    SamplingParams p = base;
    p.seed = test::test_seed();
    const TokenDistribution d = token_distribution(logits.data(), vocab, p);
    for (std::uint64_t s = 0; s < 20; ++s) {
      const std::int32_t proposed = draw_token(d, draw_uniform(p.seed, s, DrawPurpose::token));
      ASSERT_EQ(proposed, sample_token(logits.data(), vocab, p, s));
      const DraftVerdict v = verify_draft(d, d, proposed, p.seed, s);
      ASSERT_TRUE(v.accepted) << "T " << p.temperature << " step " << s;
      ASSERT_EQ(v.token, proposed);
    }
  }
  const std::int32_t best = greedy_token(logits.data(), vocab);
  std::vector<float> other = logits;  // another argmax
  other[static_cast<std::size_t>(best)] = -100;
  const TokenDistribution p = token_distribution(logits.data(), vocab, SamplingParams{});
  const TokenDistribution q = token_distribution(other.data(), vocab, SamplingParams{});
  for (std::uint64_t s = 0; s < 20; ++s) {
    const DraftVerdict kept = verify_draft(p, p, best, 5, s);
    EXPECT_TRUE(kept.accepted);
    EXPECT_EQ(kept.token, best);
    const DraftVerdict replaced = verify_draft(p, q, greedy_token(other.data(), vocab), 5, s);
    EXPECT_FALSE(replaced.accepted);
    EXPECT_EQ(replaced.token, best);
  }
  // Every logit masked (only past a request's end, where drafts look ahead): the first maximum.
  const std::vector<float> none(8, -INFINITY);
  const SamplingParams sampled = params(1.0, 0.9, 3, 0.1, 1);
  const TokenDistribution first = token_distribution(none.data(), 8, sampled);
  EXPECT_EQ(first.tokens, std::vector<std::int32_t>{0});
  EXPECT_EQ(sample_token(none.data(), 8, sampled, 4), 0);
}

TEST(Sampling, LogprobsAreTheFloat64LogSoftmax) {
  auto rng = test::make_rng();
  const int vocab = 300;
  std::vector<float> logits = random_logits(rng, vocab, 3.0f);
  for (int i = 5; i < vocab; i += 4) logits[static_cast<std::size_t>(i)] = logits[1];  // ties
  double m = *std::max_element(logits.begin(), logits.end()), z = 0;
  for (float x : logits) z += std::exp(x - m);
  const double lse = m + std::log(z);
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  for (const int k : {1, 5, 20, 80, vocab}) {
    const StepLogprobs lp = step_logprobs(logits.data(), vocab, 17, k);
    EXPECT_EQ(lp.chosen.token, 17);
    EXPECT_NEAR(lp.chosen.logprob, logits[17] - lse, 1e-5);
    ASSERT_EQ(lp.top.size(), static_cast<std::size_t>(k));
    for (int i = 0; i < k; ++i) {
      EXPECT_EQ(lp.top[static_cast<std::size_t>(i)].token, order[static_cast<std::size_t>(i)])
          << "k " << k << " place " << i;
      EXPECT_NEAR(lp.top[static_cast<std::size_t>(i)].logprob, logits[order[i]] - lse, 1e-5);
    }
  }
  EXPECT_TRUE(step_logprobs(logits.data(), vocab, 0, 0).top.empty());
}

// The rank is the token's place in the descending order, ties by id, counted by sorting the
// whole vocabulary: every token of a vocabulary with repeated logits.
TEST(Sampling, RanksArePlacesInTheDescendingOrder) {
  auto rng = test::make_rng();
  const int vocab = 97;
  std::vector<float> logits = random_logits(rng, vocab, 2.0f);
  for (int i = 0; i < vocab; i += 3) logits[static_cast<std::size_t>(i)] = logits[0];  // ties
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  for (int place = 0; place < vocab; ++place) {
    const int token = order[static_cast<std::size_t>(place)];
    const StepLogprobs lp = step_logprobs(logits.data(), vocab, token, 3);
    EXPECT_EQ(lp.rank, place + 1) << "token " << token;
    if (place < 3) {
      EXPECT_EQ(lp.top[static_cast<std::size_t>(place)].token, token);
    }
  }
}

TEST(Sampling, RefusesParametersOutsideTheirRanges) {
  const auto refused = [](SamplingParams p, const char* what) {
    return test::throws_error([&] { validate(p, 50); }, ErrorCategory::invalid_argument, what);
  };
  EXPECT_TRUE(refused(params(-0.1, 1, 0, 0, 0), "temperature = -0.1 must be in [0, 100]"));
  EXPECT_TRUE(refused(params(NAN, 1, 0, 0, 0), "temperature"));
  EXPECT_TRUE(refused(params(1, 0, 0, 0, 0), "top_p = 0 must be in (0, 1]"));
  EXPECT_TRUE(refused(params(1, 1.5, 0, 0, 0), "top_p"));
  EXPECT_TRUE(refused(params(1, 1, -2, 0, 0), "top_k = -2 must be >= 0"));
  EXPECT_TRUE(refused(params(1, 1, 0, 2, 0), "min_p = 2 must be in [0, 1]"));
  validate(params(0.5, 0.9, 10, 0.1, 3), 50);
  const auto with = [](auto set) {
    SamplingParams p;
    set(p);
    return p;
  };
  EXPECT_TRUE(refused(with([](SamplingParams& p) { p.repetition_penalty = 0; }),
                      "repetition_penalty = 0 must be > 0 (1: off)"));
  EXPECT_TRUE(
      refused(with([](SamplingParams& p) { p.repetition_penalty = INFINITY; }), "repetition"));
  EXPECT_TRUE(refused(with([](SamplingParams& p) { p.presence_penalty = 2.5; }),
                      "presence_penalty = 2.5 must be in [-2, 2]"));
  EXPECT_TRUE(refused(with([](SamplingParams& p) { p.frequency_penalty = -2.01; }),
                      "frequency_penalty = -2.01 must be in [-2, 2]"));
  EXPECT_TRUE(refused(with([](SamplingParams& p) { p.logit_bias[50] = 1; }),
                      "logit_bias: token 50 is outside the vocabulary [0, 50)"));
  EXPECT_TRUE(refused(with([](SamplingParams& p) { p.logit_bias[-1] = 1; }), "token -1"));
  EXPECT_TRUE(refused(with([](SamplingParams& p) { p.logit_bias[3] = 100.5; }),
                      "logit_bias: token 3's bias 100.5 must be in [-100, 100]"));
  EXPECT_TRUE(refused(with([](SamplingParams& p) {
                        p.allowed_token_ids = {3, 50};
                      }),
                      "allowed_token_ids: token 50 is outside the vocabulary [0, 50)"));
  EXPECT_TRUE(refused(with([](SamplingParams& p) {
                        p.bad_words = {{1, 2}, {}};
                      }),
                      "bad_words[1] is empty"));
  EXPECT_TRUE(refused(with([](SamplingParams& p) {
                        p.bad_words = {{-1, 2}};
                      }),
                      "bad_words[0]: token -1 is outside the vocabulary [0, 50)"));
  // Masks that could leave nothing to choose: every allowed token ends a bad word, or is a stop
  // token the caller holds back.
  EXPECT_TRUE(refused(with([](SamplingParams& p) {
                        p.allowed_token_ids = {4, 9};
                        p.bad_words = {{1, 4}, {9}};
                      }),
                      "could mask every token"));
  EXPECT_TRUE(test::throws_error(
      [&] {
        validate(with([](SamplingParams& p) {
                   p.allowed_token_ids = {4, 9};
                 }),
                 50, std::vector<std::int32_t>{9, 4});
      },
      ErrorCategory::invalid_argument, "could mask every token"));
  validate(with([](SamplingParams& p) {
             p.allowed_token_ids = {4, 9};
           }),
           50, std::vector<std::int32_t>{9});
  validate(with([](SamplingParams& p) {
             p.repetition_penalty = 1.3;
             p.presence_penalty = -2;
             p.frequency_penalty = 2;
             p.logit_bias = {{0, -100}, {49, 100}};
           }),
           50);
}

// The adjustments written out in float64: bias, then the repetition penalty over the prompt and
// output, then frequency and presence over the output; then the masks.
std::vector<double> reference_adjusted(const std::vector<float>& logits, const SamplingParams& p,
                                       const std::vector<std::int32_t>& prompt,
                                       const std::vector<std::int32_t>& output) {
  std::vector<double> out(logits.begin(), logits.end());
  for (std::size_t t = 0; t < out.size(); ++t) {
    const auto id = static_cast<std::int32_t>(t);
    if (p.logit_bias.count(id)) out[t] += p.logit_bias.at(id);
    const auto n = std::count(output.begin(), output.end(), id);
    if (n > 0 || std::count(prompt.begin(), prompt.end(), id) > 0)
      out[t] = out[t] > 0 ? out[t] / p.repetition_penalty : out[t] * p.repetition_penalty;
    out[t] -= p.frequency_penalty * static_cast<double>(n) + p.presence_penalty * (n > 0);
    const auto& allowed = p.allowed_token_ids;
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), id) == allowed.end())
      out[t] = -INFINITY;
    for (const auto& word : p.bad_words) {
      // The word's other tokens, in order, are the output's last ones.
      const std::size_t k = word.size() - 1;
      bool ends = word.back() == id && k <= output.size();
      for (std::size_t j = 0; ends && j < k; ++j) ends = output[output.size() - k + j] == word[j];
      if (ends) out[t] = -INFINITY;
    }
  }
  return out;
}

TEST(Sampling, PenaltiesBiasAndMasksAdjustTheLogitsAsTheReference) {
  auto rng = test::make_rng();
  const int vocab = 40;
  int masked = 0;
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<float> logits = random_logits(rng, vocab, 3.0f);
    // Few distinct ids, so tokens repeat within and across prompt and output; either may be empty.
    const auto tokens = [&](int max_len) {
      std::vector<std::int32_t> t(static_cast<std::size_t>(rng.range(0, max_len)));
      for (auto& x : t) x = static_cast<std::int32_t>(rng.range(0, 11));
      return t;
    };
    const std::vector<std::int32_t> prompt = tokens(8), output = tokens(10);
    SamplingParams p;
    p.repetition_penalty = trial % 3 == 0 ? 1.0 : 1 + 0.9 * rng.uniform(-1, 1);
    p.presence_penalty = trial % 4 == 1 ? 0.0 : 2 * rng.uniform(-1, 1);
    p.frequency_penalty = trial % 5 == 2 ? 0.0 : 2 * rng.uniform(-1, 1);
    for (int b = 0; b < trial % 4; ++b)
      p.logit_bias[static_cast<std::int32_t>(rng.range(0, vocab - 1))] = 100 * rng.uniform(-1, 1);
    if (trial % 3 == 1) {
      for (int a = 0; a < 12; ++a)
        p.allowed_token_ids.push_back(static_cast<std::int32_t>(rng.range(0, vocab - 1)));
    }
    // Bad words of one to three tokens over the ids the output uses, so that some end it; and
    // one taken from the output's tail, which must match.
    for (int b = 0; b < trial % 5; ++b) {
      const std::vector<std::int32_t> word = tokens(3);
      if (!word.empty()) p.bad_words.push_back(word);
    }
    if (trial % 2 == 0 && output.size() >= 2)
      p.bad_words.push_back({output[output.size() - 2], output.back(), 5});
    const std::vector<double> want = reference_adjusted(logits, p, prompt, output);
    const std::vector<float> got = adjusted_logits(logits.data(), vocab, p, prompt, output);
    ASSERT_EQ(got.size(), want.size());
    for (int i = 0; i < vocab; ++i) {
      const double w = want[static_cast<std::size_t>(i)];
      if (std::isinf(w)) {
        EXPECT_EQ(got[static_cast<std::size_t>(i)], w) << "trial " << trial << " token " << i;
        ++masked;
        continue;
      }
      EXPECT_NEAR(got[static_cast<std::size_t>(i)], w, 1e-5 * (1 + std::abs(w)))
          << "trial " << trial << " token " << i;
    }
  }
  EXPECT_GT(masked, 0) << "no trial masked a token";
}

TEST(Sampling, ChoicesAllowOnlyTheTokensThatContinueOne) {
  SamplingParams p;
  p.choices = {{1, 2, 3}, {1, 4}, {5}};
  const std::vector<float> logits(8, 0.5f);
  const auto allowed = [&](std::vector<std::int32_t> output) {
    const std::vector<float> got = adjusted_logits(logits.data(), 8, p, {}, output);
    std::vector<std::int32_t> ids;
    for (std::int32_t t = 0; t < 8; ++t) {
      if (std::isfinite(got[static_cast<std::size_t>(t)])) ids.push_back(t);
    }
    return ids;
  };
  using Ids = std::vector<std::int32_t>;
  EXPECT_EQ(allowed({}), (Ids{1, 5}));
  EXPECT_EQ(allowed({1}), (Ids{2, 4}));
  EXPECT_EQ(allowed({1, 2}), (Ids{3}));
  EXPECT_TRUE(p.completes_choice(Ids{1, 4}));
  EXPECT_TRUE(p.completes_choice(Ids{5}));
  EXPECT_FALSE(p.completes_choice(Ids{1, 2}));
  EXPECT_FALSE(p.completes_choice(Ids{1, 2, 3, 0}));
  EXPECT_FALSE(SamplingParams{}.completes_choice(Ids{}));
  validate(p, 8);
  const auto refused = [](SamplingParams q, std::vector<std::int32_t> maskable, const char* what) {
    return test::throws_error([&] { validate(q, 8, maskable); }, ErrorCategory::invalid_argument,
                              what);
  };
  SamplingParams q = p;
  q.choices.push_back({1, 2});
  EXPECT_TRUE(refused(q, {}, "choices[3] begins choices[0]: a reply could not tell them apart"));
  q.choices = {{1, 2}, {1, 2}};
  EXPECT_TRUE(refused(q, {}, "choices[0] begins choices[1]"));
  q.choices = {{1}, {}};
  EXPECT_TRUE(refused(q, {}, "choices[1] is empty"));
  q.choices = {{1, 8}};
  EXPECT_TRUE(refused(q, {}, "choices[0]: token 8 is outside the vocabulary [0, 8)"));
  EXPECT_TRUE(refused(p, {4}, "choices[1] holds token 4, a stop token that min_tokens holds back"));
  q = p;
  q.allowed_token_ids = {1, 2, 3};
  EXPECT_TRUE(refused(q, {}, "choices do not combine with allowed_token_ids or bad_words"));
  EXPECT_EQ(prefix_pair({{3}, {4, 3}}), std::nullopt);
  EXPECT_EQ(prefix_pair({{4, 3, 1}, {4, 3}}), (std::pair<std::size_t, std::size_t>{1, 0}));
}

}  // namespace
}  // namespace dcp
