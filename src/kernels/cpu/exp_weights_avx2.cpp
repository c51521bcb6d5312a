// The sampling exp compiled for AVX2 (see exp_weights_simd.h).
#include "exp_weights_simd.h"

namespace dcp::kernels {

void exp_weights_avx2(const float* logits, std::size_t n, float top, double inv_t, double* out) {
  exp_weights_lanes<4>(logits, n, top, inv_t, out);
}

}  // namespace dcp::kernels
