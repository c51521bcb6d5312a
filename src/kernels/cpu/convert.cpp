// fp32 -> bf16 conversion of KV rows, dispatched to the widest SIMD path this CPU has. The
// library's baseline (x86-64, SSE2) cannot narrow 32-bit lanes to 16 bits, so without this the
// rounding would run one element at a time, far below the write bandwidth.
#include "convert_paths.h"
#include "dcp/error.h"
#include "dcp/kernel_path.h"
#include "simd_dispatch.h"

namespace dcp {
namespace {

using ConvertFn = void (*)(const float*, bf16_t*, std::size_t);

void floats_to_bf16_portable(const float* src, bf16_t* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}

ConvertFn select_conversion(KernelPath path) {
  return kernels::select_simd_copy<ConvertFn>(path, "the bf16 conversion", floats_to_bf16_portable,
                                              kernels::floats_to_bf16_avx2,
                                              kernels::floats_to_bf16_avx512);
}

}  // namespace

void floats_to_bf16(const float* src, bf16_t* dst, std::size_t n, KernelPath path) {
  // The automatic choice is made once: this runs per KV row.
  static const ConvertFn best = select_conversion(KernelPath::automatic);
  const ConvertFn fn = path == KernelPath::automatic ? best : select_conversion(path);
  fn(src, dst, n);
}

}  // namespace dcp
