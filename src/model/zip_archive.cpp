#include "zip_archive.h"

#include <algorithm>
#include <array>
#include <set>

#include "dcp/error.h"

namespace dcp::zip {
namespace {

constexpr std::uint32_t kEndRecord = 0x06054b50, kZip64EndRecord = 0x06064b50,
                        kZip64Locator = 0x07064b50, kCentralHeader = 0x02014b50,
                        kLocalHeader = 0x04034b50;
constexpr std::size_t kEndRecordSize = 22, kZip64LocatorSize = 20, kZip64EndRecordSize = 56,
                      kCentralHeaderSize = 46, kLocalHeaderSize = 30;

// Little-endian fields; the caller has checked that they lie inside the archive.
std::uint64_t le(const std::uint8_t* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The offset of the end-of-central-directory record: the last signature whose comment length
// reaches exactly the end of the archive; size when there is none.
std::size_t find_end_record(const std::uint8_t* data, std::size_t size) {
  if (size < kEndRecordSize) return size;
  const std::size_t lowest = size - kEndRecordSize > 0xffff ? size - kEndRecordSize - 0xffff : 0;
  for (std::size_t at = size - kEndRecordSize + 1; at-- > lowest;) {
    if (le(data + at, 4) == kEndRecord && at + kEndRecordSize + le(data + at + 20, 2) == size)
      return at;
  }
  return size;
}

}  // namespace

bool looks_like_zip(const std::uint8_t* data, std::size_t size) {
  return find_end_record(data, size) < size;
}

std::vector<Entry> read_directory(const std::uint8_t* data, std::size_t size,
                                  const std::string& path) {
  const std::size_t end = find_end_record(data, size);
  DCP_CHECK(end < size, io, path, ": not a zip archive (no end-of-central-directory record)");
  const std::uint8_t* rec = data + end;
  std::uint64_t disk = le(rec + 4, 2), cd_disk = le(rec + 6, 2);
  std::uint64_t count = le(rec + 10, 2), cd_size = le(rec + 12, 4), cd_offset = le(rec + 16, 4);
  // Zip64: a locator just before the end record points to the 64-bit end record.
  if (end >= kZip64LocatorSize && le(data + end - kZip64LocatorSize, 4) == kZip64Locator) {
    const std::uint8_t* loc = data + end - kZip64LocatorSize;
    const std::uint64_t at = le(loc + 8, 8);
    DCP_CHECK(le(loc + 4, 4) == 0 && le(loc + 16, 4) <= 1, io, path,
              ": a multi-disk zip archive (dcp reads single-file archives)");
    DCP_CHECK(at <= end - kZip64LocatorSize &&
                  end - kZip64LocatorSize - at >= kZip64EndRecordSize &&
                  le(data + at, 4) == kZip64EndRecord,
              io, path, ": the zip64 locator points to offset ", at,
              ", where there is no zip64 end record");
    const std::uint8_t* r64 = data + at;
    disk = le(r64 + 16, 4);
    cd_disk = le(r64 + 20, 4);
    count = le(r64 + 32, 8);
    cd_size = le(r64 + 40, 8);
    cd_offset = le(r64 + 48, 8);
  }
  DCP_CHECK(disk == 0 && cd_disk == 0, io, path,
            ": a multi-disk zip archive (dcp reads single-file archives)");
  DCP_CHECK(cd_offset <= end && cd_size <= end - cd_offset, io, path, ": the central directory [",
            cd_offset, ", +", cd_size, ") lies outside the archive (truncated file?)");
  // Each entry takes at least a central header: a count past that is a lie, not an allocation.
  DCP_CHECK(count <= cd_size / kCentralHeaderSize, io, path, ": the zip archive claims ", count,
            " entries in a central directory of ", cd_size, " bytes");
  std::vector<Entry> entries;
  entries.reserve(static_cast<std::size_t>(count));
  std::set<std::string> names;
  std::uint64_t at = cd_offset;
  const std::uint64_t cd_end = cd_offset + cd_size;
  for (std::uint64_t i = 0; i < count; ++i) {
    DCP_CHECK(cd_end - at >= kCentralHeaderSize && le(data + at, 4) == kCentralHeader, io, path,
              ": central directory entry ", i, " at offset ", at, " is not a file header");
    const std::uint8_t* h = data + at;
    const std::uint64_t flags = le(h + 8, 2), name_len = le(h + 28, 2), extra_len = le(h + 30, 2),
                        comment_len = le(h + 32, 2);
    DCP_CHECK(cd_end - at - kCentralHeaderSize >= name_len + extra_len + comment_len, io, path,
              ": central directory entry ", i, " runs past the directory");
    Entry e;
    e.name.assign(reinterpret_cast<const char*>(h + kCentralHeaderSize), name_len);
    e.method = static_cast<int>(le(h + 10, 2));
    e.crc32 = static_cast<std::uint32_t>(le(h + 16, 4));
    std::uint64_t stored = le(h + 20, 4), length = le(h + 24, 4), local = le(h + 42, 4);
    std::uint64_t entry_disk = le(h + 34, 2);
    // The zip64 extra field holds, in this order, those of the four that overflowed theirs.
    const std::uint8_t* x = h + kCentralHeaderSize + name_len;
    for (std::uint64_t k = 0; k + 4 <= extra_len;) {
      const std::uint64_t id = le(x + k, 2), len = le(x + k + 2, 2);
      DCP_CHECK(k + 4 + len <= extra_len, io, path, ": entry '", e.name,
                "' has an extra field running past its header");
      if (id == 0x0001) {
        std::uint64_t p = k + 4;
        const auto take = [&](std::uint64_t& field, std::uint64_t overflowed, int bytes) {
          if (field != overflowed) return;
          DCP_CHECK(p + static_cast<std::uint64_t>(bytes) <= k + 4 + len, io, path, ": entry '",
                    e.name, "' has a zip64 field too short for its sizes and offset");
          field = le(x + p, bytes);
          p += static_cast<std::uint64_t>(bytes);
        };
        take(length, 0xffffffffu, 8);
        take(stored, 0xffffffffu, 8);
        take(local, 0xffffffffu, 8);
        take(entry_disk, 0xffffu, 4);
      }
      k += 4 + len;
    }
    DCP_CHECK((flags & 1u) == 0, io, path, ": entry '", e.name, "' is encrypted");
    DCP_CHECK(entry_disk == 0, io, path, ": entry '", e.name, "' is on disk ", entry_disk,
              " of a multi-disk archive");
    DCP_CHECK(e.method != 0 || stored == length, io, path, ": stored entry '", e.name, "' claims ",
              stored, " bytes stored for ", length);
    DCP_CHECK(local <= cd_offset && cd_offset - local >= kLocalHeaderSize &&
                  le(data + local, 4) == kLocalHeader,
              io, path, ": entry '", e.name, "' has no local header at offset ", local);
    const std::uint8_t* l = data + local;
    const std::uint64_t l_name = le(l + 26, 2), l_extra = le(l + 28, 2);
    DCP_CHECK(
        cd_offset - local - kLocalHeaderSize >= l_name + l_extra && l_name == name_len &&
            std::equal(l + kLocalHeaderSize, l + kLocalHeaderSize + l_name, h + kCentralHeaderSize),
        io, path, ": entry '", e.name, "': its local header names another file");
    e.offset = local + kLocalHeaderSize + l_name + l_extra;
    DCP_CHECK(stored <= cd_offset - e.offset, io, path, ": entry '", e.name, "' (", stored,
              " bytes at offset ", e.offset, ") runs into the central directory (truncated file?)");
    e.size = stored;
    DCP_CHECK(names.insert(e.name).second, io, path, ": entry '", e.name, "' appears twice");
    entries.push_back(std::move(e));
    at += kCentralHeaderSize + name_len + extra_len + comment_len;
  }
  return entries;
}

std::uint32_t crc32(const std::uint8_t* data, std::size_t size) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xffffffffu;
  for (std::size_t i = 0; i < size; ++i) c = table[(c ^ data[i]) & 0xffu] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

}  // namespace dcp::zip
