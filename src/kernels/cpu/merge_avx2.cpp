// The merge's weighted sum compiled for AVX2 (see merge_simd.h).
#include "merge_simd.h"

namespace dcp::kernels {

void weighted_sum_avx2(const float* const* parts, const float* weights, int num_parts, int dim,
                       float* out) {
  weighted_sum_lanes(parts, weights, num_parts, dim, out);
}

}  // namespace dcp::kernels
