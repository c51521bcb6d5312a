// Running the engine on thread ranks, for the model, speculative and extend tests.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "dcp/engine.h"
#include "dcp/model.h"
#include "dcp/weights.h"
#include "test_util.h"

namespace dcp::test {

struct EngineSetup {
  int tp = 1, dcp = 1;
  int ep = 1;                 // expert parallelism of the MoE layers
  int dp_attention = 1;       // > 1: that many attention groups (each runs every request)
  CombineBackend backend = CombineBackend::ag_rs;
  bool replicate_q = false;
  KvDtype kv_dtype = KvDtype::fp32;
  KernelPath weight_kernel = KernelPath::automatic;  // ModelOptions::weight_kernel
  int page_size = 16;
  int interleave = 1;  // KV stripe (divides page_size)
  int chunk = 2048;
  std::int64_t capacity = 4096;
  ForwardMode extend_mode = ForwardMode::extend;
  // Speculative decoding: a draft model replicated on every rank.
  int num_draft_tokens = 0;
  int ngram_draft = 0;  // prompt lookup instead of a draft model
  std::optional<ModelConfig> draft_config;
  const WeightSource* draft_weights = nullptr;
  // Prefix cache and host tier.
  bool prefix_cache = false;
  std::int64_t host_tokens = 0;
  int max_running = 64;
  bool step_timings = true;                                 // EngineOptions::record_step_timings
  std::shared_ptr<const GuideVocabulary> guide_vocabulary;  // for requests with a regex
  // Called on every rank's thread after each engine step (with that rank's world rank).
  std::function<void(int, const Engine&)> after_step;
};

struct EngineRun {
  std::vector<RequestResult> results;
  EngineStats stats;
  std::vector<PrefixCacheStats> cache_stats;  // per rank, when the prefix cache is on
};

// Runs `phases` of requests on `tp` thread ranks: each phase is submitted once the previous one
// finished (a later phase may continue an earlier request). Returns rank 0's results; every rank
// checks it produced the same tokens (ranks run in lockstep).
EngineRun run_engine_phases(const ModelConfig& config, const WeightSource& weights,
                            const EngineSetup& s,
                            const std::vector<std::vector<RequestSpec>>& phases);
inline EngineRun run_engine(const ModelConfig& config, const WeightSource& weights,
                            const EngineSetup& s, const std::vector<RequestSpec>& requests) {
  return run_engine_phases(config, weights, s, {requests});
}

// Runs `reqs` again under DCP 2, and with a draft equal to the target (3 tokens a step), and
// expects every request's tokens to equal `want`'s and some drafts to be accepted: a constraint
// (penalties, masks, guides) must hold the same on every rank and for the draft's proposals.
void expect_same_under_dcp2_and_a_draft(const ModelConfig& c, const WeightSource& w, EngineSetup s,
                                        const std::vector<RequestSpec>& reqs,
                                        const EngineRun& want);

// A greedy request against a reference run's (both with recorded logits): the same tokens and
// step logits within `tol`, to the end or to a step where the reference's logits put both runs'
// tokens within `tie` of each other: a near-tie that two runs' rounding may break either way. The
// texts part there, and the steps after it are not compared.
::testing::AssertionResult same_greedy_run(const RequestResult& got, const RequestResult& ref,
                                           int vocab, Tolerance tol, double tie = 1e-5);

RequestSpec request(RequestId id, std::vector<std::int32_t> prompt, int max_new,
                    std::vector<std::int32_t> forced = {});
std::vector<std::int32_t> random_tokens(Rng& rng, int n, int vocab);

}  // namespace dcp::test
