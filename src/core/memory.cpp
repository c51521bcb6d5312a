#include "dcp/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "dcp/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define DCP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DCP_ASAN 1
#endif
#endif

namespace dcp {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kLine = 64;

std::size_t round_up(std::size_t n, std::size_t to) {
  return (n + to - 1) / to * to;
}

// The line count of /proc/self/maps: one line per mapping. -1 when it cannot be read.
long mapping_count() {
  std::ifstream f("/proc/self/maps");
  if (!f) return -1;
  long lines = 0;
  std::string line;
  while (std::getline(f, line)) ++lines;
  return lines;
}

bool mapped(std::size_t bytes) {
#ifdef DCP_ASAN
  (void)bytes;
  return false;
#else
  return bytes >= kHugePage;
#endif
}

std::size_t base_page() {
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

PageMemory allocate_pages(std::size_t bytes) noexcept {
  if (!mapped(bytes)) {
    // Large buffers keep their 2 MiB alignment under the sanitizer too. aligned_alloc wants a
    // multiple of the alignment, and at least one (bytes may be 0).
    const std::size_t align = bytes >= kHugePage ? kHugePage : kLine;
    const std::size_t len = round_up(bytes > 0 ? bytes : 1, align);
    void* p = std::aligned_alloc(align, len);
    if (p == nullptr) return {};
    // The advice here too: first touches of base pages made most of the time the sanitizer
    // builds spent allocating gigabyte buffers.
    const bool huge = align == kHugePage && madvise(p, len, MADV_HUGEPAGE) == 0;
    std::memset(p, 0, bytes);
    return {p, huge};
  }
  // Map a huge page more than needed, then give back the parts before the first 2 MiB boundary
  // and after the buffer's last base page.
  const std::size_t len = round_up(bytes, base_page());
  if (len > SIZE_MAX - kHugePage) return {};
  void* m =
      mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return {};
  const auto start = reinterpret_cast<std::uintptr_t>(m);
  const std::uintptr_t aligned = round_up(start, kHugePage);
  if (aligned > start) munmap(m, aligned - start);
  const std::uintptr_t end = start + len + kHugePage;
  if (end > aligned + len) munmap(reinterpret_cast<void*>(aligned + len), end - (aligned + len));
  void* p = reinterpret_cast<void*>(aligned);
  // Advice only: without THP (or with it set to "never") the memory is simply base-paged. The
  // mapping is zero until first touched, and huge pages are given on that first touch.
  const bool huge = madvise(p, len, MADV_HUGEPAGE) == 0;
  return {p, huge};
}

bool allocate_pages_maps_memory() noexcept {
  return mapped(kHugePage);
}

std::string allocation_failure_reason() {
  long limit = -1;
  std::ifstream("/proc/sys/vm/max_map_count") >> limit;
  const long held = mapping_count();
  // A few mappings short of the limit already fail: an allocation may need more than one.
  if (limit > 0 && held >= limit - 8) {
    return str("this process holds ", held,
               " memory mappings, the kernel's limit (vm.max_map_count = ", limit,
               "): raise it, e.g. sysctl -w vm.max_map_count=", 4 * limit);
  }
  return "out of memory";
}

void throw_allocation_failure(std::string_view what, std::size_t bytes) {
  throw_error(ErrorCategory::capacity,
              str("cannot allocate ", what, " of ", bytes, " bytes: ", allocation_failure_reason()),
              __FILE__, __LINE__);
}

void free_pages(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  if (mapped(bytes))
    munmap(p, round_up(bytes, base_page()));
  else
    std::free(p);
}

std::string transparent_huge_pages() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(f, line)) return "unavailable";
  // "always [madvise] never": the bracketed word is the one in force.
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "unavailable";
  return line.substr(open + 1, close - open - 1);
}

HugePageBuffer::HugePageBuffer(std::size_t bytes, std::string_view what) : size_(bytes) {
  const PageMemory m = allocate_pages(bytes);
  if (m.data == nullptr) throw_allocation_failure(what, bytes);
  data_ =
      std::unique_ptr<std::byte, PageRelease>(static_cast<std::byte*>(m.data), PageRelease{bytes});
  huge_pages_ = m.huge_pages;
  std::memset(m.data, 0, bytes);  // the first touch: huge pages (if advised) are given here
}

}  // namespace dcp
