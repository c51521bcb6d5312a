// The decode-shaped bf16-pair product on FP8 weights (weight_bf16_pairs.h), compiled with
// AVX512-BF16 and AVX512-VBMI.
//
// Each chunk of 64 codes becomes two vectors of 32 bf16 words in registers: two byte lookups
// (vpermi2b) give each code's bf16 high and low byte (exact: E4M3 has four significant bits;
// the NaN codes look up a NaN), the sign bit is or-ed on, and one interleave per 32 words makes
// the words. The interleave works within 128-bit lanes, so the words are in a fixed permuted
// order; x is rounded and permuted the same way once per call. A column block is summed from zero
// and added times its scale, as in the prefill shapes.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "dcp/error.h"
#include "dcp/kernel_path.h"
#include "line_vector.h"
#include "simd.h"
#include "weight_bf16_pairs.h"
#include "weight_bf16_pairs_simd.h"

namespace dcp::kernels {
namespace {

constexpr std::int64_t kChunk = 64;  // codes per chunk: two vectors of 32 bf16 words

// Word j of part q (0, 1) of a widened chunk holds code chunk_source(q, j).
constexpr std::int64_t chunk_source(int q, int j) {
  return 16 * (j / 8) + 8 * q + j % 8;
}

// The bf16 bytes of E4M3 magnitude code i (0..127), by the project's own conversions.
struct ByteTables {
  alignas(64) std::uint8_t high[128];
  alignas(64) std::uint8_t low[128];
};

const ByteTables& byte_tables() {
  static const ByteTables tables = [] {
    ByteTables t{};
    for (int i = 0; i < 128; ++i) {
      const bf16_t v = float_to_bf16(fp8_e4m3_to_float(static_cast<fp8_e4m3_t>(i)));
      t.high[i] = static_cast<std::uint8_t>(v >> 8);
      t.low[i] = static_cast<std::uint8_t>(v & 0xff);
    }
    return t;
  }();
  return tables;
}

struct Widener {
  __m512i low0, low1, high0, high1, sign;
  Widener() {
    const ByteTables& t = byte_tables();
    low0 = _mm512_load_si512(t.low);
    low1 = _mm512_load_si512(t.low + 64);
    high0 = _mm512_load_si512(t.high);
    high1 = _mm512_load_si512(t.high + 64);
    sign = _mm512_set1_epi8(static_cast<char>(0x80));
  }
  // vpermi2b reads an index's low seven bits; the sign goes on the high byte afterwards.
  void widen(__m512i codes, __m512bh& part0, __m512bh& part1) const {
    const __m512i low = _mm512_permutex2var_epi8(low0, codes, low1);
    __m512i high = _mm512_permutex2var_epi8(high0, codes, high1);
    high = _mm512_ternarylogic_epi32(high, codes, sign, 0xf8);  // high | (codes & 0x80)
    part0 = as_pairs(_mm512_unpacklo_epi8(low, high));
    part1 = as_pairs(_mm512_unpackhi_epi8(low, high));
  }
};

// A column block of the slice: columns [begin, end) of w, at `at` in the rounded x rows (each
// block padded with zeros to whole chunks).
struct ColumnBlock {
  std::int64_t begin, end, at;
};

// Sums of MG rows of rounded x (stride `stride`) against RB weight rows (stride k) that share
// the scale row `scales`: out[i * RB + r]. With kPrefetch (3: into L1, 2: into L2) the rows at
// `ahead` are asked for as these are read.
template <int MG, int RB, int kPrefetch>
void dot_rows(const Widener& wd, const bf16_t* xb, std::int64_t stride, const fp8_e4m3_t* w,
              std::int64_t k, const ColumnBlock* blocks, std::int64_t nblocks, const float* scales,
              float* out, const fp8_e4m3_t* ahead) {
  __m512 total[MG][RB];
  for (int i = 0; i < MG; ++i) {
    for (int r = 0; r < RB; ++r) total[i][r] = _mm512_setzero_ps();
  }
  for (std::int64_t b = 0; b < nblocks; ++b) {
    const ColumnBlock& block = blocks[b];
    __m512 acc[MG][RB];
    for (int i = 0; i < MG; ++i) {
      for (int r = 0; r < RB; ++r) acc[i][r] = _mm512_setzero_ps();
    }
    const bf16_t* xc = xb + block.at;
    for (std::int64_t c = block.begin; c < block.end; c += kChunk, xc += kChunk) {
      // A block's last chunk may be partial: its codes past the block load as zero (+0), as x is.
      const std::int64_t n = std::min(kChunk, block.end - c);
      const auto mask = n == kChunk ? ~__mmask64{0} : (__mmask64{1} << n) - 1;
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r) {
        if constexpr (kPrefetch != 0) __builtin_prefetch(ahead + r * k + c, 0, kPrefetch);
        __m512bh w0, w1;
        wd.widen(_mm512_maskz_loadu_epi8(mask, w + r * k + c), w0, w1);
#pragma GCC unroll 4
        for (int i = 0; i < MG; ++i) {
          const bf16_t* xi = xc + i * stride;
          acc[i][r] = _mm512_dpbf16_ps(acc[i][r], as_pairs(_mm512_load_si512(xi)), w0);
          acc[i][r] = _mm512_dpbf16_ps(acc[i][r], as_pairs(_mm512_load_si512(xi + 32)), w1);
        }
      }
    }
    const __m512 s = _mm512_set1_ps(scales[b]);
    for (int i = 0; i < MG; ++i) {
      for (int r = 0; r < RB; ++r) total[i][r] = _mm512_fmadd_ps(acc[i][r], s, total[i][r]);
    }
  }
  for (int i = 0; i < MG; ++i) {
    for (int r = 0; r < RB; ++r) out[i * RB + r] = Simd<16>::sum(total[i][r]);
  }
}

struct Slice {
  const Widener& wd;
  const bf16_t* xb;
  std::int64_t stride;
  const GemvWeight& w;
  const std::vector<ColumnBlock>& blocks;
};

// Weight rows [r_begin, r_end), which share their scale row, against MG rows of rounded x, RB
// rows at a time; the rows two groups on (one where two groups are over 32 KB) are asked for
// while these are summed, as the exact decode product does.
template <int MG>
void gemv_group(const Slice& s, std::int64_t r_begin, std::int64_t r_end, float* y,
                std::int64_t ldy, bool prefetch) {
  // Four sums per weight row and x row would spill past two weight rows for four rows of x.
  constexpr int RB = MG <= 2 ? 4 : 2;
  const auto* data = static_cast<const fp8_e4m3_t*>(s.w.data);
  const std::int64_t k = s.w.k, nblocks = static_cast<std::int64_t>(s.blocks.size());
  const float* scales = s.w.row_scales(r_begin);
  const std::int64_t ahead = 2 * RB * k <= (32 << 10) ? 2 : 1;
  const bool into_l1 = gemv_prefetch_into_l1();
  float sums[MG * RB];
  std::int64_t r = r_begin;
  for (; r + RB <= r_end; r += RB) {
    const fp8_e4m3_t* rows = data + r * k;
    if (prefetch && r + (ahead + 1) * RB <= s.w.rows) {
      const fp8_e4m3_t* later = rows + ahead * RB * k;
      if (into_l1) {
        dot_rows<MG, RB, 3>(s.wd, s.xb, s.stride, rows, k, s.blocks.data(), nblocks, scales, sums,
                            later);
      } else {
        dot_rows<MG, RB, 2>(s.wd, s.xb, s.stride, rows, k, s.blocks.data(), nblocks, scales, sums,
                            later);
      }
    } else {
      dot_rows<MG, RB, 0>(s.wd, s.xb, s.stride, rows, k, s.blocks.data(), nblocks, scales, sums,
                          nullptr);
    }
    for (int i = 0; i < MG; ++i) {
      for (int j = 0; j < RB; ++j) y[i * ldy + r + j] = sums[i * RB + j];
    }
  }
  for (; r < r_end; ++r) {
    dot_rows<MG, 1, 0>(s.wd, s.xb, s.stride, data + r * k, k, s.blocks.data(), nblocks, scales,
                       sums, nullptr);
    for (int i = 0; i < MG; ++i) y[i * ldy + r] = sums[i];
  }
}

}  // namespace

