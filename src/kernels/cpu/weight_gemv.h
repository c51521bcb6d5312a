// Decode-shaped products with weights in their checkpoint dtype: y[i, r] = x[i, :] . w[r, :] for
// a few rows of x (a decode batch) and every row r of an fp32, bf16, FP8 or INT4 weight. The
// weights are widened in registers, never into memory, so each weight byte is read from memory
// once; the per-instruction-set copies are compiled from weight_gemv_simd.h with their own flags.
#pragma once

#include <algorithm>
#include <cstdint>

#include "dcp/dtype.h"

namespace dcp::kernels {

enum class GemvDtype : std::uint8_t { f32, bf16, fp8, int4 };

// A weight slice [rows, k] in its dtype. FP8: the values of row r between column boundaries
// share one scale, scales[r_block * scale_stride + c_block]; the first column block of the slice
// ends at column `first_block_cols` (a slice may start inside a block), later ones every
// `block_cols` columns; r_block = (row0 + r) / block_rows - row0 / block_rows. INT4: the same
// with blocks of one row and block_cols (the group) columns, the first one whole
// (first_block_cols = block_cols, a multiple of 32 that divides k); row r's codes are the k / 2
// bytes at data + r * k / 2, column c in the low (c even) or high nibble of byte c / 2.
struct GemvWeight {
  const void* data = nullptr;
  GemvDtype dtype = GemvDtype::f32;
  std::int64_t rows = 0, k = 0;
  const float* scales = nullptr;
  std::int64_t scale_stride = 0;
  std::int64_t row0 = 0;
  int block_rows = 1;
  std::int64_t first_block_cols = 0, block_cols = 0;

  // FP8: row r's scales, one per column block.
  const float* row_scales(std::int64_t r) const {
    return scales + ((row0 + r) / block_rows - row0 / block_rows) * scale_stride;
  }
  // FP8: where column block b, which starts at column c, ends.
  std::int64_t block_end(std::int64_t c, std::int64_t b) const {
    return std::min(k, b == 0 ? first_block_cols : c + block_cols);
  }
};

// INT4 column c of a row of codes, before its group's scale: code - 8.
inline float int4_weight(const std::uint8_t* row, std::int64_t c) {
  return static_cast<float>(((row[c / 2] >> (4 * (c % 2))) & 15) - 8);
}

// INT4 columns [c0, c0 + count) of a row (codes at `row`, its group scales at `scales`, groups of
// `group` columns) as fp32: code - 8 times its scale, rounded once.
inline void widen_int4(const std::uint8_t* row, const float* scales, std::int64_t group,
                       std::int64_t c0, std::int64_t count, float* out) {
  for (std::int64_t c = c0; c < c0 + count;) {
    const float s = scales[c / group];
    const std::int64_t end = std::min(c0 + count, (c / group + 1) * group);
    for (; c < end; ++c) out[c - c0] = int4_weight(row, c) * s;
  }
}

// One weight as fp32 (an FP8 value before its block scale): the tails and the portable copy.
inline float widen_weight(float v) {
  return v;
}
inline float widen_weight(bf16_t v) {
  return bf16_to_float(v);
}
inline float widen_weight(fp8_e4m3_t v) {
  return fp8_e4m3_to_float(v);
}

// y[i * ldy + r] for i < m and every row r of w. x rows have stride ldx.
using GemvFn = void (*)(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w,
                        float* y, std::int64_t ldy);

void gemv_portable(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* y,
                   std::int64_t ldy);
void gemv_avx2(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* y,
               std::int64_t ldy);
void gemv_avx512(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* y,
                 std::int64_t ldy);
// gemv_avx512 with FP8 widened by AVX512-VBMI byte lookups instead of F16C (faster where the CPU
// has VBMI: the automatic and avx512 paths pick it there).
void gemv_avx512_vbmi(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w,
                      float* y, std::int64_t ldy);
bool avx512_vbmi_available();

// The CPU's L1 data cache per core in bytes, which decides how the copies ask for weight lines
// ahead of reading them (weight_gemv_simd.h): what glibc reads from CPUID, else sysfs, else 32 KB.
std::int64_t l1_data_cache_bytes();
// Whether weight lines are asked into L1 (a cache of at least 48 KB) or only into L2. Measured on
// cold weights at one row of x: Zen 5 (48 KB) reads 1-9% faster with lines asked into L1; Zen 4
// (32 KB) reads 1.4-1.8x faster with them asked into L2, where lines asked into L1 evict each
// other and x before they are read.
bool gemv_prefetch_into_l1();

// Rows [r0, r1) of w widened to fp32, row-major with stride w.k: widen_weight(v) (FP8: times its
// block scale), bit for bit, for WeightMatrix::to_float and the tiles BLAS multiplies on the
// portable path. AVX-512 CPUs run the AVX2 copy (a copy is widened once and read many times).
using WidenRowsFn = void (*)(const GemvWeight& w, std::int64_t r0, std::int64_t r1, float* out);

void widen_rows_portable(const GemvWeight& w, std::int64_t r0, std::int64_t r1, float* out);
void widen_rows_avx2(const GemvWeight& w, std::int64_t r0, std::int64_t r1, float* out);
// INT4 rows, for both copies (each value one conversion and one multiplication).
void widen_rows_int4(const GemvWeight& w, std::int64_t r0, std::int64_t r1, float* out);
// widen_rows_avx2's pieces: count bf16 values, and count FP8 codes under one block scale s.
void widen_bf16_avx2(const bf16_t* src, std::int64_t count, float* out);
void widen_fp8_avx2(const fp8_e4m3_t* src, std::int64_t count, float s, float* out);

}  // namespace dcp::kernels
