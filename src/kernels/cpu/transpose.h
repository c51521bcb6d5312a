// A 16 x 16 transpose of 32-bit words in vector registers. The kernels turn a query's heads
// into lanes and probabilities' lanes into per-head rows; done element by element (or with a
// 16-word scatter) every store lands on a different cache line, which cost a quarter to a third
// of a short call at 128 heads. Written with vector shuffles, not intrinsics: GCC 12 warns on the
// AVX-512 unpack intrinsics (their masked forms start from an undefined vector), and the AVX2
// build lowers the same code to 256-bit shuffles.
#pragma once

#include <algorithm>
#include <cstdint>

namespace dcp::kernels {
namespace {  // internal linkage: each ISA's translation unit keeps its own compiled copy

using Words16 = std::uint32_t __attribute__((vector_size(64)));

// r[i][j] -> r[j][i] for a 16 x 16 block of 32-bit words, in registers.
void transpose_16x16(Words16 (&r)[16]) {
  Words16 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {  // 32-bit interleave of row pairs, per 128-bit lane
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28,
                                   13, 29);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27,
                                       14, 30, 15, 31);
  }
  // 64-bit interleave: 128-bit lane j of u[4i + m] is column 4j + m of rows 4i..4i+3.
  for (int i = 0; i < 16; i += 4) {
    for (int h = 0; h < 2; ++h) {
      u[i + 2 * h] = __builtin_shufflevector(t[i + h], t[i + h + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8,
                                             9, 24, 25, 12, 13, 28, 29);
      u[i + 2 * h + 1] = __builtin_shufflevector(t[i + h], t[i + h + 2], 2, 3, 18, 19, 6, 7, 22, 23,
                                                 10, 11, 26, 27, 14, 15, 30, 31);
    }
  }
  // Column 4j + m is 128-bit lane j of u[m], u[4 + m], u[8 + m], u[12 + m].
  for (int m = 0; m < 4; ++m) {
    const Words16 x0 = __builtin_shufflevector(u[m], u[4 + m], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18,
                                               19, 20, 21, 22, 23);  // lanes 0, 1 of each
    const Words16 x1 = __builtin_shufflevector(u[m], u[4 + m], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25,
                                               26, 27, 28, 29, 30, 31);  // lanes 2, 3
    const Words16 y0 = __builtin_shufflevector(u[8 + m], u[12 + m], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17,
                                               18, 19, 20, 21, 22, 23);
    const Words16 y1 = __builtin_shufflevector(u[8 + m], u[12 + m], 8, 9, 10, 11, 12, 13, 14, 15,
                                               24, 25, 26, 27, 28, 29, 30, 31);
    r[m] =
        __builtin_shufflevector(x0, y0, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    r[4 + m] =
        __builtin_shufflevector(x0, y0, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    r[8 + m] =
        __builtin_shufflevector(x1, y1, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    r[12 + m] =
        __builtin_shufflevector(x1, y1, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  }
}

// Per-head rows of words into per-word rows of heads (the heads in the lanes), 16 x 16 words at
// a time. For each block of up to 16 heads from hb and each whole block of 16 words from w,
// fill(h, w, row) puts words w..w+15 of head h in `row`; after the transpose, row k holds word
// w + k of heads hb..hb+block-1 (zero past them), and store(w + k, hb, block, row) writes it.
// Words past the last whole block are left to the caller.
template <typename Fill, typename Store>
void heads_to_lanes(int heads, int words, Fill fill, Store store) {
  for (int hb = 0; hb < heads; hb += 16) {
    const int block = std::min(16, heads - hb);
    for (int w = 0; w + 16 <= words; w += 16) {
      Words16 r[16] = {};
      for (int i = 0; i < block; ++i) fill(hb + i, w, r[i]);
      transpose_16x16(r);
      for (int k = 0; k < 16; ++k) store(w + k, hb, block, r[k]);
    }
  }
}

}  // namespace
}  // namespace dcp::kernels
