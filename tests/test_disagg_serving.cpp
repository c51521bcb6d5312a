// A served deployment with prefill/decode disaggregation: the tokens, logprobs and finish reasons
// of an undivided server's; requests waiting for the decode group's KV; cancellation and shutdown
// at every stage freeing both groups' KV; the configurations it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "dcp/serving.h"
#include "dcp/weights.h"
#include "engine_util.h"
#include "serving_util.h"
#include "test_util.h"

namespace dcp {
namespace {

using namespace std::chrono_literals;
using test::drain_stream;
using test::greedy;
using test::Running;
using test::small_spec;

ServeOptions disaggregated(int prefill_dcp_size) {
  ServeOptions o;
  o.prefill_dcp_size = prefill_dcp_size;
  return o;
}

// Waits until no world rank holds KV; every rank's count.
std::vector<std::int64_t> settled_kv_rows(ServingDeployment& server) {
  for (int i = 0; i < 400; ++i) {
    const std::vector<std::int64_t> rows = server.metrics().kv_rows_used;
    if (std::all_of(rows.begin(), rows.end(), [](std::int64_t r) { return r == 0; })) return rows;
    std::this_thread::sleep_for(5ms);
  }
  return server.metrics().kv_rows_used;
}

// The requests of the comparison: greedy ones of several lengths (one shorter than the DCP
// size), one token only, seeded sampling with logprobs, prompt logprobs, and stop tokens that
// end a request at its first token and at its third.
std::vector<ServeRequest> workload(const WeightSource& w) {
  auto rng = test::make_rng();
  std::vector<ServeRequest> out;
  for (const int len : {1, 9, 23, 40}) out.push_back(greedy(test::random_tokens(rng, len, 64), 8));
  out.push_back(greedy(test::random_tokens(rng, 17, 64), 1));
  ServeRequest sampled = greedy(test::random_tokens(rng, 30, 64), 12);
  sampled.sampling.temperature = 0.8;
  sampled.sampling.top_k = 20;
  sampled.sampling.seed = 777;
  sampled.logprobs = 3;
  out.push_back(sampled);
  ServeRequest prompt_lp = greedy(test::random_tokens(rng, 21, 64), 5);
  prompt_lp.prompt_logprobs = 2;
  prompt_lp.logprobs = 0;
  out.push_back(prompt_lp);
  // Stop tokens taken from the plain request's greedy tokens (a batch run's).
  const ServeRequest plain = greedy(test::random_tokens(rng, 15, 64), 8);
  DeploymentSpec batch = small_spec(w, 1, 1);
  batch.requests.push_back(plain.spec(0));
  const std::vector<std::int32_t> tokens = run_deployment(batch).report.results[0].output_tokens;
  for (const std::size_t at : {0, 2}) {
    ServeRequest stop = plain;
    stop.stop_token_ids = {tokens[at]};
    out.push_back(stop);
  }
  return out;
}

std::vector<StreamUpdate> serve_all(ServingDeployment& server,
                                    const std::vector<ServeRequest>& requests) {
  std::vector<StreamUpdate> got(requests.size());
  std::vector<std::thread> clients;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    clients.emplace_back([&, i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(2 * i));  // arrivals spread out
      got[i] = drain_stream(*server.submit(requests[i]));
    });
  }
  for (auto& c : clients) c.join();
  return got;
}

struct Split {
  int prefill_dcp, tp, dcp, dp;
  bool dp_attention;
};

DeploymentSpec decode_spec(const WeightSource& w, const Split& k) {
  DeploymentSpec s = small_spec(w, k.tp, k.dcp, k.dp);
  s.parallel.enable_dp_attention = k.dp_attention;
  return s;
}

