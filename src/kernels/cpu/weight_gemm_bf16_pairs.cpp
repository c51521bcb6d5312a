// The prefill-shaped bf16-pair weight product, bf16 and FP8 weights (weight_bf16_pairs.h),
// compiled with AVX512-BF16.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "dcp/error.h"
#include "line_vector.h"
#include "weight_bf16_pairs.h"
#include "weight_bf16_pairs_simd.h"
#include "weight_gemm.h"

namespace dcp::kernels {
namespace {

// ---- Prefill shapes: tokens in lanes, each 32-bit lane a pair of a token's columns; a weight
// row's pair is broadcast against a tile of 48 tokens. Tiles as the exact blocked product's
// (weight_gemm_blocked.h): 3 vectors of tokens x 8 weight rows of sums in registers, blocks of 64
// weight rows that stay in L2 while every tile passes over them, passes of at most 2048 pairs.

constexpr int kLanes = 16;
constexpr int kTileVectors = 3;
constexpr int kTileRows = 8;
constexpr std::int64_t kTileTokens = kLanes * kTileVectors;
constexpr std::int64_t kRowsPerBlock = 64;
constexpr std::int64_t kMaxPairs = 2048;
constexpr std::int64_t kPrefetchAhead = 512;  // bf16 values: 1 KB ahead in each weight row

std::int64_t packed_width(std::int64_t tokens) {
  return (tokens + kLanes - 1) / kLanes * kLanes;
}

const float* align64(const float* p) {
  return reinterpret_cast<const float*>((reinterpret_cast<std::uintptr_t>(p) + 63) &
                                        ~std::uintptr_t{63});
}

inline __m512bh broadcast_pair(const bf16_t* p) {
  std::uint32_t word;
  std::memcpy(&word, p, sizeof word);
  return as_pairs(_mm512_set1_epi32(static_cast<int>(word)));
}

// Sums of a tile's packed pairs [0, pairs) against NR weight rows (at rows + r * k, pair 0 at
// column 0); `odd` adds the column after them alone (a row of odd length ends with it).
template <int MZ, int NR>
void tile(const float* p, const bf16_t* rows, std::int64_t k, std::int64_t pairs, bool odd,
          float* y, std::int64_t ldy, std::int64_t tokens, bool resume) {
  constexpr int width = kLanes * MZ;
  alignas(64) float sums[NR][width];
  __m512 acc[MZ][NR];
  if (resume) {
    for (int r = 0; r < NR; ++r) {
      for (std::int64_t i = 0; i < width; ++i) sums[r][i] = i < tokens ? y[i * ldy + r] : 0.0f;
    }
  }
  for (int j = 0; j < MZ; ++j) {
    for (int r = 0; r < NR; ++r)
      acc[j][r] = resume ? _mm512_load_ps(&sums[r][kLanes * j]) : _mm512_setzero_ps();
  }
  for (std::int64_t c = 0; c < pairs; ++c) {
    if (c % 16 == 0) {
      for (int r = 0; r < NR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rows + r * k + 2 * c + kPrefetchAhead),
                     _MM_HINT_T0);
      }
    }
    __m512bh a[MZ];
    for (int j = 0; j < MZ; ++j) a[j] = as_pairs(_mm512_load_si512(p + c * width + kLanes * j));
    for (int r = 0; r < NR; ++r) {
      const __m512bh b = broadcast_pair(rows + r * k + 2 * c);
      for (int j = 0; j < MZ; ++j) acc[j][r] = _mm512_dpbf16_ps(acc[j][r], a[j], b);
    }
  }
  if (odd) {  // the pair's second value is x's zero padding; w's is not read
    __m512bh a[MZ];
    for (int j = 0; j < MZ; ++j) a[j] = as_pairs(_mm512_load_si512(p + pairs * width + kLanes * j));
    for (int r = 0; r < NR; ++r) {
      const __m512bh b = as_pairs(_mm512_set1_epi32(rows[r * k + 2 * pairs]));
      for (int j = 0; j < MZ; ++j) acc[j][r] = _mm512_dpbf16_ps(acc[j][r], a[j], b);
    }
  }
  for (int j = 0; j < MZ; ++j) {
    for (int r = 0; r < NR; ++r) _mm512_store_ps(&sums[r][kLanes * j], acc[j][r]);
  }
  for (std::int64_t i = 0; i < tokens; ++i) {
    for (int r = 0; r < NR; ++r) y[i * ldy + r] = sums[r][i];
  }
}

