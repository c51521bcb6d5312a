// Machine ceilings measured inside a benchmark run, and a minimal SVG line chart.
#pragma once

#include <string>
#include <vector>

namespace dcp::cli {

// fp32 GEMM rate (GFLOP/s) of OpenBLAS on an n x n x n product with `threads` threads.
double measure_sgemm_gflops(int threads, int n = 2048);
// STREAM-like read bandwidth (GB/s): OpenBLAS sasum over `bytes` of floats, `threads` threads.
double measure_read_gbps(int threads, std::size_t bytes = std::size_t{512} << 20);

struct Series {
  std::string name;
  std::vector<double> x, y;
};
// Writes an SVG line chart (log-scale x when log_x), one polyline per series.
void write_svg_chart(const std::string& path, const std::string& title, const std::string& x_label,
                     const std::string& y_label, const std::vector<Series>& series, bool log_x);

}  // namespace dcp::cli