TEST(DisaggregatedServing, StreamsWhatAnUndividedServerStreams) {
  const auto w = make_synthetic_weights(41);
  const std::vector<ServeRequest> requests = workload(*w);
  // Prefill DCP 1 relayouts into decode DCP 2; prefill DCP 2 moves pages as they are; decode
  // replicas (two attention groups of TP 2 x DCP 2 in TP 4; two TP 1 replicas) each take what
  // their KV holds.
  for (const Split split : {Split{1, 2, 2, 1, false}, Split{2, 2, 2, 1, false},
                            Split{1, 4, 2, 2, true}, Split{1, 1, 1, 2, false}}) {
    std::vector<StreamUpdate> want;
    {
      Running undivided(decode_spec(*w, split));
      want = serve_all(*undivided, requests);
    }
    Running server(decode_spec(*w, split), disaggregated(split.prefill_dcp));
    const std::vector<StreamUpdate> got = serve_all(*server, requests);
    const int prefill = split.prefill_dcp;
    for (std::size_t i = 0; i < requests.size(); ++i) {
      SCOPED_TRACE(testing::Message()
                   << "prefill DCP " << prefill << ", decode TP " << split.tp << " DCP "
                   << split.dcp << " DP " << split.dp << ", request " << i);
      EXPECT_TRUE(got[i].error.empty()) << got[i].error;
      EXPECT_EQ(got[i].tokens, want[i].tokens);
      EXPECT_EQ(got[i].finish_reason, want[i].finish_reason);
      ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size());
      for (std::size_t k = 0; k < got[i].logprobs.size(); ++k) {
        EXPECT_EQ(got[i].logprobs[k].chosen.token, want[i].logprobs[k].chosen.token);
        EXPECT_NEAR(got[i].logprobs[k].chosen.logprob, want[i].logprobs[k].chosen.logprob, 1e-4);
        EXPECT_EQ(got[i].logprobs[k].top.size(), want[i].logprobs[k].top.size());
      }
      ASSERT_EQ(got[i].prompt_logprobs.size(), want[i].prompt_logprobs.size());
      for (std::size_t k = 0; k < got[i].prompt_logprobs.size(); ++k) {
        EXPECT_NEAR(got[i].prompt_logprobs[k].chosen.logprob,
                    want[i].prompt_logprobs[k].chosen.logprob, 1e-4);
      }
    }
    // The stop tokens ended their requests where they first came: at the first token, and at
    // the third unless the second was the same token.
    for (std::size_t i = got.size() - 2; i < got.size(); ++i) {
      const std::vector<std::int32_t>& t = got[i].tokens;
      ASSERT_FALSE(t.empty());
      EXPECT_EQ(t.back(), requests[i].stop_token_ids[0]);
      EXPECT_EQ(std::count(t.begin(), t.end(), t.back()), 1);
      EXPECT_EQ(got[i].finish_reason, FinishReason::stop);
    }
    EXPECT_EQ(got[got.size() - 2].tokens.size(), 1u);
    EXPECT_LE(got.back().tokens.size(), 3u);
    const ServeMetrics m = server->metrics();
    EXPECT_EQ(m.requests_finished, static_cast<std::int64_t>(requests.size()));
    std::int64_t tokens = 0;
    for (const StreamUpdate& u : got) tokens += static_cast<std::int64_t>(u.tokens.size());
    EXPECT_EQ(m.generation_tokens, tokens);
    EXPECT_EQ(m.time_to_first_token.count, static_cast<std::int64_t>(requests.size()));
    const int decode_ranks = split.dp_attention ? split.tp : split.tp * split.dp;
    ASSERT_EQ(m.kv_rows_used.size(), static_cast<std::size_t>(prefill + decode_ranks));
    for (const std::int64_t rows : settled_kv_rows(*server)) EXPECT_EQ(rows, 0);
  }
}

