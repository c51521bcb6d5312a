// Software prefetch of the next KV tile while the current one computes.
//
// With few heads (or with 16 heads and fp32 rows) a decode call reads the KV from memory about
// as fast as it computes on it, and the call takes the longer of the two only if reading overlaps
// computing. Cold-cache measurements on this machine (4 heads, 32K rows) put the kernels at
// compute + read time, not the larger of the two, while a synthetic loop that prefetched each
// line of the next tile once, in memory order, spread evenly over its compute, ran at the read
// bandwidth. Two things mattered in that loop: the spreading (a burst of requests fills the
// line-fill buffers and stalls the core, and the memory then idles while it computes), and the
// order (column blocks across rows, the order the value pass reads in, was 10-15% slower than
// row after row). So the kernels ask for a few lines per step of their passes, row after row: 4
// heads fp32 (the row kernel) went from 7.6-7.8 to 6.5-6.7 ms at 32K cold rows, 16 heads (the
// heads-in-lanes kernel) 9% faster.
//
// The AMX kernel does without: its value operand's interleave reads the tile as a stream that
// the hardware prefetcher follows, and this scheme, spread over its passes in three ways, was
// 5-21% slower on a cold cache and 15% slower in cache (4 and 16 heads).
#pragma once

#include <algorithm>
#include <cstdint>

namespace dcp::kernels {
namespace {

template <int kRows>
class TilePrefetch {
 public:
  explicit TilePrefetch(int row_bytes)
      : line_count_((row_bytes + 63) / 64), row_bytes_(row_bytes) {}

  // Starts on the next tile: its `rows` rows (at most kRows; 0 past the task's end) are rows
  // phys[0 .. rows) of the pool at `pool`.
  void restart(const void* pool, const std::int64_t* phys, int rows) {
    rows_ = rows;
    j_ = 0;
    line_ = 0;
    for (int j = 0; j < rows; ++j) row_[j] = static_cast<const char*>(pool) + phys[j] * row_bytes_;
  }

  // Lines per call to lines() for a pass that makes `steps` calls and requests `share` of the
  // tile (rounded up, so the passes finish the tile early rather than late).
  int lines_per_step(double share, int steps) const {
    const int total = kRows * line_count_;
    return steps > 0 ? static_cast<int>(share * total / steps) + 1 : total;
  }

  // Requests the next `count` lines into L2 (T1: the tile is read after this one is done with
  // L1); nothing once the whole tile has been requested.
  void lines(int count) {
    for (int k = 0; k < count && j_ < rows_; ++k) {
      __builtin_prefetch(row_[j_] + 64 * line_, 0, 2);
      if (++line_ == line_count_) {
        line_ = 0;
        ++j_;
      }
    }
  }

  // Requests whatever of the tile the steps have not.
  void rest() { lines((rows_ - j_) * line_count_ - line_); }

 private:
  int line_count_;
  int rows_ = 0, j_ = 0, line_ = 0;
  const char* row_[kRows] = {};
  // Last on purpose: ahead of the counters it moved them and everything after them in the
  // kernels by 8 bytes, and the row kernel at 4 heads fp32 ran 7% slower (A/B, cold, 32K rows).
  int row_bytes_;
};

}  // namespace
}  // namespace dcp::kernels
