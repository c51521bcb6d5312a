// The SIMD kernels at 8 floats per vector; compiled with AVX2 + FMA (see src/CMakeLists.txt) and
// called only when the CPU reports both.
#include "attention_simd.h"

namespace dcp::kernels {

void run_avx2(const MlaAttentionParams& p, const Task* tasks, std::size_t n) {
  run_simd<8>(p, tasks, n);
}

}  // namespace dcp::kernels