void widen_fp8_to_bf16_vbmi(const fp8_e4m3_t* src, std::int64_t count, bf16_t* out) {
  // The codes are first reordered so that the interleave, which works within 128-bit lanes,
  // leaves the words in column order: byte 16 l + t takes code 8 l + t, byte 16 l + 8 + t takes
  // code 32 + 8 l + t.
  struct Order {
    alignas(64) std::uint8_t index[64];
  };
  static const Order order = [] {
    Order o{};
    for (int l = 0; l < 4; ++l) {
      for (int t = 0; t < 8; ++t) {
        o.index[16 * l + t] = static_cast<std::uint8_t>(8 * l + t);
        o.index[16 * l + 8 + t] = static_cast<std::uint8_t>(32 + 8 * l + t);
      }
    }
    return o;
  }();
  const __m512i index = _mm512_load_si512(order.index);
  const Widener wd;
  std::int64_t c = 0;
  for (; c + kChunk <= count; c += kChunk) {
    __m512bh w0, w1;
    // (The zero-masked form: the plain one trips GCC 12's -Wmaybe-uninitialized.)
    wd.widen(_mm512_maskz_permutexvar_epi8(~__mmask64{0}, index, _mm512_loadu_si512(src + c)), w0,
             w1);
    _mm512_storeu_si512(out + c, reinterpret_cast<__m512i&>(w0));
    _mm512_storeu_si512(out + c + 32, reinterpret_cast<__m512i&>(w1));
  }
  for (; c < count; ++c) out[c] = float_to_bf16(fp8_e4m3_to_float(src[c]));
}

