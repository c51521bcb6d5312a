// The attention state and its one rule for empty input: every kernel and every merge in dcp
// computes with these functions (the SIMD kernels apply the same rule lane by lane, see
// src/kernels/cpu/simd_state.h).
//
// Running, inside a kernel, per (token, head): a max m, a sum l = sum_j exp(s_j - m) and an
// accumulator acc = sum_j exp(s_j - m) v_j. A tile of scores s_j is added by
//     m' = max(m, max_j s_j);   acc, l *= rescale(m, m');   p_j = exp(s_j - base(m'))
//     l += sum_j p_j;           acc += sum_j p_j v_j
// Finished: (O, LSE) = (acc / l, m + log l), or (0, -inf) when l = 0 (no row seen).
//
// Merged, across DCP ranks, split-KV parts or a chunk's two halves, K finished states combine as
//     L = M + log sum_k exp(L_k - M),  M = max_k L_k,   O = sum_k exp(L_k - L) O_k.
//
// The rule for -inf: an empty state (m = -inf, or an LSE of -inf) contributes exactly nothing,
// NaN and +inf LSEs count as empty, and nothing ever computes exp(-inf - -inf) = NaN. So a state
// that has seen no rows, or only rows scored -inf, finishes as (0, -inf), and merging only empty
// states gives (0, -inf).
#pragma once

#include <cmath>
#include <limits>

namespace dcp::attention_state {
// Internal linkage: the SIMD kernels compile these once per instruction set (attention_rows.h),
// and one shared out-of-line copy could carry another instruction set's code to every caller.
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// What the probabilities of a state with max m are taken against: m itself, or 0 for an empty
// state, so that exp(s - base(m)) is 0 for s = -inf instead of NaN.
inline float base(float m) noexcept {
  return m == kNegInf ? 0.0f : m;
}

// The factor that moves a running (acc, l) from max m_old to m_new >= m_old: 1 when the max
// stays, 0 for an empty state (whose acc and l are 0 anyway).
inline float rescale(float m_old, float m_new) noexcept {
  if (m_old == m_new) return 1.0f;
  return m_old == kNegInf ? 0.0f : std::exp(m_old - base(m_new));
}

// Writes O = acc / l (dim values) and returns LSE = m + log l; O = 0 and -inf when l = 0.
inline float finish(const float* acc, float m, float l, int dim, float* o) noexcept {
  if (!(l > 0.0f)) {
    for (int d = 0; d < dim; ++d) o[d] = 0.0f;
    return kNegInf;
  }
  const float inv = 1.0f / l;
  for (int d = 0; d < dim; ++d) o[d] = acc[d] * inv;
  return m + std::log(l);
}

// An LSE as a merge reads it: NaN and +inf are empty (-inf).
inline float as_part(float lse) noexcept {
  return std::isnan(lse) || lse == std::numeric_limits<float>::infinity() ? kNegInf : lse;
}

// The merge of K states given their natural-log LSEs (read through as_part): returns L, and when
// `weights` is not null writes each part's share exp(L_k - L) (0 for an empty part; all 0 when
// every part is empty, and then L = -inf).
inline float merge_weights(const float* lse, int k, float* weights) noexcept {
  float m = kNegInf;
  for (int i = 0; i < k; ++i) m = std::fmax(m, as_part(lse[i]));
  if (m == kNegInf) {
    if (weights)
      for (int i = 0; i < k; ++i) weights[i] = 0.0f;
    return kNegInf;
  }
  float total = 0.0f;
  for (int i = 0; i < k; ++i) {
    const float l = as_part(lse[i]);
    const float w = l == kNegInf ? 0.0f : std::exp(l - m);
    if (weights) weights[i] = w;
    total += w;
  }
  if (weights) {
    const float inv = 1.0f / total;
    for (int i = 0; i < k; ++i) weights[i] *= inv;
  }
  return m + std::log(total);
}

// One part's share once the merged LSE is known (ag_rs rescales each rank's O by it): 0 when the
// part or the whole is empty.
inline float part_weight(float lse_part, float lse_merged) noexcept {
  const float l = as_part(lse_part);
  return l == kNegInf || lse_merged == kNegInf ? 0.0f : std::exp(l - lse_merged);
}

}  // namespace
}  // namespace dcp::attention_state
