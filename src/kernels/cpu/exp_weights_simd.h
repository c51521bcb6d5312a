// exp((logit - top) * inv_t) in double for a row of logits: a draw's unnormalised probabilities.
// Written once with GCC vector extensions and compiled per instruction set (exp_weights_avx2.cpp,
// exp_weights_avx512.cpp; exp_weights.cpp keeps the baseline copy), each with the vector width
// its registers hold (wider vectors than the registers lower their comparisons one lane at a
// time). Within 1 ulp of std::exp for normal results; a scalar std::exp per logit cost about
// 5 ns, most of a sampled draw over a 129K vocabulary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace dcp::kernels {

// The lanes of one vector width: doubles, the floats they come from, 64-bit integers.
template <int N>
struct ExpLanes;
template <>
struct ExpLanes<2> {
  using Doubles = double __attribute__((vector_size(16)));
  using Floats = float __attribute__((vector_size(8)));
  using Ints = std::int64_t __attribute__((vector_size(16)));
};
template <>
struct ExpLanes<4> {
  using Doubles = double __attribute__((vector_size(32)));
  using Floats = float __attribute__((vector_size(16)));
  using Ints = std::int64_t __attribute__((vector_size(32)));
};
template <>
struct ExpLanes<8> {
  using Doubles = double __attribute__((vector_size(64)));
  using Floats = float __attribute__((vector_size(32)));
  using Ints = std::int64_t __attribute__((vector_size(64)));
};

// N results from N logits. x = k ln2 + r with |r| <= ln2 / 2 (ln2 split in two so that k ln2's
// high part is exact), exp(r) by its Taylor series to r^13 (the next term is below 1e-17), then
// scaled by 2^k through the exponent bits: twice when the result is subnormal (k < -1000).
// Below -746 (and for -inf or NaN) the result is 0, as std::exp rounds it.
template <int N>
inline void exp_weights_block(const float* logits, float top, double inv_t, double* out) {
  using Doubles = typename ExpLanes<N>::Doubles;
  using Floats = typename ExpLanes<N>::Floats;
  using Ints = typename ExpLanes<N>::Ints;
  constexpr double kLog2e = 0x1.71547652b82fep0;
  constexpr double kLn2Hi = 0x1.62e42fefa3800p-1;  // trailing zeros: k * kLn2Hi is exact
  constexpr double kLn2Lo = 0x1.ef35793c76730p-45;
  constexpr double kRound = 0x1.8p52;  // adding it rounds to an integer, held in the low bits
  constexpr double kTaylor[] = {1.0 / 479001600,
                                1.0 / 39916800,
                                1.0 / 3628800,
                                1.0 / 362880,
                                1.0 / 40320,
                                1.0 / 5040,
                                1.0 / 720,
                                1.0 / 120,
                                1.0 / 24,
                                1.0 / 6,
                                0.5,
                                1.0,
                                1.0};
  Floats f;
  std::memcpy(&f, logits, sizeof f);
  Doubles x = (__builtin_convertvector(f, Doubles) - static_cast<double>(top)) * inv_t;
  const Ints valid = x >= -746.0;
  x = valid ? x : Doubles{};
  const Doubles rounded = x * kLog2e + kRound;
  const Doubles k = rounded - kRound;
  Ints k_bits, round_bits;
  const Doubles round_v = Doubles{} + kRound;
  std::memcpy(&k_bits, &rounded, sizeof k_bits);
  std::memcpy(&round_bits, &round_v, sizeof round_bits);
  const Ints ki = k_bits - round_bits;
  Doubles r = x - k * kLn2Hi;
  r = r - k * kLn2Lo;
  Doubles p = Doubles{} + 1.0 / 6227020800;
  for (const double c : kTaylor) p = p * r + c;
  const Ints low = (k < -1000.0) & -64;  // a double comparison: AVX2 has no signed 64-bit one
  const Ints high_exponent = (ki - low + 1023) << 52, low_exponent = (low + 1023) << 52;
  Doubles high_scale, low_scale;
  std::memcpy(&high_scale, &high_exponent, sizeof high_scale);
  std::memcpy(&low_scale, &low_exponent, sizeof low_scale);
  const Doubles w = valid ? p * high_scale * low_scale : Doubles{};
  std::memcpy(out, &w, sizeof w);
}

template <int N>
inline void exp_weights_lanes(const float* logits, std::size_t n, float top, double inv_t,
                              double* out) {
  std::size_t i = 0;
  for (; i + N <= n; i += N) exp_weights_block<N>(logits + i, top, inv_t, out + i);
  if (i == n) return;
  float tail[N];  // the last partial vector, padded with -inf (weight 0)
  double weights[N];
  for (std::size_t j = 0; j < N; ++j)
    tail[j] = i + j < n ? logits[i + j] : -std::numeric_limits<float>::infinity();
  exp_weights_block<N>(tail, top, inv_t, weights);
  for (std::size_t j = 0; i + j < n; ++j) out[i + j] = weights[j];
}

// Per-ISA copies (exp_weights_avx2.cpp, exp_weights_avx512.cpp).
void exp_weights_avx2(const float* logits, std::size_t n, float top, double inv_t, double* out);
void exp_weights_avx512(const float* logits, std::size_t n, float top, double inv_t, double* out);

}  // namespace dcp::kernels