// The tiles of a block of n weight rows: run.template operator()<MZ, NR>(r) for the tile of NR
// rows from row r, MZ = `vectors` vectors of tokens wide (1 .. kTileVectors); whole tiles of
// kTileRows rows, then one of the rows left.
template <int MZ, int NR = kTileRows - 1, class Run>
void last_tile(int rows, std::int64_t r, Run& run) {
  if constexpr (NR >= 1) {
    if (rows == NR) {
      run.template operator()<MZ, NR>(r);
    } else {
      last_tile<MZ, NR - 1>(rows, r, run);
    }
  }
}

template <int MZ = kTileVectors, class Run>
void over_tiles(int vectors, std::int64_t n, Run&& run) {
  if constexpr (MZ >= 1) {
    if (vectors != MZ) {
      over_tiles<MZ - 1>(vectors, n, run);
      return;
    }
    std::int64_t r = 0;
    for (; r + kTileRows <= n; r += kTileRows) run.template operator()<MZ, kTileRows>(r);
    if (r < n) last_tile<MZ>(static_cast<int>(n - r), r, run);
  }
}

// ---- FP8 weights in prefill shapes: a block of rows widened once to the bf16 of each code's
// value (exact: E4M3 has four significant bits), then tiles as above, except that each column
// block's sums start from zero and join the totals times their row's block scale.

// bf16 bits of E4M3 magnitude codes 0..7 (exponent field 0: m x 2^-9), the rest zero.
__m512i subnormal_table() {
  alignas(64) bf16_t t[32] = {};
  for (int m = 0; m < 8; ++m) t[m] = float_to_bf16(std::ldexp(static_cast<float>(m), -9));
  return _mm512_load_si512(t);
}

}  // namespace

// Normal codes by moving their fields (exponent bias 7 to 127), the exponent-0 codes from a
// table, the NaN codes to a quiet NaN; signs kept.
void widen_fp8_to_bf16_avx512(const fp8_e4m3_t* src, std::int64_t count, bf16_t* out) {
  static const __m512i subnormals = subnormal_table();
  const __m512i magnitude_bits = _mm512_set1_epi16(0x7f), sign_bit = _mm512_set1_epi16(0x80);
  const __m512i bias = _mm512_set1_epi16(120 << 7), quiet_nan = _mm512_set1_epi16(0x7fc0);
  std::int64_t c = 0;
  for (; c + 32 <= count; c += 32) {
    const __m512i code =
        _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + c)));
    const __m512i magnitude = _mm512_and_si512(code, magnitude_bits);
    __m512i v = _mm512_add_epi16(_mm512_slli_epi16(magnitude, 4), bias);
    v = _mm512_mask_permutexvar_epi16(v, _mm512_cmplt_epu16_mask(magnitude, _mm512_set1_epi16(8)),
                                      magnitude, subnormals);
    v = _mm512_mask_mov_epi16(v, _mm512_cmpeq_epi16_mask(magnitude, magnitude_bits), quiet_nan);
    v = _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(code, sign_bit), 8));
    _mm512_storeu_si512(out + c, v);
  }
  for (; c < count; ++c) out[c] = float_to_bf16(fp8_e4m3_to_float(src[c]));
}

