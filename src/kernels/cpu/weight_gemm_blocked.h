// The blocked prefill product (weight_gemm.h), written once over an instruction set's vector
// operations `V` and compiled per instruction set (weight_gemm_avx512.cpp, weight_gemm_avx2.cpp).
// V provides:
//   vec, lanes                    a vector of `lanes` floats
//   tile_vectors, tile_rows       a token tile is tile_vectors vectors wide; its sums for
//                                 tile_rows weight rows stay in registers
//   rows_per_block                weight rows per block, which stays in L2 while every token
//                                 tile passes over it
//   zero(), load(p), set1(f), fma(a, b, c) = a * b + c, store(p, v)   (p aligned to a vector)
//   load_first(p, count)          p[0 .. count) (count <= lanes), zero in the lanes past it
//   transpose(r[lanes])           element j of r[i] to element i of r[j]
//   widen_bf16(src, count, out), widen_fp8(src, count, scale, out),
//   widen_int4(row, scales, group, c0, count, out)   bit for bit widen_rows'
// Internal linkage: each instruction set keeps its own copy.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dcp/dtype.h"
#include "weight_gemv.h"

namespace dcp::kernels {
namespace {

// Columns per pass over the tokens: beyond this the tiles of x no longer stay in L2 between
// weight rows, so longer rows are summed in passes (each continuing the sums it left in y).
constexpr std::int64_t kMaxColumns = 2048;
// How far ahead each weight row is prefetched (floats): a row is read once per token tile, and
// the first tile reads it from memory.
constexpr std::int64_t kPrefetchAhead = 256;
// Columns are widened (bf16, FP8) and summed a chunk at a time: a tile's rows of a chunk (8 KB
// for 8 rows) stay in L1 while the token tile's sums run over them.
constexpr std::int64_t kChunk = 256;

template <class V>
constexpr std::int64_t tile_tokens() {
  return V::lanes * V::tile_vectors;
}

// Packed width of a tile of `tokens` tokens: whole vectors.
template <class V>
std::int64_t packed_width(std::int64_t tokens) {
  return (tokens + V::lanes - 1) / V::lanes * V::lanes;
}

inline float* align64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(p) + 63) & ~std::uintptr_t{63});
}

// Columns [c0, c0 + count) of rows [r0, r0 + rows) of a bf16 or FP8 weight as fp32, row i at
// out + i * ld.
template <class V>
void widen_chunk(const GemvWeight& w, std::int64_t r0, std::int64_t rows, std::int64_t c0,
                 std::int64_t count, float* out, std::int64_t ld) {
  for (std::int64_t i = 0; i < rows; ++i, out += ld) {
    const std::int64_t r = r0 + i;
    if (w.dtype == GemvDtype::bf16) {
      V::widen_bf16(static_cast<const bf16_t*>(w.data) + r * w.k + c0, count, out);
      continue;
    }
    if (w.dtype == GemvDtype::int4) {
      V::widen_int4(static_cast<const std::uint8_t*>(w.data) + r * (w.k / 2), w.row_scales(r),
                    w.block_cols, c0, count, out);
      continue;
    }
    const auto* row = static_cast<const fp8_e4m3_t*>(w.data) + r * w.k;
    const float* scales = w.row_scales(r);
    for (std::int64_t c = c0; c < c0 + count;) {
      const std::int64_t b =
          c < w.first_block_cols ? 0 : 1 + (c - w.first_block_cols) / w.block_cols;
      const std::int64_t end = std::min(c0 + count, w.first_block_cols + b * w.block_cols);
      V::widen_fp8(row + c, end - c, scales[b], out + (c - c0));
      c = end;
    }
  }
}

// acc[j][r] += the packed tokens' columns [0, count) times row r (at rows + r * ld), a column at
// a time; kPrefetch asks for each row 1 KB ahead (rows read from memory, not widened in L1).
template <class V, int MZ, int NR, bool kPrefetch>
__attribute__((always_inline)) inline void sum_columns(const float* p, const float* rows,
                                                       std::int64_t ld, std::int64_t count,
                                                       typename V::vec (&acc)[MZ][NR]) {
  constexpr int width = V::lanes * MZ;
  for (std::int64_t c = 0; c < count; ++c) {
    if (kPrefetch && c % 16 == 0) {
      for (int r = 0; r < NR; ++r) {
        __builtin_prefetch(rows + r * ld + c + kPrefetchAhead, 0, 3);
      }
    }
    typename V::vec a[MZ];
    for (int j = 0; j < MZ; ++j) a[j] = V::load(p + c * width + V::lanes * j);
    for (int r = 0; r < NR; ++r) {
      const typename V::vec b = V::set1(rows[r * ld + c]);
      for (int j = 0; j < MZ; ++j) acc[j][r] = V::fma(a[j], b, acc[j][r]);
    }
  }
}

