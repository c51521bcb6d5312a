#include "dcp/merge.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "dcp/attention_state.h"
#include "dcp/error.h"
#include "dcp/kernel_path.h"
#include "merge_simd.h"
#include "simd_dispatch.h"

namespace dcp {

float lse_to_natural(float lse, LseBase base) noexcept {
  lse = attention_state::as_part(lse);
  return base == LseBase::e || lse == kNegInf ? lse : lse * std::numbers::ln2_v<float>;
}

void merge_state_into(float* acc_o, float& acc_lse, const float* o, float lse, int dim) noexcept {
  const float parts[2] = {acc_lse, lse};
  float w[2];
  acc_lse = attention_state::merge_weights(parts, 2, w);
  // An empty part's O may be garbage: it is never read (0 x NaN would be NaN).
  if (w[1] == 0.0f) {
    if (w[0] == 0.0f) std::fill(acc_o, acc_o + dim, 0.0f);
    return;
  }
  if (w[0] == 0.0f) {
    std::copy(o, o + dim, acc_o);
    return;
  }
  for (int d = 0; d < dim; ++d) acc_o[d] = w[0] * acc_o[d] + w[1] * o[d];
}

namespace {

using WeightedSumFn = void (*)(const float* const*, const float*, int, int, float*);

void weighted_sum_portable(const float* const* parts, const float* weights, int num_parts, int dim,
                           float* out) {
  kernels::weighted_sum_lanes(parts, weights, num_parts, dim, out);
}

WeightedSumFn select_weighted_sum(KernelPath path) {
  return kernels::select_simd_copy<WeightedSumFn>(path, "the merge", weighted_sum_portable,
                                                  kernels::weighted_sum_avx2,
                                                  kernels::weighted_sum_avx512);
}

// The automatic choice is made once: the merge and ag_rs's rescale call this per row.
WeightedSumFn weighted_sum_for(KernelPath path) {
  static const WeightedSumFn best = select_weighted_sum(KernelPath::automatic);
  return path == KernelPath::automatic ? best : select_weighted_sum(path);
}

void check_merge_args(int num_parts, std::int64_t rows, int dim) {
  DCP_ARG_CHECK(num_parts >= 0, "num_parts = ", num_parts, " must be >= 0");
  DCP_ARG_CHECK(rows >= 0, "rows = ", rows, " must be >= 0");
  DCP_ARG_CHECK(dim >= 0, "dim = ", dim, " must be >= 0");
}

}  // namespace

void merge_attention_states(const float* o_parts, const float* lse_parts, int num_parts,
                            std::int64_t rows, int dim, LseBase base, float* out_o,
                            float* out_lse) {
  merge_attention_states(o_parts, rows * dim, lse_parts, rows, num_parts, rows, dim, base, out_o,
                         out_lse);
}

void merge_attention_states(const float* o_parts, std::int64_t o_part_stride,
                            const float* lse_parts, std::int64_t lse_part_stride, int num_parts,
                            std::int64_t rows, int dim, LseBase base, float* out_o,
                            float* out_lse) {
  check_merge_args(num_parts, rows, dim);
  const WeightedSumFn sum = weighted_sum_for(KernelPath::automatic);
  std::vector<float> weight(static_cast<std::size_t>(num_parts));
  std::vector<const float*> part(static_cast<std::size_t>(num_parts));
  std::vector<float> lse(static_cast<std::size_t>(num_parts));
  for (std::int64_t row = 0; row < rows; ++row) {
    for (int k = 0; k < num_parts; ++k)
      lse[k] = lse_to_natural(lse_parts[k * lse_part_stride + row], base);
    const float merged = attention_state::merge_weights(lse.data(), num_parts, weight.data());
    // One pass over the row with every part that holds anything (an empty part's O may be
    // garbage), each weighted by its share.
    int used = 0;
    for (int k = 0; k < num_parts; ++k) {
      if (weight[k] == 0.0f) continue;
      weight[used] = weight[k];
      part[used++] = o_parts + k * o_part_stride + row * dim;
    }
    float* o = out_o + row * dim;
    if (used == 0) {
      std::fill(o, o + dim, 0.0f);
    } else {
      sum(part.data(), weight.data(), used, dim, o);
    }
    if (out_lse) out_lse[row] = merged;
  }
}

void weighted_sum(const float* const* parts, const float* weights, int num_parts, int dim,
                  float* out, KernelPath path) {
  check_merge_args(num_parts, 0, dim);
  weighted_sum_for(path)(parts, weights, num_parts, dim, out);
}

void global_lse(const float* lse_parts, int num_parts, std::int64_t rows, LseBase base,
                float* out_lse) {
  check_merge_args(num_parts, rows, 0);
  std::vector<float> lse(static_cast<std::size_t>(num_parts));
  for (std::int64_t row = 0; row < rows; ++row) {
    for (int k = 0; k < num_parts; ++k) lse[k] = lse_to_natural(lse_parts[k * rows + row], base);
    out_lse[row] = attention_state::merge_weights(lse.data(), num_parts, nullptr);
  }
}

void merge_sink(float* o, float* lse, const float* sink_logit, std::int64_t rows, int dim) {
  check_merge_args(1, rows, dim);
  // A sink is one more state: weight exp(sink), no value.
  const std::vector<float> no_value(static_cast<std::size_t>(dim), 0.0f);
  for (std::int64_t row = 0; row < rows; ++row) {
    merge_state_into(o + row * dim, lse[row], no_value.data(), sink_logit[row], dim);
  }
}

}  // namespace dcp
