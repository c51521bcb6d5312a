// The prefill-shaped weight product with AVX2 and FMA (weight_gemm.h): 24-token tiles, 4 weight
// rows (12 sums of the 16 registers).
#include <immintrin.h>

#include "weight_gemm.h"
#include "weight_gemm_blocked.h"

namespace dcp::kernels {
namespace {

// 8 vectors of 8 floats transposed in registers: element j of r[i] goes to element i of r[j].
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + c], 128-bit lane L: column 4L + c of rows 4g .. 4g + 3.
  for (int g = 0; g < 2; ++g) {
    u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
    u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

// INT4 columns [c0, c0 + count) of a row as fp32, 16 at a time where they start an aligned 16
// (code x scale - 8 x scale in one fused multiply-add, as widen_int4); the rest one by one.
void widen_int4_avx2(const std::uint8_t* row, const float* scales, std::int64_t group,
                     std::int64_t c0, std::int64_t count, float* out) {
  std::int64_t c = c0;
  const std::int64_t end = c0 + count;
  while (c < end) {
    if (c % 16 != 0 || c + 16 > end) {
      widen_int4(row, scales, group, c, 1, out + (c - c0));
      ++c;
      continue;
    }
    const __m256 s = _mm256_set1_ps(scales[c / group]);
    const __m256 bias = _mm256_mul_ps(s, _mm256_set1_ps(-8.0f));
    const __m256i codes =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + c / 2)));
    const __m256 even = _mm256_fmadd_ps(
        _mm256_cvtepi32_ps(_mm256_and_si256(codes, _mm256_set1_epi32(15))), s, bias);
    const __m256 odd = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(codes, 4)), s, bias);
    // Columns 2j and 2j + 1 side by side: unpack within each 128-bit half, then join the halves.
    const __m256 lo = _mm256_unpacklo_ps(even, odd);  // columns 0-3 | 8-11
    const __m256 hi = _mm256_unpackhi_ps(even, odd);  // columns 4-7 | 12-15
    _mm256_storeu_ps(out + (c - c0), _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(out + (c - c0) + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    c += 16;
  }
}

struct Avx2 {
  using vec = __m256;
  static constexpr int lanes = 8;
  // Three vectors of tokens x 4 weight rows: 12 sums of the 16 registers.
  static constexpr int tile_vectors = 3;
  static constexpr int tile_rows = 4;
  // A block of 32 rows is 256 KB of fp32 at 2048 columns: within the 512 KB L2 of Zen 2 and 3.
  static constexpr std::int64_t rows_per_block = 32;
  static vec zero() { return _mm256_setzero_ps(); }
  static vec load(const float* p) { return _mm256_load_ps(p); }
  static vec set1(float f) { return _mm256_set1_ps(f); }
  static vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, vec v) { _mm256_store_ps(p, v); }
  static vec load_first(const float* p, std::int64_t count) {
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_ps(p, mask);
  }
  static void transpose(vec (&r)[lanes]) { transpose8(r); }
  static void widen_bf16(const bf16_t* src, std::int64_t count, float* out) {
    widen_bf16_avx2(src, count, out);
  }
  static void widen_fp8(const fp8_e4m3_t* src, std::int64_t count, float s, float* out) {
    widen_fp8_avx2(src, count, s, out);
  }
  static void widen_int4(const std::uint8_t* row, const float* scales, std::int64_t group,
                         std::int64_t c0, std::int64_t count, float* out) {
    widen_int4_avx2(row, scales, group, c0, count, out);
  }
};

}  // namespace

void gemm_pack_x_avx2(const float* x, std::int64_t m, std::int64_t k, std::int64_t ldx,
                      float* packed) {
  pack_x<Avx2>(x, m, k, ldx, packed);
}

void gemm_packed_avx2(const float* packed, std::int64_t m, const GemvWeight& w, float* y,
                      std::int64_t ldy) {
  gemm_packed<Avx2>(packed, m, w, y, ldy);
}

}  // namespace dcp::kernels
