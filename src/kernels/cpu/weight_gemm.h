// Prefill-shaped weight products: y[i, r] = x[i, :] . w[r, :] for many rows of x (tokens) and the
// rows of an fp32, bf16 or FP8 weight. x is packed once per product, transposed into tiles of
// tokens (48 on AVX-512, 24 on AVX2); a tile's sums for several weight rows (8 on AVX-512, 4 on
// AVX2) live in registers, and each weight value is broadcast against the tile's tokens. Every
// sum runs k in order, one fused multiply-add per term, so it depends neither on the tiling, the
// blocking, the threads nor the instruction set: sum = fma(x[c], w[c], sum) for c = 0, 1, ...
// from 0. The two copies are compiled from weight_gemm_blocked.h.
#pragma once

#include <cstdint>

#include "weight_gemv.h"

namespace dcp::kernels {

// Floats (plus 64-byte alignment slack) that either gemm_pack_x copy needs for m rows of k.
std::int64_t gemm_packed_x_floats(std::int64_t m, std::int64_t k);

// x [m, k] (row stride ldx) into `packed`, 64-byte aligned: tiles of 48 (AVX-512) or 24 (AVX2)
// tokens, the last one a whole number of vectors wide (zero past m), each k columns of `width`
// tokens.
void gemm_pack_x_avx512(const float* x, std::int64_t m, std::int64_t k, std::int64_t ldx,
                        float* packed);
void gemm_pack_x_avx2(const float* x, std::int64_t m, std::int64_t k, std::int64_t ldx,
                      float* packed);

// y[i * ldy + r] = x[i, :] . w[r, :] for i < m and every row r of w, with x packed by the same
// instruction set's gemm_pack_x (k = w.k). fp32 rows are read in place. bf16 and FP8 rows are
// widened to the values widen_rows gives, bit for bit: with one tile of tokens 256 columns of a
// tile's rows at a time into L1, with several a block of 64 rows once into memory that every
// tile reads.
void gemm_packed_avx512(const float* packed, std::int64_t m, const GemvWeight& w, float* y,
                        std::int64_t ldy);
void gemm_packed_avx2(const float* packed, std::int64_t m, const GemvWeight& w, float* y,
                      std::int64_t ldy);

}  // namespace dcp::kernels
