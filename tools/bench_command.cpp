// `dcp bench ...`: measurements, each beside a baseline taken in the same run.
//   dcp bench attention  local MLA decode attention vs sgemm / read ceilings, a two-GEMM peer
//                        and PyTorch (where python3-torch is installed)
//   dcp bench merge      LSE merge and KV write/gather vs the read ceiling
//   dcp bench step       decode step vs context, its components beside dcp plan
//   dcp bench comm       the DCP step's collectives vs raw collectives of the same bytes
//   dcp bench extend     time and DCP bytes per extend (prefill chunk over a cached prefix),
//                        gather path vs DCP-native path, against prefix length.
//   dcp bench plot       a table, CSV and SVG plot of the Google Benchmark binaries' JSON
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bench.h"
#include "bench_util.h"
#include "cli_checks.h"
#include "commands.h"
#include "dcp/comm_mpi.h"
#include "dcp/comm_threads.h"
#include "dcp/error.h"

namespace dcp::cli {

namespace {

// Every benchmark's --csv (the table) and --svg (`plot`, e.g. "a plot (GFLOP/s vs heads)"), both
// checked as they parse, so that a long run does not end on a file it cannot write.
void add_output_files(CLI::App* cmd, std::string& csv, std::string& svg, const std::string& plot,
                      const std::string& note = "") {
  cmd->add_option("--csv", csv, "write the table as CSV" + note)->check(writable_file());
  cmd->add_option("--svg", svg, "write " + plot + " as SVG" + note)->check(writable_file());
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench =
      app.add_subcommand("bench", "Benchmarks, each against a baseline measured in the same run");
  bench->require_subcommand(1);
  auto ao = std::make_shared<AttentionBenchOptions>();
  CLI::App* att = bench->add_subcommand(
      "attention", "Local MLA decode attention vs sgemm / read ceilings and a two-GEMM peer");
  att->add_option("--contexts", ao->contexts, "rank-local context lengths")
      ->check(list_at_least(1))
      ->capture_default_str();
  att->add_option("--heads", ao->heads, "query heads")
      ->check(list_at_least(1))
      ->capture_default_str();
  att->add_option("--batches", ao->batches, "requests per call")
      ->check(list_at_least(1))
      ->capture_default_str();
  att->add_option("--query-tokens", ao->query_tokens,
                  "query tokens per request: 1 is decode, T > 1 a causal prefill chunk of the "
                  "context's last T positions (no PyTorch peer then)")
      ->check(at_least(1))
      ->capture_default_str();
  att->add_option("--dtypes", ao->dtypes,
                  "KV dtypes on the fastest exact path (fp32, bf16), or bf16-amx: bf16 KV on the "
                  "opt-in AMX path")
      ->check(list_of({"fp32", "bf16", "bf16-amx"}))
      ->capture_default_str();
  att->add_option("--threads", ao->threads, "threads (kernel split-KV and BLAS alike)")
      ->check(at_least(1))
      ->capture_default_str();
  att->add_option("--repeats", ao->repeats, "timed calls per point (median)")
      ->check(at_least(1))
      ->capture_default_str();
  att->add_option("--torch-python", ao->torch_python,
                  "Python that runs the PyTorch peer (Debian's python3-torch lives under "
                  "/usr/bin/python3), or off")
      ->capture_default_str();
  att->add_option("--cache", ao->cache,
                  "cold: read a buffer twice the last-level cache before every timed call (decode "
                  "reads each layer's KV once per step); warm: repeat calls on warm caches")
      ->check(one_of({"cold", "warm"}))
      ->capture_default_str();
  add_output_files(att, ao->csv, ao->svg, "a plot (GFLOP/s vs heads)");
  att->callback([ao] { bench_attention(*ao); });

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
        static std::unique_ptr<MpiSession> session;
        if (!session) session = std::make_unique<MpiSession>(nullptr, nullptr);
        auto world = session->world();
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

  auto eo = std::make_shared<EngineBenchOptions>();
  CLI::App* en = bench->add_subcommand(
      "engine",
      "Decode throughput vs concurrency at a fixed per-rank KV budget: TP only vs TP + DCP");
  en->add_option("--preset", eo->preset, "model geometry")->capture_default_str();
  en->add_option("--num-layers", eo->num_layers, "layers")
      ->check(at_least(1))
      ->capture_default_str();
  en->add_option("--ranks", eo->ranks, "TP size (ranks as threads); DCP 1 vs DCP = ranks")
      ->check(at_least(1))
      ->capture_default_str();
  en->add_option("--context", eo->context, "prompt tokens per request")
      ->check(at_least(1))
      ->capture_default_str();
  en->add_option("--new-tokens", eo->new_tokens, "tokens generated per request")
      ->check(at_least(2))
      ->capture_default_str();
  en->add_option("--kv-budget-mib", eo->kv_budget_mib,
                 "KV memory per rank (MiB), the same for both")
      ->check(positive())
      ->capture_default_str();
  en->add_option("--concurrency", eo->concurrency, "requests submitted at once")
      ->check(list_at_least(1))
      ->capture_default_str();
  add_output_files(en, eo->csv, eo->svg, "a plot (tokens/s vs concurrency)");
  en->callback([eo] { bench_engine(*eo); });

  auto so = std::make_shared<StepBenchOptions>();
  CLI::App* st = bench->add_subcommand(
      "step", "Decode step vs context: attention / DCP comm / other, beside dcp plan");
  st->add_option("--preset", so->preset, "model geometry")->capture_default_str();
  st->add_option("--num-layers", so->num_layers, "layers")
      ->check(at_least(1))
      ->capture_default_str();
  st->add_option("--ranks", so->ranks, "TP size (ranks as threads); DCP 1 and this")
      ->check(at_least(1))
      ->capture_default_str();
  st->add_option("--dcp-comm-backend", so->backend, "ag_rs or a2a")
      ->check(one_of({"ag_rs", "a2a"}))
      ->capture_default_str();
  st->add_option("--batch", so->batch, "requests decoded together")
      ->check(at_least(1))
      ->capture_default_str();
  st->add_option("--contexts", so->contexts, "comma-separated prompt lengths")
      ->check(list_at_least(1))
      ->capture_default_str();
  st->add_option("--new-tokens", so->new_tokens, "tokens generated per request")
      ->check(at_least(2))
      ->capture_default_str();
  st->add_option("--hardware", so->hardware, "dcp plan hardware preset to compare with")
      ->capture_default_str();
  add_output_files(st, so->csv, so->svg, "a plot (the components vs context)");
  st->callback([so] { bench_step(*so); });

  auto o = std::make_shared<ExtendBenchOptions>();
  CLI::App* ext = bench->add_subcommand(
      "extend", "Extend (prefill chunk over a cached prefix): gather vs DCP-native");
  ext->add_option("--preset", o->preset, "model geometry")->capture_default_str();
  ext->add_option("--num-layers", o->num_layers, "layers")
      ->check(at_least(1))
      ->capture_default_str();
  ext->add_option("--dcp-size", o->dcp_size, "DCP size (= TP size; ranks as threads)")
      ->check(at_least(1))
      ->capture_default_str();
  ext->add_option("--chunk", o->chunk, "tokens per extend")
      ->check(at_least(1))
      ->capture_default_str();
  ext->add_option("--prefix-lens", o->prefix_lens, "comma-separated prefix lengths")
      ->check(list_at_least(0))
      ->capture_default_str();
  ext->add_option("--repeats", o->repeats, "timed extends per point (median reported)")
      ->check(at_least(1))
      ->capture_default_str();
  add_output_files(ext, o->csv, o->svg, "a plot (gather and native ms vs prefix)");
  ext->callback([o] {
    const auto rows = bench_extend(*o);
    std::printf(
        "extend of %d tokens, %s, %d layer(s), DCP %d (threads); bytes are DCP bytes sent per rank "
        "per layer\n",
        o->chunk, o->preset.c_str(), o->num_layers, o->dcp_size);
    std::printf("%10s %14s %14s %16s %16s %12s\n", "prefix", "gather ms", "native ms",
                "gather bytes", "native bytes", "native/gather");
    for (const auto& r : rows) {
      std::printf("%10lld %14.2f %14.2f %16.0f %16.0f %12.2f\n", static_cast<long long>(r.prefix),
                  r.gather_ms, r.native_ms, r.gather_bytes, r.native_bytes,
                  r.gather_ms > 0 ? r.native_ms / r.gather_ms : 0.0);
    }
    CsvFile csv(o->csv, {"prefix", "gather_ms", "native_ms", "gather_bytes_per_rank_layer",
                         "native_bytes_per_rank_layer"});
    for (const auto& r : rows) {
      csv.row({str(r.prefix), str(r.gather_ms), str(r.native_ms), str(r.gather_bytes),
               str(r.native_bytes)});
    }
    if (!o->svg.empty()) {
      Series gather{"gather (all-gather the prefix)", {}, {}}, native{"DCP-native", {}, {}};
      for (const auto& r : rows) {
        const auto x = static_cast<double>(std::max<std::int64_t>(r.prefix, 1));  // log axis
        gather.x.push_back(x);
        gather.y.push_back(r.gather_ms);
        native.x.push_back(x);
        native.y.push_back(r.native_ms);
      }
      write_svg_chart(o->svg, str("extend of ", o->chunk, " tokens, DCP ", o->dcp_size),
                      "prefix tokens (0 plotted at 1)", "ms", {gather, native}, true);
    }
  });

  auto po = std::make_shared<PlotBenchOptions>();
  CLI::App* plot = bench->add_subcommand(
      "plot",
      "Table, CSV and SVG plot of a Google Benchmark JSON file (bench/bench_kernels "
      "--benchmark_out=FILE --benchmark_out_format=json)");
  plot->add_option("--json", po->json, "the Google Benchmark JSON file")->required();
  plot->add_option("--x", po->x, "the benchmark argument on the x axis (e.g. heads, parts)")
      ->required();
  plot->add_option("--y", po->y,
                   "the measure: real_time or cpu_time (ms), or a user counter (e.g. FLOP/s)")
      ->capture_default_str();
  add_output_files(plot, po->csv, po->svg, "the plot");
  plot->callback([po] { bench_plot(*po); });
}

}  // namespace dcp::cli
