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

#include "weight_gemm.h"

namespace dcp::kernels {
namespace {

constexpr std::int64_t kTileTokens = 48;  // three vectors of 16: 24 sums for 8 weight rows
constexpr int kTileRows = 8;
// Weight rows per block: a block (up to 256 KB of fp32 at k = 1024) stays in L2 while every
// token tile passes over it.
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

// Sums of `tokens` (<= 16 * MZ) packed tokens against NR weight rows over k columns; `resume`
// continues the sums already in y (a later pass over a long row), else they start from 0.
template <int MZ, int NR>
void tile(const float* p, const float* w, std::int64_t ldw, std::int64_t k, float* y,
          std::int64_t ldy, std::int64_t tokens, bool resume) {
  constexpr int width = 16 * MZ;
  alignas(64) float sums[NR][width];
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
  for (std::int64_t c = 0; c < k; ++c) {
    if (c % 16 == 0) {
      for (int r = 0; r < NR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w + r * ldw + c + kPrefetchAhead), _MM_HINT_T0);
      }
    }
    __m512 a[MZ];
    for (int j = 0; j < MZ; ++j) a[j] = _mm512_load_ps(p + c * width + 16 * j);
    for (int r = 0; r < NR; ++r) {
      const __m512 b = _mm512_set1_ps(w[r * ldw + c]);
      for (int j = 0; j < MZ; ++j) acc[j][r] = _mm512_fmadd_ps(a[j], b, acc[j][r]);
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
void tile_rows(const float* p, const float* w, std::int64_t ldw, std::int64_t n, std::int64_t k,
               float* y, std::int64_t ldy, std::int64_t tokens, bool resume) {
  std::int64_t r = 0;
  for (; r + kTileRows <= n; r += kTileRows) {
    tile<MZ, kTileRows>(p, w + r * ldw, ldw, k, y + r, ldy, tokens, resume);
  }
  w += r * ldw;
  y += r;
  switch (n - r) {
    case 1: tile<MZ, 1>(p, w, ldw, k, y, ldy, tokens, resume); break;
    case 2: tile<MZ, 2>(p, w, ldw, k, y, ldy, tokens, resume); break;
    case 3: tile<MZ, 3>(p, w, ldw, k, y, ldy, tokens, resume); break;
    case 4: tile<MZ, 4>(p, w, ldw, k, y, ldy, tokens, resume); break;
    case 5: tile<MZ, 5>(p, w, ldw, k, y, ldy, tokens, resume); break;
    case 6: tile<MZ, 6>(p, w, ldw, k, y, ldy, tokens, resume); break;
    case 7: tile<MZ, 7>(p, w, ldw, k, y, ldy, tokens, resume); break;
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

void gemm_packed_avx512(const float* packed, std::int64_t m, std::int64_t k, const float* w,
                        std::int64_t ldw, std::int64_t n, float* y, std::int64_t ldy) {
  const float* p = align64(const_cast<float*>(packed));
  // One pass unless rows are well over kMaxColumns (a short last pass costs its y round trip).
  const std::int64_t pass = k <= kMaxColumns + kMaxColumns / 4 ? k : kMaxColumns;
  for (std::int64_t c0 = 0; c0 < k; c0 += pass) {
    const std::int64_t cols = std::min(pass, k - c0);
    for (std::int64_t n0 = 0; n0 < n; n0 += kBlockRows) {
      const std::int64_t rows = std::min(kBlockRows, n - n0);
      const float* pt = p;
      for (std::int64_t t0 = 0; t0 < m; t0 += kTileTokens) {
        const std::int64_t tokens = std::min(kTileTokens, m - t0);
        const std::int64_t width = (tokens + 15) / 16 * 16;
        const float* pc = pt + c0 * width;
        const float* wb = w + n0 * ldw + c0;
        float* yb = y + t0 * ldy + n0;
        switch (width / 16) {
          case 3: tile_rows<3>(pc, wb, ldw, rows, cols, yb, ldy, tokens, c0 > 0); break;
          case 2: tile_rows<2>(pc, wb, ldw, rows, cols, yb, ldy, tokens, c0 > 0); break;
          default: tile_rows<1>(pc, wb, ldw, rows, cols, yb, ldy, tokens, c0 > 0); break;
        }
        pt += width * k;
      }
    }
  }
}

}  // namespace dcp::kernels
