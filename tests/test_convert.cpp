// fp32 -> bf16 rounding: the scalar float_to_bf16 against a float64 round-to-nearest-even
// reference, and every SIMD row path against the scalar one, bit for bit. fp32 -> FP8 E4M3
// (float_to_fp8_e4m3, which writes FP8 checkpoints and synthetic weights) against a float64
// nearest-code search.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
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

TEST(Bf16Conversion, RefusesTheAttentionOnlyPaths) {
  const float x = 1.0f;
  bf16_t y = 0;
  for (const KernelPath path : {KernelPath::amx_bf16, KernelPath::avx512_bf16}) {
    const std::string name(to_string(path));
    try {
      floats_to_bf16(&x, &y, 1, path);
      FAIL() << name << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name + " is an attention path"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(y, 0);
}

// E4M3 code c's magnitude (c in [0, 0x7e]) from the format's definition, in double.
double e4m3_magnitude(int c) {
  const int e = c >> 3, m = c & 7;
  return e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
}

// Independent of the encoder's bit trick: the nearest of the 127 finite magnitudes in double,
// the even code on a tie, 448 (0x7e) for anything larger; NaN is 0x7f.
fp8_e4m3_t reference_fp8(float x) {
  if (std::isnan(x)) return 0x7f;
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  for (int c = 1; c <= 0x7e; ++c) {
    const double d = std::fabs(a - e4m3_magnitude(c)), d_best = std::fabs(a - e4m3_magnitude(best));
    if (d < d_best || (d == d_best && c % 2 == 0)) best = c;
  }
  return static_cast<fp8_e4m3_t>((std::signbit(x) ? 0x80 : 0) | best);
}

TEST(Fp8Conversion, EncoderRoundsToTheNearestCodeLikeFloat64) {
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::signaling_NaN(),
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::min()};
  // Every code's value and every midpoint between neighbours (ties: both go to the even code),
  // with the floats next to them; past the top, the midpoint to where 480 would be.
  for (int c = 0; c <= 0x7e; ++c) {
    const double lo = e4m3_magnitude(c), hi = c < 0x7e ? e4m3_magnitude(c + 1) : 480.0;
    for (const double v : {lo, (lo + hi) / 2}) {
      const float f = static_cast<float>(v);
      ASSERT_EQ(static_cast<double>(f), v) << "code " << c << ": not exact as a float";
      for (const float g : {f, std::nextafter(f, 0.0f), std::nextafter(f, 1000.0f)}) {
        xs.push_back(g);
        xs.push_back(-g);
      }
    }
  }
  // Random bit patterns (every exponent, NaNs, infinities, subnormals) and random magnitudes
  // spread over E4M3's range.
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> log2_magnitude(-12.0f, 10.0f);
  for (int i = 0; i < 200000; ++i) {
    xs.push_back(from_bits(static_cast<std::uint32_t>(rng())));
    xs.push_back((rng() & 1 ? -1.0f : 1.0f) * std::exp2(log2_magnitude(rng)));
  }
  for (const float x : xs) {
    ASSERT_EQ(float_to_fp8_e4m3(x), reference_fp8(x)) << "x = " << x << " (bits 0x" << std::hex
                                                       << to_bits(x) << ")";
  }
}

TEST(Fp8Conversion, EveryFiniteCodeSurvivesARoundTrip) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(static_cast<fp8_e4m3_t>(code))));
      continue;
    }
    const float v = fp8_e4m3_to_float(static_cast<fp8_e4m3_t>(code));
    EXPECT_EQ(static_cast<double>(std::fabs(v)), e4m3_magnitude(code & 0x7f)) << "code " << code;
    EXPECT_EQ(float_to_fp8_e4m3(v), code) << "code " << code << " value " << v;
  }
}

}  // namespace
}  // namespace dcp
