#include "bench/bench_util.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "dcp/dtype.h"
#include "dcp/error.h"
#include "dcp/memory.h"
#include "dcp/weights.h"

namespace dcp::cli {
namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

double measure_sgemm_gflops(int threads, int n) {
  openblas_set_num_threads(threads);
  std::vector<float> a(static_cast<std::size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
              0.0f, c.data(), n);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    best = std::max(best, 2.0 * n * n * n / seconds_since(t0) / 1e9);
  }
  return best;
}

double measure_blocked_gflops(int threads, int n, KernelPath path, WeightDtype dtype) {
  if (!prefill_runs_blocked_product(path)) return 0;
  std::vector<float> x(static_cast<std::size_t>(n) * n, 0.5f), y(x.size());
  WeightMatrix w = WeightMatrix::from_float(std::vector<float>(x.size(), 0.25f), n, n);
  if (dtype == WeightDtype::bf16) {  // 0.25 is exact in bf16: its top half-word
    w.dtype = WeightDtype::bf16;
    const std::vector<bf16_t> quarters(x.size(), float_to_bf16(0.25f));
    w.data.resize(quarters.size() * sizeof(bf16_t));
    std::memcpy(w.data.data(), quarters.data(), w.data.size());
  } else if (dtype == WeightDtype::f8_e4m3) {
    w = WeightMatrix::quantize_fp8(std::vector<float>(x.size(), 0.25f), n, n, 128, 128);
  }
  linear(x.data(), n, w, y.data(), -1, -1, path, threads);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    linear(x.data(), n, w, y.data(), -1, -1, path, threads);
    best = std::max(best, 2.0 * n * n * n / seconds_since(t0) / 1e9);
  }
  return best;
}

