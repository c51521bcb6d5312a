// The prefill-shaped weight product with AVX-512 (weight_gemm.h).

// GCC 12's AVX-512 unpack intrinsics pass an undefined vector as the unused merge source, which
// -Wmaybe-uninitialized reports once they are inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include <algorithm>
#include <vector>

#include "dcp/dtype.h"
#include "weight_gemm.h"

namespace dcp::kernels {
namespace {

constexpr std::int64_t kTileTokens = 48;  // three vectors of 16: 24 sums for 8 weight rows
constexpr int kTileRows = 8;
// Weight rows per block: a block (256 KB of fp32 at 1024 columns, 640 KB at 2560) stays in L2
// while every token tile passes over it.
constexpr std::int64_t kBlockRows = 64;
// Columns per pass over the tokens: beyond this the tiles of x no longer stay in L2 between
// weight rows, so longer rows are summed in passes (each continuing the sums it left in y).
constexpr std::int64_t kMaxColumns = 2048;
// How far ahead each weight row is prefetched (floats): a row is read once per token tile, and
// the first tile reads it from memory.
constexpr std::int64_t kPrefetchAhead = 256;

// 16 vectors of 16 floats transposed in registers: element j of r[i] goes to element i of r[j].
inline void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + c], 128-bit lane L: column 4L + c of rows 4g .. 4g + 3.
  for (int g = 0; g < 4; ++g) {
    const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * g + 2]), d = _mm512_castps_pd(t[4 * g + 3]);
    u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 s0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
    const __m512 s1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xee);
    const __m512 s2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
    const __m512 s3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_f32x4(s0, s2, 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(s0, s2, 0xdd);
    r[8 + c] = _mm512_shuffle_f32x4(s1, s3, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(s1, s3, 0xdd);
  }
}

// Columns are widened (bf16, FP8) and summed a chunk at a time: NR rows of a chunk are 8 KB,
// which stay in L1 while the token tile's sums run over them.
constexpr std::int64_t kChunk = 256;

// count bf16 values as fp32 (the bits moved up a half-word), the source read 1 KB ahead.
void widen_bf16(const bf16_t* src, std::int64_t count, float* out) {
  std::int64_t c = 0;
  for (; c + 16 <= count; c += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(src + c + 512), _MM_HINT_T0);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c));
    _mm512_storeu_ps(out + c, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  for (; c < count; ++c) out[c] = bf16_to_float(src[c]);
}

// count FP8 codes under one block scale s, as widen_rows_avx2 widens them (through fp16, times
// s x 2^8; the NaN code to all-ones bits), sixteen at a time.
void widen_fp8(const fp8_e4m3_t* src, std::int64_t count, float s, float* out) {
  const __m512 scale = _mm512_set1_ps(s * 256.0f);
  const __m512i nan_widened = _mm512_set1_epi32(0x3ff00000);
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512 all_ones = _mm512_castsi512_ps(_mm512_set1_epi32(-1));
  std::int64_t c = 0;
  for (; c + 16 <= count; c += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(src + c + 1024), _MM_HINT_T0);
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c));
    const __m256i words =
        _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8), 1),
                         _mm256_set1_epi16(static_cast<short>(0xbfff)));
    const __m512 f = _mm512_cvtph_ps(words);
    const __mmask16 is_nan =
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(f), magnitude), nan_widened);
    _mm512_storeu_ps(out + c, _mm512_mask_mov_ps(_mm512_mul_ps(f, scale), is_nan, all_ones));
  }
  for (; c < count; ++c) out[c] = fp8_e4m3_to_float(src[c]) * s;
}

// Columns [c0, c0 + count) of rows [r0, r0 + rows) of a bf16 or FP8 weight as fp32, row i at
// out + i * ld.
void widen_chunk(const GemvWeight& w, std::int64_t r0, std::int64_t rows, std::int64_t c0,
                 std::int64_t count, float* out, std::int64_t ld) {
  for (std::int64_t i = 0; i < rows; ++i, out += ld) {
    const std::int64_t r = r0 + i;
    if (w.dtype == GemvDtype::bf16) {
      widen_bf16(static_cast<const bf16_t*>(w.data) + r * w.k + c0, count, out);
      continue;
    }
    const auto* row = static_cast<const fp8_e4m3_t*>(w.data) + r * w.k;
    const float* scales =
        w.scales + ((w.row0 + r) / w.block_rows - w.row0 / w.block_rows) * w.scale_stride;
    for (std::int64_t c = c0; c < c0 + count;) {
      const std::int64_t b =
          c < w.first_block_cols ? 0 : 1 + (c - w.first_block_cols) / w.block_cols;
      const std::int64_t end = std::min(c0 + count, w.first_block_cols + b * w.block_cols);
      widen_fp8(row + c, end - c, scales[b], out + (c - c0));
      c = end;
    }
  }
}

