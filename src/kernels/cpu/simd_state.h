// The attention state's rule for -inf (dcp/attention_state.h) lane by lane, for the kernels
// that keep one head's running max, sum and correction per SIMD lane.
#pragma once

#include <cstddef>

#include "dcp/attention_state.h"
#include "simd.h"

namespace dcp::kernels {
namespace {

// attention_state::base per lane: m, or 0 where m = -inf.
template <class S>
typename S::vec state_base(typename S::vec m) {
  return m == S::splat(attention_state::kNegInf) ? S::splat(0.0f) : m;
}

// attention_state::rescale per lane: 0 where the state is empty (m_old = -inf), else
// exp(m_old - base(m_new)) (1 where the max stays).
template <class S>
typename S::vec state_rescale(typename S::vec m_old, typename S::vec m_new) {
  const typename S::vec c = S::exp(m_old - state_base<S>(m_new));
  return m_old == S::splat(attention_state::kNegInf) ? S::splat(0.0f) : c;
}

// The running max after n >= 1 more rows of scores: max(m_old, rows[j * stride]) per lane.
template <class S>
typename S::vec state_max(typename S::vec m_old, const float* rows, int n, std::size_t stride) {
  typename S::vec mx = S::load(rows);
  for (int j = 1; j < n; ++j) {
    const typename S::vec x = S::load(rows + static_cast<std::size_t>(j) * stride);
    mx = x > mx ? x : mx;
  }
  return mx > m_old ? mx : m_old;
}

}  // namespace
}  // namespace dcp::kernels
