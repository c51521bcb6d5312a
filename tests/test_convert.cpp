// fp32 -> bf16 rounding: the scalar float_to_bf16 against a float64 round-to-nearest-even
// reference, and every SIMD row path against the scalar one, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "dcp/dtype.h"
#include "dcp/error.h"
#include "dcp/kernel_path.h"

namespace dcp {
namespace {

float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
std::uint32_t to_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Independent of the bit trick under test: the two bf16 values around x (by truncation and the
// next one away from zero), compared in double; ties go to the even one.
bf16_t reference_bf16(float x) {
  const std::uint32_t bits = to_bits(x);
  if (std::isnan(x)) return static_cast<bf16_t>((bits >> 16) | 0x40u);
  const auto down = static_cast<bf16_t>(bits >> 16);
  if ((bits & 0xffffu) == 0) return down;
  const auto up = static_cast<bf16_t>(down + 1);  // magnitude up; 0x7f7f + 1 = inf
  // IEEE rounds to infinity as if the exponent went on: "inf" stands for 2^128 here.
  const double up_value =
      (up & 0x7fffu) == 0x7f80u ? std::copysign(std::ldexp(1.0, 128), x) : bf16_to_float(up);
  const double d_down = std::fabs(static_cast<double>(x) - bf16_to_float(down));
  const double d_up = std::fabs(up_value - x);
  if (d_down != d_up) return d_down < d_up ? down : up;
  return (down & 1u) == 0 ? down : up;
}

// Every high half (all exponents, signs, NaN payloads) with the low halves where rounding turns:
// exact, just below / at / just above the tie, and the largest.
std::vector<float> edge_values(std::mt19937& rng) {
  std::vector<float> v;
  for (std::uint32_t hi = 0; hi <= 0xffffu; ++hi)
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu,
                             static_cast<std::uint32_t>(rng() & 0xffffu)})
      v.push_back(from_bits(hi << 16 | lo));
  return v;
}

TEST(Bf16Conversion, ScalarRoundsToNearestEvenLikeFloat64) {
  std::mt19937 rng(std::random_device{}());
  for (float x : edge_values(rng)) {
    ASSERT_EQ(float_to_bf16(x), reference_bf16(x)) << "x bits 0x" << std::hex << to_bits(x);
  }
}

TEST(Bf16Conversion, EveryRowPathMatchesTheScalarBits) {
  std::mt19937 rng(std::random_device{}());
  const std::vector<float> values = edge_values(rng);
  std::vector<KernelPath> paths = available_kernel_paths();
  paths.push_back(KernelPath::automatic);
  for (KernelPath path : paths) {
    SCOPED_TRACE(std::string(to_string(path)));
    // The whole set at once, then short rows at every offset so each tail length is exercised;
    // the guard words after each row must stay untouched.
    std::vector<bf16_t> out(values.size());
    floats_to_bf16(values.data(), out.data(), values.size(), path);
    for (std::size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(out[i], float_to_bf16(values[i])) << "index " << i;
    for (std::size_t n = 0; n <= 40; ++n) {
      const std::size_t start = rng() % (values.size() - n);
      std::vector<bf16_t> row(n + 4, 0xabcd);
      floats_to_bf16(values.data() + start, row.data(), n, path);
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(row[i], float_to_bf16(values[start + i]));
      for (std::size_t i = n; i < n + 4; ++i) ASSERT_EQ(row[i], 0xabcd) << "wrote past n = " << n;
    }
  }
}

TEST(Bf16Conversion, RefusesTheAttentionOnlyPath) {
  const float x = 1.0f;
  bf16_t y = 0;
  try {
    floats_to_bf16(&x, &y, 1, KernelPath::amx_bf16);
    FAIL() << "amx_bf16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("amx_bf16 is an attention path"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(y, 0);
}

}  // namespace
}  // namespace dcp