// Speculative decoding on the decode side (the target's first layer as the draft, computing each
// moved prompt's draft KV itself) and the prefix cache on the prefill side: greedy tokens are an
// undivided server's without either.
TEST(DisaggregatedServing, SpeculationAndThePrefixCacheKeepTheTokens) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(46);
  std::vector<ServeRequest> requests;
  const std::vector<std::int32_t> shared = test::random_tokens(rng, 40, 64);
  for (int i = 0; i < 4; ++i) {
    std::vector<std::int32_t> prompt = shared;  // whole pages shared: the cache serves them
    for (const std::int32_t t : test::random_tokens(rng, 3 + 5 * i, 64)) prompt.push_back(t);
    requests.push_back(greedy(prompt, 9));
  }
  std::vector<StreamUpdate> want;
  {
    Running undivided(small_spec(*w, 2, 2));
    want = serve_all(*undivided, requests);
  }
  DeploymentSpec spec = small_spec(*w, 2, 2);
  spec.engine.num_draft_tokens = 2;
  spec.draft.emplace();
  spec.draft->config = preset_config("tiny", 1);
  spec.draft->weights = w.get();
  spec.engine.enable_prefix_cache = true;
  Running server(spec, disaggregated(1));
  std::vector<StreamUpdate> got;
  for (const ServeRequest& r : requests) got.push_back(drain_stream(*server->submit(r)));
  std::int64_t cached = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i << ": " << got[i].error;
    cached += got[i].cached_prompt_tokens;
    // The decode group's steps: 8 tokens after the prefill's, 1 to 3 a step.
    EXPECT_GE(got[i].spec_verify_steps, 3) << "request " << i;
    EXPECT_LE(got[i].spec_verify_steps, 8) << "request " << i;
  }
  EXPECT_GT(cached, 0) << "the prefill group's cache served none of the shared prefix";
  for (const std::int64_t rows : settled_kv_rows(*server)) EXPECT_EQ(rows, 0);
  const ServeMetrics m = server->metrics();  // the decode group's draft, reported
  EXPECT_GT(m.spec_verifications, 0);
  EXPECT_GT(m.spec_proposed, 0);
  // N-gram lookup instead: no draft model on the decode side, the same tokens.
  spec.draft.reset();
  spec.engine.ngram_draft = 2;
  Running lookup(spec, disaggregated(1));
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const StreamUpdate u = drain_stream(*lookup->submit(requests[i]));
    EXPECT_EQ(u.tokens, want[i].tokens) << "n-gram, request " << i << ": " << u.error;
  }
}

// A decode group that holds one request at a time: the others' prompts are computed and wait,
// KV kept, until it frees; every text is the undivided server's.
TEST(DisaggregatedServing, ComputedPromptsWaitForTheDecodeGroupsKv) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(42);
  std::vector<ServeRequest> requests;
  for (int i = 0; i < 5; ++i) requests.push_back(greedy(test::random_tokens(rng, 14 + i, 64), 20));
  std::vector<StreamUpdate> want;
  {
    Running undivided(small_spec(*w, 2, 2, 1, 48));
    want = serve_all(*undivided, requests);
  }
  Running server(small_spec(*w, 2, 2, 1, 48), disaggregated(1));
  const std::vector<StreamUpdate> got = serve_all(*server, requests);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_TRUE(got[i].error.empty()) << got[i].error;
  }
  for (const std::int64_t rows : settled_kv_rows(*server)) EXPECT_EQ(rows, 0);
  const ServeMetrics m = server->metrics();
  EXPECT_EQ(m.requests_finished, 5);
  EXPECT_EQ(m.kv_transfers, 5);
  EXPECT_EQ(m.awaiting_transfer, 0);
  // Every prompt's rows (80 fp32 values, 2 layers), over the two decode ranks, and each rank's
  // header per request.
  std::int64_t bytes = 0;
  for (const ServeRequest& r : requests)
    bytes += static_cast<std::int64_t>(r.prompt.size()) * 80 * 4 * 2 + 2 * 32;
  EXPECT_EQ(m.kv_transfer_bytes, bytes);
}

