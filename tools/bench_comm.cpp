// dcp bench merge and dcp bench comm: merge/KV bandwidth, and the DCP step's collectives against
// raw ones.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <sstream>

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

// ---- merge and KV write/gather against the read ceiling ----

void bench_merge(const MergeBenchOptions& o) {
  const int repeats = o.repeats;
  const bool cold = parse_cache_state(o.cache, "--cache") == CacheState::cold;
  CacheFlusher memory;
  const double read = memory.read_gbps(1);
  std::printf("merge and KV write/gather, 1 thread; read ceiling measured now: %.1f GB/s\n", read);
  std::printf("cache: %s\n", cold
                                 ? "cold, a read twice the last-level cache before every timed call"
                                 : "warm, calls repeat on whatever the caches kept");
  std::printf("%-34s %10s %10s %8s\n", "operation", "ms", "GB/s", "%read");
  CsvFile csv(o.csv, {"operation", "ms", "gbps", "fraction_of_read", "read_gbps", "cache"});
  Series merge{"merge", {}, {}}, ceiling{"read ceiling", {}, {}};
  const auto report = [&](const std::string& what, double bytes, const std::function<void()>& f) {
    f();
    std::vector<double> ms;
    for (int r = 0; r < repeats; ++r) {
      if (cold) memory.flush();
      const auto t0 = Clock::now();
      f();
      ms.push_back(ms_since(t0));
    }
    const double t = median(ms), gbps = bytes / t / 1e6;
    std::printf("%-34s %10.3f %10.1f %7.0f%%\n", what.c_str(), t, gbps, 100 * gbps / read);
    std::fflush(stdout);
    csv.row({what, str(t), str(gbps), str(gbps / read), str(read), o.cache});
    return gbps;
  };
  // Merge K partial states of 64 x 128 rows of 512.
  for (int parts : {2, 4, 8}) {
    const std::int64_t rows = 64 * 128;
    std::vector<float> o_parts(static_cast<std::size_t>(parts * rows) * 512),
        lse(static_cast<std::size_t>(parts * rows));
    fill(o_parts.data(), o_parts.size(), 3);
    fill(lse.data(), lse.size(), 4);
    std::vector<float> out(static_cast<std::size_t>(rows) * 512),
        out_lse(static_cast<std::size_t>(rows));
    const double bytes = 4.0 * (o_parts.size() + lse.size() + out.size() + out_lse.size());
    const double gbps = report(str("merge ", parts, " parts x 8192 rows x 512"), bytes, [&] {
      merge_attention_states(o_parts.data(), lse.data(), parts, rows, 512, LseBase::e, out.data(),
                             out_lse.data());
    });
    merge.x.push_back(parts);
    merge.y.push_back(gbps);
    ceiling.x.push_back(parts);
    ceiling.y.push_back(read);
  }
  // KV write (owner-only, fp32 -> bf16) and gather (local rows back to fp32), one rank of DCP 4.
  for (KvDtype dtype : {KvDtype::fp32, KvDtype::bf16}) {
    const std::int64_t tokens = 65536;
    KvAllocator alloc(4, 64, tokens / 256 + 1);
    LatentPool pool(alloc.num_pages(), 64, {512, 64, dtype});
    KvShard shard(alloc, pool, 1);
    alloc.allocate(1, tokens);
    std::vector<float> rows(static_cast<std::size_t>(tokens) * 576);
    fill(rows.data(), rows.size(), 5);
    const double owned = static_cast<double>(tokens / 4);
    report(str("KV write ", tokens, " tokens (1/4 owned) ", to_string(dtype)),
           owned * 576 * (4 + dtype_size(dtype)), [&] { shard.write(1, 0, tokens, rows.data()); });
    std::vector<float> gathered(static_cast<std::size_t>(owned) * 576);
    report(str("KV gather local rows ", to_string(dtype)), owned * 576 * (4 + dtype_size(dtype)),
           [&] { shard.local_rows(1, gathered.data()); });
  }
  if (!o.svg.empty()) {
    write_svg_chart(o.svg, str("LSE merge of K parts, 1 thread, ", o.cache, " caches"), "parts",
                    "GB/s", {merge, ceiling}, false);
  }
}

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

}  // namespace dcp::cli
