#include "tensor_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "dcp/dtype.h"
#include "dcp/error.h"

namespace dcp {
namespace {

float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal
  } else if (exp == 31) {
    f = man == 0 ? INFINITY : NAN;
  } else {
    f = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  }
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= sign;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

std::size_t dtype_bytes(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

TensorFile::TensorFile(const std::string& path, const char* kind) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  DCP_CHECK(fd >= 0, io, "cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(ErrorCategory::io, str("cannot stat ", path));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw Error(ErrorCategory::io, str(path, ": truncated ", kind, " (", size_, " bytes)"));
  }
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  DCP_CHECK(m != MAP_FAILED, io, "cannot map ", path, ": ", std::strerror(errno));
  map_ = static_cast<const std::uint8_t*>(m);
  data_ = map_;
}

TensorFile::~TensorFile() {
  if (map_) ::munmap(const_cast<std::uint8_t*>(map_), size_);
}

std::vector<float> TensorFile::read(const std::string& name, std::int64_t r0, std::int64_t r1,
                                    std::int64_t c0, std::int64_t c1) const {
  const TensorInfo& t = tensors_.at(name);
  const std::int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
  const std::uint8_t* base = data_ + t.begin;
  std::vector<float> out(static_cast<std::size_t>((r1 - r0) * (c1 - c0)));
  std::size_t k = 0;
  for (std::int64_t r = r0; r < r1; ++r) {
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * cols + c);
      if (t.dtype == "F32") {
        std::memcpy(&out[k], base + 4 * i, 4);
      } else if (t.dtype == "BF16") {
        std::uint16_t h;
        std::memcpy(&h, base + 2 * i, 2);
        out[k] = bf16_to_float(h);
      } else if (t.dtype == "F16") {
        std::uint16_t h;
        std::memcpy(&h, base + 2 * i, 2);
        out[k] = half_to_float(h);
      } else {
        throw Error(ErrorCategory::unsupported,
                    str(path_, ": tensor '", name, "' has dtype ", t.dtype,
                        "; dcp reads F32, F16, BF16 and F8_E4M3 (with its weight_scale_inv)"));
      }
      ++k;
    }
  }
  return out;
}

}  // namespace dcp
