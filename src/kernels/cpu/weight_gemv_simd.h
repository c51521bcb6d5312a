// The decode-shaped weight product (weight_gemv.h) written once over GCC vectors of W lanes and
// compiled per instruction set (weight_gemv_avx2.cpp, weight_gemv_avx512.cpp). A chunk of W
// weights is widened in registers and multiplied by its block scale, so that each weight value
// equals WeightMatrix::row_to_float's, then meets up to four rows of x.
//
// FP8 E4M3 goes through fp16: its sign, exponent and mantissa bits, moved into an fp16 word's,
// make an fp16 equal to the E4M3 value times 2^-8 (fp16's exponent bias is 15, E4M3's 7), which
// F16C widens to fp32 in one instruction, subnormals included and without the microcode assists
// that fp32 subnormals cost. The 2^8 rides on the block scale (exactly: a power of two), and the
// NaN code, which this makes the fp16 1.875, is turned back into a NaN.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "dcp/dtype.h"
#include "simd.h"
#include "weight_gemv.h"

namespace dcp::kernels {
namespace {

template <int W>
struct WeightLanes;

#define DCP_WEIGHT_LANES_COMMON(WIDTH)                                                    \
  using S = Simd<WIDTH>;                                                                  \
  using vec = typename S::vec;                                                            \
  static vec widen(const float* p) { return S::load(p); }                                 \
  static vec widen(const bf16_t* p) { return S::widen_bf16(p); }                          \
  /* E4M3 codes (one per 16-bit word) -> fp16 words: sign to bit 15, exponent and mantissa \
     one bit lower (the arithmetic shift copies the sign into bit 14, which is then cleared). */ \
  template <typename UWords, typename IWords>                                               \
  static IWords fp16_words(UWords codes) {                                                  \
    const UWords high = codes << 8;                                                         \
    IWords w;                                                                               \
    std::memcpy(&w, &high, sizeof w);                                                       \
    return (w >> 1) & static_cast<std::int16_t>(~0x4000);                                   \
  }                                                                                         \
  /* Only the NaN code widens to +-1.875 (times 2^8 it is E4M3's 0x7f, 480): make it NaN. */ \
  static vec nan_code_to_nan(vec v) {                                                       \
    typedef std::int32_t ivec __attribute__((vector_size(WIDTH * 4)));                      \
    ivec bits;                                                                              \
    std::memcpy(&bits, &v, sizeof bits);                                                    \
    bits |= (bits & 0x7fffffff) == 0x3ff00000;                                              \
    std::memcpy(&v, &bits, sizeof v);                                                       \
    return v;                                                                               \
  }

#if defined(__AVX2__)
template <>
struct WeightLanes<8> {
  DCP_WEIGHT_LANES_COMMON(8)
  // 8 codes -> their values times 2^-8.
  static vec widen(const fp8_e4m3_t* p) {
    typedef std::uint16_t UWords __attribute__((vector_size(16)));
    typedef std::int16_t IWords __attribute__((vector_size(16)));
    const __m128i codes = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    UWords u;
    std::memcpy(&u, &codes, sizeof u);
    const IWords w = fp16_words<UWords, IWords>(u);
    __m128i halves;
    std::memcpy(&halves, &w, sizeof halves);
    const __m256 f = _mm256_cvtph_ps(halves);
    vec v;
    std::memcpy(&v, &f, sizeof v);
    return v;
  }
};
#endif
#if defined(__AVX512F__)
template <>
struct WeightLanes<16> {
  DCP_WEIGHT_LANES_COMMON(16)
  static vec widen(const fp8_e4m3_t* p) {
    typedef std::uint16_t UWords __attribute__((vector_size(32)));
    typedef std::int16_t IWords __attribute__((vector_size(32)));
    const __m256i codes =
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    UWords u;
    std::memcpy(&u, &codes, sizeof u);
    const IWords w = fp16_words<UWords, IWords>(u);
    __m256i halves;
    std::memcpy(&halves, &w, sizeof halves);
    const __m512 f = _mm512_maskz_cvtph_ps(0xffff, halves);  // (GCC 12 warns on the unmasked one)
    vec v;
    std::memcpy(&v, &f, sizeof v);
    return v;
  }
};
#endif
#undef DCP_WEIGHT_LANES_COMMON

// Whether codes [0, n) hold E4M3's NaN code (0x7f or 0xff), 32 at a time: checked once per
// scale block, so that blocks without one (all of them, in a real checkpoint) skip the fix-up.
inline bool has_nan_code(const fp8_e4m3_t* p, std::int64_t n) {
  typedef std::uint8_t Bytes __attribute__((vector_size(32)));
  Bytes any = {};
  std::int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    Bytes b;
    std::memcpy(&b, p + i, sizeof b);
    any |= (b | 0x80) == 0xff;
  }
  std::uint64_t words[4];
  std::memcpy(words, &any, sizeof words);
  bool found = (words[0] | words[1] | words[2] | words[3]) != 0;
  for (; i < n; ++i) found = found || (p[i] | 0x80) == 0xff;
  return found;
}

// Sums of MG rows of x against one weight row of k values (scales: one per column block for
// FP8, else null).
template <int W, int MG, typename T>
void dot_row(const float* x, std::int64_t ldx, const T* w, std::int64_t k, const float* scales,
             std::int64_t first_block, std::int64_t block, float* out) {
  using L = WeightLanes<W>;
  using vec = typename L::vec;
  constexpr bool fp8 = sizeof(T) == 1;
  vec acc0[MG] = {}, acc1[MG] = {};
  float tail[MG] = {};
  std::int64_t c = 0;
  for (int b = 0; c < k; ++b) {
    const std::int64_t end = fp8 ? std::min(k, b == 0 ? first_block : c + block) : k;
    const float s = fp8 ? scales[b] : 1.0f;
    // The lanes hold FP8 values times 2^-8: the scale takes the 2^8 back (exactly, unless that
    // overflows: then the two multiplications stay apart).
    const float lane_scale = s * 256.0f;
    const bool folded = std::isfinite(lane_scale) || !std::isfinite(s);
    bool nan_codes = false;
    if constexpr (fp8) nan_codes = has_nan_code(w + c, end - c);
    for (; c + 2 * W <= end; c += 2 * W) {
      vec w0 = L::widen(w + c), w1 = L::widen(w + c + W);
      if constexpr (fp8) {
        if (nan_codes) {
          w0 = L::nan_code_to_nan(w0);
          w1 = L::nan_code_to_nan(w1);
        }
        if (folded) {
          w0 = w0 * lane_scale;
          w1 = w1 * lane_scale;
        } else {
          w0 = (w0 * 256.0f) * s;
          w1 = (w1 * 256.0f) * s;
        }
      }
      for (int i = 0; i < MG; ++i) {
        acc0[i] += w0 * L::S::load(x + i * ldx + c);
        acc1[i] += w1 * L::S::load(x + i * ldx + c + W);
      }
    }
    for (; c < end; ++c) {
      const float wv = fp8 ? widen_weight(w[c]) * s : widen_weight(w[c]);
      for (int i = 0; i < MG; ++i) tail[i] += wv * x[i * ldx + c];
    }
  }
  for (int i = 0; i < MG; ++i) out[i] = L::S::sum(acc0[i] + acc1[i]) + tail[i];
}

template <int W, int MG, typename T>
void gemv_group(const float* x, std::int64_t ldx, const GemvWeight& w, std::int64_t r_begin,
                std::int64_t r_end, float* y, std::int64_t ldy) {
  const T* data = static_cast<const T*>(w.data);
  for (std::int64_t r = r_begin; r < r_end; ++r) {
    const float* scales = nullptr;
    if (w.dtype == GemvDtype::fp8) {
      const std::int64_t block_row = (w.row0 + r) / w.block_rows - w.row0 / w.block_rows;
      scales = w.scales + block_row * w.scale_stride;
    }
    float sums[MG];
    dot_row<W, MG>(x, ldx, data + r * w.k, w.k, scales, w.first_block_cols, w.block_cols, sums);
    for (int i = 0; i < MG; ++i) y[i * ldy + r] = sums[i];
  }
}

template <int W, typename T>
void gemv_typed(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* y,
                std::int64_t ldy) {
  // Weight rows in tiles that stay in L1/L2 while every group of four x rows passes over them:
  // memory reads each weight once however many rows x has.
  const std::int64_t tile =
      std::max<std::int64_t>(1, (24 << 10) / std::max<std::int64_t>(1, w.k * sizeof(T)));
  for (std::int64_t r0 = 0; r0 < w.rows; r0 += tile) {
    const std::int64_t r1 = std::min(w.rows, r0 + tile);
    std::int64_t i = 0;
    for (; i + 4 <= m; i += 4) gemv_group<W, 4, T>(x + i * ldx, ldx, w, r0, r1, y + i * ldy, ldy);
    switch (m - i) {
      case 3: gemv_group<W, 3, T>(x + i * ldx, ldx, w, r0, r1, y + i * ldy, ldy); break;
      case 2: gemv_group<W, 2, T>(x + i * ldx, ldx, w, r0, r1, y + i * ldy, ldy); break;
      case 1: gemv_group<W, 1, T>(x + i * ldx, ldx, w, r0, r1, y + i * ldy, ldy); break;
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
  }
}

}  // namespace
}  // namespace dcp::kernels
