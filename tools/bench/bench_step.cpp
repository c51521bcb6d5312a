// dcp bench step: the decode step against context, its components beside `dcp plan`.
#include <algorithm>
#include <cstdio>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "dcp/deployment.h"
#include "dcp/error.h"
#include "dcp/timing.h"
#include "plan/plan_model.h"

namespace dcp::cli {

void bench_step(const StepBenchOptions& o) {
  const ModelConfig config = preset_config(o.preset, o.num_layers);
  const Hardware hw = hardware_preset(o.hardware);
  const CombineBackend backend = parse_combine_backend(o.backend);
  check_divides_heads(config, o.ranks, "--ranks");
  const int h_loc = config.num_attention_heads / o.ranks;
  const int layers = config.num_hidden_layers;
  std::printf(
      "decode step against context, %s %d layer(s), TP %d, batch %d, bf16 KV, %s combine; per "
      "MLA layer and rank, medians over %d decode steps; plan: dcp plan --hardware %s\n",
      o.preset.c_str(), layers, o.ranks, o.batch, o.backend.c_str(), o.new_tokens - 1,
      o.hardware.c_str());
  std::printf(
      "comm: rank 0's DCP collectives, including its wait for the other ranks; least: per step, "
      "the rank that waited least (it arrived last), the transfer the plan models\n");
  std::printf("%8s %4s | %9s %9s %6s | %9s %9s %9s %6s | %9s %9s\n", "context", "dcp", "attn ms",
              "plan ms", "error", "comm ms", "least ms", "plan ms", "error", "other ms", "step ms");
  CsvFile csv(o.csv, {"context", "dcp", "attention_ms", "plan_attention_ms", "comm_ms",
                      "least_comm_ms", "plan_comm_ms", "other_ms", "step_ms"});
  std::vector<Series> series;  // attention (measured, plan) per DCP size, then DCP comm
  for (std::int64_t context : parse_list(o.contexts, "--contexts")) {
    for (int dcp : dcp_sizes(o.ranks)) {
      std::vector<double> attn, other, step;
      std::vector<std::vector<double>> rank_comm(static_cast<std::size_t>(o.ranks));
      ParallelConfig pc;
      pc.tp_size = o.ranks;
      pc.dcp_size = dcp;
      if (dcp > 1) pc.dcp_comm_backend = backend;
      const Topology topo = resolve(pc);
      ModelSource model;
      model.config = config;  // synthetic weights
      ModelOptions mo;
      mo.kv_dtype = KvDtype::bf16;
      mo.kv_capacity_tokens = o.batch * (context + o.new_tokens);
      EngineOptions eo;
      eo.chunked_prefill_size = 4096;
      LaunchOptions lo;
      lo.world_size = topo.world_size;
      launch_ranks(lo, [&](Communicator& world, bool) {
        RankSystem sys(world, topo, model, mo, eo);
        Engine& engine = sys.engine();
        for (const RequestSpec& r :
             random_requests(o.batch, context, o.new_tokens, config.vocab_size))
          engine.submit(r);
        engine.run();
        const auto& stats = engine.stats();
        for (const ForwardTimings& t : stats.decode_timings) {
          rank_comm[world.rank()].push_back(t.dcp_comm_ms / layers);
        }
        if (world.rank() != 0) return;
        for (std::size_t i = 0; i < stats.decode_timings.size(); ++i) {
          const ForwardTimings& t = stats.decode_timings[i];
          attn.push_back(t.attention_ms / layers);
          step.push_back(stats.decode_step_ms[i]);
          other.push_back(stats.decode_step_ms[i] - t.attention_ms - t.dcp_comm_ms);
        }
      });
      // The decode steps see contexts from `context` to context + new_tokens - 1.
      const LayerPrediction plan = predict_layer(config, hw, h_loc, dcp, backend, false, o.batch,
                                                 context + o.new_tokens / 2, KvDtype::bf16);
      // Per step, the DCP collectives of rank 0 and of the rank that waited least (ranks run the
      // same steps in lockstep).
      std::vector<double> least(rank_comm[0]);
      for (std::size_t i = 0; i < least.size(); ++i) {
        for (const auto& r : rank_comm) least[i] = std::min(least[i], r.at(i));
      }
      const double a = median(attn), c = median(rank_comm[0]), l = median(least);
      const auto error = [](double measured, double predicted) {
        return measured > 0 ? 100.0 * (predicted - measured) / measured : 0.0;
      };
      std::printf("%8lld %4d | %9.3f %9.3f %5.0f%% | %9.3f %9.3f %9.3f %5.0f%% | %9.2f %9.2f\n",
                  static_cast<long long>(context), dcp, a, plan.attn_ms, error(a, plan.attn_ms), c,
                  l, plan.comm_ms, dcp > 1 ? error(l, plan.comm_ms) : 0.0, median(other),
                  median(step));
      std::fflush(stdout);
      csv.row({str(context), str(dcp), str(a), str(plan.attn_ms), str(c), str(l), str(plan.comm_ms),
               str(median(other)), str(median(step))});
      const auto x = static_cast<double>(context);
      add_point(series, str("attention, DCP ", dcp), x, a);
      add_point(series, str("plan attention, DCP ", dcp), x, plan.attn_ms);
      if (dcp > 1) {
        add_point(series, str("DCP comm (least), DCP ", dcp), x, l);
        add_point(series, str("plan comm, DCP ", dcp), x, plan.comm_ms);
      }
    }
  }
  if (!o.svg.empty()) {
    write_svg_chart(o.svg, str("decode step per MLA layer and rank, ", o.preset, ", TP ", o.ranks),
                    "context (tokens)", "ms", series, true);
  }
}

void add_step_bench(CLI::App* bench) {
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
}

}  // namespace dcp::cli
