// Large, long-lived buffers (the KV pools): zero-filled, 2 MiB-aligned once they are that big,
// and backed by transparent huge pages where the kernel allows them (madvise). Attention walks
// the KV a row at a time across the whole context; with 4 KiB pages every few rows cost a TLB
// miss and a restart of the hardware prefetcher, which at 16 heads cost a third of the kernel's
// speed out of cache (see docs/performance.md).
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

namespace dcp {

class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  // Throws dcp::Error (capacity) naming `what` and the size when the memory cannot be allocated.
  explicit HugePageBuffer(std::size_t bytes, std::string_view what = "a buffer");

  std::byte* data() noexcept { return data_.get(); }
  const std::byte* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }
  // Whether the kernel accepted the huge-page advice (false under THP "never", or when small).
  bool huge_pages() const noexcept { return huge_pages_; }

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const noexcept;
  };
  std::unique_ptr<std::byte, FreeDeleter> data_;
  std::size_t size_ = 0;
  bool huge_pages_ = false;
};

}  // namespace dcp
