// Token ownership in a DCP group: pure index math, no state.
//
// A DCP group of N ranks stripes a sequence by position. With interleave size I
// (I = 1 is the default and the seeds' layout), position p belongs to
//
//     owner(p) = floor(p / I) mod N
//     row(p)   = floor(p / (I*N)) * I + p mod I        (its compact local row on the owner)
//
// For I = 1 this is owner = p mod N, row = floor(p / N). The number of positions of [0, x)
// owned by rank r is count(x, r): for I = 1, max(0, ceil((x - r) / N)). A chunk [a, a+L)
// gives rank r count(a+L, r) - count(a, r) rows, never L/N.
#pragma once

#include <cstdint>

namespace dcp {

namespace layout {

constexpr int owner(std::int64_t p, int n, int i = 1) noexcept {
  return static_cast<int>((p / i) % n);
}

constexpr std::int64_t row(std::int64_t p, int n, int i = 1) noexcept {
  return (p / (static_cast<std::int64_t>(i) * n)) * i + p % i;
}

// Positions in [0, x) owned by rank r. Negative x counts as 0.
constexpr std::int64_t count(std::int64_t x, int r, int n, int i = 1) noexcept {
  if (x <= 0) return 0;
  const std::int64_t block = static_cast<std::int64_t>(i) * n;
  const std::int64_t rem = x % block - static_cast<std::int64_t>(r) * i;
  return (x / block) * i + (rem < 0 ? 0 : (rem > i ? i : rem));
}

// Inverse of row(): the global position of local row `local_row` on rank r.
constexpr std::int64_t position(std::int64_t local_row, int r, int n, int i = 1) noexcept {
  return (local_row / i) * (static_cast<std::int64_t>(i) * n) + static_cast<std::int64_t>(r) * i +
         local_row % i;
}

}  // namespace layout

// The rows of a chunk [a, a+L) that one rank stores: local rows [first_row, first_row + rows).
struct ChunkShare {
  std::int64_t first_row = 0;
  std::int64_t rows = 0;
  friend constexpr bool operator==(const ChunkShare&, const ChunkShare&) = default;
};

// One rank's view of the striping, validated once at construction (off the hot path).
class ShardLayout {
 public:
  // Throws dcp::Error unless dcp_size >= 1, 0 <= dcp_rank < dcp_size, interleave >= 1.
  ShardLayout(int dcp_size, int dcp_rank, int interleave = 1);

  int size() const noexcept { return size_; }
  int rank() const noexcept { return rank_; }
  int interleave() const noexcept { return interleave_; }

  bool owns(std::int64_t p) const noexcept { return layout::owner(p, size_, interleave_) == rank_; }
  std::int64_t local_row(std::int64_t p) const noexcept {
    return layout::row(p, size_, interleave_);
  }
  std::int64_t position(std::int64_t local_row) const noexcept {
    return layout::position(local_row, rank_, size_, interleave_);
  }
  // Rank-local length of a sequence of global length x.
  std::int64_t local_length(std::int64_t x) const noexcept {
    return layout::count(x, rank_, size_, interleave_);
  }
  // This rank's share of the chunk [start, start + length).
  ChunkShare chunk_share(std::int64_t start, std::int64_t length) const noexcept {
    const std::int64_t first = local_length(start);
    return {first, local_length(start + length) - first};
  }

 private:
  int size_;
  int rank_;
  int interleave_;
};

// The widened (virtual) slot space the scheduler sees over per-rank physical pools.
// Each rank has `physical_pages` pages of `page_size` rows; the scheduler sees
// page_size * N slots per virtual page and physical_rows * N slots in all. One virtual page
// is the physical page with the same id on every rank of the group.
class WidenedPages {
 public:
  // Throws unless dcp_size >= 1, page_size >= 1, physical_pages >= 0, interleave >= 1 and
  // page_size is a multiple of interleave (so a virtual page never straddles two pages).
  WidenedPages(int dcp_size, std::int64_t physical_pages, int page_size, int interleave = 1);

  int dcp_size() const noexcept { return size_; }
  int page_size() const noexcept { return page_size_; }
  int interleave() const noexcept { return interleave_; }
  std::int64_t physical_pages() const noexcept { return pages_; }
  std::int64_t physical_rows() const noexcept { return pages_ * page_size_; }
  std::int64_t virtual_page_size() const noexcept {
    return static_cast<std::int64_t>(page_size_) * size_;
  }
  std::int64_t virtual_capacity() const noexcept { return physical_rows() * size_; }

  int owner(std::int64_t v) const noexcept { return layout::owner(v, size_, interleave_); }
  std::int64_t physical(std::int64_t v) const noexcept {
    return layout::row(v, size_, interleave_);
  }

 private:
  int size_;
  std::int64_t pages_;
  int page_size_;
  int interleave_;
};

}  // namespace dcp
