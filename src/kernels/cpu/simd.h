// GCC vector types at a width fixed per instruction set, for the kernels compiled once per ISA
// (attention_avx512.cpp, attention_avx2.cpp). Internal linkage: each ISA keeps its own copy.
#pragma once

#include <cstdint>
#include <cstring>

namespace dcp::kernels {
namespace {

// Horizontal sum and max by halving (log2(width) steps): a loop over the lanes compiles to a
// serial chain of scalar adds, which the row-wise kernel paid for every (head, row) score.
typedef float Lanes4 __attribute__((vector_size(16)));
#if defined(__AVX2__)
typedef float Lanes8 __attribute__((vector_size(32)));
template <typename Op>
Lanes4 halve(Lanes8 v, Op op) {
  return op(__builtin_shufflevector(v, v, 0, 1, 2, 3), __builtin_shufflevector(v, v, 4, 5, 6, 7));
}
#endif
#if defined(__AVX512F__)
typedef float Lanes16 __attribute__((vector_size(64)));
template <typename Op>
Lanes4 halve(Lanes16 v, Op op) {
  return halve(op(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7),
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15)),
               op);
}
#endif
template <typename Op>
float reduce4(Lanes4 v, Op op) {
  v = op(v, __builtin_shufflevector(v, v, 2, 3, 0, 1));
  return op(v, __builtin_shufflevector(v, v, 1, 0, 3, 2))[0];
}

// GCC vector extensions; a vector_size cannot depend on a template argument, so each width is
// spelled out.
template <int V>
struct Simd;

#define DCP_DEFINE_SIMD(WIDTH)                                                                  \
  template <>                                                                                   \
  struct Simd<WIDTH> {                                                                          \
    typedef float vec __attribute__((vector_size(WIDTH * 4)));                                  \
    typedef std::int32_t ivec __attribute__((vector_size(WIDTH * 4)));                          \
    typedef std::uint32_t uvec __attribute__((vector_size(WIDTH * 4)));                         \
    typedef std::uint16_t hvec __attribute__((vector_size(WIDTH * 2)));                         \
    static vec load(const float* p) {                                                           \
      vec v;                                                                                    \
      std::memcpy(&v, p, sizeof v);                                                             \
      return v;                                                                                 \
    }                                                                                           \
    static void store(float* p, vec v) { std::memcpy(p, &v, sizeof v); }                        \
    /* Not vec{} + x: 0 + x is not x for x = -0, so that costs an add before each broadcast. */ \
    static vec splat(float x) { return x - vec{}; }                                             \
    static float sum(vec v) {                                                                   \
      const auto add = [](auto a, auto b) { return a + b; };                                    \
      return reduce4(halve(v, add), add);                                                       \
    }                                                                                           \
    static float max(vec v) {                                                                   \
      const auto larger = [](auto a, auto b) { return a > b ? a : b; };                         \
      return reduce4(halve(v, larger), larger);                                                 \
    }                                                                                           \
    /* bf16 words -> fp32: the word is the top half of the float. */                            \
    static vec widen_bf16(const std::uint16_t* p) {                                             \
      hvec h;                                                                                   \
      std::memcpy(&h, p, sizeof h);                                                             \
      const uvec u = __builtin_convertvector(h, uvec) << 16;                                    \
      vec v;                                                                                    \
      std::memcpy(&v, &u, sizeof v);                                                            \
      return v;                                                                                 \
    }                                                                                           \
    static void widen_bf16_row(const std::uint16_t* src, float* dst, int n) {                   \
      int d = 0;                                                                                \
      for (; d + WIDTH <= n; d += WIDTH) store(dst + d, widen_bf16(src + d));                   \
      for (; d < n; ++d) {                                                                      \
        const std::uint32_t u = static_cast<std::uint32_t>(src[d]) << 16;                       \
        std::memcpy(dst + d, &u, 4);                                                            \
      }                                                                                         \
    }                                                                                           \
    /* e^x for x <= 0: x = n ln2 + r (Cody-Waite), e^r by a degree-6 polynomial, 2^n via the    \
       exponent bits; relative error ~1e-7; inputs below -87 (and -inf) give ~1e-38. */         \
    static vec exp(vec x) {                                                                     \
      x = x < -87.0f ? splat(-87.0f) : x;                                                       \
      const vec t = x * 1.44269504088896341f;                                                   \
      const ivec n = __builtin_convertvector(t + (t >= 0 ? splat(0.5f) : splat(-0.5f)), ivec);  \
      const vec nf = __builtin_convertvector(n, vec);                                           \
      const vec r = x - nf * 0.693145751953125f - nf * 1.428606765330187045e-06f;               \
      vec p = splat(1.0f / 720);                                                                \
      p = p * r + 1.0f / 120;                                                                   \
      p = p * r + 1.0f / 24;                                                                    \
      p = p * r + 1.0f / 6;                                                                     \
      p = p * r + 0.5f;                                                                         \
      p = p * r + 1.0f;                                                                         \
      p = p * r + 1.0f;                                                                         \
      const ivec bits = (n + 127) << 23;                                                        \
      vec scale;                                                                                \
      std::memcpy(&scale, &bits, sizeof scale);                                                 \
      return p * scale;                                                                         \
    }                                                                                           \
  };
#if defined(__AVX2__)
DCP_DEFINE_SIMD(8)
#endif
#if defined(__AVX512F__)
DCP_DEFINE_SIMD(16)
#endif
#undef DCP_DEFINE_SIMD

}  // namespace
}  // namespace dcp::kernels
