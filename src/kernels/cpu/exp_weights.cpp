// The exp of a draw's logits, dispatched to the widest SIMD copy this CPU has (exp_weights_simd.h).
#include "exp_weights.h"

#include "exp_weights_simd.h"
#include "simd_dispatch.h"

namespace dcp {
namespace {

using ExpWeightsFn = void (*)(const float*, std::size_t, float, double, double*);

void exp_weights_portable(const float* logits, std::size_t n, float top, double inv_t,
                          double* out) {
  kernels::exp_weights_lanes<2>(logits, n, top, inv_t, out);  // SSE2's two doubles
}

ExpWeightsFn select_exp_weights(KernelPath path) {
  return kernels::select_simd_copy<ExpWeightsFn>(path, "the sampling exp", exp_weights_portable,
                                                 kernels::exp_weights_avx2,
                                                 kernels::exp_weights_avx512);
}

}  // namespace

void exp_weights(const float* logits, std::size_t n, float top, double inv_t, double* out,
                 KernelPath path) {
  static const ExpWeightsFn best = select_exp_weights(KernelPath::automatic);
  (path == KernelPath::automatic ? best : select_exp_weights(path))(logits, n, top, inv_t, out);
}

}  // namespace dcp
