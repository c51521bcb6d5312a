// The decode-shaped weight product compiled for AVX2 + FMA (see weight_gemv_simd.h).
#include "weight_gemv_simd.h"

namespace dcp::kernels {

void gemv_avx2(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* y,
              std::int64_t ldy) {
  gemv_lanes<8>(x, m, ldx, w, y, ldy);
}

}  // namespace dcp::kernels
