// The SIMD kernels at 8 floats per vector; compiled with AVX2 + FMA (see src/CMakeLists.txt) and
// called only when the CPU reports both. Many heads take the heads-in-lanes kernel.
#include "attention_lanes.h"
#include "attention_rows.h"

namespace dcp::kernels {

void run_avx2(const MlaAttentionParams& p, const Task* tasks, std::size_t n) {
  if (p.num_heads >= kLaneKernelMinHeads) {
    LaneKernel<8> k(p);
    for (std::size_t i = 0; i < n; ++i) k.run(tasks[i]);
  } else {
    RowKernel<8> k(p);
    for (std::size_t i = 0; i < n; ++i) k.run(tasks[i]);
  }
}

}  // namespace dcp::kernels
