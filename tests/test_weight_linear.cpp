// dcp::linear with weights in their checkpoint dtype (fp32, bf16, FP8 E4M3 with block scales,
// INT4 with group scales)
// against a float64 reference that decodes the weight bits itself: every SIMD path, decode shapes
// (widened in registers) and prefill shapes (dcp's blocked product, or tiles for BLAS), slices that
// start inside a scale block, row strides, and the FP8 NaN code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "dcp/dtype.h"
#include "dcp/error.h"
#include "dcp/kernel_path.h"
#include "dcp/weights.h"
#include "dcp/worker_pool.h"
#include "kernels/cpu/weight_bf16_pairs.h"
#include "kernels/cpu/weight_gemv.h"
#include "model/ops.h"
#include "test_util.h"

namespace dcp {
namespace {

// E4M3 ("fn"): bias 7, no infinities, 0x7f / 0xff NaN; subnormals 2^-6 * m/8.
double decode_e4m3(std::uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 15, man = b & 7;
  if ((b & 0x7f) == 0x7f) return std::numeric_limits<double>::quiet_NaN();
  const double mag = exp == 0 ? std::ldexp(man / 8.0, -6) : std::ldexp(1 + man / 8.0, exp - 7);
  return sign ? -mag : mag;
}

double decode_bf16(std::uint16_t h) {
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

struct Case {
  WeightMatrix w;
  std::vector<double> values;  // [rows, cols]: what the weight means, decoded here
};

Case random_bf16(std::int64_t rows, std::int64_t cols, test::Rng& rng) {
  Case c;
  c.w.dtype = WeightDtype::bf16;
  c.w.rows = rows;
  c.w.cols = cols;
  c.w.data.resize(static_cast<std::size_t>(rows * cols * 2));
  auto* h = reinterpret_cast<std::uint16_t*>(c.w.data.data());
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    h[i] = float_to_bf16(rng.normal());
    c.values.push_back(decode_bf16(h[i]));
  }
  return c;
}

Case random_f32(std::int64_t rows, std::int64_t cols, test::Rng& rng) {
  std::vector<float> values(static_cast<std::size_t>(rows * cols));
  for (float& v : values) v = rng.normal();
  Case c;
  c.w = WeightMatrix::from_float(values, rows, cols);
  c.values.assign(values.begin(), values.end());
  return c;
}

// A slice [row0, row0 + rows) x [col0, col0 + cols) of an FP8 tensor with blocks br x bc.
Case random_fp8(std::int64_t rows, std::int64_t cols, int br, int bc, std::int64_t row0,
                std::int64_t col0, test::Rng& rng) {
  Case c;
  WeightMatrix& w = c.w;
  w.dtype = WeightDtype::f8_e4m3;
  w.rows = rows;
  w.cols = cols;
  w.block_rows = br;
  w.block_cols = bc;
  w.row0 = row0;
  w.col0 = col0;
  w.scale_rows = (row0 + rows - 1) / br - row0 / br + 1;
  w.scale_cols = (col0 + cols - 1) / bc - col0 / bc + 1;
  for (std::int64_t i = 0; i < w.scale_rows * w.scale_cols; ++i)
    w.scale_inv.push_back(rng.uniform(0.001f, 0.01f));
  w.data.resize(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t k = 0; k < cols; ++k) {
      std::uint8_t b;
      do {  // any code but NaN (that one is tested on its own)
        b = static_cast<std::uint8_t>(rng.range(0, 255));
      } while ((b & 0x7f) == 0x7f);
      w.data[r * cols + k] = b;
      const std::int64_t sr = (row0 + r) / br - row0 / br, sc = (col0 + k) / bc - col0 / bc;
      c.values.push_back(decode_e4m3(b) * static_cast<double>(w.scale_inv[sr * w.scale_cols + sc]));
    }
  }
  return c;
}

// A slice [row0, row0 + rows) x [col0, col0 + cols) of an INT4 tensor with groups of `group`
// columns (col0 and cols whole groups), every code 0..15 (value code - 8) with random scales.
Case random_int4(std::int64_t rows, std::int64_t cols, int group, std::int64_t row0,
                 std::int64_t col0, test::Rng& rng) {
  Case c;
  WeightMatrix& w = c.w;
  w.dtype = WeightDtype::int4;
  w.rows = rows;
  w.cols = cols;
  w.block_rows = 1;
  w.block_cols = group;
  w.row0 = row0;
  w.col0 = col0;
  w.scale_rows = rows;
  w.scale_cols = cols / group;
  for (std::int64_t i = 0; i < w.scale_rows * w.scale_cols; ++i)
    w.scale_inv.push_back(rng.uniform(0.001f, 0.1f));
  w.data.resize(static_cast<std::size_t>(rows * cols / 2));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t k = 0; k < cols; k += 2) {
      const int lo = rng.range(0, 15), hi = rng.range(0, 15);
      w.data[static_cast<std::size_t>((r * cols + k) / 2)] =
          static_cast<std::uint8_t>(lo | hi << 4);
      const double s0 = w.scale_inv[r * w.scale_cols + k / group];
      const double s1 = w.scale_inv[r * w.scale_cols + (k + 1) / group];
      c.values.push_back((lo - 8) * s0);
      c.values.push_back((hi - 8) * s1);
    }
  }
  return c;
}

