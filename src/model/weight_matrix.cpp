// Weights held in their checkpoint dtype, and the default typed load of a WeightSource.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "dcp/dtype.h"
#include "dcp/error.h"
#include "dcp/weights.h"
#include "ops.h"

namespace dcp {

std::string_view to_string(WeightDtype d) noexcept {
  switch (d) {
    case WeightDtype::f32: return "fp32";
    case WeightDtype::bf16: return "bf16";
    case WeightDtype::f8_e4m3: return "fp8_e4m3";
    case WeightDtype::int4: return "int4";
  }
  return "?";
}

std::size_t WeightMatrix::bytes() const noexcept {
  return data.size() + scale_inv.size() * sizeof(float);
}

void WeightMatrix::row_to_float(std::int64_t r, float* out) const {
  ops::widen_rows(*this, r, r + 1, out);
}

std::vector<float> WeightMatrix::to_float() const {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  ops::widen_rows(*this, 0, rows, out.data());
  return out;
}

WeightMatrix WeightMatrix::transposed() const {
  DCP_CHECK(dtype != WeightDtype::int4, unsupported,
            "an INT4 weight cannot be transposed: its values are packed and grouped along its "
            "columns (leave the projection unquantized)");
  WeightMatrix t;
  t.dtype = dtype;
  t.rows = cols;
  t.cols = rows;
  t.data.resize(data.size());
  const auto transpose = [&](auto element) {
    using E = decltype(element);
    const auto* src = reinterpret_cast<const E*>(data.data());
    auto* dst = reinterpret_cast<E*>(t.data.data());
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
    }
  };
  switch (dtype) {
    case WeightDtype::f32: transpose(std::uint32_t{}); break;
    case WeightDtype::bf16: transpose(std::uint16_t{}); break;
    case WeightDtype::f8_e4m3: transpose(std::uint8_t{}); break;
    case WeightDtype::int4: break;
  }
  t.block_rows = block_cols;
  t.block_cols = block_rows;
  t.row0 = col0;
  t.col0 = row0;
  t.scale_rows = scale_cols;
  t.scale_cols = scale_rows;
  t.scale_inv.resize(scale_inv.size());
  for (std::int64_t i = 0; i < scale_rows; ++i) {
    for (std::int64_t j = 0; j < scale_cols; ++j)
      t.scale_inv[j * scale_rows + i] = scale_inv[i * scale_cols + j];
  }
  return t;
}

WeightMatrix WeightMatrix::from_float(std::vector<float> values, std::int64_t rows,
                                      std::int64_t cols) {
  DCP_ARG_CHECK(static_cast<std::int64_t>(values.size()) == rows * cols,
                "from_float: ", values.size(), " values for a ", rows, " x ", cols, " matrix");
  WeightMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(m.data.data(), values.data(), m.data.size());
  return m;
}

WeightMatrix WeightMatrix::quantize_fp8(const std::vector<float>& values, std::int64_t rows,
                                        std::int64_t cols, int block_rows, int block_cols) {
  DCP_ARG_CHECK(rows >= 0 && cols >= 0 && static_cast<std::int64_t>(values.size()) == rows * cols,
                "quantize_fp8: ", values.size(), " values for a ", rows, " x ", cols, " matrix");
  DCP_ARG_CHECK(block_rows > 0 && block_cols > 0, "quantize_fp8: block ", block_rows, " x ",
                block_cols, " (block_rows and block_cols must be positive)");
  WeightMatrix m;
  m.dtype = WeightDtype::f8_e4m3;
  m.rows = rows;
  m.cols = cols;
  m.block_rows = block_rows;
  m.block_cols = block_cols;
  m.scale_rows = (rows + block_rows - 1) / block_rows;
  m.scale_cols = (cols + block_cols - 1) / block_cols;
  m.scale_inv.assign(static_cast<std::size_t>(m.scale_rows * m.scale_cols), 0.0f);
  const auto block = [&](std::int64_t r, std::int64_t c) -> float& {
    return m.scale_inv[static_cast<std::size_t>((r / block_rows) * m.scale_cols + c / block_cols)];
  };
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      block(r, c) = std::max(block(r, c), std::fabs(values[r * cols + c]));
  for (float& s : m.scale_inv) s = s > 0 ? s / 448.0f : 1.0f;
  m.data.resize(values.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      m.data[r * cols + c] = float_to_fp8_e4m3(values[r * cols + c] / block(r, c));
  return m;
}

WeightMatrix WeightMatrix::quantize_int4(const std::vector<float>& values, std::int64_t rows,
                                         std::int64_t cols, int group) {
  DCP_ARG_CHECK(rows >= 0 && cols >= 0 && static_cast<std::int64_t>(values.size()) == rows * cols,
                "quantize_int4: ", values.size(), " values for a ", rows, " x ", cols, " matrix");
  DCP_ARG_CHECK(group > 0 && group % 2 == 0 && cols % group == 0, "quantize_int4: group = ", group,
                " must be even and divide cols = ", cols);
  WeightMatrix m;
  m.dtype = WeightDtype::int4;
  m.rows = rows;
  m.cols = cols;
  m.block_rows = 1;
  m.block_cols = group;
  m.scale_rows = rows;
  m.scale_cols = cols / group;
  m.scale_inv.resize(static_cast<std::size_t>(rows * m.scale_cols));
  m.data.assign(static_cast<std::size_t>(rows * cols / 2), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t g = 0; g < m.scale_cols; ++g) {
      const float* v = values.data() + r * cols + g * group;
      float largest = 0;
      for (int c = 0; c < group; ++c) largest = std::max(largest, std::fabs(v[c]));
      const float s = largest > 0 ? bf16_to_float(float_to_bf16(largest / 7.5f)) : 1.0f;
      m.scale_inv[static_cast<std::size_t>(r * m.scale_cols + g)] = s;
      for (int c = 0; c < group; ++c) {
        const auto code =
            static_cast<std::uint8_t>(std::clamp(std::nearbyint(v[c] / s), -8.0f, 7.0f) + 8.0f);
        const std::int64_t at = r * cols + g * group + c;
        m.data[static_cast<std::size_t>(at / 2)] |=
            static_cast<std::uint8_t>(code << (4 * (at % 2)));
      }
    }
  }
  return m;
}

WeightMatrix WeightSource::load_matrix(const std::string& name,
                                       const std::vector<std::int64_t>& shape, Range rows,
                                       Range cols) const {
  const std::int64_t r = rows.whole() ? shape[0] : rows.end - rows.begin;
  const std::int64_t c = shape.size() == 2 ? (cols.whole() ? shape[1] : cols.end - cols.begin) : 1;
  return WeightMatrix::from_float(load(name, shape, rows, cols), r, c);
}

}  // namespace dcp
