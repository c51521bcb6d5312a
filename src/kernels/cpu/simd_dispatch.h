// Choosing among a kernel's per-instruction-set copies (the bf16 conversion, the merge's sum).
#pragma once

#include "dcp/error.h"
#include "dcp/kernel_path.h"

namespace dcp::kernels {

// The copy for `path` (automatic: the widest this CPU runs; a path it lacks is an error).
// The bf16-pair paths are attention-only and are refused, naming `what`.
template <typename Fn>
Fn select_simd_copy(KernelPath path, const char* what, Fn portable, Fn avx2, Fn avx512) {
  DCP_ARG_CHECK(!is_bf16_pair_path(path), "kernel path ", to_string(path),
                " is an attention path; ", what, " runs on automatic, portable, avx2 or avx512");
  switch (resolve_exact_path(path)) {
    case KernelPath::avx512: return avx512;
    case KernelPath::avx2: return avx2;
    default: return portable;
  }
}

}  // namespace dcp::kernels