// acc[j][r] += the packed tokens' columns [0, count) times row r (at rows + r * ld), a column at
// a time; kPrefetch asks for each row 1 KB ahead (rows read from memory, not widened in L1).
template <int MZ, int NR, bool kPrefetch>
__attribute__((always_inline)) inline void sum_columns(const float* p, const float* rows,
                                                       std::int64_t ld, std::int64_t count,
                                                       __m512 (&acc)[MZ][NR]) {
  constexpr int width = 16 * MZ;
  for (std::int64_t c = 0; c < count; ++c) {
    if (kPrefetch && c % 16 == 0) {
      for (int r = 0; r < NR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rows + r * ld + c + kPrefetchAhead),
                     _MM_HINT_T0);
      }
    }
    __m512 a[MZ];
    for (int j = 0; j < MZ; ++j) a[j] = _mm512_load_ps(p + c * width + 16 * j);
    for (int r = 0; r < NR; ++r) {
      const __m512 b = _mm512_set1_ps(rows[r * ld + c]);
      for (int j = 0; j < MZ; ++j) acc[j][r] = _mm512_fmadd_ps(a[j], b, acc[j][r]);
    }
  }
}

// Sums of `tokens` (<= 16 * MZ) packed tokens against rows [r0, r0 + NR) of w over columns
// [c_begin, c_begin + k); `resume` continues the sums already in y (a later pass over a long
// row), else they start from 0.
template <int MZ, int NR>
void tile(const float* p, const GemvWeight& w, std::int64_t r0, std::int64_t c_begin,
          std::int64_t k, float* y, std::int64_t ldy, std::int64_t tokens, bool resume) {
  constexpr int width = 16 * MZ;
  alignas(64) float sums[NR][width];
  alignas(64) float chunk[NR][kChunk];
  __m512 acc[MZ][NR];
  if (resume) {
    for (int r = 0; r < NR; ++r) {
      for (std::int64_t i = 0; i < width; ++i) sums[r][i] = i < tokens ? y[i * ldy + r] : 0.0f;
    }
  }
  for (int j = 0; j < MZ; ++j) {
    for (int r = 0; r < NR; ++r) {
      acc[j][r] = resume ? _mm512_load_ps(&sums[r][16 * j]) : _mm512_setzero_ps();
    }
  }
  if (w.dtype == GemvDtype::f32) {
    sum_columns<MZ, NR, true>(p, static_cast<const float*>(w.data) + r0 * w.k + c_begin, w.k, k,
                              acc);
  } else {
    for (std::int64_t c0 = 0; c0 < k; c0 += kChunk) {
      const std::int64_t count = std::min(kChunk, k - c0);
      widen_chunk(w, r0, NR, c_begin + c0, count, &chunk[0][0], kChunk);
      sum_columns<MZ, NR, false>(p + c0 * width, &chunk[0][0], kChunk, count, acc);
    }
  }
  for (int j = 0; j < MZ; ++j) {
    for (int r = 0; r < NR; ++r) _mm512_store_ps(&sums[r][16 * j], acc[j][r]);
  }
  for (std::int64_t i = 0; i < tokens; ++i) {
    for (int r = 0; r < NR; ++r) y[i * ldy + r] = sums[r][i];
  }
}

template <int MZ>
void tile_rows(const float* p, const GemvWeight& w, std::int64_t r0, std::int64_t n,
               std::int64_t c_begin, std::int64_t k, float* y, std::int64_t ldy,
               std::int64_t tokens, bool resume) {
  const std::int64_t whole = n / kTileRows * kTileRows;
  for (std::int64_t r = 0; r < whole; r += kTileRows) {
    tile<MZ, kTileRows>(p, w, r0 + r, c_begin, k, y + r, ldy, tokens, resume);
  }
  // The last n % 8 rows: one tile of that many.
  const std::int64_t rt = r0 + whole;
  float* yt = y + whole;
  switch (n - whole) {
    case 1: tile<MZ, 1>(p, w, rt, c_begin, k, yt, ldy, tokens, resume); break;
    case 2: tile<MZ, 2>(p, w, rt, c_begin, k, yt, ldy, tokens, resume); break;
    case 3: tile<MZ, 3>(p, w, rt, c_begin, k, yt, ldy, tokens, resume); break;
    case 4: tile<MZ, 4>(p, w, rt, c_begin, k, yt, ldy, tokens, resume); break;
    case 5: tile<MZ, 5>(p, w, rt, c_begin, k, yt, ldy, tokens, resume); break;
    case 6: tile<MZ, 6>(p, w, rt, c_begin, k, yt, ldy, tokens, resume); break;
    case 7: tile<MZ, 7>(p, w, rt, c_begin, k, yt, ldy, tokens, resume); break;
    default: break;
  }
}

