// The SIMD kernels at 16 floats per vector; compiled with AVX-512 (see src/CMakeLists.txt) and
// called only when the CPU reports AVX-512F.
#include "attention_simd.h"

namespace dcp::kernels {

void run_avx512(const MlaAttentionParams& p, const Task* tasks, std::size_t n) {
  run_simd<16>(p, tasks, n);
}

}  // namespace dcp::kernels
