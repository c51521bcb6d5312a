// Element types of the latent KV cache. bf16 is stored as 16-bit words (g++ 12 has no
// bf16 arithmetic type); conversion to fp32 is exact, from fp32 rounds to nearest even.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "dcp/kernel_path.h"

namespace dcp {

enum class KvDtype : std::uint8_t { fp32, bf16 };

constexpr std::size_t dtype_size(KvDtype t) noexcept {
  return t == KvDtype::fp32 ? 4 : 2;
}
constexpr std::string_view to_string(KvDtype t) noexcept {
  return t == KvDtype::fp32 ? "fp32" : "bf16";
}
// Parses "fp32" / "bf16"; throws dcp::Error naming the legal values otherwise.
KvDtype parse_kv_dtype(std::string_view name);

using bf16_t = std::uint16_t;

inline float bf16_to_float(bf16_t v) noexcept {
  std::uint32_t bits = static_cast<std::uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline bf16_t float_to_bf16(float f) noexcept {
  std::uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  // Round to nearest, ties to even; a NaN stays a (quiet) NaN. Written without branches so
  // that loops over rows vectorise.
  const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return static_cast<bf16_t>(is_nan ? quiet_nan : rounded);
}

// FP8 E4M3 (the "fn" variant DeepSeek-V3 and Kimi-K2 ship): 1 sign, 4 exponent (bias 7) and 3
// mantissa bits; no infinities; 0x7f and 0xff are NaN; the largest finite value is 448.
using fp8_e4m3_t = std::uint8_t;
float fp8_e4m3_to_float(fp8_e4m3_t v) noexcept;
// Round to nearest (ties to an even code), saturating at +-448; NaN maps to 0x7f.
fp8_e4m3_t float_to_fp8_e4m3(float f) noexcept;

// float_to_bf16 over n values, bit for bit, on the widest SIMD path this CPU has (or the one
// forced by `path`; the bf16-pair paths are attention-only and are refused).
void floats_to_bf16(const float* src, bf16_t* dst, std::size_t n,
                    KernelPath path = KernelPath::automatic);

}  // namespace dcp
