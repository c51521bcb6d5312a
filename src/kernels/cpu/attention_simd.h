// The SIMD paths' choice of kernel, shared by the per-ISA files (attention_avx512.cpp,
// attention_avx2.cpp), which instantiate it at their vector width.
#pragma once

#include <cstddef>

#include "attention_lanes.h"
#include "attention_rows.h"
#include "attention_tasks.h"

namespace dcp::kernels {
namespace {

// From this many query heads the heads-in-lanes kernel; below it, the row-wise one. Measured
// with `dcp bench attention` (equal at 8 heads, row-wise ahead at 4).
constexpr int kLaneKernelMinHeads = 8;

template <int V>
void run_simd(const MlaAttentionParams& p, const Task* tasks, std::size_t n) {
  if (p.num_heads >= kLaneKernelMinHeads) {
    LaneKernel<V> k(p);
    for (std::size_t i = 0; i < n; ++i) k.run(tasks[i]);
  } else if (p.kv_dtype == KvDtype::bf16) {
    RowKernel<V, bf16_t> k(p);
    for (std::size_t i = 0; i < n; ++i) k.run(tasks[i]);
  } else {
    RowKernel<V, float> k(p);
    for (std::size_t i = 0; i < n; ++i) k.run(tasks[i]);
  }
}

}  // namespace
}  // namespace dcp::kernels
