// dcp bench engine: decode throughput against concurrency at a fixed per-rank KV budget,
// TP only (DCP 1: every rank holds the whole KV) against TP + DCP at the same rank count (each
// rank holds 1/N): the TP-only run saturates once its replicated KV fills the budget. And
// dcp bench step: the decode step against context, its components beside `dcp plan`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "bench.h"
#include "bench_util.h"
#include "dcp/comm_threads.h"
#include "dcp/engine.h"
#include "dcp/error.h"
#include "dcp/model.h"
#include "dcp/weights.h"
#include "plan_model.h"

namespace dcp::cli {
namespace {

// `count` requests of `context` random prompt tokens (the same on every rank: fixed seed).
void submit_random_requests(Engine& engine, std::int64_t count, std::int64_t context,
                            int new_tokens, int vocab_size) {
  std::mt19937 gen(5);
  std::uniform_int_distribution<std::int32_t> tok(0, vocab_size - 1);
  for (std::int64_t i = 0; i < count; ++i) {
    RequestSpec q;
    q.id = i;
    q.prompt.resize(static_cast<std::size_t>(context));
    for (auto& t : q.prompt) t = tok(gen);
    q.max_new_tokens = new_tokens;
    engine.submit(q);
  }
}

// TP only, then TP + DCP over all `ranks` (once when there is one rank).
std::vector<int> dcp_sizes(int ranks) {
  return ranks > 1 ? std::vector<int>{1, ranks} : std::vector<int>{1};
}

}  // namespace

std::vector<EngineBenchRow> bench_engine(const EngineBenchOptions& o) {
  const ModelConfig config = preset_config(o.preset, o.num_layers);
  check_divides_heads(config, o.ranks, "--ranks");
  std::printf(
      "decode throughput, %s %d layers, TP %d, context %lld, %d new tokens, %.1f MiB KV per "
      "rank\n",
      o.preset.c_str(), o.num_layers, o.ranks, static_cast<long long>(o.context), o.new_tokens,
      o.kv_budget_mib);
  std::printf("%4s %5s %12s %8s %10s %12s %10s %9s %9s\n", "dcp", "conc", "kv tokens", "running",
              "tokens", "tokens/s", "step ms", "attn ms", "comm ms");
  const std::size_t row_bytes = static_cast<std::size_t>(config.latent_width()) * 2;  // bf16
  const auto concurrency = parse_list(o.concurrency, "--concurrency");
  std::vector<EngineBenchRow> rows;
  CsvFile csv(o.csv, {"dcp", "concurrency", "kv_tokens", "peak_running", "decode_tokens",
                      "tokens_per_s", "median_step_ms", "attention_ms", "comm_ms"});
  std::vector<Series> series;  // tokens/s against concurrency, per DCP size
  set_blas_threads(1);
  for (int dcp : dcp_sizes(o.ranks)) {
    // The same bytes per rank for both: tokens the group can hold = budget / (row x layers) x N.
    const std::int64_t capacity =
        static_cast<std::int64_t>(o.kv_budget_mib * 1048576.0 /
                                  (row_bytes * config.num_hidden_layers)) *
        dcp;
    for (std::int64_t c : concurrency) {
      EngineBenchRow r;
      r.dcp = dcp;
      r.concurrency = static_cast<int>(c);
      r.capacity_tokens = capacity;
      run_threads(o.ranks, [&](Communicator& world) {
        auto group = world.split(world.rank() / dcp, world.rank());
        const auto weights = make_synthetic_weights(1234);
        ModelOptions mo;
        mo.backend = dcp > 1 ? CombineBackend::a2a : CombineBackend::ag_rs;
        mo.kv_dtype = KvDtype::bf16;
        mo.page_size = 64;
        mo.kv_capacity_tokens = capacity;
        MlaModel model(config, *weights, world, *group, mo);
        EngineOptions eo;
        eo.chunked_prefill_size = 4096;
        Engine engine(model, eo);
        submit_random_requests(engine, c, o.context, o.new_tokens, config.vocab_size);
        std::int64_t peak_running = 0;
        engine.run([&](const Engine& e) { peak_running = std::max(peak_running, e.running()); });
        if (world.rank() != 0) return;
        double decode_ms = 0;
        for (double ms : engine.stats().decode_step_ms) decode_ms += ms;
        r.decode_tokens = engine.stats().decode_tokens;
        r.tokens_per_s =
            decode_ms > 0 ? 1000.0 * static_cast<double>(r.decode_tokens) / decode_ms : 0;
        r.peak_running = peak_running;
        std::vector<double> step = engine.stats().decode_step_ms;
        r.median_step_ms = step.empty() ? 0 : median(step);
        std::vector<double> attn, comm;  // medians, like the step time
        for (const ForwardTimings& t : engine.stats().decode_timings) {
          attn.push_back(t.attention_ms);
          comm.push_back(t.dcp_comm_ms + t.tp_comm_ms);
        }
        r.attention_ms = attn.empty() ? 0 : median(attn);
        r.comm_ms = comm.empty() ? 0 : median(comm);
      });
      rows.push_back(r);
      std::printf("%4d %5d %12lld %8lld %10lld %12.1f %10.2f %9.2f %9.2f\n", r.dcp, r.concurrency,
                  static_cast<long long>(r.capacity_tokens), static_cast<long long>(r.peak_running),
                  static_cast<long long>(r.decode_tokens), r.tokens_per_s, r.median_step_ms,
                  r.attention_ms, r.comm_ms);
      std::fflush(stdout);
      csv.row({str(r.dcp), str(r.concurrency), str(r.capacity_tokens), str(r.peak_running),
               str(r.decode_tokens), str(r.tokens_per_s), str(r.median_step_ms),
               str(r.attention_ms), str(r.comm_ms)});
      add_point(series, str("TP ", o.ranks, ", DCP ", dcp), r.concurrency, r.tokens_per_s);
    }
  }
  if (!o.svg.empty()) {
    write_svg_chart(o.svg, str("decode throughput at ", o.kv_budget_mib, " MiB KV per rank"),
                    "requests submitted", "tokens/s", series, true);
  }
  return rows;
}

void bench_step(const StepBenchOptions& o) {
  const ModelConfig config = preset_config(o.preset, o.num_layers);
  const Hardware hw = hardware_preset(o.hardware);
  const CombineBackend backend = parse_combine_backend(o.backend);
  check_divides_heads(config, o.ranks, "--ranks");
  const int h_loc = config.num_attention_heads / o.ranks;
  const int layers = config.num_hidden_layers;
  set_blas_threads(1);
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
      run_threads(o.ranks, [&](Communicator& world) {
        auto group = world.split(world.rank() / dcp, world.rank());
        const auto weights = make_synthetic_weights(1234);
        ModelOptions mo;
        mo.backend = dcp > 1 ? backend : CombineBackend::ag_rs;
        mo.kv_dtype = KvDtype::bf16;
        mo.kv_capacity_tokens = o.batch * (context + o.new_tokens);
        MlaModel model(config, *weights, world, *group, mo);
        EngineOptions eo;
        eo.chunked_prefill_size = 4096;
        Engine engine(model, eo);
        submit_random_requests(engine, o.batch, context, o.new_tokens, config.vocab_size);
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

}  // namespace dcp::cli
