// The prefill-shaped weight product with AVX-512 (weight_gemm.h): 48-token tiles, 8 weight rows.

// GCC 12's AVX-512 widening intrinsics (_mm512_cvtepu16_epi32, _mm512_cvtph_ps) pass an undefined
// vector as the unused merge source, which -W(maybe-)uninitialized reports once they are inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include <cstring>

#include "transpose.h"
#include "weight_gemm.h"
#include "weight_gemm_blocked.h"

namespace dcp::kernels {
namespace {

// count bf16 values as fp32 (the bits moved up a half-word), the source read 1 KB ahead.
void widen_bf16_avx512(const bf16_t* src, std::int64_t count, float* out) {
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
void widen_fp8_avx512(const fp8_e4m3_t* src, std::int64_t count, float s, float* out) {
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

// INT4 columns [c0, c0 + count) of a row as fp32, 32 at a time where they start a group's
// aligned 32 (code x scale - 8 x scale in one fused multiply-add, as widen_int4); the rest one by
// one.
void widen_int4_avx512(const std::uint8_t* row, const float* scales, std::int64_t group,
                       std::int64_t c0, std::int64_t count, float* out) {
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  std::int64_t c = c0;
  const std::int64_t end = c0 + count;
  while (c < end) {
    if (c % 32 != 0 || c + 32 > end) {
      widen_int4(row, scales, group, c, 1, out + (c - c0));
      ++c;
      continue;
    }
    const __m512 s = _mm512_set1_ps(scales[c / group]);
    const __m512 bias = _mm512_mul_ps(s, _mm512_set1_ps(-8.0f));
    const __m512i codes =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c / 2)));
    const __m512 even = _mm512_fmadd_ps(
        _mm512_cvtepi32_ps(_mm512_and_si512(codes, _mm512_set1_epi32(15))), s, bias);
    const __m512 odd = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(codes, 4)), s, bias);
    _mm512_storeu_ps(out + (c - c0), _mm512_permutex2var_ps(even, first, odd));
    _mm512_storeu_ps(out + (c - c0) + 16, _mm512_permutex2var_ps(even, second, odd));
    c += 32;
  }
}

struct Avx512 {
  using vec = __m512;
  static constexpr int lanes = 16;
  // Three vectors of tokens x 8 weight rows: 24 sums of the 32 registers.
  static constexpr int tile_vectors = 3;
  static constexpr int tile_rows = 8;
  // A block of 64 rows is 256 KB of fp32 at 1024 columns, 640 KB at 2560.
  static constexpr std::int64_t rows_per_block = 64;
  static vec zero() { return _mm512_setzero_ps(); }
  static vec load(const float* p) { return _mm512_load_ps(p); }
  static vec set1(float f) { return _mm512_set1_ps(f); }
  static vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, vec v) { _mm512_store_ps(p, v); }
  static vec load_first(const float* p, std::int64_t count) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1), p);
  }
  // The attention kernels' 16 x 16 transpose (transpose.h), on the same bits.
  static void transpose(vec (&r)[lanes]) {
    Words16 words[16];
    std::memcpy(words, r, sizeof words);
    transpose_16x16(words);
    std::memcpy(r, words, sizeof words);
  }
  static void widen_bf16(const bf16_t* src, std::int64_t count, float* out) {
    widen_bf16_avx512(src, count, out);
  }
  static void widen_fp8(const fp8_e4m3_t* src, std::int64_t count, float s, float* out) {
    widen_fp8_avx512(src, count, s, out);
  }
  static void widen_int4(const std::uint8_t* row, const float* scales, std::int64_t group,
                         std::int64_t c0, std::int64_t count, float* out) {
    widen_int4_avx512(row, scales, group, c0, count, out);
  }
};

}  // namespace

std::int64_t gemm_packed_x_floats(std::int64_t m, std::int64_t k) {
  return (m + 15) / 16 * 16 * k + 16;
}

void gemm_pack_x_avx512(const float* x, std::int64_t m, std::int64_t k, std::int64_t ldx,
                        float* packed) {
  pack_x<Avx512>(x, m, k, ldx, packed);
}

void gemm_packed_avx512(const float* packed, std::int64_t m, const GemvWeight& w, float* y,
                        std::int64_t ldy) {
  gemm_packed<Avx512>(packed, m, w, y, ldy);
}

}  // namespace dcp::kernels
