// The decode-shaped weight product for AVX-512 CPUs with AVX512-VBMI (see weight_gemv_simd.h):
// FP8 widened by byte lookups; fp32 and bf16 weights run the plain AVX-512 copy.
#include "weight_gemv_simd.h"

namespace dcp::kernels {

void gemv_avx512_vbmi(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w,
                      float* y, std::int64_t ldy) {
  if (w.dtype != GemvDtype::fp8) {
    gemv_avx512(x, m, ldx, w, y, ldy);
    return;
  }
  gemv_typed<16, fp8_e4m3_t>(x, m, ldx, w, y, ldy);
}

}  // namespace dcp::kernels