// y = x @ w^T in float64, and the bound on the rounding of an fp32 sum of |x w| terms. With
// round_x, x's values are first rounded to bf16 here (the bf16-pair path's contract).
void check(const Case& c, std::int64_t m, KernelPath path, test::Rng& rng, const char* what,
           bool round_x = false) {
  const std::int64_t n = c.w.rows, k = c.w.cols, ldx = k + 3, ldy = n + 5;
  std::vector<float> x(static_cast<std::size_t>(m * ldx));
  for (float& v : x) v = rng.normal();
  std::vector<float> y(static_cast<std::size_t>(m * ldy), -7.0f);
  linear(x.data(), m, c.w, y.data(), ldx, ldy, path);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t r = 0; r < n; ++r) {
      double want = 0, magnitude = 0;
      for (std::int64_t j = 0; j < k; ++j) {
        const float xv = x[i * ldx + j];
        const double t = (round_x ? decode_bf16(float_to_bf16(xv)) : static_cast<double>(xv)) *
                         c.values[r * k + j];
        want += t;
        magnitude += std::fabs(t);
      }
      const double got = y[i * ldy + r];
      ASSERT_NEAR(got, want, 1e-6 * magnitude + 1e-30)
          << what << " path " << to_string(path) << " m " << m << " k " << k << " (" << i << ", "
          << r << ")";
    }
    for (std::int64_t r = n; r < ldy; ++r) ASSERT_EQ(y[i * ldy + r], -7.0f) << "stride padding";
  }
}

// linear() on three threads gives one thread's bits.
void expect_threads_keep_sums(const Case& c, std::int64_t m, KernelPath path, test::Rng& rng) {
  const std::int64_t n = c.w.rows, k = c.w.cols;
  std::vector<float> x(static_cast<std::size_t>(m * k));
  for (float& v : x) v = rng.normal();
  std::vector<float> one(static_cast<std::size_t>(m * n)), many(one.size());
  linear(x.data(), m, c.w, one.data(), -1, -1, path);
  linear(x.data(), m, c.w, many.data(), -1, -1, path, 3);
  ASSERT_EQ(many, one) << to_string(c.w.dtype) << " m " << m;
}

std::vector<KernelPath> paths() {
  std::vector<KernelPath> p = available_kernel_paths();
  p.push_back(KernelPath::automatic);
  return p;
}

TEST(WeightLinear, Bf16EveryPathEveryShape) {
  test::Rng rng = test::make_rng();
  for (const KernelPath path : paths()) {
    for (const std::int64_t m : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 40}) {
      for (const std::int64_t k : {1, 7, 16, 33, 100, 200}) {
        check(random_bf16(rng.range(1, 70), k, rng), m, path, rng, "bf16");
      }
    }
  }
}

// Long bf16 rows: with one row of x they are read one row at a time, the lines 4 KB on asked for
// as they go, while x's row fits in L1 beside them (k <= 8192 on a 48 KB L1, k <= 2048 on a 32 KB
// one), and four rows side by side past it.
TEST(WeightLinear, Bf16LongRowsEveryPath) {
  test::Rng rng = test::make_rng();
  for (const KernelPath path : paths()) {
    for (const std::int64_t m : {1, 2, 5}) {
      for (const std::int64_t k : {2048, 2056, 4100, 8192, 8200}) {
        check(random_bf16(rng.range(5, 40), k, rng), m, path, rng, "bf16");
      }
    }
  }
}

// fp32-held weights through the same kernels: groups of one to four rows of x against one, two or
// four weight rows, weight row counts that leave every remainder, k with and without a tail.
TEST(WeightLinear, F32EveryPathEveryShape) {
  test::Rng rng = test::make_rng();
  for (const KernelPath path : paths()) {
    for (const std::int64_t m : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17}) {
      for (const std::int64_t k : {1, 7, 16, 33, 200}) {
        check(random_f32(rng.range(1, 70), k, rng), m, path, rng, "f32");
      }
    }
  }
}

TEST(WeightLinear, Fp8BlockScaledSlicesEveryPath) {
  test::Rng rng = test::make_rng();
  for (const KernelPath path : paths()) {
    for (const std::int64_t m : {1, 3, 4, 6, 16, 20}) {
      for (const std::int64_t k : {5, 24, 97, 300}) {
        // Blocks of 16 x 8 (and DeepSeek's 128 x 128), slices starting inside a block.
        const int br = rng.coin() ? 16 : 128, bc = rng.coin() ? 8 : 128;
        const Case c =
            random_fp8(rng.range(1, 50), k, br, bc, rng.range(0, 300), rng.range(0, 300), rng);
        check(c, m, path, rng, "fp8");
      }
    }
  }
}

// INT4 groups of 32 (Kimi-K2-Thinking's), 64 and 128 columns: every path, one to 40 rows of x
// (decode groups of one to four rows against one, two or four weight rows, and prefill), slices
// that start at any row and at a later group.
TEST(WeightLinear, Int4GroupScaledSlicesEveryPath) {
  test::Rng rng = test::make_rng();
  for (const KernelPath path : paths()) {
    for (const std::int64_t m : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 40}) {
      for (const int groups : {1, 2, 3, 7}) {
        const int group = std::vector<int>{32, 64, 128}[rng.range(0, 2)];
        const Case c = random_int4(rng.range(1, 70), std::int64_t{groups} * group, group,
                                   rng.range(0, 300), group * rng.range(0, 5), rng);
        check(c, m, path, rng, "int4");
      }
    }
  }
}

