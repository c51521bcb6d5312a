// dcp bench engine: decode throughput against concurrency at a fixed per-rank KV budget,
// TP only (DCP 1: every rank holds the whole KV) against TP + DCP at the same rank count (each
// rank holds 1/N): the TP-only run saturates once its replicated KV fills the budget. Optionally
// DP attention at the same rank count: D attention groups, each striping its own KV over DCP =
// ranks / D.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "dcp/deployment.h"
#include "dcp/engine.h"
#include "dcp/error.h"
#include "dcp/model.h"
#include "dcp/weights.h"

namespace dcp::cli {

std::vector<EngineBenchRow> bench_engine(const EngineBenchOptions& o) {
  const ModelConfig config = preset_config(o.preset, o.num_layers);
  check_divides_heads(config, o.ranks, "--ranks");
  std::vector<std::pair<int, int>> layouts;  // (dp attention groups, dcp)
  for (int dcp : dcp_sizes(o.ranks)) layouts.push_back({1, dcp});
  if (!o.dp_attention.empty()) {
    for (std::int64_t d : parse_list(o.dp_attention, "--dp-attention")) {
      DCP_ARG_CHECK(d >= 2 && o.ranks % d == 0, "--dp-attention: ", d,
                    " must be >= 2 and divide --ranks ", o.ranks);
      layouts.push_back({static_cast<int>(d), o.ranks / static_cast<int>(d)});
    }
  }
  std::printf(
      "decode throughput, %s %d layers, TP %d, context %lld, %d new tokens, %.1f MiB KV per "
      "rank\n",
      o.preset.c_str(), o.num_layers, o.ranks, static_cast<long long>(o.context), o.new_tokens,
      o.kv_budget_mib);
  std::printf("%3s %4s %5s %12s %8s %10s %12s %10s %9s %9s\n", "dp", "dcp", "conc", "kv tokens",
              "running", "tokens", "tokens/s", "step ms", "attn ms", "comm ms");
  const std::size_t row_bytes = static_cast<std::size_t>(config.latent_width()) * 2;  // bf16
  const auto concurrency = parse_list(o.concurrency, "--concurrency");
  std::vector<EngineBenchRow> rows;
  CsvFile csv(o.csv, {"dcp", "concurrency", "kv_tokens", "peak_running", "decode_tokens",
                      "tokens_per_s", "median_step_ms", "attention_ms", "comm_ms", "dp"});
  std::vector<Series> series;  // tokens/s against concurrency, per layout
  for (const auto& [dp, dcp] : layouts) {
    // The same bytes per rank for all: tokens a group can hold = budget / (row x layers) x N.
    const std::int64_t capacity =
        static_cast<std::int64_t>(o.kv_budget_mib * 1048576.0 /
                                  (row_bytes * config.num_hidden_layers)) *
        dcp;
    for (std::int64_t c : concurrency) {
      EngineBenchRow r;
      r.dcp = dcp;
      r.dp = dp;
      r.concurrency = static_cast<int>(c);
      r.capacity_tokens = capacity * dp;  // over all groups
      DeploymentSpec spec;
      spec.model.config = config;  // synthetic weights
      spec.parallel.tp_size = o.ranks;
      spec.parallel.dp_size = dp;
      spec.parallel.enable_dp_attention = dp > 1;
      spec.parallel.dcp_size = dcp;
      if (dcp > 1) spec.parallel.dcp_comm_backend = CombineBackend::a2a;
      spec.model_options.kv_dtype = KvDtype::bf16;
      spec.model_options.page_size = 64;
      spec.model_options.kv_capacity_tokens = capacity;
      spec.engine.chunked_prefill_size = 4096;
      spec.requests = random_requests(c, o.context, o.new_tokens, config.vocab_size);
      const DeploymentReport rep = run_deployment(spec).report;
      const EngineStats& stats = rep.stats;
      double decode_ms = 0;
      for (double ms : stats.decode_step_ms) decode_ms += ms;
      r.decode_tokens = stats.decode_tokens;
      r.tokens_per_s =
          decode_ms > 0 ? 1000.0 * static_cast<double>(r.decode_tokens) / decode_ms : 0;
      r.peak_running = rep.peak_running;
      r.median_step_ms = median(stats.decode_step_ms);
      std::vector<double> attn, comm;  // medians, like the step time
      for (const ForwardTimings& t : stats.decode_timings) {
        attn.push_back(t.attention_ms);
        comm.push_back(t.dcp_comm_ms + t.tp_comm_ms + t.mlp_comm_ms);
      }
      r.attention_ms = median(attn);
      r.comm_ms = median(comm);
      rows.push_back(r);
      std::printf("%3d %4d %5d %12lld %8lld %10lld %12.1f %10.2f %9.2f %9.2f\n", r.dp, r.dcp,
                  r.concurrency,
                  static_cast<long long>(r.capacity_tokens), static_cast<long long>(r.peak_running),
                  static_cast<long long>(r.decode_tokens), r.tokens_per_s, r.median_step_ms,
                  r.attention_ms, r.comm_ms);
      std::fflush(stdout);
      csv.row({str(r.dcp), str(r.concurrency), str(r.capacity_tokens), str(r.peak_running),
               str(r.decode_tokens), str(r.tokens_per_s), str(r.median_step_ms),
               str(r.attention_ms), str(r.comm_ms), str(r.dp)});
      add_point(series,
                dp == 1 ? str("TP ", o.ranks, ", DCP ", dcp)
                        : str("DP ", dp, " x (TP ", o.ranks / dp, ", DCP ", dcp, ")"),
                r.concurrency, r.tokens_per_s);
    }
  }
  if (!o.svg.empty()) {
    write_svg_chart(o.svg, str("decode throughput at ", o.kv_budget_mib, " MiB KV per rank"),
                    "requests submitted", "tokens/s", series, true);
  }
  return rows;
}

void add_engine_bench(CLI::App* bench) {
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
  en->add_option("--dp-attention", eo->dp_attention,
                 "also DP attention: for each D (comma-separated), D attention groups of TP "
                 "ranks/D with DCP ranks/D inside each, the same KV per rank");
  add_output_files(en, eo->csv, eo->svg, "a plot (tokens/s vs concurrency)");
  en->callback([eo] { bench_engine(*eo); });
}

}  // namespace dcp::cli
