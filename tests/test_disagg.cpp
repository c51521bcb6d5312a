// Prefill/decode disaggregation: transfer plans, and decoding after a transfer equals a
// monolithic run.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "dcp/comm_threads.h"
#include "dcp/disagg.h"
#include "dcp/error.h"
#include "dcp/layout.h"
#include "engine_util.h"
#include "test_util.h"

namespace dcp {
namespace {

using test::error_of;

TEST(TransferPlan, EqualSizesMoveEachRanksRowsAsTheyAre) {
  for (int n = 1; n <= 5; ++n) {
    for (std::int64_t tokens = 0; tokens <= 150; ++tokens) {
      for (int r = 0; r < n; ++r) {
        const TransferPlan p =
            make_transfer_plan({n, 16, KvDtype::bf16}, {n, 16, KvDtype::bf16}, r, tokens);
        ASSERT_TRUE(p.page_path);
        ASSERT_EQ(p.src_dcp_rank, r);
        for (std::int64_t j = 0; j < p.rows; ++j) ASSERT_EQ(p.source_row(j), j);
        std::int64_t owned = 0;  // brute force: positions below `tokens` that r owns
        for (std::int64_t q = 0; q < tokens; ++q) owned += q % n == r;
        ASSERT_EQ(p.rows, owned) << "exact count: nothing past the last token";
      }
    }
  }
}

TEST(TransferPlan, DcpOneToNRelayoutsTokens) {
  for (int il : {1, 2, 8}) {
    for (int n = 1; n <= 6; ++n) {
      for (std::int64_t tokens : {0, 1, 5, 63, 64, 65, 200}) {
        for (int r = 0; r < n; ++r) {
          const TransferPlan p = make_transfer_plan({1, 8, KvDtype::fp32, il},
                                                    {n, 8, KvDtype::fp32, il}, r, tokens);
          ASSERT_EQ(p.src_dcp_rank, 0);
          // Decode local row j must receive the j-th position it owns (brute force over the
          // stripes of il tokens), in order.
          std::vector<std::int64_t> expect;
          for (std::int64_t q = 0; q < tokens; ++q) {
            if (q / il % n == r) expect.push_back(q);
          }
          ASSERT_EQ(p.rows, static_cast<std::int64_t>(expect.size()));
          for (std::int64_t j = 0; j < p.rows; ++j) ASSERT_EQ(p.source_row(j), expect[j]);
        }
      }
    }
  }
  EXPECT_TRUE(test::throws_error(
      [] { make_transfer_plan({1, 8, KvDtype::fp32, 2}, {2, 8, KvDtype::fp32, 4}, 0, 10); },
      ErrorCategory::invalid_argument, "interleave sizes differ: prefill 2, decode 4"));
}

TEST(TransferPlan, RejectedPairsNameBothSizes) {
  const std::pair<int, int> bad[] = {{2, 4}, {4, 2}, {4, 1}, {3, 6}};
  for (auto [a, b] : bad) {
    const std::string why = error_of([a = a, b = b] {  // clang 14: a binding is named to capture
      make_transfer_plan({a, 16, KvDtype::bf16}, {b, 16, KvDtype::bf16}, 0, 10);
    });
    EXPECT_NE(why.find("prefill DCP size " + std::to_string(a) + " -> decode DCP size " +
                       std::to_string(b)),
              std::string::npos)
        << why;
  }
  EXPECT_NE(error_of([&] {
              make_transfer_plan({2, 16, KvDtype::bf16}, {2, 64, KvDtype::bf16}, 0, 10);
            }).find("page sizes differ"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              make_transfer_plan({1, 16, KvDtype::fp32}, {2, 16, KvDtype::bf16}, 0, 10);
            }).find("KV dtypes differ"),
            std::string::npos);
}

struct DisaggCase {
  int prefill_dcp, decode_tp, decode_dcp, page;
};

// Speculative decoding on the decode side: the draft's geometry (weights: the target's) and the
// tokens it proposes per step.
struct DraftCase {
  ModelConfig config;
  int tokens = 0;
};

// Runs disaggregated on threads and returns the decode side's results (first decode rank), and
// the first prefill rank's outcome in `prefill` when given; `engine` adjusts the engine options.
DisaggOutcome run_disagg(const ModelConfig& c, const WeightSource& w, const DisaggCase& k,
                         const std::vector<RequestSpec>& reqs,
                         const TransportOptions& transport = {},
                         const std::optional<DraftCase>& draft = std::nullopt,
                         const std::function<void(EngineOptions&)>& engine = {},
                         DisaggOutcome* prefill = nullptr) {
  DisaggOutcome outcome;
  set_blas_threads(1);
  run_threads(k.prefill_dcp + k.decode_tp, [&](Communicator& world) {
    DisaggConfig cfg;
    cfg.model.config = c;
    cfg.model.weights = &w;
    cfg.prefill_dcp_size = k.prefill_dcp;
    cfg.decode.tp_size = k.decode_tp;
    cfg.decode.dcp_size = k.decode_dcp;
    if (k.decode_dcp > 1) cfg.decode.dcp_comm_backend = CombineBackend::a2a;
    cfg.model_options.kv_dtype = KvDtype::fp32;
    cfg.model_options.page_size = k.page;
    cfg.model_options.kv_capacity_tokens = 4096;
    cfg.engine.record_logits = true;
    cfg.engine.chunked_prefill_size = 50;
    cfg.transport = transport;
    cfg.poison_decode_pools = true;  // a stale row would surface as NaN logits
    if (draft) {
      cfg.engine.num_draft_tokens = draft->tokens;
      cfg.draft.emplace();
      cfg.draft->config = draft->config;
      cfg.draft->weights = &w;
    }
    if (engine) engine(cfg.engine);
    DisaggOutcome o = run_disaggregated(world, cfg, reqs);
    if (world.rank() == 0 && prefill) *prefill = o;
    if (world.rank() == k.prefill_dcp) outcome = std::move(o);
  });
  return outcome;
}

// The monolithic engine with the decode side's layout, the reference of a disaggregated run.
test::EngineSetup monolithic(const DisaggCase& k) {
  test::EngineSetup mono;
  mono.tp = k.decode_tp;
  mono.dcp = k.decode_dcp;
  mono.backend = CombineBackend::a2a;
  mono.page_size = k.page;
  mono.chunk = 50;
  return mono;
}

TEST(Disaggregation, DecodeAfterTransferEqualsMonolithic) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(51);
  std::vector<RequestSpec> reqs;
  const int lengths[] = {1, 7, 67, 130};  // not multiples of the page size or N
  for (int i = 0; i < 4; ++i)
    reqs.push_back(test::request(i, test::random_tokens(rng, lengths[i], c.vocab_size), 5));
  // Penalties and masks span the handoff: the decode side counts the first token, chosen by the
  // prefill side.
  reqs[2].sampling.repetition_penalty = 0.6;
  reqs[2].sampling.presence_penalty = -1.5;
  reqs[3].sampling.logit_bias = {{reqs[3].prompt[0], 5.0}};
  reqs[3].sampling.frequency_penalty = 2;
  reqs[1].stop_token_ids = {3, 5, 8, 13, 21};
  reqs[1].min_tokens = 4;
  for (int t = 0; t < c.vocab_size; t += 3) reqs[0].sampling.allowed_token_ids.push_back(t);
  reqs[0].sampling.bad_words = {{0}, {6, 9}};
  const DisaggCase cases[] = {{1, 4, 4, 1},  {1, 4, 4, 64}, {1, 2, 2, 16},
                              {2, 2, 2, 64}, {4, 4, 4, 1},  {2, 4, 2, 16}};
  for (const DisaggCase& k : cases) {
    const auto expect = test::run_engine(c, *w, monolithic(k), reqs);
    const DisaggOutcome got = run_disagg(c, *w, k, reqs);
    const std::string what = std::to_string(k.prefill_dcp) + " -> " + std::to_string(k.decode_dcp) +
                             " (decode tp " + std::to_string(k.decode_tp) + ") page " +
                             std::to_string(k.page);
    ASSERT_TRUE(got.is_decode);
    std::int64_t expect_bytes =
        0;  // this rank (decode DCP rank 0) receives count_0(L) rows of every layer
    for (int i = 0; i < 4; ++i) {
      ASSERT_EQ(got.results[i].state, RequestState::finished)
          << what << " " << got.results[i].error;
      EXPECT_TRUE(
          test::same_greedy_run(got.results[i], expect.results[i], c.vocab_size, {1e-10, 1e-4}))
          << what << " request " << i;
      expect_bytes += layout::count(lengths[i], 0, k.decode_dcp) * 80 * 4 * 2 +
                      32;  // rows x width x fp32 x layers + header
    }
    EXPECT_EQ(got.bytes_received, expect_bytes) << what;
  }
}