// quantize_int4: each group's scale is its largest magnitude over 7.5 in bf16, each code the
// nearest of value / scale clamped to [-8, 7]; row_to_float gives code - 8 times the scale.
TEST(WeightLinear, QuantizeInt4PicksEachGroupsScaleAndTheNearestCode) {
  test::Rng rng = test::make_rng();
  const std::int64_t rows = 5, cols = 96;
  const int group = 32;
  std::vector<float> values(static_cast<std::size_t>(rows * cols));
  for (float& v : values) v = rng.normal();
  std::fill(values.begin() + cols, values.begin() + cols + group, 0.0f);  // an all-zero group
  const WeightMatrix m = WeightMatrix::quantize_int4(values, rows, cols, group);
  ASSERT_EQ(m.dtype, WeightDtype::int4);
  ASSERT_EQ(m.data.size(), static_cast<std::size_t>(rows * cols / 2));
  ASSERT_EQ(m.scale_rows, rows);
  ASSERT_EQ(m.scale_cols, cols / group);
  EXPECT_EQ(m.bytes(), 5u * 96u / 2u + 5u * 3u * 4u);  // codes, then an fp32 scale per group
  std::vector<float> row(static_cast<std::size_t>(cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    m.row_to_float(r, row.data());
    for (std::int64_t g = 0; g < cols / group; ++g) {
      double largest = 0;
      for (int c = 0; c < group; ++c)
        largest = std::max(largest, std::fabs(double{values[r * cols + g * group + c]}));
      const float s = m.scale_inv[r * m.scale_cols + g];
      if (largest == 0) {
        EXPECT_EQ(s, 1.0f);
      } else {
        EXPECT_EQ(s, decode_bf16(float_to_bf16(static_cast<float>(largest) / 7.5f)));
      }
      for (int c = 0; c < group; ++c) {
        const std::int64_t at = r * cols + g * group + c;
        const int code = (m.data[static_cast<std::size_t>(at / 2)] >> (4 * (at % 2))) & 15;
        const double want = std::clamp(std::nearbyint(values[at] / s), -8.0f, 7.0f);
        ASSERT_EQ(code - 8, want) << "row " << r << " column " << g * group + c;
        ASSERT_EQ(row[static_cast<std::size_t>(g * group + c)], static_cast<float>(want) * s);
      }
    }
  }
  EXPECT_THROW(WeightMatrix::quantize_int4(values, rows, cols, 40), Error);  // 96 % 40
  EXPECT_THROW(m.transposed(), Error);  // packed along its columns
}

TEST(WeightLinear, Fp8NanCodeGivesNan) {
  // m = 1: the decode product; m = 20: prefill tiles widened in memory.
  test::Rng rng = test::make_rng();
  for (const KernelPath path : paths()) {
    for (const std::int64_t m : {1, 20}) {
      Case c = random_fp8(3, 40, 128, 128, 0, 0, rng);
      c.w.data[1 * 40 + 17] = 0x7f;  // row 1 holds a NaN
      std::vector<float> x(static_cast<std::size_t>(m * 40), 1.0f),
          y(static_cast<std::size_t>(m * 3));
      linear(x.data(), m, c.w, y.data(), -1, -1, path);
      for (std::int64_t i = 0; i < m; ++i) {
        EXPECT_FALSE(std::isnan(y[i * 3 + 0])) << to_string(path) << " m " << m;
        EXPECT_TRUE(std::isnan(y[i * 3 + 1])) << to_string(path) << " m " << m;
        EXPECT_FALSE(std::isnan(y[i * 3 + 2])) << to_string(path) << " m " << m;
      }
    }
  }
}

TEST(WeightLinear, EveryFp8CodeWidensExactly) {
  // One weight row per code, the code alone in its row, against rows of x that are all ones:
  // each output is the code's value times its scale. Rows of 80 columns hold whole chunks of the
  // SIMD copies in columns 0-63 (32 codes a chunk on AVX2, 64 on AVX-512) and a scalar tail after
  // them: the code sits at column code % 64 (every lane of a chunk) or at column 70 (the tail).
  // m = 1 is the decode product, m = 20 the prefill tiles widened in memory.
  constexpr std::int64_t kCols = 80;
  for (const KernelPath path : paths()) {
    for (const bool tail : {false, true}) {
      for (const std::int64_t m : {1, 20}) {
        WeightMatrix w;
        w.dtype = WeightDtype::f8_e4m3;
        w.rows = 256;
        w.cols = kCols;
        w.block_rows = w.block_cols = 128;
        w.scale_rows = 2;
        w.scale_cols = 1;
        w.scale_inv = {0.5f, 3.0f};
        w.data.assign(256 * kCols, 0);
        for (int code = 0; code < 256; ++code)
          w.data[code * kCols + (tail ? 70 : code % 64)] = static_cast<std::uint8_t>(code);
        std::vector<float> x(static_cast<std::size_t>(m * kCols), 1.0f);
        std::vector<float> y(static_cast<std::size_t>(m * 256));
        linear(x.data(), m, w, y.data(), -1, -1, path);
        for (std::int64_t i = 0; i < m; ++i) {
          for (int code = 0; code < 256; ++code) {
            const double want =
                decode_e4m3(static_cast<std::uint8_t>(code)) * (code < 128 ? 0.5 : 3.0);
            const float got = y[i * 256 + code];
            if (std::isnan(want)) {
              EXPECT_TRUE(std::isnan(got)) << code;
            } else {
              EXPECT_EQ(got, static_cast<float>(want))
                  << "code " << code << " " << to_string(path) << " m " << m << " tail " << tail;
            }
          }
        }
      }
    }
  }
}

TEST(WeightLinear, ThreadsSplitTheRowsAndKeepEverySum) {
  test::Rng rng = test::make_rng();
  const bool blocked = prefill_runs_blocked_product();
  for (const std::int64_t rows : {5, 1000, 2051}) {
    for (const std::int64_t k : {64, 300}) {
      std::vector<Case> cases;
      cases.push_back(random_bf16(rows, k, rng));
      cases.push_back(random_fp8(rows, k, 128, 128, rng.range(0, 300), rng.range(0, 300), rng));
      if (k % 32 == 0) cases.push_back(random_int4(rows, k, 32, rng.range(0, 300), 0, rng));
      cases.push_back(random_bf16(rows, k, rng));
      cases.back().w = WeightMatrix::from_float(
          std::vector<float>(cases.back().values.begin(), cases.back().values.end()), rows, k);
      for (const Case& c : cases) {
        for (const std::int64_t m : {1, 3, 8, 16, 40}) {
          std::vector<float> x(static_cast<std::size_t>(m * k));
          for (float& v : x) v = rng.normal();
          std::vector<float> one(static_cast<std::size_t>(m * rows));
          linear(x.data(), m, c.w, one.data());
          for (const int threads : {2, 3, 5}) {
            std::vector<float> many(one.size(), -7.0f);
            linear(x.data(), m, c.w, many.data(), -1, -1, KernelPath::automatic, threads);
            for (std::size_t i = 0; i < one.size(); ++i) {
              if (m <= weight_gemv_max_rows(c.w.dtype) || blocked) {
                ASSERT_EQ(many[i], one[i]) << to_string(c.w.dtype) << " rows " << rows << " m " << m
                                           << " threads " << threads << " at " << i;
              } else {  // BLAS may block a narrower product differently
                ASSERT_NEAR(many[i], one[i], 1e-4 * (1 + std::fabs(one[i])))
                    << to_string(c.w.dtype) << " rows " << rows << " m " << m << " at " << i;
              }
            }
          }
        }
      }
    }
  }
  // The large products did run on the pool: this thread's pool has workers now.
  EXPECT_GE(this_thread_worker_pool(0).workers(), 1);
  const Case c = random_bf16(4, 16, rng);
  std::vector<float> x(16, 1.0f), y(4);
  EXPECT_THROW(linear(x.data(), 1, c.w, y.data(), -1, -1, KernelPath::automatic, 0), Error);
}

// transposed(): value (r, c) of the slice is value (c, r) of its transpose, bit for bit, scale
// included (an FP8 slice that starts inside a block, blocks of unequal sides); and linear() over
// the transpose is x @ w.
TEST(WeightLinear, TransposedKeepsEveryValueAndItsScale) {
  test::Rng rng = test::make_rng();
  std::vector<Case> cases;
  cases.push_back(random_f32(37, 70, rng));
  cases.push_back(random_bf16(64, 33, rng));
  cases.push_back(random_fp8(45, 150, 16, 32, 5, 100, rng));
  cases.push_back(random_fp8(128, 512, 128, 128, 0, 0, rng));
  for (const Case& c : cases) {
    Case tc;
    tc.w = c.w.transposed();
    const WeightMatrix& t = tc.w;
    ASSERT_EQ(t.rows, c.w.cols);
    ASSERT_EQ(t.cols, c.w.rows);
    ASSERT_EQ(t.dtype, c.w.dtype);
    std::vector<float> row(static_cast<std::size_t>(t.cols));
    for (std::int64_t j = 0; j < t.rows; ++j) {
      t.row_to_float(j, row.data());
      for (std::int64_t i = 0; i < t.cols; ++i) {
        ASSERT_EQ(row[i], static_cast<float>(c.values[i * c.w.cols + j]))
            << to_string(c.w.dtype) << " (" << i << ", " << j << ")";
      }
    }
    for (std::int64_t j = 0; j < t.rows; ++j) {
      for (std::int64_t i = 0; i < t.cols; ++i) tc.values.push_back(c.values[i * c.w.cols + j]);
    }
    for (const std::int64_t m : {1, 3, 20}) check(tc, m, KernelPath::automatic, rng, "transposed");
  }
}

// quantize_fp8: each block's scale is its largest magnitude over 448 (1 when all zero), and each
// value gets the code whose float64 value, times that scale, is nearest (any of two when tied).
// Blocks of unequal sides, edge blocks cut short, an all-zero block, magnitudes down to the
// subnormal codes.
TEST(WeightLinear, QuantizeFp8PicksEachBlocksScaleAndTheNearestCode) {
  const std::int64_t rows = 300, cols = 200;
  const int br = 128, bc = 64;
  test::Rng rng(11);
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      v[r * cols + c] = r < br && c >= bc && c < 2 * bc
                            ? 0.0f
                            : rng.normal() * std::exp(rng.uniform(-9.0f, 3.0f));
  const WeightMatrix m = WeightMatrix::quantize_fp8(v, rows, cols, br, bc);
  ASSERT_EQ(m.dtype, WeightDtype::f8_e4m3);
  ASSERT_EQ(m.scale_rows, 3);
  ASSERT_EQ(m.scale_cols, 4);
  ASSERT_EQ(m.data.size(), v.size());
  std::vector<float> want_scale(12, 0.0f);
  std::vector<std::int64_t> largest(12, -1);  // where each block's largest magnitude is
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t b = (r / br) * 4 + c / bc;
      if (std::fabs(v[r * cols + c]) > want_scale[b]) {
        want_scale[b] = std::fabs(v[r * cols + c]);
        largest[b] = r * cols + c;
      }
    }
  for (float& s : want_scale) s = s > 0 ? s / 448.0f : 1.0f;
  EXPECT_EQ(want_scale[1], 1.0f) << "the all-zero block";
  for (std::size_t b = 0; b < want_scale.size(); ++b) ASSERT_EQ(m.scale_inv[b], want_scale[b]) << b;
  std::vector<double> codes;  // every finite code's value
  for (int b = 0; b < 256; ++b)
    if ((b & 0x7f) != 0x7f) codes.push_back(decode_e4m3(static_cast<std::uint8_t>(b)));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const double s = want_scale[(r / br) * 4 + c / bc];
      const double want = static_cast<double>(v[r * cols + c]) / s;
      const double got = decode_e4m3(m.data[r * cols + c]);
      double nearest = 1e30;
      for (double q : codes) nearest = std::min(nearest, std::fabs(q - want));
      ASSERT_LE(std::fabs(got - want), nearest * (1 + 1e-6) + 1e-12)
          << "(" << r << ", " << c << "): " << v[r * cols + c] << " / " << s << " -> " << got;
    }
  for (std::size_t b = 0; b < largest.size(); ++b) {
    if (largest[b] >= 0) {
      EXPECT_EQ(std::fabs(decode_e4m3(m.data[largest[b]])), 448.0)
          << "block " << b << ": its largest value takes the largest code";
    }
  }
  EXPECT_THROW(WeightMatrix::quantize_fp8(v, rows, cols + 1, br, bc), Error);
  EXPECT_THROW(WeightMatrix::quantize_fp8(v, rows, cols, 0, bc), Error);
  EXPECT_THROW(WeightMatrix::quantize_fp8(v, rows, cols, br, -1), Error);
}

