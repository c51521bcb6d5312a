// The benchmarks behind `dcp bench`, one file each: its options, its function, and the
// add_*_bench that registers its subcommand under `dcp bench`.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/cli_checks.h"  // parse_list
#include "dcp/comm.h"
#include "dcp/engine.h"
#include "dcp/timing.h"

namespace dcp::cli {

void add_attention_bench(CLI::App* bench);
void add_merge_bench(CLI::App* bench);
void add_comm_bench(CLI::App* bench);
void add_engine_bench(CLI::App* bench);
void add_step_bench(CLI::App* bench);
void add_decode_bench(CLI::App* bench);
void add_extend_bench(CLI::App* bench);
void add_plot_bench(CLI::App* bench);
void add_moe_bench(CLI::App* bench);
void add_serve_bench(CLI::App* bench);
void add_guide_bench(CLI::App* bench);

// Every benchmark's --csv (the table) and --svg (`plot`, e.g. "a plot (GFLOP/s vs heads)"), both
// checked as they parse, so that a long run does not end on a file it cannot write.
void add_output_files(CLI::App* cmd, std::string& csv, std::string& svg, const std::string& plot,
                      const std::string& note = "");

// Cheap deterministic fill (the values only need to be varied and finite).
void fill(float* x, std::size_t n, std::uint64_t seed);
// `count` requests (ids 0..count-1) of `context` random prompt tokens, the same on every call.
std::vector<RequestSpec> random_requests(std::int64_t count, std::int64_t context, int new_tokens,
                                         int vocab_size);
// TP only, then TP + DCP over all `ranks` (once when there is one rank).
std::vector<int> dcp_sizes(int ranks);

struct ExtendBenchOptions {
  std::string preset = "tiny";
  int num_layers = 1;
  int dcp_size = 4;
  int chunk = 256;
  std::string prefix_lens = "0,256,1024,4096,16384";
  int repeats = 5;
  std::string csv, svg;
};

struct ExtendRow {
  std::int64_t prefix = 0;
  double gather_ms = 0, native_ms = 0;        // median forward time
  double gather_bytes = 0, native_bytes = 0;  // DCP bytes sent per rank per layer
};

std::vector<ExtendRow> bench_extend(const ExtendBenchOptions& o);

struct AttentionBenchOptions {
  std::string contexts = "4096,32768,131072";
  std::string heads = "1,4,16,128";
  std::string batches = "1,8";
  // Query tokens per request: 1 is decode; T > 1 is a prefill chunk (or a verification) of the
  // context's last T positions, causal.
  int query_tokens = 1;
  std::string dtypes = "fp32,bf16,bf16-amx,bf16-vdp";
  int threads = 1;
  int repeats = 3;
  std::string torch_python = "/usr/bin/python3";  // runs tools/torch_peer.py; "off" skips it
  std::string cache = "cold";                     // cold: flush the caches before each timed call
  std::string csv, svg;
};

void bench_attention(const AttentionBenchOptions& o);

struct EngineBenchOptions {
  std::string preset = "tiny";
  int num_layers = 2;
  int ranks = 4;                // TP size; DCP is 1 (TP only) or this
  std::int64_t context = 4096;  // prompt tokens per request
  int new_tokens = 16;
  double kv_budget_mib = 4;  // KV bytes per rank, the same for both runs
  std::string concurrency = "1,2,4,8,16";
  // DP-attention rows: for each D, D attention groups of TP ranks/D with DCP = ranks/D inside.
  std::string dp_attention;  // comma-separated; empty: none
  std::string csv, svg;  // the table as CSV; tokens/s against concurrency as SVG
};
struct EngineBenchRow {
  int dcp = 1, concurrency = 0;
  int dp = 1;  // attention groups (DP attention) 
  std::int64_t capacity_tokens = 0, peak_running = 0, decode_tokens = 0;
  double tokens_per_s = 0, median_step_ms = 0, attention_ms = 0, comm_ms = 0;
};
std::vector<EngineBenchRow> bench_engine(const EngineBenchOptions& o);

// Decode step time against context length, split into attention / DCP communication / other per
// MLA layer, beside the predictions of `dcp plan` for the same configuration.
struct StepBenchOptions {
  std::string preset = "deepseek-v3-attn";
  int num_layers = 1;
  int ranks = 2;  // TP size; DCP is 1 (TP only) and this
  std::string backend = "a2a";
  int batch = 1;
  std::string contexts = "1024,2048,4096";
  int new_tokens = 8;
  std::string hardware = "this-cpu";
  std::string csv, svg;  // the table as CSV; the components against context as SVG
};
void bench_step(const StepBenchOptions& o);

// Whole decode steps with the weights held in fp32, bf16 or FP8, against the step's roofline.
struct DecodeBenchOptions {
  std::string preset = "deepseek-v2-lite";
  int num_layers = 2;
  std::string configs = "tp1dcp1,tp2dcp2";
  std::string dtypes = "f32,bf16,fp8";
  std::string contexts = "0,4096";
  std::string batches = "1,8";
  std::string threads = "1";  // per rank
  std::string prefill_tokens = "512";  // prompt lengths of the prefill rows ("" or 0: none)
  int new_tokens = 8;
  std::string weight_kernel = "automatic";     // the weight products' path (ModelOptions)
  std::string attention_kernel = "automatic";  // the local attention kernel's (ModelOptions)
  std::string csv;
};
void bench_decode(const DecodeBenchOptions& o);
struct MergeBenchOptions {
  int repeats = 5;
  std::string cache = "cold";
  std::string csv, svg;  // the table as CSV; merge GB/s against parts as SVG
};
void bench_merge(const MergeBenchOptions& o);

// Guided decoding's allowed-token sets per automaton state, against a token-by-token scan.
struct GuideBenchOptions {
  std::string tokenizer_path;  // empty: a synthetic vocabulary
  int vocab_size = 129280;
  std::uint64_t seed = 1;
  int repeats = 5;
  std::string csv;
};
void bench_guide(const GuideBenchOptions& o);

// One MoE layer (TP 1) at decode batches: the weight bytes it reads against the read ceiling.
struct MoeBenchOptions {
  std::string preset = "deepseek-v2-lite";
  std::string batches = "1,8,64";
  std::string dtypes = "bf16,fp8";
  std::string threads = "1,2";
  // > 1: the layer over this many thread ranks, TP-sliced against expert parallel (ep_sizes).
  int ranks = 1;
  std::string ep_sizes = "1";
  bool threads_given = false;  // --threads on the command line (refused with --ranks > 1)
  int repeats = 5;
  std::string cache = "cold";
  std::uint64_t seed = 1;
  std::string csv, svg;
};
void bench_moe(const MoeBenchOptions& o);

// A Google Benchmark JSON file (bench/bench_kernels --benchmark_out=FILE) as a table, CSV and SVG:
// the measure y (real_time or cpu_time in ms, or a user counter) against the argument x, a series
// per benchmark family and combination of its other arguments.
struct PlotBenchOptions {
  std::string json, x, y = "real_time";
  std::string csv, svg;
};
void bench_plot(const PlotBenchOptions& o);

// One point of `dcp bench comm`: the DCP step's combine against raw collectives of its bytes.
struct CommBenchRow {
  std::string comm, backend;
  int n = 0, tokens = 0;
  double combine_ms = 0, raw_ms = 0;
};
// Both backends at one token count; every rank calls it, rank 0 prints and gets the rows.
std::vector<CommBenchRow> bench_comm_rank(Communicator& c, int heads_per_rank, int tokens,
                                          int repeats);
// The table as CSV and the ratios against tokens as SVG (each skipped when its path is empty).
void write_comm_results(const std::vector<CommBenchRow>& rows, const std::string& csv,
                        const std::string& svg);

}  // namespace dcp::cli
