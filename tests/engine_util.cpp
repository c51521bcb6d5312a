#include "engine_util.h"

#include "dcp/comm_threads.h"
#include "dcp/error.h"

namespace dcp::test {

EngineRun run_engine_phases(const ModelConfig& config, const WeightSource& weights,
                            const EngineSetup& s,
                            const std::vector<std::vector<RequestSpec>>& phases) {
  EngineRun out;
  set_blas_threads(1);
  run_threads(s.tp, [&](Communicator& world) {
    auto dcp = world.split(world.rank() / s.dcp, world.rank());
    ModelOptions mo;
    mo.backend = s.backend;
    mo.replicate_q_proj = s.replicate_q;
    mo.kv_dtype = s.kv_dtype;
    mo.page_size = s.page_size;
    mo.kv_capacity_tokens = s.capacity;
    MlaModel model(config, weights, world, *dcp, mo);
    std::unique_ptr<Communicator> solo_tp, solo_dcp;
    std::unique_ptr<MlaModel> draft;
    if (s.draft_config) {  // replicated: TP 1 and DCP 1 on every rank
      solo_tp = world.split(world.rank(), 0);
      solo_dcp = world.split(world.rank(), 0);
      ModelOptions dmo = mo;
      dmo.replicate_q_proj = false;
      draft =
          std::make_unique<MlaModel>(*s.draft_config, *s.draft_weights, *solo_tp, *solo_dcp, dmo);
    }
    EngineOptions eo;
    eo.chunked_prefill_size = s.chunk;
    eo.record_logits = true;
    eo.extend_mode = s.extend_mode;
    eo.num_draft_tokens = s.num_draft_tokens;
    eo.enable_prefix_cache = s.prefix_cache;
    eo.host_kv_capacity_tokens = s.host_tokens;
    eo.max_running_requests = s.max_running;
    Engine engine(model, eo, draft.get());
    for (const auto& phase : phases) {
      for (const RequestSpec& r : phase) engine.submit(r);
      engine.run();
    }
    if (world.rank() == 0) {
      out.results = engine.results();
      out.stats = engine.stats();
    }
    if (s.prefix_cache) {
      std::vector<PrefixCacheStats> all(static_cast<std::size_t>(world.size()));
      const PrefixCacheStats mine = engine.prefix_cache()->stats();
      world.all_gather(&mine, all.data(), sizeof mine);
      if (world.rank() == 0) out.cache_stats = all;
    }
    model.allocator().check_invariants();
    world.barrier();
    for (std::size_t i = 0; i < engine.results().size(); ++i) {
      if (engine.results()[i].output_tokens != out.results[i].output_tokens) {
        throw Error(ErrorCategory::internal, "ranks disagree on the generated tokens");
      }
    }
  });
  return out;
}

RequestSpec request(RequestId id, std::vector<std::int32_t> prompt, int max_new,
                    std::vector<std::int32_t> forced) {
  RequestSpec r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new;
  r.forced_outputs = std::move(forced);
  return r;
}

std::vector<std::int32_t> random_tokens(Rng& rng, int n, int vocab) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = static_cast<std::int32_t>(rng.range(0, vocab - 1));
  return t;
}

}  // namespace dcp::test
