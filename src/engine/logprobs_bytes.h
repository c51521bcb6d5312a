// Per-token logprobs as bytes, as results and stream news carry them across ranks.
#pragma once

#include <algorithm>
#include <vector>

#include "core/bytes.h"
#include "dcp/sampling.h"

namespace dcp {

// lps[from, end): a count, then each entry's chosen token, its rank and its alternatives.
inline void write_logprobs(ByteWriter& w, const std::vector<StepLogprobs>& lps,
                           std::size_t from = 0) {
  from = std::min(from, lps.size());
  w.i64(static_cast<std::int64_t>(lps.size() - from));
  for (std::size_t k = from; k < lps.size(); ++k) {
    w.raw(&lps[k].chosen, sizeof(TokenLogprob));
    w.i64(lps[k].rank);
    w.vec(lps[k].top);
  }
}

inline std::vector<StepLogprobs> read_logprobs(ByteReader& in) {
  std::vector<StepLogprobs> lps(in.count(sizeof(TokenLogprob) + 2 * sizeof(std::int64_t)));
  for (StepLogprobs& lp : lps) {
    in.raw(&lp.chosen, sizeof lp.chosen);
    lp.rank = in.i64();
    lp.top = in.vec<TokenLogprob>();
  }
  return lps;
}

}  // namespace dcp
