// Machine ceilings measured inside a benchmark run, and a minimal SVG line chart.
#pragma once

#include <cstddef>
#include <fstream>
#include <string>
#include <vector>

#include "dcp/kernel_path.h"
#include "dcp/memory.h"
#include "dcp/weights.h"

namespace dcp::cli {

// fp32 GEMM rate (GFLOP/s) of OpenBLAS on an n x n x n product with `threads` threads.
double measure_sgemm_gflops(int threads, int n = 2048);
// The same of dcp's blocked product (linear() on `path` on weights of `dtype`, FP8 in 128 x 128
// blocks, n rows of x, `threads` threads); 0 where linear() runs BLAS for it
// (prefill_runs_blocked_product(path) is false).
double measure_blocked_gflops(int threads, int n = 2048, KernelPath path = KernelPath::automatic,
                              WeightDtype dtype = WeightDtype::f32);

// A buffer larger than the last-level cache. Reading it evicts whatever a benchmark touched
// before, and it is also what the read ceiling reads.
//
// Why: last-level caches of hundreds of MiB exist. A KV read call after call moves into them
// within a few calls, so a benchmark that repeats one call measures the cache, not memory, and
// "read bandwidth" ratios above 100% follow. Decode reads each
// layer's KV once per step, and the KV of all layers is far larger than any cache: a call on
// a cold cache is the case that matters, and the benchmarks flush before each timed call.
class CacheFlusher {
 public:
  // Twice the last-level cache (sysconf), and at least 256 MiB.
  CacheFlusher();
  // Reads the whole buffer on `threads` threads; returns that read's GB/s. Plain threads, not
  // OpenBLAS: OpenBLAS's workers spin for a while after a call, and a spinning worker takes a
  // core from the next timed call.
  double flush(int threads = 1);
  // STREAM-like read bandwidth (GB/s): the best of `reads` flushes.
  double read_gbps(int threads, int reads = 5);
  std::size_t bytes() const { return buffer_.size(); }

 private:
  HugePageBuffer buffer_;  // huge pages where the kernel allows, like the KV pools
};

// The last-level cache size in bytes as the C library reports it; 0 when unknown.
std::size_t last_level_cache_bytes();

// Whether benchmarks time calls on a cold cache (flushed before each) or a warm one.
enum class CacheState { cold, warm };
// Parses "cold" or "warm"; the error names `flag` and the legal values.
CacheState parse_cache_state(const std::string& text, const std::string& flag);

// `c` with its weights held as a benchmark's --dtypes row names them: "fp8" (E4M3 projections
// in c's blocks, as DeepSeek-V3 ships them), "int4" (routed experts in INT4, the rest 16-bit, as
// Kimi-K2-Thinking ships them), or "bf16"/"f32" (no quantization_config).
void hold_weights_as(ModelConfig& c, const std::string& dtype);

// A benchmark's table as CSV: the column names, then a line per row, each written as the
// benchmark prints it (a long run that is stopped keeps what it measured). An empty path writes
// nothing. Throws dcp::Error (io) naming the path when it cannot be written.
class CsvFile {
 public:
  CsvFile(const std::string& path, const std::vector<std::string>& columns);
  void row(const std::vector<std::string>& cells);  // one cell per column

 private:
  void line(const std::vector<std::string>& cells);
  std::string path_;
  std::size_t columns_;
  std::ofstream out_;
};

struct Series {
  std::string name;
  std::vector<double> x, y;
};
// Appends (x, y) to the series called `name`, which is added to `chart` the first time.
void add_point(std::vector<Series>& chart, const std::string& name, double x, double y);
// Writes an SVG line chart (log-scale x when log_x), one polyline per series.
void write_svg_chart(const std::string& path, const std::string& title, const std::string& x_label,
                     const std::string& y_label, const std::vector<Series>& series, bool log_x);

}  // namespace dcp::cli