// Speculative decoding on the decode side: the draft computes each adopted prompt's KV itself;
// greedy verification gives the same tokens as the monolithic engine without a draft, and the
// drafts accepted equal those of a monolithic speculative run (the draft saw the same prompt).
TEST(Disaggregation, SpeculativeDecodingAfterTransferEqualsGreedy) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(53);
  const auto draw = [&] {
    std::vector<RequestSpec> reqs;
    const int lengths[] = {3, 40, 97};
    for (int i = 0; i < 3; ++i)
      reqs.push_back(test::request(i, test::random_tokens(rng, lengths[i], c.vocab_size), 9));
    return reqs;
  };
  for (const auto& [k, tokens] : {std::pair{DisaggCase{1, 2, 2, 16}, 3},
                                  std::pair{DisaggCase{2, 2, 2, 16}, 2}}) {
    const DraftCase d{preset_config("tiny", 1), tokens};
    const std::string what = std::to_string(k.prefill_dcp) + " -> " + std::to_string(k.decode_dcp);
    const test::EngineSetup mono = monolithic(k);
    test::EngineSetup spec = mono;
    spec.num_draft_tokens = d.tokens;
    spec.draft_config = d.config;
    spec.draft_weights = w.get();
    // Prompts whose monolithic speculative run accepts drafts, so that the comparison below
    // covers accepted tokens (about one random draw in several hundred accepts none).
    std::vector<RequestSpec> reqs = draw();
    test::EngineRun speculative = test::run_engine(c, *w, spec, reqs);
    for (int tries = 0; speculative.stats.spec_accepted == 0 && tries < 10; ++tries) {
      reqs = draw();
      speculative = test::run_engine(c, *w, spec, reqs);
    }
    const auto plain = test::run_engine(c, *w, mono, reqs);
    const DisaggOutcome got = run_disagg(c, *w, k, reqs, {}, d);
    ASSERT_TRUE(got.is_decode);
    bool exact = true;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(got.results[i].state, RequestState::finished)
          << what << " " << got.results[i].error;
      EXPECT_TRUE(
          test::same_greedy_run(got.results[i], plain.results[i], c.vocab_size, {1e-10, 1e-4}))
          << what << " request " << i;
      exact = exact && got.results[i].output_tokens == speculative.results[i].output_tokens;
    }
    EXPECT_GT(got.decode_stats.spec_accepted, 0) << what;
    if (exact) {  // where a near-tie parted the texts, the drafts accepted may differ too
      EXPECT_EQ(got.decode_stats.spec_proposed, speculative.stats.spec_proposed) << what;
      EXPECT_EQ(got.decode_stats.spec_accepted, speculative.stats.spec_accepted) << what;
    }
  }
}

