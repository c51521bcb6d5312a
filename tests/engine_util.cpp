#include "engine_util.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "dcp/deployment.h"
#include "dcp/error.h"

namespace dcp::test {

EngineRun run_engine_phases(const ModelConfig& config, const WeightSource& weights,
                            const EngineSetup& s,
                            const std::vector<std::vector<RequestSpec>>& phases) {
  ParallelConfig parallel;
  parallel.tp_size = s.tp;
  parallel.dcp_size = s.dcp;
  parallel.ep_size = s.ep;
  parallel.dp_size = s.dp_attention;
  parallel.enable_dp_attention = s.dp_attention > 1;
  if (s.dcp > 1) parallel.dcp_comm_backend = s.backend;
  parallel.replicate_q_proj = s.replicate_q && s.dcp > 1;
  const Topology topo = resolve(parallel);
  ModelSource model;
  model.config = config;
  model.weights = &weights;
  std::optional<ModelSource> draft;
  if (s.draft_config) {
    draft.emplace();
    draft->config = *s.draft_config;
    draft->weights = s.draft_weights;
  }
  ModelOptions mo;
  mo.kv_dtype = s.kv_dtype;
  mo.page_size = s.page_size;
  mo.kv_interleave = s.interleave;
  mo.kv_capacity_tokens = s.capacity;
  mo.weight_kernel = s.weight_kernel;
  EngineOptions eo;
  eo.chunked_prefill_size = s.chunk;
  eo.record_logits = true;
  eo.extend_mode = s.extend_mode;
  eo.num_draft_tokens = s.num_draft_tokens;
  eo.ngram_draft = s.ngram_draft;
  eo.guide_vocabulary = s.guide_vocabulary;
  eo.enable_prefix_cache = s.prefix_cache;
  eo.host_kv_capacity_tokens = s.host_tokens;
  eo.max_running_requests = s.max_running;
  eo.record_step_timings = s.step_timings;

  LaunchOptions lo;
  lo.world_size = topo.world_size;
  const auto launched = launch<EngineRun>(lo, 0, [&](Communicator& world) {
    RankSystem sys(world, topo, model, mo, eo, draft);
    Engine& engine = sys.engine();
    for (const auto& phase : phases) {
      for (const RequestSpec& r : phase) engine.submit(r);
      if (s.after_step) {
        engine.run([&](const Engine& e) { s.after_step(world.rank(), e); });
      } else {
        engine.run();
      }
    }
    EngineRun out;
    out.results = engine.results();
    out.stats = engine.stats();
    if (s.prefix_cache) {
      out.cache_stats.resize(static_cast<std::size_t>(world.size()));
      const PrefixCacheStats mine = engine.prefix_cache()->stats();
      world.all_gather(&mine, out.cache_stats.data(), sizeof mine);
    }
    sys.model().allocator().check_invariants();
    // Ranks run in lockstep: every rank must have produced the same tokens. The gathered list
    // holds each request once per rank, in rank order (a stable sort by id).
    const std::vector<RequestResult> all = gather_results(world, true, engine.results());
    const std::size_t ranks = static_cast<std::size_t>(world.size());
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (all[i].output_tokens != all[i - i % ranks].output_tokens)
        throw Error(ErrorCategory::internal, "ranks disagree on the generated tokens");
    }
    return out;
  });
  return launched.report;
}

::testing::AssertionResult same_greedy_run(const RequestResult& got, const RequestResult& ref,
                                           int vocab, Tolerance tol, double tie) {
  const std::vector<std::int32_t>& a = got.output_tokens;
  const std::vector<std::int32_t>& b = ref.output_tokens;
  const auto v = static_cast<std::size_t>(vocab);
  const std::size_t part = static_cast<std::size_t>(
      std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
  if (a == b) return close_runs(got.step_logits, ref.step_logits, tol, "step logits");
  const std::size_t n = (part + 1) * v;  // the logits compared: up to the step where they part
  if (part >= a.size() || part >= b.size() || ref.step_logits.size() < n ||
      got.step_logits.size() < n)
    return ::testing::AssertionFailure() << "tokens part at step " << part << " (" << a.size()
                                         << " against " << b.size() << " tokens)";
  const float* l = ref.step_logits.data() + part * v;
  const double gap = static_cast<double>(l[b[part]]) - l[a[part]];
  if (gap < 0 || gap > tie)
    return ::testing::AssertionFailure()
           << "tokens part at step " << part << ": " << a[part] << " where the reference chose "
           << b[part] << ", whose logit is higher by " << gap << " (a tie is within " << tie << ")";
  const auto upto = [n](const std::vector<float>& x) {
    return std::vector<float>(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n));
  };
  return close_runs(upto(got.step_logits), upto(ref.step_logits), tol, "step logits");
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

void expect_same_under_dcp2_and_a_draft(const ModelConfig& c, const WeightSource& w, EngineSetup s,
                                        const std::vector<RequestSpec>& reqs,
                                        const EngineRun& want) {
  s.dcp = 2;
  const EngineRun two = run_engine(c, w, s, reqs);
  s.num_draft_tokens = 3;
  s.draft_weights = &w;
  s.draft_config = c;
  const EngineRun spec = run_engine(c, w, s, reqs);
  // The draft is the target, so each round's first proposal is the request's next token: a
  // request that goes on past its first decode token has one accepted. One that ends there (a
  // guide that closes "{}" at once) is verified without an acceptance; the seeds where every
  // request does so prove only that the draft ran.
  std::size_t longest = 0;
  for (const RequestResult& r : want.results) longest = std::max(longest, r.output_tokens.size());
  if (longest >= 2) {
    EXPECT_GT(spec.stats.spec_verifications, 0);
  }
  if (longest >= 3) {
    EXPECT_GT(spec.stats.spec_accepted, 0);
  }
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(two.results[i].output_tokens, want.results[i].output_tokens) << "request " << i;
    EXPECT_EQ(spec.results[i].output_tokens, want.results[i].output_tokens) << "request " << i;
  }
}

}  // namespace dcp::test
