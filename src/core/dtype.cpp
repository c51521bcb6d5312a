#include "dcp/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>
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
  if (a >= 448.0f) return static_cast<fp8_e4m3_t>(sign | 0x7e);  // saturate at the largest finite
  if (a < 0x1p-6f) {
    // Subnormal codes are m x 2^-9, m = 0..7 (8 rounds up to 0x08, the smallest normal): the
    // scaling is exact and rint rounds to nearest even in the default rounding mode.
    return static_cast<fp8_e4m3_t>(sign | static_cast<int>(std::rint(a * 512.0f)));
  }
  // A normal code's exponent and mantissa are the float's with 20 mantissa bits rounded off (to
  // nearest even; a carry moves into the exponent) and the exponent rebiased from 127 to 7.
  std::uint32_t bits;
  std::memcpy(&bits, &a, sizeof bits);
  const std::uint32_t rounded = (bits + 0x7ffffu + ((bits >> 20) & 1u)) >> 20;
  return static_cast<fp8_e4m3_t>(sign | (rounded - (120u << 3)));
}

}  // namespace dcp
