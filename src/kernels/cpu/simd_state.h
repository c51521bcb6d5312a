// The attention state's rule for -inf (dcp/attention_state.h) lane by lane, for the kernels
// that keep one head's running max, sum and correction per SIMD lane.
#pragma once

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

}  // namespace
}  // namespace dcp::kernels