// Two decode replicas (attention groups of TP 2 x DCP 2): a request the first cannot hold beside
// its running one goes to the second, which decodes it at once (it would wait for the first
// request's 1000 tokens otherwise).
TEST(DisaggregatedServing, EachDecodeReplicaTakesWhatItsKvHolds) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(45);
  DeploymentSpec spec = small_spec(*w, 4, 2, 2, 1100);
  spec.parallel.enable_dp_attention = true;
  Running server(spec, disaggregated(1));
  const auto a = server->submit(greedy(test::random_tokens(rng, 10, 64), 1000));
  std::size_t a_tokens = 0;
  while (a_tokens < 2) {
    const std::optional<StreamUpdate> u = a->next(10s);
    ASSERT_TRUE(u.has_value());
    a_tokens += u->tokens.size();
  }
  const auto b = server->submit(greedy(test::random_tokens(rng, 10, 64), 200));
  std::size_t b_tokens = 0;
  while (b_tokens < 2) {  // its second token: decoded, so moved
    const std::optional<StreamUpdate> u = b->next(10s);
    ASSERT_TRUE(u.has_value());
    ASSERT_FALSE(u->finished);
    b_tokens += u->tokens.size();
  }
  const ServeMetrics m = server->metrics();
  ASSERT_EQ(m.kv_rows_used.size(), 5u);  // world ranks 0-1 and 2-3 decode; 4 prefills
  EXPECT_FALSE(a->timing().finished.has_value());
  for (std::size_t rank = 0; rank < 4; ++rank)
    EXPECT_GT(m.kv_rows_used[rank], 0) << "decode rank " << rank << " holds no request";
  a->cancel();
  b->cancel();
  EXPECT_EQ(drain_stream(*a).finish_reason, FinishReason::cancelled);
  EXPECT_EQ(drain_stream(*b).finish_reason, FinishReason::cancelled);
  for (const std::int64_t rows : settled_kv_rows(*server)) EXPECT_EQ(rows, 0);
}

// The decode side never waits for the prefill group: with the prefill group held before its next
// step, a request already decoding streams 30 more tokens while one that arrived meanwhile gets
// nothing; released, the second is served. (Stepping the groups together, the first would stop.)
TEST(DisaggregatedServing, DecodeStepsDoNotWaitForThePrefillGroup) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(46);
  std::mutex mutex;
  std::condition_variable released;
  bool hold = false;
  ServeOptions o = disaggregated(1);
  o.prefill_step_hook = [&] {
    std::unique_lock lock(mutex);
    released.wait(lock, [&] { return !hold; });
  };
  Running server(small_spec(*w, 2, 2), o);
  const auto release = [&] {
    {
      std::lock_guard lock(mutex);
      hold = false;
    }
    released.notify_all();
  };
  struct OnExit {  // a failed check still lets the prefill group go before the server stops
    std::function<void()> f;
    ~OnExit() { f(); }
  } release_on_exit{release};
  const auto a = server->submit(greedy(test::random_tokens(rng, 10, 64), 200));
  std::size_t a_tokens = 0;
  while (a_tokens < 2) {  // decoding
    const std::optional<StreamUpdate> u = a->next(10s);
    ASSERT_TRUE(u.has_value());
    a_tokens += u->tokens.size();
  }
  {
    std::lock_guard lock(mutex);
    hold = true;
  }
  const auto b = server->submit(greedy(test::random_tokens(rng, 20, 64), 4));
  const std::size_t before = a_tokens;
  while (a_tokens < before + 30) {
    const std::optional<StreamUpdate> u = a->next(10s);
    ASSERT_TRUE(u.has_value()) << "decoding stopped after " << a_tokens << " tokens";
    ASSERT_FALSE(u->finished);
    a_tokens += u->tokens.size();
  }
  EXPECT_FALSE(b->timing().first_token.has_value());
  release();
  const StreamUpdate rest = drain_stream(*b);
  EXPECT_EQ(rest.tokens.size(), 4u);
  EXPECT_EQ(rest.finish_reason, FinishReason::length);
  a->cancel();
  EXPECT_EQ(drain_stream(*a).finish_reason, FinishReason::cancelled);
  for (const std::int64_t rows : settled_kv_rows(*server)) EXPECT_EQ(rows, 0);
}

