// Weight rows widened to fp32 in memory with AVX2 + F16C (weight_gemv.h), and the pieces the AVX2
// blocked product widens its chunks with (weight_gemm_avx2.cpp). Columns stay in their natural
// order; FP8 goes through fp16 as in the product (weight_gemv_simd.h), times its block scale times
// 2^8, which gives the bits of code value x scale exactly (the power of two only moves the
// exponent).
#include <immintrin.h>

#include <algorithm>

#include "weight_gemv.h"

namespace dcp::kernels {

void widen_bf16_avx2(const bf16_t* src, std::int64_t count, float* out) {
  std::int64_t c = 0;
  for (; c + 8 <= count; c += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c));
    _mm256_storeu_ps(out + c, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  for (; c < count; ++c) out[c] = bf16_to_float(src[c]);
}

void widen_fp8_avx2(const fp8_e4m3_t* src, std::int64_t count, float s, float* out) {
  const __m256 scale = _mm256_set1_ps(s * 256.0f);
  const __m256i nan_widened = _mm256_set1_epi32(0x3ff00000);  // the NaN code as fp16 -> fp32
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  std::int64_t c = 0;
  for (; c + 16 <= count; c += 16) {
    // Sixteen codes, each in a word's high byte, shifted right arithmetically: fp16 words of
    // value x 2^-8 once bit 14 (a copy of the sign) is cleared.
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + c));
    const __m256i words =
        _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8), 1),
                         _mm256_set1_epi16(static_cast<short>(0xbfff)));
    for (int half = 0; half < 2; ++half) {
      const __m256 f = _mm256_cvtph_ps(half ? _mm256_extracti128_si256(words, 1)
                                            : _mm256_castsi256_si128(words));
      const __m256i is_nan =
          _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(f), magnitude), nan_widened);
      const __m256 v = _mm256_or_ps(_mm256_mul_ps(f, scale), _mm256_castsi256_ps(is_nan));
      _mm256_storeu_ps(out + c + 8 * half, v);
    }
  }
  for (; c < count; ++c) out[c] = fp8_e4m3_to_float(src[c]) * s;
}

void widen_rows_avx2(const GemvWeight& w, std::int64_t r0, std::int64_t r1, float* out) {
  for (std::int64_t r = r0; r < r1; ++r, out += w.k) {
    switch (w.dtype) {
      case GemvDtype::f32:
        std::copy_n(static_cast<const float*>(w.data) + r * w.k, w.k, out);
        break;
      case GemvDtype::bf16:
        widen_bf16_avx2(static_cast<const bf16_t*>(w.data) + r * w.k, w.k, out);
        break;
      case GemvDtype::fp8: {
        const auto* row = static_cast<const fp8_e4m3_t*>(w.data) + r * w.k;
        const float* scales = w.row_scales(r);
        std::int64_t c = 0;
        for (int b = 0; c < w.k; ++b) {
          const std::int64_t end = w.block_end(c, b);
          widen_fp8_avx2(row + c, end - c, scales[b], out + c);
          c = end;
        }
        break;
      }
      case GemvDtype::int4: widen_rows_int4(w, r, r + 1, out); break;
    }
  }
}

}  // namespace dcp::kernels
