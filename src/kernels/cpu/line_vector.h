// Vectors whose storage starts on a cache line. The kernels load their work buffers 64 bytes at a
// time (AVX-512 vectors, AMX tile rows); from operator new's 16-byte alignment every such load
// straddles two lines and costs two.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace dcp::kernels {
// Internal linkage, as simd.h: the kernels are compiled once per instruction set, and a
// std::vector<T, LineAligned<T>> with external linkage would be one template instantiation that
// the linker picks from any of those objects, AVX-512 code included, for every caller (seen:
// SIGILL on an AVX2-only host in a build that did not inline the vector's growth).
namespace {

template <typename T>
struct LineAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  LineAligned() = default;
  template <typename U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, kAlign); }
  bool operator==(const LineAligned&) const { return true; }
  bool operator!=(const LineAligned&) const { return false; }
};

template <typename T>
using LineVector = std::vector<T, LineAligned<T>>;

// Makes `v` hold at least n elements; never shrinks it. A kernel that alternates between a block
// task (many lanes) and one-token tasks keeps its largest buffers instead of growing them again,
// and zero-filling the new part, at every switch. Such a kernel touches only the part it uses.
template <typename T>
void grow_to(LineVector<T>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
}

// A kernel's work buffers, kept per thread between calls. Decode calls a kernel once per layer,
// and buffers of a few hundred KB come fresh from mmap, so each call faulted its pages in and
// zeroed them again (the AMX path: a fifth of a 512-row call at 128 heads). One kernel object
// per buffer type and thread is alive at a time (mla_attention runs one kernel per thread).
template <typename Buffers>
Buffers& thread_buffers() {
  thread_local Buffers buffers;
  return buffers;
}

}  // namespace
}  // namespace dcp::kernels
