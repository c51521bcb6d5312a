// dcp bench engine: decode throughput against concurrency at a fixed per-rank KV budget,
// TP only (DCP 1: every rank holds the whole KV) against TP + DCP at the same rank count (each
// rank holds 1/N): the TP-only run saturates once its replicated KV fills the budget.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

#include "bench.h"
#include "dcp/comm_threads.h"
#include "dcp/engine.h"
#include "dcp/error.h"
#include "dcp/model.h"
#include "dcp/weights.h"

namespace dcp::cli {

std::vector<EngineBenchRow> bench_engine(const EngineBenchOptions& o) {
  DCP_ARG_CHECK(o.ranks >= 1 && o.context >= 1 && o.new_tokens >= 2,
                "--ranks, --context >= 1 and --new-tokens >= 2");
  const ModelConfig config = preset_config(o.preset, o.num_layers);
  const std::size_t row_bytes = static_cast<std::size_t>(config.latent_width()) * 2;  // bf16
  const auto concurrency = parse_list(o.concurrency, "--concurrency");
  std::vector<EngineBenchRow> rows;
  set_blas_threads(1);
  for (int dcp : {1, o.ranks}) {
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
        std::mt19937 gen(5);
        std::uniform_int_distribution<std::int32_t> tok(0, config.vocab_size - 1);
        for (std::int64_t i = 0; i < c; ++i) {
          RequestSpec q;
          q.id = i;
          q.prompt.resize(static_cast<std::size_t>(o.context));
          for (auto& t : q.prompt) t = tok(gen);
          q.max_new_tokens = o.new_tokens;
          engine.submit(q);
        }
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
    }
  }
  return rows;
}

}  // namespace dcp::cli
