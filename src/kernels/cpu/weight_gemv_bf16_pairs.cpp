// The decode-shaped bf16-pair weight product (weight_bf16_pairs.h), compiled with AVX512-BF16.
#include <immintrin.h>

#include <algorithm>

#include "dcp/error.h"
#include "line_vector.h"
#include "simd.h"
#include "weight_bf16_pairs.h"
#include "weight_bf16_pairs_simd.h"

namespace dcp::kernels {
namespace {

// ---- Decode shapes: columns in lanes, a weight row's 32 values against x's in one instruction.

// Sums of MG rows of rounded x (stride `stride`, zero past k) against RB weight rows (stride k):
// out[i * RB + r]. With kPrefetch (3: into L1, 2: into L2) the rows at `ahead` are asked for as
// these are read.
template <int MG, int RB, int kPrefetch>
void dot_rows(const bf16_t* xb, std::int64_t stride, const bf16_t* w, std::int64_t k, float* out,
              const bf16_t* ahead) {
  __m512 acc[MG][RB];
  for (int i = 0; i < MG; ++i) {
    for (int r = 0; r < RB; ++r) acc[i][r] = _mm512_setzero_ps();
  }
  std::int64_t c = 0;
  for (; c + kVectorValues <= k; c += kVectorValues) {
    __m512bh xv[MG];
#pragma GCC unroll 4
    for (int i = 0; i < MG; ++i) xv[i] = as_pairs(_mm512_load_si512(xb + i * stride + c));
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      if constexpr (kPrefetch != 0) __builtin_prefetch(ahead + r * k + c, 0, kPrefetch);
      const __m512bh wv = as_pairs(_mm512_loadu_si512(w + r * k + c));
#pragma GCC unroll 4
      for (int i = 0; i < MG; ++i) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xv[i], wv);
    }
  }
  if (c < k) {  // the last values of each row, masked: nothing past a row is read
    const auto mask = static_cast<__mmask32>((std::uint64_t{1} << (k - c)) - 1);
    __m512bh xv[MG];
    for (int i = 0; i < MG; ++i) xv[i] = as_pairs(_mm512_load_si512(xb + i * stride + c));
    for (int r = 0; r < RB; ++r) {
      const __m512bh wv = as_pairs(_mm512_maskz_loadu_epi16(mask, w + r * k + c));
      for (int i = 0; i < MG; ++i) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xv[i], wv);
    }
  }
  for (int i = 0; i < MG; ++i) {
    for (int r = 0; r < RB; ++r) out[i * RB + r] = Simd<16>::sum(acc[i][r]);
  }
}

// One weight row against one row of rounded x, read front to back: four chunks per step in four
// sums, the line 4 KB further on in the weight asked for as each is read (on the rows after this
// one). One stream where four rows side by side make four, as the exact product does for one row
// of bf16 x (the hardware prefetchers serve one stream faster).
constexpr std::int64_t kSequentialAhead = 4096;  // bytes

