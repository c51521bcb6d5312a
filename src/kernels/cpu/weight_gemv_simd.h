// The decode-shaped weight product (weight_gemv.h) written once over GCC vectors of W lanes and
// compiled per instruction set (weight_gemv_avx2.cpp, weight_gemv_avx512.cpp).
//
// Widening without shuffles. A chunk of weights is loaded as whole vectors and split into its
// even and odd values by shifts and masks alone (bf16: the low and high word of each 32-bit
// lane; FP8: the low and high byte of each 16-bit word). The lanes therefore hold the chunk's
// columns in a fixed permuted order, and x is permuted the same way once per call (x is a few
// rows; the weights are megabytes). Several weight rows are taken at once so that each x vector
// loaded meets several weight rows, and their sums are independent dependency chains.
//
// FP8 E4M3 widens to its value times 2^-8; the block scales times 2^8 go on x, once per block of
// weight rows that shares them (a few thousand multiplications per hundred-odd weight rows), so
// the loop over the weights is the same as bf16's: widen, multiply-add. Two widenings:
// - F16C (AVX2, and AVX-512 without VBMI): the code's sign, exponent and mantissa bits, moved
//   into an fp16 word's, make an fp16 of that value (fp16's exponent bias is 15, E4M3's 7), which
//   F16C widens to fp32 in one instruction, subnormals included. The NaN code, which this makes
//   the fp16 1.875, is noticed in passing; rows that hold one are computed again with a fix-up
//   that turns it back into a NaN.
// - AVX512-VBMI: two byte lookups (vpermi2b) give each code's fp32 top two bytes, and two rounds
//   of unpacking with zero bytes make the floats: fewer instructions than F16C's shifts and
//   conversions, whose throughput bounded the F16C copy at one row of x on Zen 5. The NaN codes
//   look up a NaN.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "dcp/dtype.h"
#include "line_vector.h"
#include "simd.h"
#include "weight_gemv.h"

