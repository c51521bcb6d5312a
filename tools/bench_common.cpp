#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <random>

#include "bench.h"
#include "bench_util.h"
#include "dcp/attention.h"
#include "dcp/comm_mpi.h"
#include "dcp/comm_threads.h"
#include "dcp/dcp_attention.h"
#include "dcp/error.h"
#include "dcp/kv_cache.h"
#include "dcp/merge.h"
#include "dcp/model.h"
#include "dcp/weights.h"

namespace dcp::cli {

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Cheap deterministic fill (the values only need to be varied and finite).
void fill(float* x, std::size_t n, std::uint64_t seed) {
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = static_cast<float>(static_cast<std::int64_t>(s >> 40) - (1 << 23)) /
           static_cast<float>(1 << 23);
  }
}

}  // namespace dcp::cli
