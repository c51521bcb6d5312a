#include "dcp/merge.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "dcp/error.h"
#include "dcp/kernel_path.h"
#include "merge_simd.h"
#include "simd_dispatch.h"

namespace dcp {

float lse_to_natural(float lse, LseBase base) noexcept {
  if (std::isnan(lse) || lse == std::numeric_limits<float>::infinity()) return kNegInf;
  return base == LseBase::e ? lse : lse * std::numbers::ln2_v<float>;
}

void merge_state_into(float* acc_o, float& acc_lse, const float* o, float lse, int dim) noexcept {
  lse = lse_to_natural(lse, LseBase::e);
  const float acc = lse_to_natural(acc_lse, LseBase::e);
  if (lse == kNegInf) {  // nothing to add; also scrubs a NaN accumulator LSE to -inf
    if (acc == kNegInf) std::fill(acc_o, acc_o + dim, 0.0f);
    acc_lse = acc;
    return;
  }
  if (acc == kNegInf) {
    std::copy(o, o + dim, acc_o);
    acc_lse = lse;
    return;
  }
  const float m = std::max(acc, lse);
  const float wa = std::exp(acc - m);
  const float wb = std::exp(lse - m);
  const float inv = 1.0f / (wa + wb);
  const float ca = wa * inv;
  const float cb = wb * inv;
  for (int d = 0; d < dim; ++d) acc_o[d] = ca * acc_o[d] + cb * o[d];
  acc_lse = m + std::log(wa + wb);
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
  for (std::int64_t row = 0; row < rows; ++row) {
    float m = kNegInf;
    for (int k = 0; k < num_parts; ++k) {
      weight[k] = lse_to_natural(lse_parts[k * lse_part_stride + row], base);
      m = std::max(m, weight[k]);
    }
    float* o = out_o + row * dim;
    if (m == kNegInf) {  // every part empty
      std::fill(o, o + dim, 0.0f);
      if (out_lse) out_lse[row] = kNegInf;
      continue;
    }
    float total = 0;
    for (int k = 0; k < num_parts; ++k) {
      weight[k] = weight[k] == kNegInf ? 0.0f : std::exp(weight[k] - m);
      total += weight[k];
    }
    // One pass over the row with every part that holds anything (an empty part's O may be
    // garbage), each weighted by its share of the total.
    const float inv = 1.0f / total;
    int used = 0;
    for (int k = 0; k < num_parts; ++k) {
      if (weight[k] == 0.0f) continue;
      weight[used] = weight[k] * inv;
      part[used++] = o_parts + k * o_part_stride + row * dim;
    }
    sum(part.data(), weight.data(), used, dim, o);
    if (out_lse) out_lse[row] = m + std::log(total);
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
  for (std::int64_t row = 0; row < rows; ++row) {
    float m = kNegInf;
    for (int k = 0; k < num_parts; ++k) {
      m = std::max(m, lse_to_natural(lse_parts[k * rows + row], base));
    }
    if (m == kNegInf) {
      out_lse[row] = kNegInf;
      continue;
    }
    float total = 0;
    for (int k = 0; k < num_parts; ++k) {
      const float l = lse_to_natural(lse_parts[k * rows + row], base);
      if (l != kNegInf) total += std::exp(l - m);
    }
    out_lse[row] = m + std::log(total);
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
