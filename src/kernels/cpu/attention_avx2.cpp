// The tiled kernel at 8 floats per vector; compiled with AVX2 + FMA (see src/CMakeLists.txt) and
// called only when the CPU reports both.
#include "attention_simd.h"

namespace dcp::kernels {

void run_avx2(const MlaAttentionParams& p, const Task* tasks, std::size_t n) {
  TiledKernel<8> k(p);
  for (std::size_t i = 0; i < n; ++i) k.run(tasks[i]);
}

}  // namespace dcp::kernels
