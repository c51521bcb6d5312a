// The SIMD paths' choice of kernel, shared by the per-ISA files (attention_avx512.cpp,
// attention_avx2.cpp), which instantiate it at their vector width.
#pragma once

#include <cstddef>
#include <optional>

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
    return;
  }
  // A block of tokens is heads x tokens query vectors over one set of rows: the lanes kernel's
  // shape whatever the head count. Made on the first block task.
  std::optional<LaneKernel<V>> lanes;
  const auto each = [&](auto& rows_kernel) {
    for (std::size_t i = 0; i < n; ++i) {
      if (tasks[i].tokens == 1) {
        rows_kernel.run(tasks[i]);
      } else {
        if (!lanes) lanes.emplace(p);
        lanes->run(tasks[i]);
      }
    }
  };
  if (p.kv_dtype == KvDtype::bf16) {
    RowKernel<V, bf16_t> k(p);
    each(k);
  } else {
    RowKernel<V, float> k(p);
    each(k);
  }
}

}  // namespace
}  // namespace dcp::kernels
