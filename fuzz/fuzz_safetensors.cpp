// A safetensors file: the 8-byte header length, the JSON header, the data. Every input either
// opens, and then every tensor reads, or fails with a dcp::Error; nothing else may happen.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "dcp/error.h"
#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const int fd = memfd_create("fuzz_safetensors", 0);  // a file without a disk
  if (fd < 0 || ftruncate(fd, 0) != 0) return 0;
  if (size > 0 && pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  try {
    const dcp::safetensors::File file("/proc/self/fd/" + std::to_string(fd));
    for (const auto& [name, t] : file.tensors()) {
      if (t.shape.empty() || t.shape.size() > 2) continue;
      if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16") continue;
      const std::int64_t rows = t.shape[0], cols = t.shape.size() == 2 ? t.shape[1] : 1;
      if (rows * cols > (1 << 20)) continue;  // the data section is at most the input
      file.read(name, 0, rows, 0, cols);
    }
  } catch (const dcp::Error&) {
  }
  return 0;
}
