// The fp32 -> bf16 row conversion compiled for AVX512 (see convert_simd.h).
#include "convert_paths.h"
#include "convert_simd.h"

namespace dcp::kernels {

void floats_to_bf16_avx512(const float* src, bf16_t* dst, std::size_t n) {
  floats_to_bf16_lanes(src, dst, n);
}

}  // namespace dcp::kernels
