#include "dcp/dtype.h"

#include <cmath>
#include <limits>
#include <string>

#include "dcp/error.h"

namespace dcp {

KvDtype parse_kv_dtype(std::string_view name) {
  if (name == "fp32") return KvDtype::fp32;
  if (name == "bf16") return KvDtype::bf16;
  throw Error(ErrorCategory::invalid_argument,
              str("kv dtype '", std::string(name), "' is not supported (legal: fp32, bf16)"));
}

namespace {

// Every E4M3 code's value: 2^(e - 7) x (1 + m / 8), or 2^-6 x m / 8 for e = 0.
struct Fp8Table {
  float value[256];
  Fp8Table() {
    for (int code = 0; code < 256; ++code) {
      const int e = (code >> 3) & 15, m = code & 7;
      const float magnitude = e == 0 ? std::ldexp(static_cast<float>(m) / 8.0f, -6)
                                     : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
      value[code] = (code & 0x7f) == 0x7f ? std::numeric_limits<float>::quiet_NaN()
                                          : ((code & 0x80) ? -magnitude : magnitude);
    }
  }
};
const Fp8Table& fp8_table() {
  static const Fp8Table table;
  return table;
}

}  // namespace

float fp8_e4m3_to_float(fp8_e4m3_t v) noexcept {
  return fp8_table().value[v];
}

fp8_e4m3_t float_to_fp8_e4m3(float f) noexcept {
  if (std::isnan(f)) return 0x7f;
  const std::uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  // The positive codes 0x00..0x7e grow with their value: find the two around a, keep the nearer
  // (the even code on a tie), saturate at 0x7e (448).
  const float* v = fp8_table().value;
  int lo = 0, hi = 0x7e;
  if (a >= v[hi]) return static_cast<fp8_e4m3_t>(sign | hi);
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (v[mid] <= a ? lo : hi) = mid;
  }
  const float below = a - v[lo], above = v[hi] - a;
  const int code = below < above ? lo : (above < below ? hi : (lo % 2 == 0 ? lo : hi));
  return static_cast<fp8_e4m3_t>(sign | code);
}

}  // namespace dcp