template <bool kPrefetch>
float dot_row_sequential(const bf16_t* xb, const bf16_t* w, std::int64_t k) {
  constexpr std::int64_t kStep = 4 * kVectorValues;
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  std::int64_t c = 0;
  for (; c + kStep <= k; c += kStep) {
    if constexpr (kPrefetch) {
      const char* ahead = reinterpret_cast<const char*>(w + c) + kSequentialAhead;
#pragma GCC unroll 4
      for (int b = 0; b < 4 * 64; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      const std::int64_t at = c + q * kVectorValues;
      acc[q] = _mm512_dpbf16_ps(acc[q], as_pairs(_mm512_load_si512(xb + at)),
                                as_pairs(_mm512_loadu_si512(w + at)));
    }
  }
  for (; c < k; c += kVectorValues) {  // x is zero past k; w is masked there
    const auto mask = static_cast<__mmask32>(
        (std::uint64_t{1} << std::min<std::int64_t>(kVectorValues, k - c)) - 1);
    acc[0] = _mm512_dpbf16_ps(acc[0], as_pairs(_mm512_load_si512(xb + c)),
                              as_pairs(_mm512_maskz_loadu_epi16(mask, w + c)));
  }
  return Simd<16>::sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

// Weight rows [r_begin, r_end) against MG rows of rounded x, four rows at a time; the rows two
// groups on (one where two groups are over 32 KB) are asked for while these are summed, as the
// exact decode product does (the hardware prefetchers stop at page edges).
template <int MG>
void gemv_group(const bf16_t* xb, std::int64_t stride, const GemvWeight& w, std::int64_t r_begin,
                std::int64_t r_end, float* y, std::int64_t ldy, bool prefetch) {
  constexpr int RB = 4;
  const auto* data = static_cast<const bf16_t*>(w.data);
  const std::int64_t k = w.k;
  if constexpr (MG == 1) {
    if (k * static_cast<std::int64_t>(sizeof(bf16_t)) <= (32 << 10)) {  // x's row stays in L1
      const std::int64_t row_bytes = k * static_cast<std::int64_t>(sizeof(bf16_t));
      for (std::int64_t r = r_begin; r < r_end; ++r) {
        const bool ask = prefetch && (r + 1) * row_bytes + kSequentialAhead <= w.rows * row_bytes;
        y[r] = ask ? dot_row_sequential<true>(xb, data + r * k, k)
                   : dot_row_sequential<false>(xb, data + r * k, k);
      }
      return;
    }
  }
  const std::int64_t ahead =
      2 * RB * k * static_cast<std::int64_t>(sizeof(bf16_t)) <= (32 << 10) ? 2 : 1;
  const bool into_l1 = gemv_prefetch_into_l1();  // as the exact product asks
  float sums[MG * RB];
  std::int64_t r = r_begin;
  for (; r + RB <= r_end; r += RB) {
    const bf16_t* rows = data + r * k;
    if (prefetch && r + (ahead + 1) * RB <= w.rows) {
      if (into_l1) {
        dot_rows<MG, RB, 3>(xb, stride, rows, k, sums, rows + ahead * RB * k);
      } else {
        dot_rows<MG, RB, 2>(xb, stride, rows, k, sums, rows + ahead * RB * k);
      }
    } else {
      dot_rows<MG, RB, 0>(xb, stride, rows, k, sums, nullptr);
    }
    for (int i = 0; i < MG; ++i) {
      for (int j = 0; j < RB; ++j) y[i * ldy + r + j] = sums[i * RB + j];
    }
  }
  for (; r < r_end; ++r) {
    dot_rows<MG, 1, 0>(xb, stride, data + r * k, k, sums, nullptr);
    for (int i = 0; i < MG; ++i) y[i * ldy + r] = sums[i];
  }
}
}  // namespace

void gemv_bf16_pairs(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w,
                     float* y, std::int64_t ldy) {
  DCP_ARG_CHECK(w.dtype == GemvDtype::bf16, "the bf16-pair weight product multiplies bf16 weights");
  const std::int64_t stride = (w.k + kVectorValues - 1) / kVectorValues * kVectorValues;
  thread_local LineVector<bf16_t> rounded;
  grow_to(rounded, static_cast<std::size_t>(m * stride));
  round_rows(x, m, w.k, ldx, rounded.data(), stride);
  const bf16_t* xb = rounded.data();
  const std::int64_t tile = weight_row_tile(m, w.rows, w.k * 2);
  for (std::int64_t r0 = 0; r0 < w.rows; r0 += tile) {
    const std::int64_t r1 = std::min(w.rows, r0 + tile);
    over_x_groups(m, [&]<int MG>(std::int64_t i) {
      gemv_group<MG>(xb + i * stride, stride, w, r0, r1, y + i * ldy, ldy, i == 0);
    });
  }
}

}  // namespace dcp::kernels
