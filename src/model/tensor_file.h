// A memory-mapped file of named tensors, the part the checkpoint loader needs from any weight
// format (safetensors, torch's zip archives). Internal to dcp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dcp {

struct TensorInfo {
  std::string dtype;  // safetensors' names: "F32", "F16", "BF16", "F8_E4M3", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets into the file's data region
};

// Bytes per element of a dtype name; 0 for names safetensors does not define.
std::size_t dtype_bytes(const std::string& dtype);

class TensorFile {
 public:
  virtual ~TensorFile();
  TensorFile(const TensorFile&) = delete;
  TensorFile& operator=(const TensorFile&) = delete;

  const std::map<std::string, TensorInfo>& tensors() const noexcept { return tensors_; }
  const std::string& path() const noexcept { return path_; }
  // The raw bytes of a tensor (info.end - info.begin of them), row-major.
  const std::uint8_t* bytes(const TensorInfo& info) const noexcept { return data_ + info.begin; }
  // Rows [r0, r1) x cols [c0, c1) of a 1-D or 2-D tensor, converted to fp32.
  std::vector<float> read(const std::string& name, std::int64_t r0, std::int64_t r1,
                          std::int64_t c0, std::int64_t c1) const;

 protected:
  // Maps the whole file read-only; `kind` names the format in errors.
  TensorFile(const std::string& path, const char* kind);
  const std::uint8_t* map() const noexcept { return map_; }
  std::size_t size() const noexcept { return size_; }
  // Where the tensors' offsets count from (the start of the file until set).
  void set_data(const std::uint8_t* data) noexcept { data_ = data; }

  std::map<std::string, TensorInfo> tensors_;

 private:
  std::string path_;
  const std::uint8_t* map_ = nullptr;
  std::size_t size_ = 0;
  const std::uint8_t* data_ = nullptr;
};

}  // namespace dcp