// Sums of `tokens` (<= lanes * MZ) packed tokens against rows [r0, r0 + NR) of w over columns
// [c_begin, c_begin + k); `resume` continues the sums already in y (a later pass over a long
// row), else they start from 0.
template <class V, int MZ, int NR>
void tile(const float* p, const GemvWeight& w, std::int64_t r0, std::int64_t c_begin,
          std::int64_t k, float* y, std::int64_t ldy, std::int64_t tokens, bool resume) {
  constexpr int width = V::lanes * MZ;
  alignas(64) float sums[NR][width];
  alignas(64) float chunk[NR][kChunk];
  typename V::vec acc[MZ][NR];
  if (resume) {
    for (int r = 0; r < NR; ++r) {
      for (std::int64_t i = 0; i < width; ++i) sums[r][i] = i < tokens ? y[i * ldy + r] : 0.0f;
    }
  }
  for (int j = 0; j < MZ; ++j) {
    for (int r = 0; r < NR; ++r) {
      acc[j][r] = resume ? V::load(&sums[r][V::lanes * j]) : V::zero();
    }
  }
  if (w.dtype == GemvDtype::f32) {
    sum_columns<V, MZ, NR, true>(p, static_cast<const float*>(w.data) + r0 * w.k + c_begin, w.k, k,
                                 acc);
  } else {
    for (std::int64_t c0 = 0; c0 < k; c0 += kChunk) {
      const std::int64_t count = std::min(kChunk, k - c0);
      widen_chunk<V>(w, r0, NR, c_begin + c0, count, &chunk[0][0], kChunk);
      sum_columns<V, MZ, NR, false>(p + c0 * width, &chunk[0][0], kChunk, count, acc);
    }
  }
  for (int j = 0; j < MZ; ++j) {
    for (int r = 0; r < NR; ++r) V::store(&sums[r][V::lanes * j], acc[j][r]);
  }
  for (std::int64_t i = 0; i < tokens; ++i) {
    for (int r = 0; r < NR; ++r) y[i * ldy + r] = sums[r][i];
  }
}

// The last `rows` (< V::tile_rows) rows of a block: one tile of exactly that many.
template <class V, int MZ, int NR = V::tile_rows - 1>
void tail_tile(int rows, const float* p, const GemvWeight& w, std::int64_t r0, std::int64_t c_begin,
               std::int64_t k, float* y, std::int64_t ldy, std::int64_t tokens, bool resume) {
  if constexpr (NR >= 1) {
    if (rows == NR) {
      tile<V, MZ, NR>(p, w, r0, c_begin, k, y, ldy, tokens, resume);
    } else {
      tail_tile<V, MZ, NR - 1>(rows, p, w, r0, c_begin, k, y, ldy, tokens, resume);
    }
  }
}

template <class V, int MZ>
void tile_rows(const float* p, const GemvWeight& w, std::int64_t r0, std::int64_t n,
               std::int64_t c_begin, std::int64_t k, float* y, std::int64_t ldy,
               std::int64_t tokens, bool resume) {
  const std::int64_t whole = n / V::tile_rows * V::tile_rows;
  for (std::int64_t r = 0; r < whole; r += V::tile_rows) {
    tile<V, MZ, V::tile_rows>(p, w, r0 + r, c_begin, k, y + r, ldy, tokens, resume);
  }
  tail_tile<V, MZ>(static_cast<int>(n - whole), p, w, r0 + whole, c_begin, k, y + whole, ldy,
                   tokens, resume);
}

