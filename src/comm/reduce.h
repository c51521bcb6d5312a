// Elementwise reductions shared by the backends that reduce on the host.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "dcp/comm.h"

namespace dcp::detail {

template <typename T>
void reduce_into(T* acc, const T* x, std::size_t count, ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
      for (std::size_t i = 0; i < count; ++i) acc[i] += x[i];
      break;
    case ReduceOp::max:
      for (std::size_t i = 0; i < count; ++i) acc[i] = std::max(acc[i], x[i]);
      break;
    case ReduceOp::min:
      for (std::size_t i = 0; i < count; ++i) acc[i] = std::min(acc[i], x[i]);
      break;
  }
}

// acc op= x, for `count` elements of `type`.
inline void reduce_into(void* acc, const void* x, std::size_t count, ScalarType type,
                        ReduceOp op) noexcept {
  switch (type) {
    case ScalarType::f32:
      reduce_into(static_cast<float*>(acc), static_cast<const float*>(x), count, op);
      break;
    case ScalarType::f64:
      reduce_into(static_cast<double*>(acc), static_cast<const double*>(x), count, op);
      break;
    case ScalarType::i32:
      reduce_into(static_cast<std::int32_t*>(acc), static_cast<const std::int32_t*>(x), count, op);
      break;
    case ScalarType::i64:
      reduce_into(static_cast<std::int64_t*>(acc), static_cast<const std::int64_t*>(x), count, op);
      break;
  }
}

}  // namespace dcp::detail
