// What the bf16-pair weight products share (weight_gemv_bf16_pairs.cpp, weight_gemv_fp8_pairs.cpp,
// weight_gemm_bf16_pairs.cpp, all compiled with AVX512-BF16): x rounded to bf16, the vector of
// pairs, and the decode products' walk over x's rows. Internal linkage.
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

// Decode shapes: weight rows per tile (a multiple of four) that stay in L1/L2 while every group
// of four rows of x passes over them, so that memory reads each weight once however many rows x
// has; all of them for up to four rows of x. row_bytes: one weight row's.
inline std::int64_t weight_row_tile(std::int64_t m, std::int64_t rows, std::int64_t row_bytes) {
  if (m <= 4) return rows;
  return 4 * std::max<std::int64_t>(1, (24 << 10) / std::max<std::int64_t>(1, 4 * row_bytes));
}

// Decode shapes: the m rows of x in groups of four, then one of the 1-3 left, as
// run.template operator()<MG>(i) for the group from row i.
template <class Run>
void over_x_groups(std::int64_t m, Run&& run) {
  std::int64_t i = 0;
  for (; i + 4 <= m; i += 4) run.template operator()<4>(i);
  switch (m - i) {
    case 3: run.template operator()<3>(i); break;
    case 2: run.template operator()<2>(i); break;
    case 1: run.template operator()<1>(i); break;
    default: break;
  }
}

}  // namespace
}  // namespace dcp::kernels
