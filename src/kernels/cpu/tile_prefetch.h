// Software prefetch of the next KV tile while the current one computes.
//
// With few heads (or with 16 heads and fp32 rows) a decode call reads the KV from memory about
// as fast as it computes on it, and the call takes the longer of the two only if reading overlaps
// computing; left to the hardware, the kernels take compute + read time. Two things make the
// overlap: spreading the requests (a burst fills the line-fill buffers and stalls the core, and
// the memory then idles while it computes), and their order (row after row beats column blocks
// across rows, the order the value pass reads in). So the kernels ask for a few lines per step of
// their passes, row after row.
//
// The AMX kernel does without: its value operand's interleave reads the tile as a stream that
// the hardware prefetcher follows, and this scheme only slowed it.
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
  // Last on purpose: ahead of the counters it moves them and everything after them in the
  // kernels by 8 bytes, which slows the row kernel's hot loop.
  int row_bytes_;
};

}  // namespace
}  // namespace dcp::kernels
