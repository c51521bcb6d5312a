// The merge's inner loop, out[d] = sum_k w[k] * part_k[d], written once with GCC vector
// extensions (16 lanes) and compiled per instruction set (merge_avx2.cpp, merge_avx512.cpp;
// merge.cpp keeps the baseline copy). One pass over the output row, every part read once.
#pragma once

#include <cstring>

namespace dcp::kernels {

inline void weighted_sum_lanes(const float* const* parts, const float* weights, int num_parts,
                               int dim, float* out) {
  using Lanes = float __attribute__((vector_size(64)));
  int d = 0;
  for (; d + 16 <= dim; d += 16) {
    Lanes acc = {};
    for (int k = 0; k < num_parts; ++k) {
      Lanes x;
      std::memcpy(&x, parts[k] + d, sizeof x);
      acc += weights[k] * x;
    }
    std::memcpy(out + d, &acc, sizeof acc);
  }
  for (; d < dim; ++d) {
    float acc = 0;
    for (int k = 0; k < num_parts; ++k) acc += weights[k] * parts[k][d];
    out[d] = acc;
  }
}

// Per-ISA copies (merge_avx2.cpp, merge_avx512.cpp).
void weighted_sum_avx2(const float* const* parts, const float* weights, int num_parts, int dim,
                       float* out);
void weighted_sum_avx512(const float* const* parts, const float* weights, int num_parts, int dim,
                         float* out);

}  // namespace dcp::kernels
