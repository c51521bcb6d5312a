// The central directory of a zip archive held in memory (torch.save's format is one), zip64
// included. Internal to dcp: the torch checkpoint reader uses it to find each entry's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dcp::zip {

struct Entry {
  std::string name;
  int method = 0;            // 0: stored; anything else is compressed
  std::uint64_t offset = 0;  // of the entry's data in the archive (after its local header)
  std::uint64_t size = 0;    // bytes stored (= its length for a stored entry)
  std::uint32_t crc32 = 0;
};

// Every entry of the archive `data` (`size` bytes), each checked to lie inside it; `path` names
// the archive in errors. Throws dcp::Error (io) on anything that is not one well-formed
// single-disk, unencrypted archive.
std::vector<Entry> read_directory(const std::uint8_t* data, std::size_t size,
                                  const std::string& path);

// Whether `data` ends with a zip archive's end record (to tell a zip from other formats).
bool looks_like_zip(const std::uint8_t* data, std::size_t size);

// The CRC-32 (ISO-HDLC, as zip uses) of `size` bytes.
std::uint32_t crc32(const std::uint8_t* data, std::size_t size);

}  // namespace dcp::zip