bool fp8_pairs_decode_available() {
  return avx512_bf16_available() && avx512_vbmi_available();
}

void gemv_fp8_pairs(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* y,
                    std::int64_t ldy) {
  DCP_ARG_CHECK(w.dtype == GemvDtype::fp8, "the FP8-pair decode product multiplies FP8 weights");
  // The column blocks, each padded to whole chunks in x's rounded rows.
  thread_local std::vector<ColumnBlock> blocks;
  blocks.clear();
  std::int64_t stride = 0;
  for (std::int64_t c = 0, b = 0; c < w.k; ++b) {
    const std::int64_t end = w.block_end(c, static_cast<int>(b));
    blocks.push_back({c, end, stride});
    stride += (end - c + kChunk - 1) / kChunk * kChunk;
    c = end;
  }
  // x rounded to bf16, then each chunk's words in the order the widening gives the codes'.
  thread_local LineVector<bf16_t> rounded, permuted;
  const auto size = static_cast<std::size_t>(m * stride);
  grow_to(rounded, size);
  grow_to(permuted, size);
  for (std::int64_t i = 0; i < m; ++i) {
    bf16_t* row = rounded.data() + i * stride;
    bf16_t* out = permuted.data() + i * stride;
    std::fill(row, row + stride, bf16_t{0});
    for (const ColumnBlock& b : blocks) {
      floats_to_bf16_avx512(x + i * ldx + b.begin, row + b.at,
                            static_cast<std::size_t>(b.end - b.begin));
    }
    for (std::int64_t c = 0; c < stride; c += kChunk) {
      for (int q = 0; q < 2; ++q) {
        for (int j = 0; j < 32; ++j) out[c + 32 * q + j] = row[c + chunk_source(q, j)];
      }
    }
  }
  const Widener wd;
  // Tiles of weight rows within each block of rows that shares a scale row.
  const std::int64_t tile = weight_row_tile(m, w.rows, w.k);
  for (std::int64_t r = 0; r < w.rows;) {
    const std::int64_t row_block = (w.row0 + r) / w.block_rows;
    const std::int64_t block_end = std::min(w.rows, (row_block + 1) * w.block_rows - w.row0);
    for (std::int64_t r0 = r; r0 < block_end; r0 += tile) {
      const std::int64_t r1 = std::min(block_end, r0 + tile);
      over_x_groups(m, [&]<int MG>(std::int64_t i) {
        gemv_group<MG>(Slice{wd, permuted.data() + i * stride, stride, w, blocks}, r0, r1,
                       y + i * ldy, ldy, i == 0);
      });
    }
    r = block_end;
  }
}

}  // namespace dcp::kernels
