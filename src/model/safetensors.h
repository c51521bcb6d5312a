// The safetensors format: an 8-byte little-endian header length, a JSON header mapping tensor
// names to {dtype, shape, data_offsets}, then the raw data. Internal to dcp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor_file.h"

namespace dcp::safetensors {

// A safetensors file whose header was checked against the file: known dtypes only, offsets
// inside the data section, byte counts equal to shape x dtype size, tensors tiling the section.
class File final : public TensorFile {
 public:
  explicit File(const std::string& path);
};

// Writes tensors to one file, each in its own dtype: fp32 `values` converted to "F32", "F16" or
// "BF16", or `raw` bytes as they are (any dtype, e.g. "F8_E4M3").
struct NamedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
  std::string dtype = "F32";
  std::vector<std::uint8_t> raw;  // used when not empty
};
void write_file(const std::string& path, const std::vector<NamedTensor>& tensors);

}  // namespace dcp::safetensors