// The prefix cache serves the prefill side: prompts that share a prefix compute it once (one
// request runs at a time there, so each later one finds the earlier ones' pages), with a host
// tier or without; the decode side receives whole prompts and decodes as the monolithic engine
// does.
TEST(Disaggregation, ThePrefillSidesPrefixCacheSharesPromptsPrefixes) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(57);
  const std::vector<std::int32_t> shared = test::random_tokens(rng, 150, c.vocab_size);
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 4; ++i) {
    std::vector<std::int32_t> prompt = shared;
    for (std::int32_t t : test::random_tokens(rng, 5 + 13 * i, c.vocab_size)) prompt.push_back(t);
    reqs.push_back(test::request(i, prompt, 6));
  }
  for (const std::int64_t host_tokens : {0, 1024}) {
    for (const DisaggCase& k : {DisaggCase{1, 2, 2, 16}, DisaggCase{2, 4, 2, 16}}) {
      const std::string what =
          str(k.prefill_dcp, " -> ", k.decode_dcp, ", host tier ", host_tokens);
      const auto expect = test::run_engine(c, *w, monolithic(k), reqs);
      DisaggOutcome prefill;
      const DisaggOutcome got = run_disagg(
          c, *w, k, reqs, {}, std::nullopt,
          [&](EngineOptions& e) {
            e.enable_prefix_cache = true;
            e.host_kv_capacity_tokens = host_tokens;
            e.max_running_requests = 1;
          },
          &prefill);
      ASSERT_TRUE(got.is_decode);
      for (std::size_t i = 0; i < reqs.size(); ++i) {
        ASSERT_EQ(got.results[i].state, RequestState::finished)
            << what << " " << got.results[i].error;
        EXPECT_TRUE(
            test::same_greedy_run(got.results[i], expect.results[i], c.vocab_size, {1e-10, 1e-4}))
            << what << " request " << i;
      }
      ASSERT_FALSE(prefill.is_decode);
      ASSERT_TRUE(prefill.prefill_cache.has_value()) << what;
      // Each later request finds the shared prefix's whole pages, of page_size x the prefill
      // side's DCP size tokens (the widened allocator's): 144 or 128 of its 150 tokens.
      const int page = k.page * k.prefill_dcp;
      EXPECT_EQ(prefill.prefill_cache->hit_tokens, 3 * (150 / page * page)) << what;
      EXPECT_FALSE(got.prefill_cache.has_value()) << what;  // the decode side has no cache
    }
  }
}

