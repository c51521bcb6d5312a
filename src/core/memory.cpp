#include "dcp/memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "dcp/error.h"

namespace dcp {
namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
}  // namespace

void HugePageBuffer::FreeDeleter::operator()(std::byte* p) const noexcept {
  std::free(p);
}

HugePageBuffer::HugePageBuffer(std::size_t bytes, std::string_view what) : size_(bytes) {
  // Small buffers keep cache-line alignment: rounding them up to 2 MiB would waste memory.
  const std::size_t align = bytes >= kHugePage ? kHugePage : 64;
  // aligned_alloc wants a multiple of the alignment, and at least one (bytes may be 0).
  const std::size_t allocated = std::max(align, (bytes + align - 1) / align * align);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(align, allocated));
  DCP_CHECK(p != nullptr, capacity, "cannot allocate ", what, " of ", bytes, " bytes");
  data_.reset(p);
  // Advice only: without THP (or with it set to "never") the buffer is simply 4 KiB-paged. It
  // must come before the first touch, which the zero fill is.
  if (align == kHugePage) huge_pages_ = madvise(p, allocated, MADV_HUGEPAGE) == 0;
  std::memset(p, 0, allocated);
}

}  // namespace dcp
