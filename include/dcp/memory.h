// Large, long-lived buffers (the KV pools, the weights): 2 MiB-aligned once they are that big,
// and backed by transparent huge pages where the kernel allows them (madvise). Attention walks
// the KV a row at a time across the whole context and a decode step streams every weight once;
// with 4 KiB pages every few rows cost a TLB miss and a restart of the hardware prefetcher,
// which at 16 heads cost a third of the attention kernel's speed out of cache (see
// docs/performance.md).
#pragma once

#include <cstddef>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

namespace dcp {

struct PageMemory {
  void* data = nullptr;     // nullptr when the memory could not be had
  bool huge_pages = false;  // whether the kernel accepted the huge-page advice
};

// `bytes` of zeroed memory. From 2 MiB up it is its own mapping, 2 MiB-aligned and advised for
// huge pages; the mapping is `bytes` rounded up to the base page, so a last part smaller than a
// huge page stays base-paged and the advice costs no memory. Smaller sizes come from the heap,
// 64-byte aligned. Under AddressSanitizer every size comes from the heap (from 2 MiB up
// 2 MiB-aligned and advised too), so that the sanitizer still sees overruns. Release with
// free_pages and the same `bytes`.
PageMemory allocate_pages(std::size_t bytes) noexcept;
void free_pages(void* p, std::size_t bytes) noexcept;
// Whether allocate_pages maps large buffers itself (false under AddressSanitizer).
bool allocate_pages_maps_memory() noexcept;

// Why an allocation failed, for an error message: where this process holds as many memory
// mappings as the kernel allows (vm.max_map_count, which a process reaches long before memory
// runs out when it holds tens of thousands of weights), that limit and how to raise it; else
// "out of memory".
std::string allocation_failure_reason();
// Throws dcp::Error (capacity): "cannot allocate <what> of <bytes> bytes: <reason>".
[[noreturn]] void throw_allocation_failure(std::string_view what, std::size_t bytes);

// The kernel's transparent-huge-page mode ("always", "madvise" or "never"; "unavailable" without
// /sys/kernel/mm/transparent_hugepage): under "never" the advice above is ignored, and a
// benchmark should say so.
std::string transparent_huge_pages();

// allocate_pages as a standard allocator, for vectors of weights.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT: rebinding is implicit
  T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    void* p = allocate_pages(n * sizeof(T)).data;
    if (p == nullptr) throw_allocation_failure("a weight", n * sizeof(T));
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept { free_pages(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;  // stateless: any instance frees what another allocated
  }
};
template <class T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

// Frees what allocate_pages gave, of the size it holds.
struct PageRelease {
  std::size_t bytes = 0;
  void operator()(std::byte* p) const noexcept { free_pages(p, bytes); }
};

class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  // Throws dcp::Error (capacity) naming `what` and the size when the memory cannot be allocated.
  // Every byte is written (zero) here, so that no page faults wait for the first real use.
  explicit HugePageBuffer(std::size_t bytes, std::string_view what = "a buffer");

  std::byte* data() noexcept { return data_.get(); }
  const std::byte* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }
  // Whether the kernel accepted the huge-page advice (false under THP "never", or when small).
  bool huge_pages() const noexcept { return huge_pages_; }

 private:
  std::unique_ptr<std::byte, PageRelease> data_;
  std::size_t size_ = 0;
  bool huge_pages_ = false;
};

}  // namespace dcp
