#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <random>

#include "bench/bench.h"
#include "bench/bench_util.h"
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

void add_output_files(CLI::App* cmd, std::string& csv, std::string& svg, const std::string& plot,
                      const std::string& note) {
  cmd->add_option("--csv", csv, "write the table as CSV" + note)->check(writable_file());
  cmd->add_option("--svg", svg, "write " + plot + " as SVG" + note)->check(writable_file());
}

std::vector<RequestSpec> random_requests(std::int64_t count, std::int64_t context, int new_tokens,
                                         int vocab_size) {
  std::mt19937 gen(5);
  std::uniform_int_distribution<std::int32_t> tok(0, vocab_size - 1);
  std::vector<RequestSpec> out;
  for (std::int64_t i = 0; i < count; ++i) {
    RequestSpec q;
    q.id = i;
    q.prompt.resize(static_cast<std::size_t>(context));
    for (auto& t : q.prompt) t = tok(gen);
    q.max_new_tokens = new_tokens;
    out.push_back(std::move(q));
  }
  return out;
}

std::vector<int> dcp_sizes(int ranks) {
  return ranks > 1 ? std::vector<int>{1, ranks} : std::vector<int>{1};
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