// On AVX-512, FP8 widens one of two ways (F16C, or AVX512-VBMI byte lookups where the CPU has
// VBMI, which `linear` then always takes): each copy is called here directly, with whole chunks,
// tails, block-scaled slices and a NaN code, against the float64 reference.
TEST(WeightGemvCopies, Avx512Fp8ByF16cAndByByteLookups) {
  const auto have = available_kernel_paths();
  if (std::find(have.begin(), have.end(), KernelPath::avx512) == have.end()) {
    GTEST_SKIP() << "this CPU has no AVX-512";
  }
  std::vector<std::pair<const char*, kernels::GemvFn>> copies = {{"f16c", kernels::gemv_avx512}};
  if (kernels::avx512_vbmi_available()) copies.emplace_back("vbmi", kernels::gemv_avx512_vbmi);
  test::Rng rng = test::make_rng();
  for (const auto& [name, gemv] : copies) {
    for (const std::int64_t m : {1, 2, 3, 4, 5, 8}) {
      for (const std::int64_t k : {64, 97, 200, 300}) {
        const int br = rng.coin() ? 16 : 128, bc = rng.coin() ? 8 : 128;
        Case c = random_fp8(rng.range(1, 40), k, br, bc, rng.range(0, 300), rng.range(0, 300), rng);
        const WeightMatrix& w = c.w;
        const std::int64_t nan_row = rng.range(0, w.rows - 1);
        const bool with_nan = rng.coin();
        if (with_nan) c.w.data[nan_row * k + rng.range(0, k - 1)] = rng.coin() ? 0x7f : 0xff;
        const kernels::GemvWeight g = ops::gemv_weight(w, 0, w.rows);  // as linear() does
        std::vector<float> x(static_cast<std::size_t>(m * k));
        for (float& v : x) v = rng.normal();
        std::vector<float> y(static_cast<std::size_t>(m * w.rows));
        gemv(x.data(), m, k, g, y.data(), w.rows);
        for (std::int64_t i = 0; i < m; ++i) {
          for (std::int64_t r = 0; r < w.rows; ++r) {
            const float got = y[i * w.rows + r];
            if (with_nan && r == nan_row) {
              EXPECT_TRUE(std::isnan(got)) << name << " m " << m << " k " << k << " row " << r;
              continue;
            }
            double want = 0, magnitude = 0;
            for (std::int64_t j = 0; j < k; ++j) {
              const double t = static_cast<double>(x[i * k + j]) * c.values[r * k + j];
              want += t;
              magnitude += std::fabs(t);
            }
            ASSERT_NEAR(got, want, 1e-6 * magnitude + 1e-30)
                << name << " m " << m << " k " << k << " (" << i << ", " << r << ")";
          }
        }
      }
    }
  }
}

