// Per-instruction-set fp32 -> bf16 row conversions; each is compiled with its own flags
// (convert_avx2.cpp, convert_avx512.cpp) and must produce the bits of dcp::float_to_bf16.
#pragma once

#include <cstddef>

#include "dcp/dtype.h"

namespace dcp::kernels {

void floats_to_bf16_avx2(const float* src, bf16_t* dst, std::size_t n);
void floats_to_bf16_avx512(const float* src, bf16_t* dst, std::size_t n);

}  // namespace dcp::kernels