// A tile `vectors` vectors wide (1 .. V::tile_vectors) over rows [r0, r0 + n).
template <class V, int MZ = V::tile_vectors>
void tile_rows_of_width(int vectors, const float* p, const GemvWeight& w, std::int64_t r0,
                        std::int64_t n, std::int64_t c_begin, std::int64_t k, float* y,
                        std::int64_t ldy, std::int64_t tokens, bool resume) {
  if constexpr (MZ >= 1) {
    if (vectors == MZ) {
      tile_rows<V, MZ>(p, w, r0, n, c_begin, k, y, ldy, tokens, resume);
    } else {
      tile_rows_of_width<V, MZ - 1>(vectors, p, w, r0, n, c_begin, k, y, ldy, tokens, resume);
    }
  }
}

// Rows [0, tokens) x columns [0, cols) of x (each <= lanes) transposed in registers: column c
// at out + c * width, zero for the tokens past `tokens`.
template <class V>
void pack_block(const float* x, std::int64_t ldx, std::int64_t tokens, std::int64_t cols,
                float* out, std::int64_t width) {
  typename V::vec r[V::lanes];
  for (int i = 0; i < V::lanes; ++i)
    r[i] = i < tokens ? V::load_first(x + i * ldx, cols) : V::zero();
  V::transpose(r);
  for (std::int64_t c = 0; c < cols; ++c) V::store(out + c * width, r[c]);
}

template <class V>
void pack_x(const float* x, std::int64_t m, std::int64_t k, std::int64_t ldx, float* packed) {
  float* p = align64(packed);
  for (std::int64_t t0 = 0; t0 < m; t0 += tile_tokens<V>()) {
    const std::int64_t tokens = std::min(tile_tokens<V>(), m - t0);
    const std::int64_t width = packed_width<V>(tokens);
    for (std::int64_t g = 0; g < width; g += V::lanes) {
      const std::int64_t group = std::clamp<std::int64_t>(tokens - g, 0, V::lanes);
      for (std::int64_t c0 = 0; c0 < k; c0 += V::lanes) {
        pack_block<V>(x + (t0 + g) * ldx + c0, ldx, group, std::min<std::int64_t>(V::lanes, k - c0),
                      p + c0 * width + g, width);
      }
    }
    p += width * k;
  }
}

template <class V>
void gemm_packed(const float* packed, std::int64_t m, const GemvWeight& w, float* y,
                 std::int64_t ldy) {
  const std::int64_t k = w.k;
  const float* p = align64(const_cast<float*>(packed));
  // One pass unless rows are well over kMaxColumns (a short last pass costs its y round trip).
  const std::int64_t pass = k <= kMaxColumns + kMaxColumns / 4 ? k : kMaxColumns;
  // With more than one token tile, bf16 and FP8 blocks are widened once into memory that every
  // tile then reads (widening a chunk per tile would repeat it); one tile widens in L1 as it goes.
  const bool widen_blocks = w.dtype != GemvDtype::f32 && m > tile_tokens<V>();
  thread_local std::vector<float> block;
  if (widen_blocks) block.resize(static_cast<std::size_t>(V::rows_per_block * std::min(pass, k)));
  for (std::int64_t c0 = 0; c0 < k; c0 += pass) {
    const std::int64_t cols = std::min(pass, k - c0);
    for (std::int64_t n0 = 0; n0 < w.rows; n0 += V::rows_per_block) {
      const std::int64_t rows = std::min(V::rows_per_block, w.rows - n0);
      // The rows the tiles read: w's own, or the block widened (then rows 0.., columns 0..).
      GemvWeight source = w;
      std::int64_t r0 = n0, c_begin = c0;
      if (widen_blocks) {
        widen_chunk<V>(w, n0, rows, c0, cols, block.data(), cols);
        source = GemvWeight{};
        source.data = block.data();
        source.rows = rows;
        source.k = cols;
        r0 = 0;
        c_begin = 0;
      }
      const float* pt = p;
      for (std::int64_t t0 = 0; t0 < m; t0 += tile_tokens<V>()) {
        const std::int64_t tokens = std::min(tile_tokens<V>(), m - t0);
        const std::int64_t width = packed_width<V>(tokens);
        tile_rows_of_width<V>(static_cast<int>(width / V::lanes), pt + c0 * width, source, r0, rows,
                              c_begin, cols, y + t0 * ldy + n0, ldy, tokens, c0 > 0);
        pt += width * k;
      }
    }
  }
}

}  // namespace
}  // namespace dcp::kernels