// Prefill shapes on the avx512 and avx2 paths run dcp's blocked product: each sum is fmaf(x, w,
// sum) over the columns in order from 0, bit for bit, whatever the tiling: token tiles of 48 (24)
// and their remainders of whole vectors, weight tiles of 8 (4) and every shorter tail, rows long
// enough to be summed in passes (k > 2560), prompts packed in slabs (m > 528), row strides, and
// one or three threads.
TEST(WeightLinear, BlockedPrefillSumsEachColumnInOrder) {
  std::vector<KernelPath> paths;
  for (const KernelPath p : available_kernel_paths()) {
    if (p == KernelPath::avx2 || p == KernelPath::avx512) paths.push_back(p);
  }
  if (paths.empty())
    GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512: prefill shapes run BLAS";
  for (const KernelPath p : paths) ASSERT_TRUE(prefill_runs_blocked_product(p)) << to_string(p);
  test::Rng rng = test::make_rng();
  struct Shape {
    std::int64_t m, n, k;
  };
  for (const Shape& s :
       {Shape{17, 9, 16}, Shape{24, 4, 50}, Shape{48, 8, 100}, Shape{49, 70, 33},
        Shape{100, 131, 300}, Shape{33, 5, 2600}, Shape{130, 20, 4200}, Shape{1100, 9, 40}}) {
    std::vector<Case> cases;
    cases.push_back(random_f32(s.n, s.k, rng));
    cases.push_back(random_bf16(s.n, s.k, rng));
    cases.push_back(random_fp8(s.n, s.k, 128, 128, rng.range(0, 300), rng.range(0, 300), rng));
    const std::int64_t whole_groups = s.k / 32 * 32;
    if (whole_groups > 0) cases.push_back(random_int4(s.n, whole_groups, 32, 0, 0, rng));
    for (const Case& c : cases) {
      const std::int64_t k = c.w.cols;  // INT4: the whole groups of s.k
      const std::int64_t ldx = k + 3, ldy = s.n + 5;
      std::vector<float> x(static_cast<std::size_t>(s.m * ldx));
      for (float& v : x) v = rng.normal();
      for (const auto& [path, threads] :
           {std::pair{paths.front(), 1}, std::pair{paths.back(), 1}, std::pair{paths.back(), 3},
            std::pair{paths.front(), 3}}) {
        std::vector<float> y(static_cast<std::size_t>(s.m * ldy), -7.0f);
        linear(x.data(), s.m, c.w, y.data(), ldx, ldy, path, threads);
        for (std::int64_t i = 0; i < s.m; ++i) {
          for (std::int64_t r = 0; r < s.n; ++r) {
            float want = 0;  // the weight as the dtype holds it: its value rounded to fp32 once
            for (std::int64_t j = 0; j < k; ++j) {
              want = std::fmaf(x[i * ldx + j], static_cast<float>(c.values[r * k + j]), want);
            }
            ASSERT_EQ(y[i * ldy + r], want)
                << to_string(path) << " " << to_string(c.w.dtype) << " m " << s.m << " n " << s.n
                << " k " << k << " threads " << threads << " (" << i << ", " << r << ")";
          }
          for (std::int64_t r = s.n; r < ldy; ++r) ASSERT_EQ(y[i * ldy + r], -7.0f);
        }
      }
    }
  }
}

