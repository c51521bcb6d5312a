// Weights held in their checkpoint dtype, and the default typed load of a WeightSource.
#include <algorithm>
#include <cstring>

#include "dcp/dtype.h"
#include "dcp/error.h"
#include "dcp/weights.h"

namespace dcp {

std::string_view to_string(WeightDtype d) noexcept {
  switch (d) {
    case WeightDtype::f32: return "fp32";
    case WeightDtype::bf16: return "bf16";
    case WeightDtype::f8_e4m3: return "fp8_e4m3";
  }
  return "?";
}

std::size_t WeightMatrix::bytes() const noexcept {
  return data.size() + scale_inv.size() * sizeof(float);
}

void WeightMatrix::row_to_float(std::int64_t r, float* out) const {
  const std::size_t n = static_cast<std::size_t>(cols);
  const std::size_t at = static_cast<std::size_t>(r) * n;
  switch (dtype) {
    case WeightDtype::f32: std::memcpy(out, data.data() + at * 4, n * 4); return;
    case WeightDtype::bf16: {
      const auto* src = reinterpret_cast<const bf16_t*>(data.data()) + at;
      for (std::size_t c = 0; c < n; ++c) out[c] = bf16_to_float(src[c]);
      return;
    }
    case WeightDtype::f8_e4m3: {
      const std::uint8_t* src = data.data() + at;
      const float* value = fp8_e4m3_values();
      const std::int64_t block_row = (row0 + r) / block_rows - row0 / block_rows;
      const float* scales = scale_inv.data() + block_row * scale_cols;
      // Column by column block, so that the scale is fixed over each inner loop.
      for (std::int64_t c = 0, b = 0; c < cols; ++b) {
        const std::int64_t end = std::min(cols, ((col0 + c) / block_cols + 1) * block_cols - col0);
        const float s = scales[b];
        for (; c < end; ++c) out[c] = value[src[c]] * s;
      }
      return;
    }
  }
}

std::vector<float> WeightMatrix::to_float() const {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r) row_to_float(r, out.data() + r * cols);
  return out;
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

WeightMatrix WeightSource::load_matrix(const std::string& name,
                                       const std::vector<std::int64_t>& shape, Range rows,
                                       Range cols) const {
  const std::int64_t r = rows.whole() ? shape[0] : rows.end - rows.begin;
  const std::int64_t c = shape.size() == 2 ? (cols.whole() ? shape[1] : cols.end - cols.begin) : 1;
  return WeightMatrix::from_float(load(name, shape, rows, cols), r, c);
}

}  // namespace dcp
