// Weights held in their checkpoint dtype, and the default typed load of a WeightSource.
#include <cstring>

#include "dcp/error.h"
#include "dcp/weights.h"
#include "ops.h"

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
  ops::widen_rows(*this, r, r + 1, out);
}

std::vector<float> WeightMatrix::to_float() const {
  std::vector<float> out(static_cast<std::size_t>(rows * cols));
  ops::widen_rows(*this, 0, rows, out.data());
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
