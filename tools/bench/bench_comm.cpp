// dcp bench comm: the DCP step's collectives against raw collectives of the same bytes.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <sstream>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "dcp/attention.h"
#include "dcp/deployment.h"
#include "dcp/comm_threads.h"
#include "dcp/dcp_attention.h"
#include "dcp/error.h"
#include "dcp/kv_cache.h"
#include "dcp/merge.h"
#include "dcp/model.h"
#include "dcp/weights.h"

namespace dcp::cli {

// ---- the DCP step's communication against raw collectives of the same bytes ----

std::vector<CommBenchRow> bench_comm_rank(Communicator& c, int heads_per_rank, int tokens,
                                          int repeats) {
  std::vector<CommBenchRow> results;
  const int n = c.size(), width = 576, dc = 512;
  std::vector<float> q(static_cast<std::size_t>(tokens) * heads_per_rank * width);
  fill(q.data(), q.size(), 7);
  std::vector<std::int32_t> q_start = {0, tokens};
  std::vector<std::int64_t> q_pos(static_cast<std::size_t>(tokens), 0), local_len = {0};
  std::vector<std::int32_t> table = {0};
  std::vector<float> pool(static_cast<std::size_t>(width), 0.0f);
  MlaAttentionParams shard;
  shard.softmax_scale = 0.07f;
  shard.num_requests = 1;
  shard.q_start = q_start.data();
  shard.q_pos = q_pos.data();
  shard.kv = pool.data();
  shard.kv_dtype = KvDtype::fp32;
  shard.num_pages = 1;
  shard.page_size = 1;
  shard.page_table = table.data();
  shard.page_table_stride = 1;
  shard.local_len = local_len.data();  // an empty shard: the step is its communication
  shard.dcp_size = n;
  shard.dcp_rank = c.rank();
  std::vector<float> out(static_cast<std::size_t>(tokens) * heads_per_rank * dc),
      lse(static_cast<std::size_t>(tokens) * heads_per_rank);
  // Median over repeats of the wall time minus what f reports as not part of the combine.
  const auto time = [&](const std::function<double()>& f) {
    f();
    std::vector<double> ms;
    for (int r = 0; r < repeats; ++r) {
      c.barrier();
      const auto t0 = Clock::now();
      const double excluded = f();
      ms.push_back(ms_since(t0) - excluded);
    }
    double m = median(ms);
    c.all_reduce(&m, &m, 1, ScalarType::f64, ReduceOp::max);
    return m;
  };
  for (CombineBackend b : {CombineBackend::ag_rs, CombineBackend::a2a}) {
    DcpAttention step(c, {b, false, heads_per_rank});
    const std::size_t rows = static_cast<std::size_t>(tokens) * heads_per_rank;
    // The step minus its local kernel (which on an empty shard only writes zeros): the query
    // gather, packing, collectives and merge.
    const double step_ms = time([&] {
      step.forward(q.data(), shard, nullptr, out.data(), lse.data());
      return step.last_timings().attention_ms;
    });
    // Raw collectives moving the same bytes: the query all-gather, then the combine's collectives.
    std::vector<float> qg(q.size() * n), a(rows * n * (dc + 1)), r(rows * n * (dc + 1));
    const double raw_ms = time([&] {
      c.all_gather(q.data(), qg.data(), q.size() * sizeof(float));
      if (b == CombineBackend::a2a) {
        c.all_to_all(a.data(), r.data(), rows * (dc + 1) * sizeof(float));
      } else {
        c.all_gather(a.data(), r.data(), rows * n * sizeof(float));
        c.reduce_scatter(a.data(), r.data(), rows * dc, ScalarType::f32);
      }
      return 0.0;
    });
    if (c.rank() == 0) {
      std::printf("%6s %5d %7d %9s | %10.3f %10.3f %8.2f\n", std::string(c.backend()).c_str(), n,
                  tokens, std::string(to_string(b)).c_str(), step_ms, raw_ms, step_ms / raw_ms);
      std::fflush(stdout);
      results.push_back(
          {std::string(c.backend()), std::string(to_string(b)), n, tokens, step_ms, raw_ms});
    }
  }
  return results;
}

void write_comm_results(const std::vector<CommBenchRow>& rows, const std::string& csv,
                        const std::string& svg) {
  CsvFile table(csv, {"comm", "n", "tokens", "backend", "combine_ms", "raw_ms", "ratio"});
  for (const CommBenchRow& r : rows) {
    table.row({r.comm, str(r.n), str(r.tokens), r.backend, str(r.combine_ms), str(r.raw_ms),
               str(r.combine_ms / r.raw_ms)});
  }
  if (!svg.empty()) {
    std::vector<Series> series;  // one per (comm, N, backend), ratio against tokens
    for (const CommBenchRow& r : rows) {
      add_point(series, str(r.comm, " N=", r.n, " ", r.backend), r.tokens, r.combine_ms / r.raw_ms);
    }
    write_svg_chart(svg, "DCP combine / raw collectives of the same bytes", "query tokens",
                    "time ratio", series, true);
  }
}

void add_comm_bench(CLI::App* bench) {
  struct CommOptions {
    std::string comm = "threads";
    std::string ranks = "2,4";
    int heads_per_rank = 16, repeats = 20;
    std::string tokens = "1,8,64";
    std::string csv, svg;
  };
  auto co = std::make_shared<CommOptions>();
  CLI::App* cm = bench->add_subcommand(
      "comm", "The DCP step's collectives (empty shard) vs raw collectives of the same bytes");
  cm->add_option("--comm", co->comm, "threads or mpi (under mpirun: the world's size is N)")
      ->check(one_of({"threads", "mpi"}))
      ->capture_default_str();
  cm->add_option("--ranks", co->ranks, "DCP sizes to run as threads")
      ->check(list_at_least(1))
      ->capture_default_str();
  cm->add_option("--heads-per-rank", co->heads_per_rank, "H_loc")
      ->check(at_least(1))
      ->capture_default_str();
  cm->add_option("--tokens", co->tokens, "query tokens per step (batch)")
      ->check(list_at_least(1))
      ->capture_default_str();
  cm->add_option("--repeats", co->repeats, "timed steps (median, slowest rank)")
      ->check(at_least(1))
      ->capture_default_str();
  add_output_files(cm, co->csv, co->svg, "a plot (ratio vs tokens)", " (rank 0)");
  cm->callback([co] {
    const auto ranks = parse_list(co->ranks, "--ranks"),
               token_counts = parse_list(co->tokens, "--tokens");
    if (co->comm == "threads") {  // every rank's query and combine buffers hold N blocks
      const double n = static_cast<double>(*std::max_element(ranks.begin(), ranks.end()));
      const double t =
          static_cast<double>(*std::max_element(token_counts.begin(), token_counts.end()));
      check_fits_in_memory(6.0 * n * n * t * co->heads_per_rank * (512 + 64) * sizeof(float),
                           str("--ranks ", n, " as threads with --tokens ", t),
                           "lower --ranks or --tokens, or run one rank per process (--comm mpi)");
    }
    std::printf(
        "DCP step on an empty shard minus its local kernel (query gather + combine) vs the same "
        "bytes as raw collectives, H_loc %d\n",
        co->heads_per_rank);
    std::printf("%6s %5s %7s %9s | %10s %10s %8s\n", "comm", "N", "tokens", "backend", "combine ms",
                "raw ms", "ratio");
    std::vector<CommBenchRow> rows;  // rank 0's
    bool rank0 = true;               // under MPI, whether this process is rank 0
    for (std::int64_t tokens : token_counts) {
      if (co->comm == "mpi") {
        auto world = mpi_world();
        rank0 = world->rank() == 0;
        const auto got =
            bench_comm_rank(*world, co->heads_per_rank, static_cast<int>(tokens), co->repeats);
        rows.insert(rows.end(), got.begin(), got.end());
      } else {
        for (std::int64_t n : ranks) {
          run_threads(static_cast<int>(n), [&](Communicator& c) {
            const auto got =
                bench_comm_rank(c, co->heads_per_rank, static_cast<int>(tokens), co->repeats);
            if (c.rank() == 0) rows.insert(rows.end(), got.begin(), got.end());
          });
        }
      }
    }
    if (rank0) write_comm_results(rows, co->csv, co->svg);
  });
}

}  // namespace dcp::cli
