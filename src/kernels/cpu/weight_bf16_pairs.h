// The opt-in avx512_bf16 weight path: bf16 and FP8 weights multiplied by x rounded to bf16, two
// columns per multiply-add with AVX512-BF16's vdpbf16ps. Rounding x (relative error up to 2^-9
// per value, as the bf16-pair attention paths round q and P) is what makes it faster than the
// exact path: bf16 weights are used as they are stored, never widened, FP8 codes widen exactly to
// bf16 (half the work of widening to fp32), and each instruction does the work of two fp32
// multiply-adds. vdpbf16ps flushes subnormal inputs and outputs to zero. Decode shapes:
// weight_gemv_bf16_pairs.cpp (bf16), weight_gemv_fp8_pairs.cpp (FP8); prefill shapes:
// weight_gemm_bf16_pairs.cpp.
//
// Sums: each (row of x, weight row) sum is the same whatever the grouping of weight rows or the
// threads; one row of x (read a weight row at a time), several rows, and the prefill shapes sum
// in different orders.
#pragma once

#include <cstdint>

#include "weight_gemv.h"

namespace dcp::kernels {

// Decode shapes: y[i * ldy + r] = bf16(x[i, :]) . w[r, :] for i < m, w bf16.
void gemv_bf16_pairs(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w,
                     float* y, std::int64_t ldy);

// Decode shapes on FP8 weights (needs AVX512-VBMI too: fp8_pairs_decode_available()):
// y[i * ldy + r] = sum over column blocks b of scale(r, b) * (bf16(x[i, b]) . w[r, b]), each
// code's value exact in bf16.
void gemv_fp8_pairs(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* y,
                    std::int64_t ldy);
bool fp8_pairs_decode_available();
// count FP8 codes as the bf16 of each one's value (exact: E4M3 has four significant bits), bit
// for bit float_to_bf16(fp8_e4m3_to_float(code)) but for the NaN codes, which give a quiet NaN:
// by shifts and a table (AVX-512 BW), or by byte lookups (AVX512-VBMI: the prefill product's
// choice where the CPU has it).
void widen_fp8_to_bf16_avx512(const fp8_e4m3_t* src, std::int64_t count, bf16_t* out);
void widen_fp8_to_bf16_vbmi(const fp8_e4m3_t* src, std::int64_t count, bf16_t* out);

// Prefill shapes, in two halves as gemm_pack_x / gemm_packed: x rounded to bf16 and packed into
// tiles of 48 tokens, each 32-bit lane a pair of columns (packed needs
// gemm_packed_x_floats(m, (k + 1) / 2) floats), then the product with a w of k = w.k columns:
// bf16, or FP8 whose scale blocks start at even columns (fp8_blocks_pair). FP8 rows are widened
// a block of rows at a time to the bf16 of each code's value (exact), each column block summed
// on its own and added times its scale.
bool fp8_blocks_pair(const GemvWeight& w);
void gemm_pack_x_bf16_pairs(const float* x, std::int64_t m, std::int64_t k, std::int64_t ldx,
                            float* packed);
void gemm_packed_bf16_pairs(const float* packed, std::int64_t m, const GemvWeight& w, float* y,
                            std::int64_t ldy);

}  // namespace dcp::kernels
