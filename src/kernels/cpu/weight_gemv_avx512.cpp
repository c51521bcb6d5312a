// The decode-shaped weight product compiled for AVX-512 (see weight_gemv_simd.h).
#include "weight_gemv_simd.h"

namespace dcp::kernels {

void gemv_avx512(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* y,
                std::int64_t ldy) {
  gemv_lanes<16>(x, m, ldx, w, y, ldy);
}

}  // namespace dcp::kernels