std::size_t last_level_cache_bytes() {
  for (int name : {_SC_LEVEL4_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long size = sysconf(name);
    if (size > 0) return static_cast<std::size_t>(size);
  }
  return 0;
}

CacheFlusher::CacheFlusher()
    : buffer_(std::max(std::size_t{256} << 20, 2 * last_level_cache_bytes()),
              "the cache-flush buffer") {
  auto* x = reinterpret_cast<float*>(buffer_.data());
  std::fill(x, x + buffer_.size() / sizeof(float), 1.0f);
}

namespace {

// Sum of n floats read as four concurrent streams (the quarters of the range), each in 16
// independent partial sums the compiler keeps in vectors. One stream reads about a fifth slower
// than several on current cores; the weight kernels read four rows at a time, and a ceiling
// measured with one stream would sit below what they reach. Each stream also asks for the line
// 1 KiB ahead, as the weight kernels ask for rows ahead: the hardware prefetchers stop at 4 KiB
// page edges, and without it this read ran 10-15% below what prefetching reaches here.
// Not instrumented by the sanitizers: the loop stays within [x, x + n), and a check on every load
// (UBSan's pointer-overflow checks also keep it from being vectorized) made the flushes of the
// sanitizer tests' benchmark runs most of their time.
__attribute__((no_sanitize("address", "undefined"))) float sum_floats(const float* x,
                                                                      std::size_t n) {
  constexpr int kStreams = 4;
  constexpr std::size_t kAhead = 256;  // floats
  const std::size_t quarter = n / kStreams / 16 * 16;
  float part[kStreams][16] = {};
  for (std::size_t i = 0; i < quarter; i += 16) {
    for (int s = 0; s < kStreams; ++s) {
      __builtin_prefetch(x + s * quarter + std::min(i + kAhead, quarter - 1));
      for (int k = 0; k < 16; ++k) part[s][k] += x[s * quarter + i + k];
    }
  }
  for (std::size_t i = kStreams * quarter; i < n; ++i) part[0][0] += x[i];
  float total = 0;
  for (const auto& stream : part) {
    for (float p : stream) total += p;
  }
  return total;
}

}  // namespace

double CacheFlusher::flush(int threads) {
  const auto* x = reinterpret_cast<const float*>(buffer_.data());
  const std::size_t n = buffer_.size() / sizeof(float);
  const std::size_t per = (n / threads + 15) / 16 * 16;
  std::vector<float> sums(static_cast<std::size_t>(threads));
  const auto t0 = Clock::now();
  std::vector<std::thread> helpers;
  for (int i = 1; i < threads; ++i) {
    helpers.emplace_back([&, i] {
      const std::size_t from = std::min(n, per * i), to = std::min(n, per * (i + 1));
      sums[i] = sum_floats(x + from, to - from);
    });
  }
  sums[0] = sum_floats(x, std::min(n, per));
  for (std::thread& h : helpers) h.join();
  const double gbps = static_cast<double>(buffer_.size()) / seconds_since(t0) / 1e9;
  static volatile float sink = 0;  // keeps the sums, so the reads cannot be dropped
  for (float v : sums) sink = sink + v;
  return gbps;
}

double CacheFlusher::read_gbps(int threads, int reads) {
  double best = 0;
  for (int r = 0; r < reads; ++r) best = std::max(best, flush(threads));
  return best;
}

void hold_weights_as(ModelConfig& c, const std::string& dtype) {
  c.quantized = dtype == "fp8";
  c.quant_method = c.quantized ? "fp8" : "";
  c.int4_group_size = 0;
  c.int4_ignore.clear();
  if (dtype == "int4") quantize_experts_int4(c);
}

CacheState parse_cache_state(const std::string& text, const std::string& flag) {
  DCP_ARG_CHECK(text == "cold" || text == "warm", flag, " '", text,
                "' is not a cache state: legal values are cold, warm");
  return text == "cold" ? CacheState::cold : CacheState::warm;
}

CsvFile::CsvFile(const std::string& path, const std::vector<std::string>& columns)
    : path_(path), columns_(columns.size()) {
  if (path_.empty()) return;
  out_.open(path_);
  line(columns);
}

void CsvFile::row(const std::vector<std::string>& cells) {
  DCP_CHECK_EQ(cells.size(), columns_, "cells per CSV row");
  if (!path_.empty()) line(cells);
}

void CsvFile::line(const std::vector<std::string>& cells) {
  for (std::size_t i = 0; i < cells.size(); ++i) out_ << (i ? "," : "") << cells[i];
  out_ << std::endl;  // flushed: the file is whole up to the last row measured
  DCP_CHECK(out_.good(), io, "cannot write ", path_);
}

void add_point(std::vector<Series>& chart, const std::string& name, double x, double y) {
  auto it =
      std::find_if(chart.begin(), chart.end(), [&](const Series& s) { return s.name == name; });
  if (it == chart.end()) it = chart.insert(chart.end(), Series{name, {}, {}});
  it->x.push_back(x);
  it->y.push_back(y);
}

void write_svg_chart(const std::string& path, const std::string& title, const std::string& x_label,
                     const std::string& y_label, const std::vector<Series>& series, bool log_x) {
  const double W = 720, H = 420, L = 70, R = 180, T = 40, B = 50;
  double x0 = 1e300, x1 = -1e300, y1 = 0;
  for (const Series& s : series) {
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      const double x = log_x ? std::log10(s.x[i]) : s.x[i];
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y1 = std::max(y1, s.y[i]);
    }
  }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= 0) y1 = 1;
  y1 *= 1.1;
  const auto px = [&](double x) {
    return L + ((log_x ? std::log10(x) : x) - x0) / (x1 - x0) * (W - L - R);
  };
  const auto py = [&](double y) { return H - B - y / y1 * (H - T - B); };
  static const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                  "#9467bd", "#8c564b", "#17becf", "#7f7f7f"};
  std::ofstream out(path);
  DCP_CHECK(out.good(), io, "cannot write ", path);
  out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
      << "' font-family='sans-serif' font-size='12'>\n"
      << "<rect width='100%' height='100%' fill='white'/>\n"
      << "<text x='" << W / 2 << "' y='20' text-anchor='middle' font-size='14'>" << title
      << "</text>\n"
      << "<line x1='" << L << "' y1='" << H - B << "' x2='" << W - R << "' y2='" << H - B
      << "' stroke='black'/>\n"
      << "<line x1='" << L << "' y1='" << T << "' x2='" << L << "' y2='" << H - B
      << "' stroke='black'/>\n"
      << "<text x='" << (L + W - R) / 2 << "' y='" << H - 12 << "' text-anchor='middle'>" << x_label
      << "</text>\n"
      << "<text x='16' y='" << (T + H - B) / 2 << "' text-anchor='middle' transform='rotate(-90 16 "
      << (T + H - B) / 2 << ")'>" << y_label << "</text>\n";
  for (int k = 0; k <= 4; ++k) {
    const double y = y1 * k / 4;
    out << "<text x='" << L - 6 << "' y='" << py(y) + 4 << "' text-anchor='end'>"
        << std::round(y * 10) / 10 << "</text>\n"
        << "<line x1='" << L << "' y1='" << py(y) << "' x2='" << W - R << "' y2='" << py(y)
        << "' stroke='#ddd'/>\n";
  }
  std::vector<double> ticks;
  for (const Series& s : series) ticks.insert(ticks.end(), s.x.begin(), s.x.end());
  std::sort(ticks.begin(), ticks.end());
  ticks.erase(std::unique(ticks.begin(), ticks.end()), ticks.end());
  for (double x : ticks)
    out << "<text x='" << px(x) << "' y='" << H - B + 16 << "' text-anchor='middle'>" << x
        << "</text>\n";
  for (std::size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const char* c = colours[i % 8];
    out << "<polyline fill='none' stroke='" << c << "' stroke-width='2' points='";
    for (std::size_t k = 0; k < s.x.size(); ++k) out << px(s.x[k]) << "," << py(s.y[k]) << " ";
    out << "'/>\n";
    for (std::size_t k = 0; k < s.x.size(); ++k)
      out << "<circle cx='" << px(s.x[k]) << "' cy='" << py(s.y[k]) << "' r='3' fill='" << c
          << "'/>\n";
    out << "<text x='" << W - R + 10 << "' y='" << T + 16 * (i + 1) << "' fill='" << c << "'>"
        << s.name << "</text>\n";
  }
  out << "</svg>\n";
}

}  // namespace dcp::cli