// The L1 data cache size that decides where weight lines are asked ahead: as sysfs reports it.
TEST(WeightLinear, ReadsTheL1DataCacheSize) {
  const std::int64_t bytes = kernels::l1_data_cache_bytes();
  EXPECT_EQ(kernels::gemv_prefetch_into_l1(), bytes >= (48 << 10));
  std::ifstream type("/sys/devices/system/cpu/cpu0/cache/index0/type");
  std::ifstream size("/sys/devices/system/cpu/cpu0/cache/index0/size");
  std::string kind, text;
  if (!(type >> kind) || kind != "Data" || !(size >> text)) {
    EXPECT_GE(bytes, 4 << 10);  // no sysfs description here: a size, whatever glibc found
    return;
  }
  ASSERT_EQ(text.back(), 'K') << text;
  EXPECT_EQ(bytes, std::stoll(text.substr(0, text.size() - 1)) << 10);
}

// The label names the copy each path runs: the FP8 widening follows the path and the CPU, and
// where weight lines are asked ahead follows the L1 size.
TEST(WeightLinear, NamesTheKernelEachPathRuns) {
  EXPECT_EQ(weight_kernel_label(KernelPath::portable), "portable");
  const std::string lines = std::string(", lines asked ahead into ") +
                            (kernels::l1_data_cache_bytes() >= (48 << 10) ? "L1" : "L2") +
                            " (L1d " + std::to_string(kernels::l1_data_cache_bytes() / 1024) +
                            " KB)";
  const auto have = available_kernel_paths();
  const auto has = [&](KernelPath p) {
    return std::find(have.begin(), have.end(), p) != have.end();
  };
  if (has(KernelPath::avx2)) {
    EXPECT_EQ(weight_kernel_label(KernelPath::avx2), "avx2, FP8 widened by F16C" + lines);
  }
  if (has(KernelPath::avx512)) {
    EXPECT_EQ(
        weight_kernel_label(KernelPath::avx512),
        (__builtin_cpu_supports("avx512vbmi") ? "avx512, FP8 widened by AVX512-VBMI byte lookups"
                                              : "avx512, FP8 widened by F16C") +
            lines);
  }
  EXPECT_EQ(weight_kernel_label(), weight_kernel_label(have.back()));
  EXPECT_THROW(weight_kernel_label(KernelPath::amx_bf16), Error);
  if (avx512_bf16_available()) {
    EXPECT_EQ(weight_kernel_label(KernelPath::avx512_bf16),
              __builtin_cpu_supports("avx512vbmi")
                  ? "avx512_bf16: bf16 and FP8 weights in vdpbf16ps pairs (FP8 widened by "
                    "AVX512-VBMI byte lookups), x rounded to bf16; fp32 on avx512" +
                        lines
                  : "avx512_bf16: bf16 weights in vdpbf16ps pairs, x rounded to bf16; fp32/FP8 "
                    "on " +
                        weight_kernel_label(KernelPath::avx512));
    EXPECT_EQ(weight_prefill_kernel_label(KernelPath::avx512_bf16),
              "avx512_bf16: bf16 and FP8 weights in vdpbf16ps pairs, x rounded to bf16; fp32 on " +
                  weight_prefill_kernel_label(KernelPath::avx512));
    EXPECT_TRUE(prefill_runs_blocked_product(KernelPath::avx512_bf16));
  } else {
    EXPECT_THROW(weight_kernel_label(KernelPath::avx512_bf16), Error);
  }
  // Prefill shapes: dcp's blocked product on avx512 and avx2, BLAS on the portable path.
  for (const KernelPath p : have) {
    EXPECT_EQ(prefill_runs_blocked_product(p), p != KernelPath::portable) << to_string(p);
    EXPECT_EQ(weight_prefill_kernel_label(p),
              p == KernelPath::avx512 ? "avx512, x packed once, bf16/FP8 widened in L1 chunks"
              : p == KernelPath::avx2 ? "avx2, x packed once, bf16/FP8 widened in L1 chunks"
                                      : "BLAS sgemm, bf16/FP8 rows widened a tile at a time");
  }
  EXPECT_EQ(weight_prefill_kernel_label(), weight_prefill_kernel_label(have.back()));
  EXPECT_THROW(prefill_runs_blocked_product(KernelPath::amx_bf16), Error);
}

