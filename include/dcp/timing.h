// Wall-clock timing and the summary statistics every report uses, defined once.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace dcp {

using Clock = std::chrono::steady_clock;

// Milliseconds elapsed since t0.
inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The median (the mean of the two middle values for an even count); 0 for no values.
inline double median(std::vector<double> x) {
  if (x.empty()) return 0;
  std::sort(x.begin(), x.end());
  const std::size_t m = x.size() / 2;
  return x.size() % 2 ? x[m] : 0.5 * (x[m - 1] + x[m]);
}

}  // namespace dcp