namespace dcp::kernels {
namespace {

// A chunk of kParts * W weights widened into kParts vectors; lane j of part q holds the chunk's
// column source(q, j).
template <int W, typename T>
struct Widen;

template <int W>
struct Widen<W, float> {
  using vec = typename Simd<W>::vec;
  static constexpr int kParts = 1;
  static int source(int, int j) { return j; }
  static void widen(const float* p, vec* out) { out[0] = Simd<W>::load(p); }
};

template <int W>
struct Widen<W, bf16_t> {
  using vec = typename Simd<W>::vec;
  typedef std::uint32_t uvec __attribute__((vector_size(W * 4)));
  static constexpr int kParts = 2;
  // A 32-bit lane holds columns 2j (low word) and 2j + 1 (high word); a bf16 is the top half of
  // its float.
  static int source(int q, int j) { return 2 * j + q; }
  static void widen(const bf16_t* p, vec* out) {
    uvec u;
    std::memcpy(&u, p, sizeof u);
    const uvec even = u << 16, odd = u & 0xffff0000u;
    std::memcpy(&out[0], &even, sizeof(vec));
    std::memcpy(&out[1], &odd, sizeof(vec));
  }
};

// FP8 codes -> fp16 words of their values times 2^-8: the code in a word's high byte, shifted
// right by one arithmetically, has its sign in bits 15 and 14 and its exponent and mantissa in
// fp16's places; clearing bit 14 (and the other byte's bits) leaves the fp16.
template <int W>
struct Fp8Words {
  typedef std::int16_t words __attribute__((vector_size(W * 4)));  // 2W words: 4W codes
  static void split(const fp8_e4m3_t* p, words& even, words& odd) {
    words w;
    std::memcpy(&w, p, sizeof w);
    odd = (w >> 1) & static_cast<std::int16_t>(0xbf80);
    even = static_cast<words>(w << 8) >> 1 & static_cast<std::int16_t>(0xbfff);
  }
};

// What both FP8 widths share: a chunk of 4W codes whose even and odd words make four parts
// (word t of the even (odd) words is code 2t (2t + 1); parts 0 and 1 are the even words'
// halves), and the NaN-code check: bytes set where a chunk holds E4M3's NaN code (0x7f or 0xff),
// or-ed into `seen`. A macro, because GCC 12 miscompiles a byte vector whose size depends on a
// template argument.
#define DCP_FP8_CHUNK_COMMON(WIDTH)                                                         \
  using vec = Simd<WIDTH>::vec;                                                             \
  static constexpr int kParts = 4;                                                          \
  static int source(int q, int j) {                                                         \
    return 2 * WIDTH * (q & 1) + 2 * j + (q >> 1);                                          \
  }                                                                                         \
  typedef std::uint8_t bytes __attribute__((vector_size(4 * WIDTH)));                       \
  static void note_nan_codes(const fp8_e4m3_t* p, bytes& seen) {                            \
    bytes b;                                                                                \
    std::memcpy(&b, p, sizeof b);                                                           \
    seen |= (b | 0x80) == 0xff;                                                             \
  }                                                                                         \
  static bool any(const bytes& seen) {                                                      \
    std::uint64_t q[sizeof(bytes) / 8];                                                     \
    std::memcpy(q, &seen, sizeof q);                                                        \
    return std::any_of(std::begin(q), std::end(q), [](std::uint64_t v) { return v != 0; }); \
  }

#if defined(__AVX2__)
template <>
struct Widen<8, fp8_e4m3_t> {
  DCP_FP8_CHUNK_COMMON(8)
  static void widen(const fp8_e4m3_t* p, vec* out) {
    Fp8Words<8>::words even, odd;
    Fp8Words<8>::split(p, even, odd);
    __m128i h[4];  // the even words' halves, then the odd words'
    std::memcpy(&h[0], &even, sizeof even);
    std::memcpy(&h[2], &odd, sizeof odd);
    const __m256 f[4] = {_mm256_cvtph_ps(h[0]), _mm256_cvtph_ps(h[1]), _mm256_cvtph_ps(h[2]),
                         _mm256_cvtph_ps(h[3])};
    std::memcpy(out, f, sizeof f);
  }
};
#endif
#if defined(__AVX512F__) && !defined(__AVX512VBMI__)
template <>
struct Widen<16, fp8_e4m3_t> {
  DCP_FP8_CHUNK_COMMON(16)
  static void widen(const fp8_e4m3_t* p, vec* out) {
    Fp8Words<16>::words even, odd;
    Fp8Words<16>::split(p, even, odd);
    __m256i h[4];  // the even words' halves, then the odd words'
    std::memcpy(&h[0], &even, sizeof even);
    std::memcpy(&h[2], &odd, sizeof odd);
    // (GCC 12 warns on the unmasked conversion.)
    const __m512 f[4] = {_mm512_maskz_cvtph_ps(0xffff, h[0]), _mm512_maskz_cvtph_ps(0xffff, h[1]),
                         _mm512_maskz_cvtph_ps(0xffff, h[2]), _mm512_maskz_cvtph_ps(0xffff, h[3])};
    std::memcpy(out, f, sizeof f);
  }
};
#endif
#if defined(__AVX512VBMI__)
// Byte `shift / 8` of the fp32 bits of E4M3 magnitude code i (0..127) times 2^-8; code 0x7f is
// the NaN. Every such value is exact in the top two bytes (at most 4 significant bits).
constexpr std::uint8_t fp8_lane_byte(int i, int shift) {
  const int e = i >> 3, m = i & 7;
  std::uint32_t bits = 0;  // code 0: +0
  if (i == 0x7f) {
    bits = 0x7fc00000u;
  } else if (e > 0) {  // (1 + m/8) 2^(e - 7 - 8): fp32 exponent field e - 15 + 127
    bits = static_cast<std::uint32_t>(e + 112) << 23 | static_cast<std::uint32_t>(m) << 20;
  } else if (m > 0) {  // m/8 2^(-6 - 8), normalized: m << s in [8, 16) is 1.f x 2^(3 - s)
    int s = 0;
    while ((m << s) < 8) ++s;
    const auto exponent = static_cast<std::uint32_t>(127 - 14 - s);
    const auto fraction = static_cast<std::uint32_t>((m << s) & 7);
    bits = exponent << 23 | fraction << 20;
  }
  return static_cast<std::uint8_t>(bits >> shift);
}

struct Fp8ByteTables {
  alignas(64) std::uint8_t high[128];  // bits 24-31 of the fp32
  alignas(64) std::uint8_t low[128];   // bits 16-23
};

constexpr Fp8ByteTables make_fp8_byte_tables() {
  Fp8ByteTables t{};
  for (int i = 0; i < 128; ++i) {
    t.high[i] = fp8_lane_byte(i, 24);
    t.low[i] = fp8_lane_byte(i, 16);
  }
  return t;
}

inline constexpr Fp8ByteTables kFp8ByteTables = make_fp8_byte_tables();

// 64 codes -> four vectors of 16 floats. vpermi2b reads an index's low seven bits, so the sign
// bit is or-ed onto the high byte afterwards. The unpacking works within 128-bit lanes: lane j of
// part q holds code 16 (j / 4) + 4 q + j % 4.
template <>
struct Widen<16, fp8_e4m3_t> {
  using vec = Simd<16>::vec;
  static constexpr int kParts = 4;
  static int source(int q, int j) { return 16 * (j / 4) + 4 * q + j % 4; }
  // No NaN fix-up: the tables give NaN codes a NaN.
  typedef std::uint8_t bytes __attribute__((vector_size(64)));
  static void note_nan_codes(const fp8_e4m3_t*, bytes&) {}
  static bool any(const bytes&) { return false; }
  static void widen(const fp8_e4m3_t* p, vec* out) {
    const Fp8ByteTables& t = kFp8ByteTables;
    const __m512i codes = _mm512_loadu_si512(p);
    const __m512i low =
        _mm512_permutex2var_epi8(_mm512_load_si512(t.low), codes, _mm512_load_si512(t.low + 64));
    __m512i high =
        _mm512_permutex2var_epi8(_mm512_load_si512(t.high), codes, _mm512_load_si512(t.high + 64));
    // high | (codes & 0x80)
    high = _mm512_ternarylogic_epi32(high, codes, _mm512_set1_epi8(static_cast<char>(0x80)), 0xf8);
    const __m512i words_lo = _mm512_unpacklo_epi8(low, high);  // codes 16 l + 0..7 of lane l
    const __m512i words_hi = _mm512_unpackhi_epi8(low, high);  // codes 16 l + 8..15
    const __m512i zero = _mm512_setzero_si512();
    const __m512i f[4] = {
        _mm512_unpacklo_epi16(zero, words_lo), _mm512_unpackhi_epi16(zero, words_lo),
        _mm512_unpacklo_epi16(zero, words_hi), _mm512_unpackhi_epi16(zero, words_hi)};
    std::memcpy(out, f, sizeof f);
  }
};
#endif
#undef DCP_FP8_CHUNK_COMMON

// Only the NaN code widens to +-1.875 (times 2^8 it is E4M3's 0x7f, 480): make it NaN.
template <int W>
typename Simd<W>::vec nan_code_to_nan(typename Simd<W>::vec v) {
  typename Simd<W>::ivec bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits |= (bits & 0x7fffffff) == 0x3ff00000;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// The end of the column block that starts at column c (block b): one block without scales.
inline std::int64_t block_end(const GemvWeight& w, std::int64_t c, int b) {
  return w.dtype == GemvDtype::fp8 ? w.block_end(c, b) : w.k;
}

// x's rows with every whole chunk of every block in Widen's lane order (the columns left over at
// a block's end stay in place).
template <int W, typename T>
void permute_x(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* xp) {
  using Wd = Widen<W, T>;
  constexpr int kChunk = Wd::kParts * W;
  for (std::int64_t i = 0; i < m; ++i) {
    const float* src = x + i * ldx;
    float* dst = xp + i * w.k;
    std::int64_t c = 0;
    for (int b = 0; c < w.k; ++b) {
      const std::int64_t end = block_end(w, c, b);
      for (; c + kChunk <= end; c += kChunk) {
        for (int q = 0; q < Wd::kParts; ++q) {
          for (int j = 0; j < W; ++j) dst[c + q * W + j] = src[c + Wd::source(q, j)];
        }
      }
      for (; c < end; ++c) dst[c] = src[c];
    }
  }
}

// FP8: the m rows of permuted x (stride k) times the scales of one block of weight rows
// (`scales`, one per column block) and 2^8, which the lanes' fp16 values lack. The product is
// rounded once, unless the scale times 2^8 overflows: then it multiplies in two steps.
inline void scale_x(const float* xp, std::int64_t m, const GemvWeight& w, const float* scales,
                    float* xs) {
  for (std::int64_t i = 0; i < m; ++i) {
    const float* src = xp + i * w.k;
    float* dst = xs + i * w.k;
    std::int64_t c = 0;
    for (int b = 0; c < w.k; ++b) {
      const std::int64_t end = block_end(w, c, b);
      const float s = scales[b], lane_scale = s * 256.0f;
      if (std::isfinite(lane_scale) || !std::isfinite(s)) {
        for (; c < end; ++c) dst[c] = src[c] * lane_scale;
      } else {
        for (; c < end; ++c) dst[c] = src[c] * 256.0f * s;
      }
    }
  }
}

// Sums of MG rows of x against RB consecutive weight rows (stride k): out[i * RB + r]. x is
// permuted (and for FP8 scaled by scale_x for these rows' scales). FP8: NaN codes are fixed up
// only with kNanCodes; without it the return says whether a row held one (then the caller runs
// the rows again with it). With kPrefetch (3: into L1, 2: into L2), `prefetch` is RB rows further
// on whose columns are asked into cache as these are read (a template choice: a run-time test in
// the loop makes GCC spill the accumulators). A row's sum does not depend on RB (bf16 rows against
// one row of x that fits L1 beside them are summed by dot_row_sequential, in its own order).
template <int W, typename T, int MG, int RB, bool kNanCodes = false, int kPrefetch = 0>
bool dot_rows(const float* xp, const T* w, const GemvWeight& g, float* out,
              const T* prefetch = nullptr) {
  using S = Simd<W>;
  using vec = typename S::vec;
  using Wd = Widen<W, T>;
  constexpr int P = Wd::kParts, kChunk = P * W;
  constexpr bool fp8 = sizeof(T) == 1;
  const std::int64_t k = g.k;
  vec acc[MG][RB] = {};
  float tail[MG][RB] = {};
  typename Widen<W, fp8_e4m3_t>::bytes nan_seen = {};  // FP8: where a chunk held a NaN code
  std::int64_t c = 0;
  for (int b = 0; c < k; ++b) {
    const std::int64_t end = block_end(g, c, b);
    for (; c + kChunk <= end; c += kChunk) {
      vec xs[MG][P];
#pragma GCC unroll 4
      for (int i = 0; i < MG; ++i) {
#pragma GCC unroll 4
        for (int q = 0; q < P; ++q) xs[i][q] = S::load(xp + i * k + c + q * W);
      }
#pragma GCC unroll 4
      for (int r = 0; r < RB; ++r) {
        // Into L1 or L2 by the CPU's L1 size (gemv_prefetch_into_l1()).
        if constexpr (kPrefetch != 0) __builtin_prefetch(prefetch + r * k + c, 0, kPrefetch);
        vec wv[P];
        Wd::widen(w + r * k + c, wv);
        if constexpr (fp8) {
          if constexpr (kNanCodes) {
#pragma GCC unroll 4
            for (int q = 0; q < P; ++q) wv[q] = nan_code_to_nan<W>(wv[q]);
          } else {
            Wd::note_nan_codes(w + r * k + c, nan_seen);
          }
        }
#pragma GCC unroll 4
        for (int i = 0; i < MG; ++i) {
#pragma GCC unroll 4
          for (int q = 0; q < P; ++q) acc[i][r] += wv[q] * xs[i][q];
        }
      }
    }
    // The columns left at a block's end; FP8 values times 2^-8 (exact), as the lanes hold them.
    for (; c < end; ++c) {
      for (int r = 0; r < RB; ++r) {
        const float wv = fp8 ? widen_weight(w[r * k + c]) * 0x1p-8f : widen_weight(w[r * k + c]);
        for (int i = 0; i < MG; ++i) tail[i][r] += wv * xp[i * k + c];
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MG; ++i) {
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) out[i * RB + r] = S::sum(acc[i][r]) + tail[i][r];
  }
  if constexpr (fp8 && !kNanCodes) {
    return Widen<W, fp8_e4m3_t>::any(nan_seen);
  }
  return false;
}

// One bf16 weight row against one row of permuted x, read front to back. Four sums (two chunks,
// two parts each) keep four multiply-adds in flight; with kPrefetch the line 4 KB further on in
// the weight is asked for as each line is read (on the rows that follow this one).
constexpr std::int64_t kSequentialAhead = 4096;

template <int W, bool kPrefetch>
float dot_row_sequential(const float* xp, const bf16_t* w, std::int64_t k) {
  using S = Simd<W>;
  using vec = typename S::vec;
  using Wd = Widen<W, bf16_t>;
  constexpr int P = Wd::kParts, kChunk = P * W;
  constexpr int kStepBytes = 2 * kChunk * static_cast<int>(sizeof(bf16_t));
  vec acc[2][P] = {};
  std::int64_t c = 0;
  for (; c + 2 * kChunk <= k; c += 2 * kChunk) {
    if constexpr (kPrefetch) {
      const char* ahead = reinterpret_cast<const char*>(w + c) + kSequentialAhead;
#pragma GCC unroll 4
      for (int b = 0; b < kStepBytes; b += 64) __builtin_prefetch(ahead + b, 0, 3);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      vec wv[P];
      Wd::widen(w + c + h * kChunk, wv);
#pragma GCC unroll 4
      for (int q = 0; q < P; ++q) acc[h][q] += wv[q] * S::load(xp + c + h * kChunk + q * W);
    }
  }
  if (c + kChunk <= k) {
    vec wv[P];
    Wd::widen(w + c, wv);
    for (int q = 0; q < P; ++q) acc[0][q] += wv[q] * S::load(xp + c + q * W);
    c += kChunk;
  }
  float tail = 0.0f;
  for (; c < k; ++c) tail += widen_weight(w[c]) * xp[c];
  vec total = acc[0][0];
  for (int q = 1; q < P; ++q) total += acc[0][q];
  for (int q = 0; q < P; ++q) total += acc[1][q];
  return S::sum(total) + tail;
}

// Weight rows [r_begin, r_end), which share their scale row (FP8), against MG rows of x prepared
// for them (permuted; FP8: scaled), RB rows at a time.
template <int W, typename T, int MG>
void gemv_group(const float* xp, const GemvWeight& w, std::int64_t r_begin, std::int64_t r_end,
                float* y, std::int64_t ldy, bool prefetch) {
  // Three or four rows of x take two weight rows at a time, except on AVX-512's 32 registers with
  // fp32 or bf16 weights, where four weight rows (16 sums, 4-8 x vectors) still fit and each x
  // vector loaded serves twice the multiply-adds (Zen 5, cold 8192 x 2048 weight: bf16 1.5x at
  // 8 and 16 rows of x, fp32 1.1-1.25x). FP8's four widened parts would spill.
  constexpr int RB = MG <= 2 || (W == 16 && sizeof(T) != 1) ? 4 : 2;
  const T* data = static_cast<const T*>(w.data);
  // bf16 with one row of x: a row at a time, so that memory sees one stream. Four rows read side
  // by side are four streams, which the hardware prefetchers serve more slowly than one while
  // the core widens and multiplies between loads (Zen 5, cold weights: 1.2-1.35x at k = 512-2048,
  // 1.0-1.15x at k = 7168). Only while x's row stays in L1 beside the weight's lines: each
  // weight row reads all of it (Zen 5, 48 KB: up to two thirds of it, k <= 8192; past that,
  // k = 12288-18432: 0.92-1.03x; Zen 4, 32 KB, whose four rows ask their lines into L2: up to a
  // quarter, k <= 2048: 1.0-1.1x at k = 1408-2048, 0.85x at 4096, 0.55x at 7168). fp32 is read
  // at memory speed either way; FP8's widening needs the four rows to share each x vector loaded;
  // two rows of x lose.
  if constexpr (MG == 1 && std::is_same_v<T, bf16_t>) {
    const std::int64_t x_room =
        gemv_prefetch_into_l1() ? l1_data_cache_bytes() * 2 / 3 : l1_data_cache_bytes() / 4;
    if (w.k * static_cast<std::int64_t>(sizeof(float)) <= x_room) {
      const std::int64_t row_bytes = w.k * static_cast<std::int64_t>(sizeof(T));
      for (std::int64_t r = r_begin; r < r_end; ++r) {
        const T* row = data + r * w.k;
        const bool ask = prefetch && (r + 1) * row_bytes + kSequentialAhead <= w.rows * row_bytes;
        y[r] = ask ? dot_row_sequential<W, true>(xp, row, w.k)
                   : dot_row_sequential<W, false>(xp, row, w.k);
      }
      return;
    }
  }
  // The hardware prefetchers do not keep ahead of a few rows read at widening speed (they stop
  // at page edges): the rows two groups on are asked for while these are summed (one group on
  // asks too late; further on gains nothing), or one group on where two groups are over 32 KB:
  // asked into L1, lines that far ahead are evicted before they are read (Zen 5, cold weights
  // with k = 7168: 1.04-1.06x for FP8 and bf16). fp32 weights with one or two rows of x are read
  // at memory speed without it, and lose by it. Into L1 or L2: gemv_prefetch_into_l1().
  const std::int64_t ahead =
      2 * RB * w.k * static_cast<std::int64_t>(sizeof(T)) <= (32 << 10) ? 2 : 1;
  const bool into_l1 = gemv_prefetch_into_l1();
  std::int64_t r = r_begin;
  float sums[MG * RB];
  for (; r + RB <= r_end; r += RB) {
    const bool ask = prefetch && !(sizeof(T) == 4 && MG <= 2) && r + (ahead + 1) * RB <= w.rows;
    const T* rows = data + r * w.k;
    const T* later = ask ? rows + ahead * RB * w.k : nullptr;
    const bool held = !ask      ? dot_rows<W, T, MG, RB>(xp, rows, w, sums)
                      : into_l1 ? dot_rows<W, T, MG, RB, false, 3>(xp, rows, w, sums, later)
                                : dot_rows<W, T, MG, RB, false, 2>(xp, rows, w, sums, later);
    if (held) dot_rows<W, T, MG, RB, true>(xp, rows, w, sums);
    for (int i = 0; i < MG; ++i) {
      for (int j = 0; j < RB; ++j) y[i * ldy + r + j] = sums[i * RB + j];
    }
  }
  for (; r < r_end; ++r) {
    if (dot_rows<W, T, MG, 1>(xp, data + r * w.k, w, sums)) {
      dot_rows<W, T, MG, 1, true>(xp, data + r * w.k, w, sums);
    }
    for (int i = 0; i < MG; ++i) y[i * ldy + r] = sums[i];
  }
}

// Weight rows [r_begin, r_end) against all m rows of x prepared for them.
template <int W, typename T>
void gemv_rows(const float* xp, std::int64_t m, const GemvWeight& w, std::int64_t r_begin,
               std::int64_t r_end, float* y, std::int64_t ldy) {
  // Weight rows in tiles that stay in L1/L2 while every group of four x rows passes over them:
  // memory reads each weight once however many rows x has.
  // (A multiple of four rows, so that gemv_group takes whole groups of rows.)
  const std::int64_t tile =
      m <= 4 ? r_end - r_begin
             : 4 * std::max<std::int64_t>(
                       1, (24 << 10) / std::max<std::int64_t>(1, 4 * w.k * sizeof(T)));
  for (std::int64_t r0 = r_begin; r0 < r_end; r0 += tile) {
    const std::int64_t r1 = std::min(r_end, r0 + tile);
    std::int64_t i = 0;
    // The first group of x rows reads the tile from memory; the others find it in cache.
    // bf16 on AVX2 past four rows of x: groups of two rows against four weight rows each hold
    // their sums, x and widened weights in the 16 registers, where groups of four spill and
    // reload x from L2 (measured on a cold 8192 x 2048 weight: 1.2x at 8 rows of x, 1.35-1.4x at
    // 12-16, 1.03x at 5-6). fp32 and FP8 were slower that way (fp32 re-reads its larger tile
    // twice as often; FP8's four widened parts spill), and AVX-512 has 32 registers.
    if (W == 8 && sizeof(T) == 2 && m > 4) {
      for (; i + 2 <= m; i += 2) {
        gemv_group<W, T, 2>(xp + i * w.k, w, r0, r1, y + i * ldy, ldy, i == 0);
      }
    }
    for (; i + 4 <= m; i += 4) {
      gemv_group<W, T, 4>(xp + i * w.k, w, r0, r1, y + i * ldy, ldy, i == 0);
    }
    switch (m - i) {
      case 3: gemv_group<W, T, 3>(xp + i * w.k, w, r0, r1, y + i * ldy, ldy, i == 0); break;
      case 2: gemv_group<W, T, 2>(xp + i * w.k, w, r0, r1, y + i * ldy, ldy, i == 0); break;
      case 1: gemv_group<W, T, 1>(xp + i * w.k, w, r0, r1, y + i * ldy, ldy, i == 0); break;
      default: break;
    }
  }
}

template <int W, typename T>
void gemv_typed(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* y,
                std::int64_t ldy) {
  // On cache lines: the kernels load x a whole vector at a time, and from operator new's 16-byte
  // alignment most of those loads straddle two lines (up to 1.9x slower at 4-16 rows of x).
  thread_local LineVector<float> permuted;
  permuted.resize(static_cast<std::size_t>(m * w.k));
  permute_x<W, T>(x, m, ldx, w, permuted.data());
  if constexpr (sizeof(T) != 1) {
    gemv_rows<W, T>(permuted.data(), m, w, 0, w.rows, y, ldy);
  } else {
    // One pass per block of weight rows that shares a scale row, with x scaled for it.
    thread_local LineVector<float> scaled;
    scaled.resize(permuted.size());
    for (std::int64_t r = 0; r < w.rows;) {
      const std::int64_t block = (w.row0 + r) / w.block_rows;
      const std::int64_t end = std::min(w.rows, (block + 1) * w.block_rows - w.row0);
      scale_x(permuted.data(), m, w, w.row_scales(r), scaled.data());
      gemv_rows<W, T>(scaled.data(), m, w, r, end, y, ldy);
      r = end;
    }
  }
}

// INT4. A chunk of 2W columns is W bytes: zero-extended into W 32-bit lanes, the low nibbles
// are the chunk's even columns and the high nibbles its odd ones, so x is permuted once per call
// into each chunk's even columns, then its odd ones. Each value is code x scale - 8 x scale in one
// fused multiply-add: code - 8 times its group's scale rounded once (-8 x scale is exact), the
// value row_to_float gives; then it is multiplied by x. Groups are multiples of 32 columns, so
// whole chunks fill them. (A lookup of the group's sixteen values by vpermps, one vector made per
// group, ran no faster on Zen 5 and puts three shuffles on every 32 values.)
// Per instruction set: W codes zero-extended from W bytes, and code x scale + bias rounded once
// (GCC's vector casts reinterpret the bits).
template <int W>
struct Int4Codes;

#if defined(__AVX2__)
template <>
struct Int4Codes<8> {
  using S = Simd<8>;
  static S::ivec load(const std::uint8_t* p) {
    return (S::ivec)_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static S::vec value(S::ivec code, S::vec scale, S::vec bias) {
    return (S::vec)_mm256_fmadd_ps((__m256) __builtin_convertvector(code, S::vec), (__m256)scale,
                                   (__m256)bias);
  }
};
#endif
#if defined(__AVX512F__)
template <>
struct Int4Codes<16> {
  using S = Simd<16>;
  static S::ivec load(const std::uint8_t* p) {
    // (The masked form: GCC 12 warns on the unmasked one's undefined source.)
    return (S::ivec)_mm512_maskz_cvtepu8_epi32(
        0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static S::vec value(S::ivec code, S::vec scale, S::vec bias) {
    return (S::vec)_mm512_fmadd_ps((__m512) __builtin_convertvector(code, S::vec), (__m512)scale,
                                   (__m512)bias);
  }
};
#endif

// Sums of MG rows of permuted x against weight rows [r, r + RB): out[i * RB + j].
template <int W, int MG, int RB>
void int4_dot_rows(const float* xp, std::int64_t r, const GemvWeight& g, float* out) {
  using S = Simd<W>;
  using vec = typename S::vec;
  using ivec = typename S::ivec;
  constexpr int kChunk = 2 * W;
  const std::int64_t k = g.k, row_bytes = g.k / 2;
  const std::uint8_t* codes = static_cast<const std::uint8_t*>(g.data) + r * row_bytes;
  const float* scales = g.scales + r * g.scale_stride;
  const std::int64_t groups = k / g.block_cols, chunks_per_group = g.block_cols / kChunk;
  vec acc[MG][RB] = {};
  const float* x = xp;
  for (std::int64_t b = 0; b < groups; ++b) {
    // The next RB rows' codes, a line at a time, while these are read.
    if ((codes - static_cast<const std::uint8_t*>(g.data)) % 64 < g.block_cols / 2) {
#pragma GCC unroll 4
      for (int j = 0; j < RB; ++j) __builtin_prefetch(codes + (RB + j) * row_bytes, 0, 3);
    }
    vec scale[RB], bias[RB];
#pragma GCC unroll 4
    for (int j = 0; j < RB; ++j) {
      scale[j] = S::splat(scales[j * g.scale_stride + b]);
      bias[j] = -8.0f * scale[j];
    }
    for (std::int64_t q = 0; q < chunks_per_group; ++q, codes += W, x += kChunk) {
      vec xs[MG][2];
#pragma GCC unroll 4
      for (int i = 0; i < MG; ++i) {
        xs[i][0] = S::load(x + i * k);
        xs[i][1] = S::load(x + i * k + W);
      }
#pragma GCC unroll 4
      for (int j = 0; j < RB; ++j) {
        const ivec c = Int4Codes<W>::load(codes + j * row_bytes);
        const vec even = Int4Codes<W>::value(c & 15, scale[j], bias[j]);
        const vec odd = Int4Codes<W>::value(c >> 4, scale[j], bias[j]);
#pragma GCC unroll 4
        for (int i = 0; i < MG; ++i) {
          acc[i][j] += even * xs[i][0];
          acc[i][j] += odd * xs[i][1];
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MG; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < RB; ++j) out[i * RB + j] = S::sum(acc[i][j]);
  }
}

// Weight rows [r_begin, r_end) against MG rows of permuted x, RB rows at a time: as many as the
// registers hold beside the sums, the x vectors and the scales (16 on AVX2, 32 on AVX-512).
template <int W, int MG>
void int4_rows(const float* xp, const GemvWeight& w, std::int64_t r_begin, std::int64_t r_end,
               float* y, std::int64_t ldy) {
  constexpr int RB = W == 16 && MG <= 2 ? 4 : 2;
  float sums[MG * RB];
  std::int64_t r = r_begin;
  for (; r + RB <= r_end; r += RB) {
    int4_dot_rows<W, MG, RB>(xp, r, w, sums);
    for (int i = 0; i < MG; ++i) {
      for (int j = 0; j < RB; ++j) y[i * ldy + r + j] = sums[i * RB + j];
    }
  }
  for (; r < r_end; ++r) {
    int4_dot_rows<W, MG, 1>(xp, r, w, sums);
    for (int i = 0; i < MG; ++i) y[i * ldy + r] = sums[i];
  }
}

template <int W>
void gemv_int4(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* y,
               std::int64_t ldy) {
  constexpr int kChunk = 2 * W;
  thread_local LineVector<float> permuted;
  permuted.resize(static_cast<std::size_t>(m * w.k));
  for (std::int64_t i = 0; i < m; ++i) {
    const float* src = x + i * ldx;
    float* dst = permuted.data() + i * w.k;
    for (std::int64_t c = 0; c < w.k; c += kChunk) {
      for (int j = 0; j < W; ++j) {
        dst[c + j] = src[c + 2 * j];
        dst[c + W + j] = src[c + 2 * j + 1];
      }
    }
  }
  // Rows of x in groups of up to four (two on AVX2's 16 registers); past one group, weight rows
  // in tiles that stay in L1/L2 while every group passes over them, so memory reads each weight
  // once however many rows x has.
  constexpr std::int64_t kGroup = W == 16 ? 4 : 2;
  const std::int64_t row_bytes = w.k / 2 + 4 * (w.k / w.block_cols);
  const std::int64_t tile =
      m <= kGroup ? w.rows : 4 * std::max<std::int64_t>(1, (24 << 10) / (4 * row_bytes));
  const float* xp = permuted.data();
  for (std::int64_t r0 = 0; r0 < w.rows; r0 += tile) {
    const std::int64_t r1 = std::min(w.rows, r0 + tile);
    std::int64_t i = 0;
    for (; i + kGroup <= m; i += kGroup) {
      int4_rows<W, kGroup>(xp + i * w.k, w, r0, r1, y + i * ldy, ldy);
    }
    switch (m - i) {
      case 3: int4_rows<W, 3>(xp + i * w.k, w, r0, r1, y + i * ldy, ldy); break;
      case 2: int4_rows<W, 2>(xp + i * w.k, w, r0, r1, y + i * ldy, ldy); break;
      case 1: int4_rows<W, 1>(xp + i * w.k, w, r0, r1, y + i * ldy, ldy); break;
      default: break;
    }
  }
}

template <int W>
void gemv_lanes(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* y,
                std::int64_t ldy) {
  switch (w.dtype) {
    case GemvDtype::f32: gemv_typed<W, float>(x, m, ldx, w, y, ldy); break;
    case GemvDtype::bf16: gemv_typed<W, bf16_t>(x, m, ldx, w, y, ldy); break;
    case GemvDtype::fp8: gemv_typed<W, fp8_e4m3_t>(x, m, ldx, w, y, ldy); break;
    case GemvDtype::int4: gemv_int4<W>(x, m, ldx, w, y, ldy); break;
  }
}

}  // namespace
}  // namespace dcp::kernels