float* align64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(p) + 63) & ~std::uintptr_t{63});
}

}  // namespace

std::int64_t gemm_packed_x_floats(std::int64_t m, std::int64_t k) {
  return (m + 15) / 16 * 16 * k + 16;
}

void gemm_pack_x_avx512(const float* x, std::int64_t m, std::int64_t k, std::int64_t ldx,
                        float* packed) {
  float* p = align64(packed);
  for (std::int64_t t0 = 0; t0 < m; t0 += kTileTokens) {
    const std::int64_t tokens = std::min(kTileTokens, m - t0);
    const std::int64_t width = (tokens + 15) / 16 * 16;
    for (std::int64_t g = 0; g < width; g += 16) {
      for (std::int64_t c0 = 0; c0 < k; c0 += 16) {
        const std::int64_t cols = std::min<std::int64_t>(16, k - c0);
        const auto mask = static_cast<__mmask16>((1u << cols) - 1);
        __m512 r[16];
        for (int i = 0; i < 16; ++i) {
          r[i] = g + i < tokens ? _mm512_maskz_loadu_ps(mask, x + (t0 + g + i) * ldx + c0)
                                : _mm512_setzero_ps();
        }
        transpose16(r);
        for (std::int64_t c = 0; c < cols; ++c) _mm512_store_ps(p + (c0 + c) * width + g, r[c]);
      }
    }
    p += width * k;
  }
}

void gemm_packed_avx512(const float* packed, std::int64_t m, const GemvWeight& w, float* y,
                        std::int64_t ldy) {
  const std::int64_t k = w.k;
  const float* p = align64(const_cast<float*>(packed));
  // One pass unless rows are well over kMaxColumns (a short last pass costs its y round trip).
  const std::int64_t pass = k <= kMaxColumns + kMaxColumns / 4 ? k : kMaxColumns;
  // With more than one token tile, bf16 and FP8 blocks are widened once into memory that every
  // tile then reads (widening a chunk per tile would repeat it); one tile widens in L1 as it goes.
  const bool widen_blocks = w.dtype != GemvDtype::f32 && m > kTileTokens;
  thread_local std::vector<float> block;
  if (widen_blocks) block.resize(static_cast<std::size_t>(kBlockRows * std::min(pass, k)));
  for (std::int64_t c0 = 0; c0 < k; c0 += pass) {
    const std::int64_t cols = std::min(pass, k - c0);
    for (std::int64_t n0 = 0; n0 < w.rows; n0 += kBlockRows) {
      const std::int64_t rows = std::min(kBlockRows, w.rows - n0);
      // The rows the tiles read: w's own, or the block widened (then rows 0.., columns 0..).
      GemvWeight source = w;
      std::int64_t r0 = n0, c_begin = c0;
      if (widen_blocks) {
        widen_chunk(w, n0, rows, c0, cols, block.data(), cols);
        source = GemvWeight{};
        source.data = block.data();
        source.rows = rows;
        source.k = cols;
        r0 = 0;
        c_begin = 0;
      }
      const float* pt = p;
      for (std::int64_t t0 = 0; t0 < m; t0 += kTileTokens) {
        const std::int64_t tokens = std::min(kTileTokens, m - t0);
        const std::int64_t width = (tokens + 15) / 16 * 16;
        const float* pc = pt + c0 * width;
        float* yb = y + t0 * ldy + n0;
        const bool resume = c0 > 0;
        switch (width / 16) {
          case 3: tile_rows<3>(pc, source, r0, rows, c_begin, cols, yb, ldy, tokens, resume); break;
          case 2: tile_rows<2>(pc, source, r0, rows, c_begin, cols, yb, ldy, tokens, resume); break;
          default:
            tile_rows<1>(pc, source, r0, rows, c_begin, cols, yb, ldy, tokens, resume);
            break;
        }
        pt += width * k;
      }
    }
  }
}

}  // namespace dcp::kernels
