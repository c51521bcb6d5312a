// The SIMD kernels at 16 floats per vector; compiled with AVX-512 (see src/CMakeLists.txt) and
// called only when the CPU reports AVX-512F. Many heads take the heads-in-lanes kernel.
#include "attention_lanes.h"
#include "attention_rows.h"

namespace dcp::kernels {

void run_avx512(const MlaAttentionParams& p, const Task* tasks, std::size_t n) {
  if (p.num_heads >= kLaneKernelMinHeads) {
    LaneKernel<16> k(p);
    for (std::size_t i = 0; i < n; ++i) k.run(tasks[i]);
  } else {
    RowKernel<16> k(p);
    for (std::size_t i = 0; i < n; ++i) k.run(tasks[i]);
  }
}

}  // namespace dcp::kernels
