// `dcp bench ...`: measurements, each beside a baseline taken in the same run.
//   dcp bench attention  local MLA decode attention vs sgemm / read ceilings, a two-GEMM peer
//                        and PyTorch (where python3-torch is installed)
//   dcp bench merge      LSE merge and KV write/gather vs the read ceiling
//   dcp bench comm       the DCP step's collectives vs raw collectives of the same bytes
//   dcp bench engine     decode throughput vs concurrency at a fixed KV budget, TP vs TP + DCP
//   dcp bench step       decode step vs context, its components beside dcp plan
//   dcp bench extend     time and DCP bytes per extend (prefill chunk over a cached prefix),
//                        gather path vs DCP-native path, against prefix length
//   dcp bench serve      dcp serve on loopback under concurrent streaming clients vs the
//                        engine alone on the same requests
//   dcp bench guide      guided decoding's allowed tokens per state vs a token-by-token scan
//   dcp bench plot       a table, CSV and SVG plot of the Google Benchmark binaries' JSON
// Each benchmark lives in tools/bench/ with the function that registers it.
#include "bench/bench.h"
#include "cli/commands.h"

namespace dcp::cli {

void add_bench_command(CLI::App& app) {
  CLI::App* bench =
      app.add_subcommand("bench", "Benchmarks, each against a baseline measured in the same run");
  bench->require_subcommand(1);
  add_attention_bench(bench);
  add_merge_bench(bench);
  add_comm_bench(bench);
  add_engine_bench(bench);
  add_step_bench(bench);
  add_decode_bench(bench);
  add_extend_bench(bench);
  add_moe_bench(bench);
  add_serve_bench(bench);
  add_guide_bench(bench);
  add_plot_bench(bench);
}

}  // namespace dcp::cli
