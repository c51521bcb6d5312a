// A draw's unnormalised probabilities: out[i] = exp((logits[i] - top) * inv_t) in double, for
// top the row's maximum (so the weights lie in [0, 1]), on the widest SIMD path this CPU has.
#pragma once

#include <cstddef>

#include "dcp/kernel_path.h"

namespace dcp {

void exp_weights(const float* logits, std::size_t n, float top, double inv_t, double* out,
                 KernelPath path = KernelPath::automatic);

}  // namespace dcp
