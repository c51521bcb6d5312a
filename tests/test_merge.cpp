// The (O, LSE) merge: exactness against float64, order independence, adversarial LSEs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "dcp/attention_state.h"
#include "dcp/error.h"
#include "dcp/merge.h"
#include "dcp/reference.h"
#include "test_util.h"

namespace dcp {
namespace {

// An owning (O, LSE) state and the pairwise operator over merge_state_into.
struct AttnState {
  std::vector<float> o;
  float lse = kNegInf;

  static AttnState empty(int dim) {
    return {std::vector<float>(static_cast<std::size_t>(dim)), kNegInf};
  }
  friend AttnState merge(AttnState a, const AttnState& b) {  // a ⊕ b
    merge_state_into(a.o.data(), a.lse, b.o.data(), b.lse, static_cast<int>(a.o.size()));
    return a;
  }
};

constexpr double kNegInfD = -std::numeric_limits<double>::infinity();

// A set of scored values split into K parts; every part's exact (O, LSE) in float64.
struct Partition {
  int dim = 0;
  int parts = 0;
  std::vector<double> scores;               // [M]
  std::vector<std::vector<double>> values;  // [M][dim]
  std::vector<int> part_of;                 // [M]

  // The state of one part in float64 (O = 0, LSE = -inf when empty).
  void part_state(int k, double* o, double* lse) const {
    double m = kNegInfD;
    for (std::size_t i = 0; i < scores.size(); ++i)
      if (part_of[i] == k) m = std::max(m, scores[i]);
    std::fill(o, o + dim, 0.0);
    *lse = kNegInfD;
    if (m == kNegInfD) return;
    double z = 0;
    for (std::size_t i = 0; i < scores.size(); ++i) {
      if (part_of[i] != k) continue;
      const double w = std::exp(scores[i] - m);
      z += w;
      for (int d = 0; d < dim; ++d) o[d] += w * values[i][d];
    }
    for (int d = 0; d < dim; ++d) o[d] /= z;
    *lse = m + std::log(z);
  }
  std::vector<double> full(double* lse) const {
    std::vector<double> o(dim, 0.0);
    double m = kNegInfD;
    for (double s : scores) m = std::max(m, s);
    *lse = kNegInfD;
    if (m == kNegInfD) return o;
    double z = 0;
    for (std::size_t i = 0; i < scores.size(); ++i) {
      const double w = std::exp(scores[i] - m);
      z += w;
      for (int d = 0; d < dim; ++d) o[d] += w * values[i][d];
    }
    for (double& v : o) v /= z;
    *lse = m + std::log(z);
    return o;
  }
  // Float parts, [K, 1, dim] and [K, 1].
  void float_parts(std::vector<float>& o, std::vector<float>& lse) const {
    o.assign(static_cast<std::size_t>(parts) * dim, 0.0f);
    lse.assign(parts, kNegInf);
    std::vector<double> od(dim);
    for (int k = 0; k < parts; ++k) {
      double l;
      part_state(k, od.data(), &l);
      for (int d = 0; d < dim; ++d) o[k * dim + d] = static_cast<float>(od[d]);
      lse[k] = static_cast<float>(l);
    }
  }
};

// `spread`: part k's scores are shifted by a random offset in [0, spread].
Partition random_partition(test::Rng& rng, int parts, int dim, double spread, double empty_prob) {
  Partition p;
  p.dim = dim;
  p.parts = parts;
  std::vector<double> offset(parts);
  std::vector<bool> empty(parts);
  for (int k = 0; k < parts; ++k) {
    offset[k] = rng.uniform(0, static_cast<float>(spread));
    empty[k] = rng.coin(empty_prob);
  }
  const int m = static_cast<int>(rng.range(parts, 8 * parts));
  for (int i = 0; i < m; ++i) {
    const int k = static_cast<int>(rng.range(0, parts - 1));
    if (empty[k]) continue;
    p.part_of.push_back(k);
    p.scores.push_back(rng.normal() + offset[k]);
    std::vector<double> v(dim);
    for (double& x : v) x = rng.normal();
    p.values.push_back(std::move(v));
  }
  return p;
}

void expect_matches_full(const Partition& p, const std::vector<float>& o, float lse) {
  double ref_lse;
  const std::vector<double> ref = p.full(&ref_lse);
  // The parts' LSEs are fp32: each carries ~6e-8 x |LSE_k| of rounding, which the merged LSE
  // inherits in absolute terms (a merged LSE near 0 can come from parts near 80), and each
  // part's weight exp(LSE_k - LSE) as a relative error of up to twice that.
  double scale = 1.0;
  for (double s : p.scores)
    scale = std::max(scale, std::abs(s) + std::log(static_cast<double>(p.scores.size())));
  const double weight_error = 2.4e-7 * scale;
  const test::Tolerance o_tol{std::max(test::kFp32Tol.nmse, weight_error * weight_error),
                              test::kFp32Tol.max_abs};
  EXPECT_TRUE(test::close(o, ref, o_tol, "merged O"));
  if (std::isinf(ref_lse)) {
    EXPECT_EQ(lse, ref_lse);
  } else {
    EXPECT_NEAR(lse, ref_lse, 1e-6 * scale) << "merged LSE";
  }
}

TEST(Merge, WeightedSumOnEveryPathMatchesFloat64) {
  // The merge's inner loop on each SIMD path, for part counts 0..9 and widths with every tail
  // length, against a float64 sum; out must be written exactly to dim.
  auto rng = test::make_rng();
  std::vector<KernelPath> paths = available_kernel_paths();
  paths.push_back(KernelPath::automatic);
  for (KernelPath path : paths) {
    for (int k = 0; k <= 9; ++k) {
      for (int dim : {0, 1, 5, 15, 16, 17, 31, 33, 512}) {
        std::vector<std::vector<float>> data(static_cast<std::size_t>(k));
        std::vector<const float*> parts;
        std::vector<float> w(static_cast<std::size_t>(k));
        for (int i = 0; i < k; ++i) {
          data[i].resize(static_cast<std::size_t>(dim));
          for (float& x : data[i]) x = static_cast<float>(rng.uniform(-4, 4));
          parts.push_back(data[i].data());
          w[i] = static_cast<float>(rng.uniform(0, 1));
        }
        std::vector<float> out(static_cast<std::size_t>(dim) + 3, 777.0f);
        weighted_sum(parts.data(), w.data(), k, dim, out.data(), path);
        for (int d = 0; d < dim; ++d) {
          double expect = 0, scale = 0;
          for (int i = 0; i < k; ++i) {
            expect += static_cast<double>(w[i]) * data[i][d];
            scale += std::abs(static_cast<double>(w[i]) * data[i][d]);
          }
          ASSERT_NEAR(out[d], expect, 1e-6 * scale + 1e-30)
              << to_string(path) << " k " << k << " dim " << dim << " d " << d;
        }
        for (int d = dim; d < dim + 3; ++d) ASSERT_EQ(out[d], 777.0f) << "wrote past dim " << dim;
        if (k == 0) continue;
        // In place (ag_rs's rescale): out is part 0 itself, and the sums are the same.
        std::vector<float> in_place = data[0];
        std::vector<const float*> aliased = parts;
        aliased[0] = in_place.data();
        weighted_sum(aliased.data(), w.data(), k, dim, in_place.data(), path);
        for (int d = 0; d < dim; ++d) {
          ASSERT_EQ(in_place[d], out[d]) << to_string(path) << " in place, k " << k << " d " << d;
        }
      }
    }
  }
  EXPECT_THROW(weighted_sum(nullptr, nullptr, 0, 0, nullptr, KernelPath::amx_bf16), Error);
  EXPECT_THROW(weighted_sum(nullptr, nullptr, 0, 0, nullptr, KernelPath::avx512_bf16), Error);
}

TEST(Merge, FlatMergeEqualsFullSoftmax) {
  auto rng = test::make_rng();
  for (int trial = 0; trial < 300; ++trial) {
    const int parts = static_cast<int>(rng.range(1, 9));
    const Partition p = random_partition(rng, parts, 24, /*spread=*/3.0, /*empty=*/0.2);
    std::vector<float> o, lse;
    p.float_parts(o, lse);
    std::vector<float> out(p.dim, std::nanf(""));  // poisoned: every element must be written
    float out_lse = std::nanf("");
    merge_attention_states(o.data(), lse.data(), parts, 1, p.dim, LseBase::e, out.data(), &out_lse);
    expect_matches_full(p, out, out_lse);
  }
}

TEST(Merge, AnyReductionTreeGivesTheSameResult) {
  auto rng = test::make_rng();
  for (int trial = 0; trial < 200; ++trial) {
    const int parts = static_cast<int>(rng.range(2, 9));
    const Partition p = random_partition(rng, parts, 16, 5.0, 0.2);
    std::vector<float> o, lse;
    p.float_parts(o, lse);
    // A random binary tree: repeatedly merge two random live states in a random order.
    std::vector<AttnState> live;
    for (int k = 0; k < parts; ++k) {
      live.push_back(
          {std::vector<float>(o.begin() + k * p.dim, o.begin() + (k + 1) * p.dim), lse[k]});
    }
    std::shuffle(live.begin(), live.end(), rng.engine());
    while (live.size() > 1) {
      const std::size_t i =
          static_cast<std::size_t>(rng.range(0, static_cast<std::int64_t>(live.size()) - 2));
      AttnState merged = rng.coin() ? merge(live[i], live[i + 1]) : merge(live[i + 1], live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i),
                 live.begin() + static_cast<std::ptrdiff_t>(i) + 2);
      live.insert(live.begin() + static_cast<std::ptrdiff_t>(i), std::move(merged));
    }
    expect_matches_full(p, live[0].o, live[0].lse);
  }
}

TEST(Merge, AdversarialLseSpreads) {
  auto rng = test::make_rng();
  // Part LSEs up to 80 apart: exp(80) overflows nothing after the max is subtracted.
  for (double spread : {0.0, 20.0, 80.0}) {
    for (int trial = 0; trial < 100; ++trial) {
      const int parts = static_cast<int>(rng.range(2, 8));
      const Partition p = random_partition(rng, parts, 8, spread, 0.0);
      std::vector<float> o, lse;
      p.float_parts(o, lse);
      std::vector<float> out(p.dim);
      float out_lse;
      merge_attention_states(o.data(), lse.data(), parts, 1, p.dim, LseBase::e, out.data(),
                             &out_lse);
      expect_matches_full(p, out, out_lse);
      // The merge's own arithmetic, against a float64 merge of the very parts it was given.
      const ref::AttentionResult exact =
          ref::merge(std::vector<double>(o.begin(), o.end()),
                     std::vector<double>(lse.begin(), lse.end()), parts, 1, p.dim);
      EXPECT_TRUE(test::close(out, exact.out, test::kFp32Tol, "merge of the given parts"));
    }
  }
}

TEST(Merge, OneDominantShardAndAllEqualShards) {
  const int dim = 4;
  // Shard 0 has LSE 80 above the others: the result is shard 0 to float precision.
  std::vector<float> o = {1, 2, 3, 4, -5, -5, -5, -5, 7, 7, 7, 7};
  std::vector<float> lse = {80.0f, 0.0f, 0.5f};
  std::vector<float> out(dim);
  float out_lse;
  merge_attention_states(o.data(), lse.data(), 3, 1, dim, LseBase::e, out.data(), &out_lse);
  const double tail = std::exp(-80.0) + std::exp(-79.5);
  EXPECT_TRUE(test::close(out, {1, 2, 3, 4}, {1e-12, 1e-6}, "dominant"));
  EXPECT_TRUE(test::close({out_lse}, {80.0 + std::log1p(tail)}, {1e-14, 1e-7}, "dominant lse"));
  // Equal LSEs: the plain average, and LSE + log K.
  lse = {1.25f, 1.25f, 1.25f};
  merge_attention_states(o.data(), lse.data(), 3, 1, dim, LseBase::e, out.data(), &out_lse);
  EXPECT_TRUE(test::close(out, {1.0, 4.0 / 3, 5.0 / 3, 2.0}, {1e-12, 1e-6}, "equal"));
  EXPECT_TRUE(test::close({out_lse}, {1.25 + std::log(3.0)}, {1e-12, 1e-6}, "equal lse"));
}

// The running state, updated tile by tile with the rule every kernel uses, equals one softmax
// over the finite scores in float64; tiles of only -inf scores (at the start, in the middle, or
// all of them) add nothing and never make a NaN.
TEST(AttentionState, TileUpdatesEqualOneSoftmaxInFloat64) {
  namespace st = attention_state;
  auto rng = test::make_rng();
  const int dim = 6;
  for (int trial = 0; trial < 300; ++trial) {
    const int tiles = static_cast<int>(rng.range(1, 6));
    std::vector<std::vector<float>> scores(static_cast<std::size_t>(tiles)), values;
    for (auto& tile : scores) {
      const bool masked = rng.coin(0.3);  // every score of the tile -inf
      tile.resize(static_cast<std::size_t>(rng.range(1, 5)));
      for (float& x : tile) x = masked || rng.coin(0.1) ? kNegInf : rng.uniform(-30.0f, 30.0f);
    }
    float m = kNegInf, l = 0.0f;
    std::vector<float> acc(dim, 0.0f);
    double ref_max = -INFINITY;
    std::vector<std::pair<double, std::vector<float>>> seen;
    for (const auto& tile : scores) {
      float tile_max = kNegInf;
      for (float x : tile) tile_max = std::max(tile_max, x);
      const float m_new = std::max(m, tile_max);
      const float c = st::rescale(m, m_new);
      l *= c;
      for (float& a : acc) a *= c;
      m = m_new;
      for (float x : tile) {
        std::vector<float> v(dim);
        for (float& e : v) e = rng.uniform(-1.0f, 1.0f);
        const float p = std::exp(x - st::base(m));
        l += p;
        for (int d = 0; d < dim; ++d) acc[d] += p * v[d];
        if (x != kNegInf) {
          seen.push_back({x, v});
          ref_max = std::max(ref_max, static_cast<double>(x));
        }
      }
    }
    std::vector<float> o(dim, 7.0f);
    const float lse = st::finish(acc.data(), m, l, dim, o.data());
    ASSERT_FALSE(std::isnan(lse)) << "trial " << trial;
    if (seen.empty()) {
      EXPECT_EQ(lse, kNegInf) << "trial " << trial;
      for (float x : o) EXPECT_EQ(x, 0.0f) << "trial " << trial;
      continue;
    }
    double z = 0;
    std::vector<double> ref_o(dim, 0.0);
    for (const auto& [x, v] : seen) {
      const double w = std::exp(x - ref_max);
      z += w;
      for (int d = 0; d < dim; ++d) ref_o[d] += w * v[d];
    }
    EXPECT_NEAR(lse, ref_max + std::log(z), 1e-5 * std::max(1.0, std::abs(ref_max)));
    for (int d = 0; d < dim; ++d) EXPECT_NEAR(o[d], ref_o[d] / z, 1e-5) << "trial " << trial;
  }
}

TEST(AttentionState, TheRuleForEmptyStates) {
  namespace st = attention_state;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = INFINITY;
  EXPECT_EQ(st::base(kNegInf), 0.0f);
  EXPECT_EQ(st::base(-3.5f), -3.5f);
  EXPECT_EQ(st::rescale(kNegInf, kNegInf), 1.0f);  // nothing moved: acc and l stay 0
  EXPECT_EQ(st::rescale(kNegInf, 2.0f), 0.0f);
  EXPECT_EQ(st::rescale(1.0f, 1.0f), 1.0f);
  EXPECT_FLOAT_EQ(st::rescale(1.0f, 3.0f), std::exp(-2.0f));
  EXPECT_EQ(std::exp(kNegInf - st::base(kNegInf)), 0.0f) << "an all -inf tile adds nothing";
  float o[2] = {5, 5};
  EXPECT_EQ(st::finish(nullptr, kNegInf, 0.0f, 2, o), kNegInf);
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_EQ(o[1], 0.0f);
  const float parts[4] = {nan, inf, kNegInf, kNegInf};
  float w[4] = {9, 9, 9, 9};
  EXPECT_EQ(st::merge_weights(parts, 4, w), kNegInf);
  for (float x : w) EXPECT_EQ(x, 0.0f);
  const float mixed[3] = {nan, 0.0f, std::log(3.0f)};
  EXPECT_FLOAT_EQ(st::merge_weights(mixed, 3, w), std::log(4.0f));
  EXPECT_EQ(w[0], 0.0f);
  EXPECT_FLOAT_EQ(w[1], 0.25f);
  EXPECT_FLOAT_EQ(w[2], 0.75f);
  EXPECT_EQ(st::part_weight(kNegInf, 1.0f), 0.0f);
  EXPECT_EQ(st::part_weight(1.0f, kNegInf), 0.0f);
  EXPECT_EQ(st::part_weight(nan, 1.0f), 0.0f);
  EXPECT_FLOAT_EQ(st::part_weight(std::log(3.0f), std::log(4.0f)), 0.75f);
}

TEST(Merge, EmptyNanAndInfinitePartsAreEmpty) {
  const int dim = 3;
  const float nan = std::nanf("");
  const float inf = std::numeric_limits<float>::infinity();
  // Parts 1..3 are empty in three spellings, each with garbage O that must not leak.
  std::vector<float> o = {1, 2, 3, nan, nan, nan, inf, inf, inf, 9, 9, 9};
  std::vector<float> lse = {0.5f, kNegInf, nan, inf};
  std::vector<float> out(dim);
  float out_lse;
  merge_attention_states(o.data(), lse.data(), 4, 1, dim, LseBase::e, out.data(), &out_lse);
  EXPECT_TRUE(test::close(out, {1, 2, 3}, {0, 0}, "one live part"));
  EXPECT_EQ(out_lse, 0.5f);
  // Every part empty: O = 0 and LSE = -inf, never NaN.
  lse = {kNegInf, nan, inf, kNegInf};
  std::fill(out.begin(), out.end(), nan);
  merge_attention_states(o.data(), lse.data(), 4, 1, dim, LseBase::e, out.data(), &out_lse);
  EXPECT_TRUE(test::close(out, {0, 0, 0}, {0, 0}, "all empty"));
  EXPECT_EQ(out_lse, kNegInf);
  // The same through the pairwise operator.
  AttnState acc = AttnState::empty(dim);
  acc = merge(acc, {{nan, nan, nan}, nan});
  acc = merge(acc, {{inf, 1, 1}, kNegInf});
  EXPECT_TRUE(test::close(acc.o, {0, 0, 0}, {0, 0}, "pairwise all empty"));
  EXPECT_EQ(acc.lse, kNegInf);
  // Zero parts at all.
  merge_attention_states(o.data(), lse.data(), 0, 1, dim, LseBase::e, out.data(), &out_lse);
  EXPECT_EQ(out_lse, kNegInf);
}

TEST(Merge, BaseTwoLseGivesTheSameResult) {
  auto rng = test::make_rng();
  // A partition on which the base matters: drawn again while a float64 merge that misreads its
  // base-2 LSEs as natural ones stays close to the right result (one part alone holding tokens,
  // or parts of nearly equal LSEs, give the same result either way).
  Partition p;
  std::vector<float> o, lse, lse2;
  for (bool base_matters = false; !base_matters;) {
    p = random_partition(rng, 5, 12, 4.0, 0.0);
    p.float_parts(o, lse);
    lse2.resize(lse.size());
    for (std::size_t k = 0; k < lse.size(); ++k)
      lse2[k] = static_cast<float>(lse[k] / std::log(2.0));
    const ref::AttentionResult misread =
        ref::merge(std::vector<double>(o.begin(), o.end()),
                   std::vector<double>(lse2.begin(), lse2.end()), 5, 1, p.dim);
    double ref_lse;
    base_matters = !test::close(std::vector<float>(misread.out.begin(), misread.out.end()),
                                p.full(&ref_lse), {1e-6, 1e-3}, "misread in float64");
  }
  std::vector<float> out(p.dim);
  float out_lse;
  merge_attention_states(o.data(), lse2.data(), 5, 1, p.dim, LseBase::two, out.data(), &out_lse);
  expect_matches_full(p, out, out_lse);  // output LSE is natural log
  // Misreading base-2 LSEs as natural gives different weights: the base matters.
  std::vector<float> wrong(p.dim);
  merge_attention_states(o.data(), lse2.data(), 5, 1, p.dim, LseBase::e, wrong.data(), nullptr);
  double ref_lse;
  EXPECT_FALSE(test::close(wrong, p.full(&ref_lse), test::kFp32Tol, "misread base"));
}

TEST(Merge, AveragingWithoutLseIsWrong) {
  // Two shards, one token each, values 1 and 0. Each shard's normalised O is its value, for
  // any score, so the average is always 0.5; the true result is sigmoid(s1 - s0).
  for (double s1 : {-3.0, 0.0, 2.0, 6.0}) {
    const double s0 = 0.25;
    std::vector<float> o = {1.0f, 0.0f};
    std::vector<float> lse = {static_cast<float>(s1), static_cast<float>(s0)};
    float out, out_lse;
    merge_attention_states(o.data(), lse.data(), 2, 1, 1, LseBase::e, &out, &out_lse);
    const double truth = 1.0 / (1.0 + std::exp(s0 - s1));
    EXPECT_NEAR(out, truth, 1e-6);
    const double average = (o[0] + o[1]) / 2.0;
    if (std::abs(truth - 0.5) > 0.1) {
      EXPECT_GT(std::abs(average - truth), 0.1);
    }
  }
}

TEST(Merge, ManyRowsGlobalLseAndSink) {
  auto rng = test::make_rng();
  const int parts = 3, dim = 8;
  const std::int64_t rows = 50;
  std::vector<double> od(static_cast<std::size_t>(parts) * rows * dim),
      ld(static_cast<std::size_t>(parts) * rows);
  std::vector<float> o(od.size()), l(ld.size());
  for (std::size_t i = 0; i < od.size(); ++i) o[i] = static_cast<float>(od[i] = rng.normal());
  for (std::size_t i = 0; i < ld.size(); ++i) {
    const bool empty = rng.coin(0.15);
    l[i] = empty ? kNegInf : rng.uniform(-10, 10);
    ld[i] = l[i];
  }
  const ref::AttentionResult expect = ref::merge(od, ld, parts, rows, dim);
  std::vector<float> out(static_cast<std::size_t>(rows) * dim, std::nanf("")),
      out_lse(rows, std::nanf(""));
  merge_attention_states(o.data(), l.data(), parts, rows, dim, LseBase::e, out.data(),
                         out_lse.data());
  EXPECT_TRUE(test::close(out, expect.out, test::kFp32Tol, "rows O"));
  EXPECT_TRUE(test::close(out_lse, expect.lse, {1e-12, 1e-6}, "rows LSE"));
  std::vector<float> g(rows);
  global_lse(l.data(), parts, rows, LseBase::e, g.data());
  EXPECT_TRUE(test::close(g, expect.lse, {1e-12, 1e-6}, "global LSE"));

  // A sink is one more part with O = 0 and LSE = sink.
  std::vector<float> sink(rows);
  for (auto& s : sink) s = rng.uniform(-5, 5);
  std::vector<double> od4 = od, ld4 = ld;
  od4.resize(od.size() + static_cast<std::size_t>(rows) * dim, 0.0);
  for (std::int64_t r = 0; r < rows; ++r) ld4.push_back(sink[r]);
  const ref::AttentionResult with_sink = ref::merge(od4, ld4, parts + 1, rows, dim);
  merge_sink(out.data(), out_lse.data(), sink.data(), rows, dim);
  EXPECT_TRUE(test::close(out, with_sink.out, test::kFp32Tol, "sink O"));
  EXPECT_TRUE(test::close(out_lse, with_sink.lse, {1e-12, 1e-6}, "sink LSE"));
}

}  // namespace
}  // namespace dcp
