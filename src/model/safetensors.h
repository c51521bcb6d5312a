// The safetensors format: an 8-byte little-endian header length, a JSON header mapping tensor
// names to {dtype, shape, data_offsets}, then the raw data. Internal to dcp.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dcp/weights.h"

namespace dcp::safetensors {

struct TensorInfo {
  std::string dtype;  // "F32", "F16", "BF16", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

// A memory-mapped file whose header was checked against the file: known dtypes only, offsets
// inside the data section, byte counts equal to shape x dtype size.
class File {
 public:
  explicit File(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::map<std::string, TensorInfo>& tensors() const noexcept { return tensors_; }
  const std::string& path() const noexcept { return path_; }
  // The raw bytes of a tensor (info.end - info.begin of them).
  const std::uint8_t* bytes(const TensorInfo& info) const noexcept { return data_ + info.begin; }
  // Rows [r0, r1) x cols [c0, c1) of a 1-D or 2-D tensor, converted to fp32.
  std::vector<float> read(const std::string& name, std::int64_t r0, std::int64_t r1,
                          std::int64_t c0, std::int64_t c1) const;

 private:
  std::string path_;
  const std::uint8_t* map_ = nullptr;
  std::size_t size_ = 0;
  const std::uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, TensorInfo> tensors_;
};

// Bytes per element of a dtype name; 0 for names safetensors does not define.
std::size_t dtype_bytes(const std::string& dtype);

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