// Cancelled while decoding and while waiting for the decode group's KV; then a shutdown that
// cancels, and one that drains. Nothing is held after any of them.
TEST(DisaggregatedServing, CancelAndShutdownEndRequestsAtEveryStage) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(43);
  {
    // The decode group (320 tokens) holds the long request (312 reserved), not the short one.
    Running server(small_spec(*w, 2, 2, 1, 320), disaggregated(1));
    const auto running = server->submit(greedy(test::random_tokens(rng, 10, 64), 300));
    ASSERT_TRUE(running->next(10s).has_value());
    const auto waiting = server->submit(greedy(test::random_tokens(rng, 10, 64), 10));
    const std::optional<StreamUpdate> first = waiting->next(10s);  // computed, not moved
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(first->tokens.size(), 1u);
    EXPECT_FALSE(first->finished);
    waiting->cancel();
    const StreamUpdate w_end = drain_stream(*waiting);
    EXPECT_EQ(w_end.finish_reason, FinishReason::cancelled);
    EXPECT_TRUE(w_end.tokens.empty());
    running->cancel();
    const StreamUpdate r_end = drain_stream(*running);
    EXPECT_EQ(r_end.finish_reason, FinishReason::cancelled);
    EXPECT_LT(r_end.tokens.size(), 299u);
    for (const std::int64_t rows : settled_kv_rows(*server)) EXPECT_EQ(rows, 0);
    EXPECT_EQ(server->metrics().requests_cancelled, 2);
  }
  for (const bool drain : {false, true}) {
    Running server(small_spec(*w, 2, 2, 1, 320), disaggregated(2));
    const auto a = server->submit(greedy(test::random_tokens(rng, 10, 64), 60));
    const auto b = server->submit(greedy(test::random_tokens(rng, 10, 64), 20));
    ASSERT_TRUE(a->next(10s).has_value());
    server.stop(drain);
    const StreamUpdate ua = drain_stream(*a), ub = drain_stream(*b);
    EXPECT_EQ(ua.finish_reason, drain ? FinishReason::length : FinishReason::cancelled);
    EXPECT_EQ(ub.finish_reason, drain ? FinishReason::length : FinishReason::cancelled);
    if (drain) {
      EXPECT_EQ(ub.tokens.size(), 20u);
    }
  }
}

TEST(DisaggregatedServing, RefusesWhatItCannotMove) {
  const auto w = make_synthetic_weights(44);
  EXPECT_TRUE(
      test::throws_error([&] { ServingDeployment(small_spec(*w, 1, 1), disaggregated(-1)); },
                         ErrorCategory::invalid_argument, "prefill_dcp_size = -1"));
  // Prefill DCP 2 -> decode DCP 3: neither equal sizes nor a DCP 1 prefill.
  EXPECT_TRUE(test::throws_error([&] { ServingDeployment(small_spec(*w, 3, 3), disaggregated(2)); },
                                 ErrorCategory::invalid_argument,
                                 "prefill DCP size 2 -> decode DCP size 3"));
  DeploymentSpec odd_page = small_spec(*w, 2, 2);
  odd_page.model_options.kv_interleave = 2;
  // Interleave 2 over page 4: both groups stripe alike, so this one is served.
  Running served(odd_page, disaggregated(1));
  const StreamUpdate u = drain_stream(*served->submit(greedy({3, 4, 5, 6, 7}, 6)));
  EXPECT_EQ(u.tokens.size(), 6u);
}

}  // namespace
}  // namespace dcp