namespace {

// A run of pairs [begin, end) (from the pass's first column) inside column block `block`.
struct Segment {
  std::int64_t begin, end;
  std::int64_t block;
};

// `next`: where these rows' codes of the next block start (column `segments`' pair 0; stride k),
// asked into L2 a segment at a time as this tile runs (null: none).
template <int MZ, int NR>
void tile_fp8(const float* p, const bf16_t* rows, std::int64_t ld, const Segment* segments,
              int count, const float* const* scales, float* y, std::int64_t ldy,
              std::int64_t tokens, bool resume, const fp8_e4m3_t* next, std::int64_t k) {
  constexpr int width = kLanes * MZ;
  alignas(64) float sums[NR][width];
  for (int r = 0; r < NR; ++r) {
    for (std::int64_t i = 0; i < width; ++i)
      sums[r][i] = resume && i < tokens ? y[i * ldy + r] : 0.0f;
  }
  for (int s = 0; s < count; ++s) {
    if (next != nullptr) {
      for (int r = 0; r < NR; ++r) {
        const char* line = reinterpret_cast<const char*>(next + r * k + 2 * segments[s].begin);
        for (std::int64_t b = 0; b < 2 * (segments[s].end - segments[s].begin); b += 64) {
          _mm_prefetch(line + b, _MM_HINT_T1);
        }
      }
    }
    __m512 acc[MZ][NR];
    for (int j = 0; j < MZ; ++j) {
      for (int r = 0; r < NR; ++r) acc[j][r] = _mm512_setzero_ps();
    }
    for (std::int64_t c = segments[s].begin; c < segments[s].end; ++c) {
      __m512bh a[MZ];
      for (int j = 0; j < MZ; ++j) a[j] = as_pairs(_mm512_load_si512(p + c * width + kLanes * j));
      for (int r = 0; r < NR; ++r) {
        const __m512bh b = broadcast_pair(rows + r * ld + 2 * c);
        for (int j = 0; j < MZ; ++j) acc[j][r] = _mm512_dpbf16_ps(acc[j][r], a[j], b);
      }
    }
    for (int r = 0; r < NR; ++r) {
      const __m512 scale = _mm512_set1_ps(scales[r][segments[s].block]);
      for (int j = 0; j < MZ; ++j) {
        float* at = &sums[r][kLanes * j];
        _mm512_store_ps(at, _mm512_fmadd_ps(acc[j][r], scale, _mm512_load_ps(at)));
      }
    }
  }
  for (std::int64_t i = 0; i < tokens; ++i) {
    for (int r = 0; r < NR; ++r) y[i * ldy + r] = sums[r][i];
  }
}

// The FP8 product: per pass of columns and block of rows, the rows widened into `block`, then
// every tile over them.
void gemm_packed_fp8_pairs(const float* p, std::int64_t m, const GemvWeight& w, float* y,
                           std::int64_t ldy) {
  const std::int64_t k = w.k, pairs = (k + 1) / 2;
  const auto* codes = static_cast<const fp8_e4m3_t*>(w.data);
  const std::int64_t pass = pairs <= kMaxPairs + kMaxPairs / 4 ? pairs : kMaxPairs;
  thread_local LineVector<bf16_t> block;
  grow_to(block, static_cast<std::size_t>(kRowsPerBlock * 2 * std::min(pass, pairs)));
  // Byte lookups where the CPU has them: 1.05-1.1x the product at an expert's 48 rows on Zen 5.
  static const auto widen =
      avx512_vbmi_available() ? widen_fp8_to_bf16_vbmi : widen_fp8_to_bf16_avx512;
  std::vector<Segment> segments;
  const float* scales[kRowsPerBlock];
  for (std::int64_t c0 = 0; c0 < pairs; c0 += pass) {
    const std::int64_t count = std::min(pass, pairs - c0);
    const std::int64_t col_begin = 2 * c0, col_end = std::min(k, 2 * (c0 + count));
    const std::int64_t ld = 2 * count;  // a widened row, padded to whole pairs
    // The column blocks this pass crosses (every boundary before k is even: fp8_blocks_pair).
    segments.clear();
    for (std::int64_t c = col_begin; c < col_end;) {
      const std::int64_t b =
          c < w.first_block_cols ? 0 : 1 + (c - w.first_block_cols) / w.block_cols;
      const std::int64_t end = std::min(col_end, w.first_block_cols + b * w.block_cols);
      segments.push_back({(c - col_begin) / 2, (end - col_begin + 1) / 2, b});
      c = end;
    }
    for (std::int64_t n0 = 0; n0 < w.rows; n0 += kRowsPerBlock) {
      const std::int64_t rows = std::min(kRowsPerBlock, w.rows - n0);
      for (std::int64_t r = 0; r < rows; ++r) {
        bf16_t* out = block.data() + r * ld;
        widen(codes + (n0 + r) * k + col_begin, col_end - col_begin, out);
        std::fill(out + (col_end - col_begin), out + ld, bf16_t{0});
        scales[r] = w.row_scales(n0 + r);
      }
      const float* pt = p;
      for (std::int64_t t0 = 0; t0 < m; t0 += kTileTokens) {
        const std::int64_t tokens = std::min(kTileTokens, m - t0);
        const std::int64_t width = packed_width(tokens);
        over_tiles(static_cast<int>(width / kLanes), rows, [&]<int MZ, int NR>(std::int64_t r) {
          // The first tile of tokens asks for the same rows of the next block into L2, a segment
          // at a time as it runs, so that widening them does not wait on memory.
          const bool ask = t0 == 0 && n0 + kRowsPerBlock + r + NR <= w.rows;
          tile_fp8<MZ, NR>(pt + c0 * width, block.data() + r * ld, ld, segments.data(),
                           static_cast<int>(segments.size()), scales + r, y + t0 * ldy + n0 + r,
                           ldy, tokens, c0 > 0,
                           ask ? codes + (n0 + kRowsPerBlock + r) * k + col_begin : nullptr, k);
        });
        pt += width * pairs;
      }
    }
  }
}

}  // namespace

