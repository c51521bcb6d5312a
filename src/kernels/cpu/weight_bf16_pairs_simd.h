// What the bf16-pair weight products share (weight_gemv_bf16_pairs.cpp, weight_gemm_bf16_pairs.cpp,
// both compiled with AVX512-BF16): x rounded to bf16 and the vector of pairs. Internal linkage.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "convert_paths.h"
#include "dcp/dtype.h"

namespace dcp::kernels {
namespace {

constexpr std::int64_t kVectorValues = 32;  // bf16 values in a vector

inline __m512bh as_pairs(__m512i v) {
  return reinterpret_cast<__m512bh&>(v);
}

// Rows of x rounded to bf16 (dcp::float_to_bf16's bits), row i at out + i * stride, zero from
// column k to `stride`.
inline void round_rows(const float* x, std::int64_t m, std::int64_t k, std::int64_t ldx,
                       bf16_t* out, std::int64_t stride) {
  for (std::int64_t i = 0; i < m; ++i) {
    bf16_t* row = out + i * stride;
    floats_to_bf16_avx512(x + i * ldx, row, static_cast<std::size_t>(k));
    std::fill(row + k, row + stride, bf16_t{0});
  }
}

}  // namespace
}  // namespace dcp::kernels