// The opt-in avx512_bf16 path: bf16 weights times x rounded to bf16, summed in fp32, against
// float64 over the rounded x (the tolerance is far below what rounding x changes, so a product
// of unrounded x fails it): decode shapes (1-16 rows of x; one row read a weight row at a time)
// and prefill shapes (tiles of 48 and
// their remainders), k odd and even with every tail of a 32-value vector, long rows summed in
// passes, row strides. Threads keep every sum; fp32 weights run the avx512 products, and FP8
// ones where they are not paired.
TEST(WeightLinear, Bf16PairsMultiplyXRoundedToBf16) {
  if (!avx512_bf16_available()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  test::Rng rng = test::make_rng();
  for (const std::int64_t m : {1, 2, 3, 4, 5, 8, 16, 17, 40, 48, 49, 97}) {
    for (const std::int64_t k : {1, 2, 31, 32, 33, 64, 95, 300}) {
      check(random_bf16(rng.range(1, 40), k, rng), m, KernelPath::avx512_bf16, rng, "bf16 pairs",
            true);
    }
  }
  for (const std::int64_t m : {1, 5, 60}) {
    // 5121: passes of 2048 pairs, odd end; 16400: one row of x past L1, four weight rows at once
    for (const std::int64_t k : {4097, 5121, 5122, 16400}) {
      check(random_bf16(rng.range(9, 20), k, rng), m, KernelPath::avx512_bf16, rng, "bf16 pairs",
            true);
    }
  }
  for (const std::int64_t m : {1, 7, 16, 100}) {
    expect_threads_keep_sums(random_bf16(1000, 333, rng), m, KernelPath::avx512_bf16, rng);
  }
  // fp32 weights run the avx512 products; so do FP8 ones in prefill shapes with a scale block
  // starting at an odd column (col0 7: the first block is 121 columns), and in decode shapes on a
  // CPU without AVX512-VBMI.
  const bool fp8_decode_paired = __builtin_cpu_supports("avx512vbmi");
  for (const Case& c : {random_f32(70, 300, rng), random_fp8(70, 300, 128, 128, 5, 7, rng)}) {
    for (const std::int64_t m : {1, 9, 16, 60}) {
      if (c.w.dtype == WeightDtype::f8_e4m3 && m <= 16 && fp8_decode_paired) continue;
      std::vector<float> x(static_cast<std::size_t>(m * 300));
      for (float& v : x) v = rng.normal();
      std::vector<float> exact(static_cast<std::size_t>(m * 70)), paired(exact.size());
      linear(x.data(), m, c.w, exact.data(), -1, -1, KernelPath::avx512);
      linear(x.data(), m, c.w, paired.data(), -1, -1, KernelPath::avx512_bf16);
      ASSERT_EQ(paired, exact) << to_string(c.w.dtype) << " m " << m;
    }
  }
}

// The pairs' two FP8 widenings, by shifts and a table and by byte lookups: every code, in runs of
// every length up to two chunks of 64 and past (the tails), each against the top half of the
// float the test decodes; the NaN codes to a NaN.
TEST(WeightLinear, Fp8CodesWidenToBf16Exactly) {
  if (!avx512_bf16_available()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  using Widen = void (*)(const fp8_e4m3_t*, std::int64_t, bf16_t*);
  std::vector<std::pair<const char*, Widen>> widenings = {
      {"shifts", kernels::widen_fp8_to_bf16_avx512}};
  if (__builtin_cpu_supports("avx512vbmi")) {
    widenings.emplace_back("byte lookups", kernels::widen_fp8_to_bf16_vbmi);
  }
  test::Rng rng = test::make_rng();
  std::vector<fp8_e4m3_t> codes(300);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<fp8_e4m3_t>(i % 256);
  for (std::size_t i = codes.size() - 1; i > 0; --i) {
    std::swap(codes[i],
              codes[static_cast<std::size_t>(rng.range(0, static_cast<std::int64_t>(i)))]);
  }
  for (const auto& [name, widen] : widenings) {
    for (std::int64_t count = 0; count <= 300; ++count) {
      std::vector<bf16_t> out(static_cast<std::size_t>(count) + 1, 0x5555);
      widen(codes.data(), count, out.data());
      for (std::int64_t i = 0; i < count; ++i) {
        const fp8_e4m3_t code = codes[static_cast<std::size_t>(i)];
        const double value = decode_e4m3(code);
        if (std::isnan(value)) {
          ASSERT_TRUE(std::isnan(decode_bf16(out[i]))) << name << " code " << int{code};
        } else {  // an fp32's top half holds every E4M3 value
          const auto f = static_cast<float>(value);
          std::uint32_t bits;
          std::memcpy(&bits, &f, 4);
          ASSERT_EQ(bits & 0xffffu, 0u);
          ASSERT_EQ(out[i], bits >> 16) << name << " code " << int{code} << " count " << count;
        }
      }
      ASSERT_EQ(out[count], 0x5555) << name << ": nothing past count is written";
    }
  }
}

// FP8 weights on the avx512_bf16 path: codes widened to bf16 exactly, each column block summed on
// its own and added times its scale, x rounded to bf16. Decode shapes (on CPUs with AVX512-VBMI):
// 1-16 rows of x, slices starting anywhere inside a block and crossing row blocks, every tail of
// a 64-code chunk. Prefill shapes: slices starting inside a block at an even column, passes over
// long rows. Blocks of 16 x 8 and 128 x 128, every code (random ones; the NaN code on its own).
TEST(WeightLinear, Fp8PairsMultiplyXRoundedToBf16) {
  if (!avx512_bf16_available()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  test::Rng rng = test::make_rng();
  if (__builtin_cpu_supports("avx512vbmi")) {
    for (const std::int64_t m : {1, 2, 3, 4, 5, 8, 11, 16}) {
      for (const std::int64_t k : {1, 5, 63, 64, 65, 127, 128, 129, 300}) {
        const int br = rng.coin() ? 16 : 128, bc = rng.coin() ? 8 : 128;
        const Case c =
            random_fp8(rng.range(1, 50), k, br, bc, rng.range(0, 300), rng.range(0, 300), rng);
        check(c, m, KernelPath::avx512_bf16, rng, "fp8 decode pairs", true);
      }
    }
    for (const std::int64_t m : {1, 6}) {
      check(random_fp8(21, 4097, 128, 128, 100, 3, rng), m, KernelPath::avx512_bf16, rng,
            "fp8 decode pairs", true);
    }
    for (const std::int64_t m : {1, 7, 16}) {
      expect_threads_keep_sums(random_fp8(1000, 333, 128, 128, 50, 9, rng), m,
                               KernelPath::avx512_bf16, rng);
    }
  }
  for (const std::int64_t m : {17, 40, 48, 49, 97}) {
    for (const std::int64_t k : {5, 24, 97, 300}) {
      const int br = rng.coin() ? 16 : 128, bc = rng.coin() ? 8 : 128;
      const Case c =
          random_fp8(rng.range(1, 50), k, br, bc, rng.range(0, 300), 2 * rng.range(0, 150), rng);
      check(c, m, KernelPath::avx512_bf16, rng, "fp8 pairs", true);
    }
  }
  for (const std::int64_t k : {4097, 5121}) {
    check(random_fp8(20, k, 128, 128, 3, 64, rng), 50, KernelPath::avx512_bf16, rng, "fp8 pairs",
          true);
  }
  Case c = random_fp8(3, 40, 128, 128, 0, 0, rng);
  c.w.data[1 * 40 + 17] = 0x7f;  // row 1 holds a NaN
  for (const std::int64_t m : {1, 3, 20}) {
    std::vector<float> x(static_cast<std::size_t>(m * 40), 1.0f);
    std::vector<float> y(static_cast<std::size_t>(m * 3));
    linear(x.data(), m, c.w, y.data(), -1, -1, KernelPath::avx512_bf16);
    for (std::int64_t i = 0; i < m; ++i) {
      EXPECT_FALSE(std::isnan(y[i * 3 + 0])) << "m " << m;
      EXPECT_TRUE(std::isnan(y[i * 3 + 1])) << "m " << m;
      EXPECT_FALSE(std::isnan(y[i * 3 + 2])) << "m " << m;
    }
  }
}

TEST(WeightLinear, RefusesAPathThisCpuLacksAndTheAmxPath) {
  test::Rng rng = test::make_rng();
  const Case c = random_bf16(4, 16, rng);
  std::vector<float> x(16, 1.0f), y(4);
  EXPECT_THROW(linear(x.data(), 1, c.w, y.data(), -1, -1, KernelPath::amx_bf16), Error);
  if (!avx512_bf16_available()) {
    EXPECT_THROW(linear(x.data(), 1, c.w, y.data(), -1, -1, KernelPath::avx512_bf16), Error);
  }
  const auto have = available_kernel_paths();
  if (std::find(have.begin(), have.end(), KernelPath::avx512) == have.end()) {
    EXPECT_THROW(linear(x.data(), 1, c.w, y.data(), -1, -1, KernelPath::avx512), Error);
  }
}

}  // namespace
}  // namespace dcp