bool fp8_blocks_pair(const GemvWeight& w) {
  return w.dtype == GemvDtype::fp8 && w.block_cols % 2 == 0 &&
         (w.first_block_cols % 2 == 0 || w.first_block_cols >= w.k);
}

void gemm_pack_x_bf16_pairs(const float* x, std::int64_t m, std::int64_t k, std::int64_t ldx,
                            float* packed) {
  const std::int64_t pairs = (k + 1) / 2;
  thread_local LineVector<bf16_t> rounded;
  grow_to(rounded, static_cast<std::size_t>(m * 2 * pairs));
  round_rows(x, m, k, ldx, rounded.data(), 2 * pairs);
  // A pair is one 32-bit word: the fp32 packing moves words without reading them as numbers.
  gemm_pack_x_avx512(reinterpret_cast<const float*>(rounded.data()), m, pairs, pairs, packed);
}

void gemm_packed_bf16_pairs(const float* packed, std::int64_t m, const GemvWeight& w, float* y,
                            std::int64_t ldy) {
  const float* p = align64(packed);
  if (w.dtype == GemvDtype::fp8) {
    DCP_ARG_CHECK(fp8_blocks_pair(w),
                  "the bf16-pair product needs FP8 scale blocks that start "
                  "at even columns (first block ",
                  w.first_block_cols, " columns, then ", w.block_cols, ")");
    gemm_packed_fp8_pairs(p, m, w, y, ldy);
    return;
  }
  DCP_ARG_CHECK(w.dtype == GemvDtype::bf16,
                "the bf16-pair weight product multiplies bf16 or FP8 weights");
  const std::int64_t k = w.k, pairs = (k + 1) / 2, whole = k / 2;
  const auto* data = static_cast<const bf16_t*>(w.data);
  // One pass unless rows are well over kMaxPairs (a short last pass costs its y round trip).
  const std::int64_t pass = pairs <= kMaxPairs + kMaxPairs / 4 ? pairs : kMaxPairs;
  for (std::int64_t c0 = 0; c0 < pairs; c0 += pass) {
    // This pass's whole pairs, and whether the row's odd last column ends it.
    const std::int64_t count = std::min(pass, whole - c0);
    const bool odd = c0 + pass >= pairs && k % 2 == 1;
    for (std::int64_t n0 = 0; n0 < w.rows; n0 += kRowsPerBlock) {
      const std::int64_t rows = std::min(kRowsPerBlock, w.rows - n0);
      const float* pt = p;
      for (std::int64_t t0 = 0; t0 < m; t0 += kTileTokens) {
        const std::int64_t tokens = std::min(kTileTokens, m - t0);
        const std::int64_t width = packed_width(tokens);
        over_tiles(static_cast<int>(width / kLanes), rows, [&]<int MZ, int NR>(std::int64_t r) {
          tile<MZ, NR>(pt + c0 * width, data + (n0 + r) * k + 2 * c0, k, count, odd,
                       y + t0 * ldy + n0 + r, ldy, tokens, c0 > 0);
        });
        pt += width * pairs;
      }
    }
  }
}

}  // namespace dcp::kernels
