// dcp bench merge: the LSE merge and KV write/gather against the read ceiling.
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
#include "dcp/comm_mpi.h"
#include "dcp/comm_threads.h"
#include "dcp/dcp_attention.h"
#include "dcp/error.h"
#include "dcp/kv_cache.h"
#include "dcp/merge.h"
#include "dcp/model.h"
#include "dcp/weights.h"

namespace dcp::cli {

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

void add_merge_bench(CLI::App* bench) {
  auto mo = std::make_shared<MergeBenchOptions>();
  CLI::App* mg =
      bench->add_subcommand("merge", "LSE merge and KV write/gather against the read ceiling");
  mg->add_option("--repeats", mo->repeats, "timed calls per point (median)")
      ->check(at_least(1))
      ->capture_default_str();
  mg->add_option("--cache", mo->cache,
                 "cold: flush the caches before every timed call; warm: repeat calls on warm "
                 "caches")
      ->check(one_of({"cold", "warm"}))
      ->capture_default_str();
  add_output_files(mg, mo->csv, mo->svg, "a plot (merge GB/s vs parts, read ceiling)");
  mg->callback([mo] { bench_merge(*mo); });
}

}  // namespace dcp::cli
