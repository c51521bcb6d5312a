// fp32 -> bf16 rounding of a row, 16 lanes at a time, written once with GCC vector extensions
// and compiled per instruction set (convert_avx2.cpp, convert_avx512.cpp): with AVX-512 the
// narrowing is one vpmovdw, with AVX2 a vpackusdw and a permute. The lanes compute the scalar
// expression of dcp::float_to_bf16 (unsigned arithmetic wraps the same way), so the bits match
// it exactly. AVX512-BF16's vcvtneps2bf16 is not used: it flushes subnormals.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dcp/dtype.h"

namespace dcp::kernels {

// Replaces each 32-bit lane, the bits of a float, by its bf16 word (in the low half): the
// expression of dcp::float_to_bf16 on a vector of unsigned lanes. Also rounds the AMX path's P.
// (In place: a 64-byte vector returned by value from an AVX2 file would change the ABI.)
template <typename Words>
inline void round_to_bf16_words(Words& bits) {
  const Words rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const Words quiet_nan = (bits >> 16) | 0x40u;
  bits = (bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

inline void floats_to_bf16_lanes(const float* src, bf16_t* dst, std::size_t n) {
  using Words = std::uint32_t __attribute__((vector_size(64)));
  using Halves = std::uint16_t __attribute__((vector_size(32)));
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    Words bits;
    std::memcpy(&bits, src + i, sizeof bits);
    round_to_bf16_words(bits);
    const Halves h = __builtin_convertvector(bits, Halves);
    std::memcpy(dst + i, &h, sizeof h);
  }
  for (; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

}  // namespace dcp::kernels
