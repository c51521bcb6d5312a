// The decode-shaped weight product's portable copy and the choice among copies.
#include "weight_gemv.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace dcp::kernels {
namespace {

template <typename T>
void gemv_scalar(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* y,
                 std::int64_t ldy) {
  const T* data = static_cast<const T*>(w.data);
  for (std::int64_t r = 0; r < w.rows; ++r) {
    const T* row = data + r * w.k;
    const float* scales = nullptr;
    if (w.dtype == GemvDtype::fp8) {
      scales = w.row_scales(r);
    }
    for (std::int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      float sum = 0;
      std::int64_t c = 0;
      for (int b = 0; c < w.k; ++b) {
        const std::int64_t end = scales ? w.block_end(c, b) : w.k;
        const float s = scales ? scales[b] : 1.0f;
        for (; c < end; ++c) sum += widen_weight(row[c]) * s * xi[c];
      }
      y[i * ldy + r] = sum;
    }
  }
}

template <typename T>
void widen_scalar(const GemvWeight& w, std::int64_t r0, std::int64_t r1, float* out) {
  for (std::int64_t r = r0; r < r1; ++r, out += w.k) {
    const T* row = static_cast<const T*>(w.data) + r * w.k;
    if (w.dtype != GemvDtype::fp8) {
      for (std::int64_t c = 0; c < w.k; ++c) out[c] = widen_weight(row[c]);
      continue;
    }
    const float* scales = w.row_scales(r);
    std::int64_t c = 0;
    for (int b = 0; c < w.k; ++b) {
      const std::int64_t end = w.block_end(c, b);
      for (; c < end; ++c) out[c] = widen_weight(row[c]) * scales[b];
    }
  }
}

void gemv_int4_scalar(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w,
                      float* y, std::int64_t ldy) {
  const auto* data = static_cast<const std::uint8_t*>(w.data);
  for (std::int64_t r = 0; r < w.rows; ++r) {
    const std::uint8_t* row = data + r * (w.k / 2);
    const float* scales = w.row_scales(r);
    for (std::int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      float sum = 0;
      for (std::int64_t c = 0; c < w.k; ++c) {
        sum += int4_weight(row, c) * scales[c / w.block_cols] * xi[c];
      }
      y[i * ldy + r] = sum;
    }
  }
}

}  // namespace

void widen_rows_int4(const GemvWeight& w, std::int64_t r0, std::int64_t r1, float* out) {
  const auto* data = static_cast<const std::uint8_t*>(w.data);
  for (std::int64_t r = r0; r < r1; ++r, out += w.k) {
    widen_int4(data + r * (w.k / 2), w.row_scales(r), w.block_cols, 0, w.k, out);
  }
}

bool avx512_vbmi_available() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512vbmi");
  return has;
}

std::int64_t l1_data_cache_bytes() {
  static const std::int64_t bytes = [] {
    const long reported = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    if (reported > 0) return std::int64_t{reported};
    // sysfs describes each cache in an index folder: the level-1 data one, its size as "48K".
    for (int i = 0; i < 8; ++i) {
      const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
      std::ifstream level(dir + "/level"), type(dir + "/type"), size(dir + "/size");
      int l = 0;
      std::string kind, unit;
      std::int64_t kib = 0;
      if (!(level >> l) || !(type >> kind) || l != 1 || kind != "Data") continue;
      if (size >> kib >> unit && kib > 0 && unit == "K") return kib << 10;
    }
    return std::int64_t{32} << 10;
  }();
  return bytes;
}

bool gemv_prefetch_into_l1() {
  static const bool into_l1 = l1_data_cache_bytes() >= (48 << 10);
  return into_l1;
}

void widen_rows_portable(const GemvWeight& w, std::int64_t r0, std::int64_t r1, float* out) {
  switch (w.dtype) {
    case GemvDtype::f32: widen_scalar<float>(w, r0, r1, out); break;
    case GemvDtype::bf16: widen_scalar<bf16_t>(w, r0, r1, out); break;
    case GemvDtype::fp8: widen_scalar<fp8_e4m3_t>(w, r0, r1, out); break;
    case GemvDtype::int4: widen_rows_int4(w, r0, r1, out); break;
  }
}

void gemv_portable(const float* x, std::int64_t m, std::int64_t ldx, const GemvWeight& w, float* y,
                   std::int64_t ldy) {
  switch (w.dtype) {
    case GemvDtype::f32: gemv_scalar<float>(x, m, ldx, w, y, ldy); break;
    case GemvDtype::bf16: gemv_scalar<bf16_t>(x, m, ldx, w, y, ldy); break;
    case GemvDtype::fp8: gemv_scalar<fp8_e4m3_t>(x, m, ldx, w, y, ldy); break;
    case GemvDtype::int4: gemv_int4_scalar(x, m, ldx, w, y, ldy); break;
  }
}

}  // namespace dcp::kernels