// The prefill side hands over one token, not the prompt's logprobs: refused, naming the field.
// A decode side of DP replicas (two TP 1 replicas; two attention groups of TP 2 x DCP 2 in TP 4):
// each request moves to the replica it is dealt to, which finishes it; the tokens are an
// undivided run's, and every replica served some.
TEST(Disaggregation, DecodeReplicasEachFinishTheRequestsDealtThem) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(56);
  for (const bool dp_attention : {false, true}) {
    DeploymentSpec spec;
    spec.model.config = preset_config("tiny", 2);
    spec.model.weights = w.get();
    spec.parallel.tp_size = dp_attention ? 4 : 1;
    spec.parallel.dp_size = 2;
    spec.parallel.dcp_size = dp_attention ? 2 : 1;
    spec.parallel.enable_dp_attention = dp_attention;
    spec.model_options.kv_dtype = KvDtype::fp32;
    spec.model_options.page_size = 16;
    spec.model_options.kv_capacity_tokens = 4096;
    for (const int len : {5, 70, 33, 130, 1})
      spec.requests.push_back(test::request(static_cast<RequestId>(spec.requests.size()),
                                            test::random_tokens(rng, len, 64), 6));
    const DeploymentReport want = run_deployment(spec).report;
    const DeploymentReport got = run_disaggregated_deployment(spec, 1).report;
    ASSERT_EQ(got.results.size(), spec.requests.size());
    for (std::size_t i = 0; i < spec.requests.size(); ++i) {
      EXPECT_EQ(got.results[i].state, RequestState::finished) << got.results[i].error;
      EXPECT_EQ(got.results[i].output_tokens, want.results[i].output_tokens)
          << "DP attention " << dp_attention << ", request " << i;
    }
    ASSERT_EQ(got.ranks.size(), static_cast<std::size_t>(spec.parallel.world_size()));
    std::int64_t served[2] = {0, 0};
    for (const RankKv& k : got.ranks)
      if (k.dcp_rank == 0) served[k.dp_rank] += k.requests;
    EXPECT_GT(served[0], 0);
    EXPECT_GT(served[1], 0);
    EXPECT_EQ(served[0] + served[1], 5);
  }
}

// The prefill side's token ends a request that stops there: adopting it does not decode on.
TEST(Disaggregation, AFirstTokenThatStopsEndsTheRequest) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 1);
  const auto w = make_synthetic_weights(55);
  const DisaggCase k{1, 2, 2, 16};
  RequestSpec r = test::request(0, test::random_tokens(rng, 12, c.vocab_size), 6);
  const auto plain = test::run_engine(c, *w, monolithic(k), {r});
  const std::int32_t first = plain.results[0].output_tokens[0];
  r.stop_token_ids = {first};
  const DisaggOutcome got = run_disagg(c, *w, k, {r});
  ASSERT_EQ(got.results[0].state, RequestState::finished) << got.results[0].error;
  EXPECT_EQ(got.results[0].output_tokens, std::vector<std::int32_t>{first});
  EXPECT_EQ(got.results[0].finish_reason, FinishReason::stop);
}

TEST(Disaggregation, RefusesPromptLogprobs) {
  const ModelConfig c = preset_config("tiny", 1);
  const auto w = make_synthetic_weights(54);
  RequestSpec r = test::request(3, {1, 2, 3}, 2);
  r.prompt_logprobs = 1;
  EXPECT_TRUE(test::throws_error(
      [&] {
        run_disagg(c, *w, DisaggCase{1, 2, 2, 16}, {r});
      },
      ErrorCategory::invalid_argument,
      "disaggregation: request 3: prompt_logprobs is not supported"));
}

TEST(Disaggregation, ACorruptedTransferFailsOnlyItsRequest) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 1);
  const auto w = make_synthetic_weights(53);
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 3; ++i)
    reqs.push_back(test::request(i, test::random_tokens(rng, 40 + 9 * i, c.vocab_size), 4));
  TransportOptions corrupt;
  corrupt.corrupt_request = 1;
  const DisaggCase k{1, 2, 2, 16};
  const DisaggOutcome clean = run_disagg(c, *w, k, reqs);
  const DisaggOutcome got = run_disagg(c, *w, k, reqs, corrupt);
  EXPECT_EQ(got.results[1].state, RequestState::rejected);
  EXPECT_NE(got.results[1].error.find("checksum"), std::string::npos) << got.results[1].error;
  for (int i : {0, 2}) {
    EXPECT_EQ(got.results[i].state, RequestState::finished);
    EXPECT_TRUE(
        test::same_greedy_run(got.results[i], clean.results[i], c.vocab_size, {1e-10, 1e-4}))
        << "request " << i;
  }
}

}  // namespace
}  // namespace dcp
