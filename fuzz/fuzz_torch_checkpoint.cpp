// A torch.save archive (pytorch_model.bin): the zip directory, the pickle, the storages. Every
// input either opens, and then every tensor reads, or fails with a dcp::Error; nothing else may
// happen (the unpickler runs nothing, so no input may reach outside its objects).
// An input starting "PK" is the whole file. Any other is a pickle (data.pkl), which the target
// wraps in a valid archive beside storages data/0 to data/15 of 256 bytes each: mutations of the
// pickle then reach the unpickler instead of failing data.pkl's CRC.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dcp/error.h"
#include "model/torch_file.h"
#include "model/zip_archive.h"

namespace {

void put(std::vector<std::uint8_t>& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

// A stored (uncompressed) zip archive of the given entries.
std::vector<std::uint8_t> zip_of(
    const std::vector<std::pair<std::string, std::vector<std::uint8_t>>>& entries) {
  std::vector<std::uint8_t> out, directory;
  for (const auto& [name, data] : entries) {
    const std::uint32_t crc = dcp::zip::crc32(data.data(), data.size());
    const std::uint64_t offset = out.size();
    put(out, 0x04034b50, 4);
    put(out, 20, 2);  // version needed
    put(out, 0, 2);   // flags
    put(out, 0, 2);   // stored
    put(out, 0, 4);   // time and date
    put(out, crc, 4);
    put(out, data.size(), 4);
    put(out, data.size(), 4);
    put(out, name.size(), 2);
    put(out, 0, 2);
    out.insert(out.end(), name.begin(), name.end());
    out.insert(out.end(), data.begin(), data.end());
    put(directory, 0x02014b50, 4);
    put(directory, 20, 2);  // version made by
    put(directory, 20, 2);
    put(directory, 0, 2);
    put(directory, 0, 2);
    put(directory, 0, 4);
    put(directory, crc, 4);
    put(directory, data.size(), 4);
    put(directory, data.size(), 4);
    put(directory, name.size(), 2);
    put(directory, 0, 2);  // extra
    put(directory, 0, 2);  // comment
    put(directory, 0, 2);  // disk
    put(directory, 0, 2);  // internal attributes
    put(directory, 0, 4);  // external attributes
    put(directory, offset, 4);
    directory.insert(directory.end(), name.begin(), name.end());
  }
  const std::uint64_t cd_offset = out.size();
  out.insert(out.end(), directory.begin(), directory.end());
  put(out, 0x06054b50, 4);
  put(out, 0, 2);
  put(out, 0, 2);
  put(out, entries.size(), 2);
  put(out, entries.size(), 2);
  put(out, directory.size(), 4);
  put(out, cd_offset, 4);
  put(out, 0, 2);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const int fd = memfd_create("fuzz_torch_checkpoint", 0);  // a file without a disk
  if (fd < 0 || ftruncate(fd, 0) != 0) return 0;
  std::vector<std::uint8_t> file(data, data + size);
  if (size < 2 || data[0] != 'P' || data[1] != 'K') {
    std::vector<std::pair<std::string, std::vector<std::uint8_t>>> entries{
        {"archive/data.pkl", file}};
    for (int k = 0; k < 16; ++k)  // 0x3c bytes: finite in every float format read
      entries.push_back(
          {"archive/data/" + std::to_string(k), std::vector<std::uint8_t>(256, 0x3c)});
    entries.push_back({"archive/byteorder", {'l', 'i', 't', 't', 'l', 'e'}});
    file = zip_of(entries);
  }
  if (!file.empty() && pwrite(fd, file.data(), file.size(), 0) != static_cast<ssize_t>(file.size()))
    return 0;
  try {
    const dcp::torch_file::File tensors("/proc/self/fd/" + std::to_string(fd));
    for (const auto& [name, t] : tensors.tensors()) {
      if (t.shape.empty() || t.shape.size() > 2) continue;
      if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16") continue;
      const std::int64_t rows = t.shape[0], cols = t.shape.size() == 2 ? t.shape[1] : 1;
      if (rows * cols > (1 << 20)) continue;  // the storages are at most the input
      tensors.read(name, 0, rows, 0, cols);
    }
  } catch (const dcp::Error&) {
  }
  return 0;
}
