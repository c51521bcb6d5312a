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

// From this many query heads the heads-in-lanes kernel; below it, the row-wise one. With AVX-512
// the lanes kernel leaves lanes idle below 16 heads, and on cold caches (decode reads each layer's
// KV from memory) the row kernel is faster at the MLA width up to 9 heads with fp32 rows and 11
// with bf16 ones (`dcp bench attention --heads 8,9,10,11,12,16` shows the crossover). With short
// rows a head's dot product is a few vectors and then a horizontal sum, which the row kernel pays
// per (head, row), so other widths switch at 8, as AVX2 does (its 8 lanes hold 8 heads without
// padding).
template <int V>
int lane_kernel_min_heads(const MlaAttentionParams& p) {
  if (V == 16 && p.kv_lora_rank + p.rope_dim == kMlaWidth)
    return p.kv_dtype == KvDtype::bf16 ? 12 : 10;
  return 8;
}

template <int V>
void run_simd(const MlaAttentionParams& p, const Task* tasks, std::size_t n) {
  if (p.num_heads >= lane_kernel_min_heads<V>(p)) {
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
