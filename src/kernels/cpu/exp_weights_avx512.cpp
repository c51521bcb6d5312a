// The sampling exp compiled for AVX512 (see exp_weights_simd.h).
#include "exp_weights_simd.h"

namespace dcp::kernels {

void exp_weights_avx512(const float* logits, std::size_t n, float top, double inv_t, double* out) {
  exp_weights_lanes<8>(logits, n, top, inv_t, out);
}

}  // namespace dcp::kernels
