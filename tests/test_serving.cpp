// The served deployment: requests from several threads, streamed tokens equal to a batch run's,
// cancellation freeing KV, the refusals a server must give, shutdown, DP replicas.
#include <gtest/gtest.h>

#include <algorithm>
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

TEST(Serving, StreamedTokensEqualABatchRunUnderConcurrentClients) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(21);
  std::vector<std::vector<std::int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(test::random_tokens(rng, 9 + 7 * i, 64));
  for (const auto [tp, dcp, dp] : {std::array{2, 2, 1}, std::array{1, 1, 2}}) {
    DeploymentSpec batch = small_spec(*w, tp, dcp, dp);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      RequestSpec r;
      r.id = static_cast<RequestId>(i);
      r.prompt = prompts[i];
      r.max_new_tokens = 10;
      batch.requests.push_back(r);
    }
    const DeploymentReport want = run_deployment(batch).report;
    Running server(small_spec(*w, tp, dcp, dp));
    std::vector<StreamUpdate> got(prompts.size());
    std::vector<int> updates(prompts.size(), 0);
    std::vector<std::thread> clients;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      clients.emplace_back([&, i] {
        std::this_thread::sleep_for(std::chrono::milliseconds(3 * i));  // arrivals spread out
        const auto stream = server->submit(greedy(prompts[i], 10));
        got[i] = drain_stream(*stream, &updates[i]);
      });
    }
    for (auto& c : clients) c.join();
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want.results[i].output_tokens)
          << "TP " << tp << " DCP " << dcp << " DP " << dp << " request " << i;
      EXPECT_EQ(got[i].finish_reason, FinishReason::length);
    }
    // Tokens stream step by step. One client may be descheduled for its whole request on a loaded
    // host and find all its tokens merged into one update; all six cannot unless nothing streams.
    int total_updates = 0;
    for (const int u : updates) total_updates += u;
    EXPECT_GT(total_updates, static_cast<int>(prompts.size()))
        << "tokens should stream step by step";
    const ServeMetrics m = server->metrics();
    EXPECT_EQ(m.requests_finished, 6);
    EXPECT_EQ(m.generation_tokens, 60);
    EXPECT_EQ(m.time_to_first_token.count, 6);
    EXPECT_EQ(m.inter_token_latency.count, 54);
    EXPECT_EQ(m.request_latency.count, 6);  // each request's from arrival to its last token:
    EXPECT_GE(m.request_latency.sum_s, m.time_to_first_token.sum_s);  // its first, then more
  }
}

TEST(Serving, SeededSamplingGivesTheSameTextUnderAnyDcpSizeAndAnExactDraft) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(22);
  ServeRequest r = greedy(test::random_tokens(rng, 30, 64), 16);
  r.sampling.temperature = 0.8;
  r.sampling.top_p = 0.9;
  r.sampling.top_k = 20;
  r.sampling.seed = 12345;
  r.logprobs = 3;
  std::vector<std::vector<std::int32_t>> outs;
  for (int dcp : {1, 2}) {
    Running server(small_spec(*w, 2, dcp));
    const StreamUpdate u = drain_stream(*server->submit(r));
    EXPECT_EQ(u.logprobs.size(), u.tokens.size());
    EXPECT_EQ(u.spec_verify_steps, 0) << "no draft, no verifying steps";
    outs.push_back(u.tokens);
  }
  EXPECT_EQ(outs[0], outs[1]);
  // Speculative sampling: with the target as its own draft every draft is kept and the text is
  // the same; with its first layer as the draft the request is served to its length.
  for (const int layers : {2, 1}) {
    DeploymentSpec spec = small_spec(*w, 2, 2);
    spec.engine.num_draft_tokens = 3;
    spec.draft.emplace();
    spec.draft->config = preset_config("tiny", layers);
    spec.draft->weights = w.get();
    Running server(spec);
    const StreamUpdate u = drain_stream(*server->submit(r));
    EXPECT_TRUE(u.error.empty()) << u.error;
    EXPECT_EQ(u.logprobs.size(), u.tokens.size());
    const ServeMetrics m = server->metrics();
    EXPECT_GT(m.spec_verifications, 0);
    EXPECT_GE(m.spec_proposed, m.spec_verifications);
    if (layers == 2) {
      EXPECT_EQ(u.tokens, outs[0]) << "a draft that is the target";
      EXPECT_EQ(m.spec_accepted, m.spec_proposed);
      EXPECT_EQ(u.spec_verify_steps, 4) << "15 tokens after the first, 4 a step";
    } else {
      EXPECT_EQ(u.tokens.size(), 16u);
      EXPECT_LE(m.spec_accepted, m.spec_proposed);
      EXPECT_GE(u.spec_verify_steps, 4);
      EXPECT_LE(u.spec_verify_steps, 15);
    }
    // Each verifying step emitted its kept drafts and one token more; the prefill the first, and
    // a last step with one token left (no draft) may add one.
    EXPECT_GE(m.generation_tokens, 1 + m.spec_verifications + m.spec_accepted);
    EXPECT_LE(m.generation_tokens, 2 + m.spec_verifications + m.spec_accepted);
  }
}

// With the prefix cache, the choices of one prompt go to one DP replica, which computes the
// prompt's whole pages once (the first choice's prefill; the others wait for them): the served
// tokens are those without the cache, and every choice but the first reports the pages it reused.
TEST(Serving, ChoicesOfOnePromptShareItsPrefillOnOneReplica) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(23);
  ServeRequest r = greedy(test::random_tokens(rng, 41, 64), 6);
  r.sampling.temperature = 1;
  for (const auto [tp, dcp, dp] : {std::array{1, 1, 2}, std::array{2, 2, 2}}) {
    const std::string what =
        "TP " + std::to_string(tp) + " DCP " + std::to_string(dcp) + " DP " + std::to_string(dp);
    std::vector<std::vector<std::int32_t>> want;
    for (const bool cache : {false, true}) {
      DeploymentSpec spec = small_spec(*w, tp, dcp, dp);
      spec.engine.enable_prefix_cache = cache;
      Running server(spec);
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (std::uint64_t i = 0; i < 3; ++i) {  // as the server submits a request's n choices
        r.sampling.seed = 100 + i;
        streams.push_back(server->submit(r));
      }
      for (std::size_t i = 0; i < streams.size(); ++i) {
        const StreamUpdate u = drain_stream(*streams[i]);
        if (!cache) {
          want.push_back(u.tokens);
          EXPECT_EQ(u.cached_prompt_tokens, 0) << what;
          continue;
        }
        EXPECT_EQ(u.tokens, want[i]) << what << " choice " << i;
        const std::int64_t vp = 4LL * dcp;  // page 4 x DCP
        EXPECT_EQ(u.cached_prompt_tokens, i == 0 ? 0 : 40 / vp * vp) << what << " choice " << i;
      }
    }
  }
}

// With the prefix cache, a conversation's next turn goes to the DP replica that served its last
// one, whose cache holds it (prompt and reply), even when load alone would send it elsewhere.
TEST(Serving, AConversationsNextTurnGoesToTheReplicaHoldingItsPrefix) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(24);
  const std::vector<std::int32_t> a1 = test::random_tokens(rng, 30, 64);
  const std::vector<std::int32_t> b1 = test::random_tokens(rng, 30, 64);
  for (const auto [tp, dcp, dp] : {std::array{1, 1, 2}, std::array{2, 2, 2}}) {
    const std::string what =
        "TP " + std::to_string(tp) + " DCP " + std::to_string(dcp) + " DP " + std::to_string(dp);
    DeploymentSpec spec = small_spec(*w, tp, dcp, dp);
    spec.engine.enable_prefix_cache = true;
    Running server(spec);
    // Turn 1, together: a to the first replica, b to the second (both empty).
    const auto sa = server->submit(greedy(a1, 4));
    const auto sb = server->submit(greedy(b1, 4));
    const StreamUpdate ra = drain_stream(*sa), rb = drain_stream(*sb);
    // Turn 2, b's first: by load (both replicas idle again) it would go to the first replica.
    const auto next = [&](std::vector<std::int32_t> p, const StreamUpdate& reply) {
      p.insert(p.end(), reply.tokens.begin(), reply.tokens.end());
      const std::vector<std::int32_t> more = test::random_tokens(rng, 6, 64);
      p.insert(p.end(), more.begin(), more.end());
      return greedy(p, 4);
    };
    const auto sb2 = server->submit(next(b1, rb));
    const StreamUpdate rb2 = drain_stream(*sb2);
    const auto sa2 = server->submit(next(a1, ra));
    const StreamUpdate ra2 = drain_stream(*sa2);
    // Page 4 x DCP: the whole pages of the first turn's prompt and reply (but its last token,
    // which never entered the KV).
    const std::int64_t vp = 4LL * dcp;
    const auto turn = [](const StreamUpdate& r) {
      return 30 + static_cast<std::int64_t>(r.tokens.size()) - 1;
    };
    EXPECT_EQ(rb2.cached_prompt_tokens, turn(rb) / vp * vp) << what;
    EXPECT_EQ(ra2.cached_prompt_tokens, turn(ra) / vp * vp) << what;
    // The server's counters add both replicas' caches: every prompt looked up, both hits.
    const ServeMetrics m = server->metrics();
    EXPECT_EQ(m.prefix_cache.hit, rb2.cached_prompt_tokens + ra2.cached_prompt_tokens) << what;
    EXPECT_EQ(m.prefix_cache.lookup, 2 * 30 + (turn(ra) + 1 + 6) + (turn(rb) + 1 + 6)) << what;
    // Each replica holds one conversation's pages: its second turn's prompt and reply but the last.
    const auto held = [&](const StreamUpdate& first, const StreamUpdate& second) {
      return (turn(first) + 1 + 6 + static_cast<std::int64_t>(second.tokens.size()) - 1) / vp * vp;
    };
    EXPECT_EQ(m.prefix_cache.on_device, held(ra, ra2) + held(rb, rb2)) << what;
  }
}

// reset_prefix_cache: every replica's cache forgets its pages before the next step, so the next
// request finds nothing cached and computes the same tokens; the cache fills again after it.
// Without the cache the call is refused by name.
TEST(Serving, AResetPrefixCacheForgetsEveryReplicasPages) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(25);
  const std::vector<std::int32_t> a = test::random_tokens(rng, 30, 64);
  const std::vector<std::int32_t> b = test::random_tokens(rng, 30, 64);
  DeploymentSpec spec = small_spec(*w, 2, 2, 2);
  spec.engine.enable_prefix_cache = true;
  Running server(spec);
  // Both prompts at once: one replica each (by load), which then caches it.
  const auto both = [&] {
    const auto sa = server->submit(greedy(a, 4));
    const auto sb = server->submit(greedy(b, 4));
    return std::pair{drain_stream(*sa), drain_stream(*sb)};
  };
  const auto [a1, b1] = both();
  const std::int64_t whole = 29 / 8 * 8;  // pages of 4 x DCP 2, the last token left
  const auto [a_hit, b_hit] = both();
  EXPECT_EQ(a_hit.cached_prompt_tokens, whole);
  EXPECT_EQ(b_hit.cached_prompt_tokens, whole);
  const std::int64_t hits = server->metrics().prefix_cache.hit;
  server->reset_prefix_cache();
  const auto [a2, b2] = both();
  EXPECT_EQ(a2.cached_prompt_tokens, 0);
  EXPECT_EQ(b2.cached_prompt_tokens, 0);
  EXPECT_EQ(a2.tokens, a1.tokens);
  EXPECT_EQ(b2.tokens, b1.tokens);
  EXPECT_EQ(server->metrics().prefix_cache.hit, hits);
  EXPECT_EQ(both().first.cached_prompt_tokens, whole);  // cached again after the reset

  DeploymentSpec off = small_spec(*w, 1, 1);
  Running plain(off);
  EXPECT_TRUE(test::throws_error([&] { plain->reset_prefix_cache(); },
                                 ErrorCategory::invalid_argument, "enable_prefix_cache"));
}

// The request run as a batch on the deployment the tests below serve (TP 2, DCP 2, DP 2).
DeploymentReport batch_run(const WeightSource& w, const ServeRequest& r) {
  DeploymentSpec batch = small_spec(w, 2, 2, 2);
  batch.requests.push_back(r.spec(0));
  return run_deployment(batch).report;
}

// Penalties, biases, masks and min_tokens travel with the request to every rank: the served tokens
// equal a batch run's with the same parameters (and differ from the plain request's).
// The metrics follow the cache's pages across its tiers: a replica of 8 pages (4 x DCP 2 tokens)
// and a host tier of 4 caches a prompt, has it pushed to the host tier by a second, brings it back
// for a hit, and loses pages for good to a third prompt that needs the whole device. Every page a
// finished request cached is on the device, on the host, or dropped: the tokens of the three stay
// the page arithmetic of the prompts. (The sum over DP replicas: the conversation test above.)
TEST(Serving, TheMetricsFollowThePrefixCachesPagesAcrossTiers) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(26);
  DeploymentSpec spec = small_spec(*w, 2, 2, 1, 64);
  spec.engine.enable_prefix_cache = true;
  spec.engine.host_kv_capacity_tokens = 32;
  Running server(spec);
  const auto run = [&](const std::vector<std::int32_t>& prompt) {
    return drain_stream(*server->submit(greedy(prompt, 1)));
  };
  // A prompt of 33 tokens with one new token leaves its 4 whole pages of 8; 57 tokens leave 7.
  const auto a = test::random_tokens(rng, 33, 64), b = test::random_tokens(rng, 33, 64),
             c = test::random_tokens(rng, 57, 64);
  run(a);
  PrefixCacheTokens m = server->metrics().prefix_cache;
  EXPECT_EQ(m.on_device, 32);
  EXPECT_EQ(m.on_host + m.offloaded + m.reloaded + m.dropped, 0);

  run(b);  // 5 pages, 4 free: some of a's pages go to the host tier, which has room
  m = server->metrics().prefix_cache;
  EXPECT_EQ(m.on_device + m.on_host, 32 + 32);
  EXPECT_GT(m.on_host, 0);
  EXPECT_EQ(m.offloaded, m.on_host);
  EXPECT_EQ(m.dropped + m.reloaded, 0);

  const std::int64_t a_on_host = m.on_host;
  EXPECT_EQ(run(a).cached_prompt_tokens, 32);  // all a's host pages back (b's go out for them)
  m = server->metrics().prefix_cache;
  EXPECT_EQ(m.reloaded, a_on_host);
  EXPECT_GT(m.offloaded, a_on_host);
  EXPECT_EQ(m.on_device + m.on_host, 32 + 32);
  EXPECT_EQ(m.dropped, 0);
  EXPECT_EQ(m.hit, 32);

  run(c);  // 8 pages: all 8 cached pages leave the device, and 4 host slots hold at most 4
  m = server->metrics().prefix_cache;
  EXPECT_EQ(m.on_device, 56);
  EXPECT_LE(m.on_host, 32);
  EXPECT_GE(m.dropped, 32);
  EXPECT_EQ(m.on_device + m.on_host + m.dropped, 32 + 32 + 56);
  EXPECT_EQ(m.lookup, 33 + 33 + 33 + 57);
}

TEST(Serving, PenaltiesBiasMasksAndMinTokensReachEveryRank) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(25);
  ServeRequest r = greedy(test::random_tokens(rng, 20, 64), 12);
  r.sampling.repetition_penalty = 0.6;
  r.sampling.presence_penalty = -1.5;
  r.sampling.frequency_penalty = -0.5;
  r.sampling.logit_bias = {{r.prompt[3], 8.0}, {r.prompt[5], -100.0}};
  const DeploymentReport want = batch_run(*w, r);
  Running server(small_spec(*w, 2, 2, 2));
  EXPECT_EQ(drain_stream(*server->submit(r)).tokens, want.results[0].output_tokens);
  const std::vector<std::int32_t> plain =
      drain_stream(*server->submit(greedy(r.prompt, 12))).tokens;
  EXPECT_NE(plain, want.results[0].output_tokens);
  // Masks: the plain request's first token banned, and a pair of its next; only the tokens of the
  // first one's parity allowed (so that it is the bad word that bans it).
  ServeRequest masked = greedy(r.prompt, 12);
  masked.sampling.bad_words = {{plain[0]}, {plain[1], plain[2]}};
  for (int t = plain[0] % 2; t < server->config().vocab_size; t += 2)
    masked.sampling.allowed_token_ids.push_back(t);
  const DeploymentReport masked_want = batch_run(*w, masked);
  EXPECT_EQ(drain_stream(*server->submit(masked)).tokens, masked_want.results[0].output_tokens);
  for (std::int32_t t : masked_want.results[0].output_tokens) {
    EXPECT_EQ(t % 2, plain[0] % 2);
    EXPECT_NE(t, plain[0]);
  }
  // Guided choices: the plain request's first token only in a choice it cannot win.
  ServeRequest guided = greedy(r.prompt, 12);
  guided.sampling.choices = {{plain[1], 5, 6}, {plain[2], 7}, {plain[0], 9, 9, 9, 9, 9, 9, 9, 9}};
  const DeploymentReport guided_want = batch_run(*w, guided);
  const StreamUpdate g = drain_stream(*server->submit(guided));
  EXPECT_EQ(g.tokens, guided_want.results[0].output_tokens);
  EXPECT_EQ(g.finish_reason, FinishReason::stop);
  if (plain[0] != plain[1] && plain[0] != plain[2]) {  // greedy takes plain[0], then is forced
    EXPECT_EQ(g.tokens, guided.sampling.choices[2]);
  }
  // min_tokens: a token biased to be chosen at every step is also a stop token; it is held back
  // for the first 3 steps, chosen and ends the request at the fourth.
  ServeRequest held = greedy(r.prompt, 12);
  held.sampling.logit_bias = {{9, 100.0}};
  held.stop_token_ids = {9};
  held.min_tokens = 3;
  const StreamUpdate u = drain_stream(*server->submit(held));
  ASSERT_EQ(u.tokens.size(), 4u);
  EXPECT_EQ(std::count(u.tokens.begin(), u.tokens.end(), 9), 1);
  EXPECT_EQ(u.tokens.back(), 9);
  EXPECT_EQ(u.finish_reason, FinishReason::stop);
}

// A regex travels with the request to every rank (each rank masks by its own copy of the
// vocabulary's bytes): the served tokens equal a batch run's and differ from the unguided ones.
TEST(Serving, RegexReachesEveryRank) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(25);
  DeploymentSpec spec = small_spec(*w, 2, 2, 2);
  std::vector<std::optional<std::string>> texts(
      static_cast<std::size_t>(spec.model.config.vocab_size));
  for (std::size_t t = 1; t < texts.size(); ++t)  // one letter, or two for every third id past 26
    texts[t] = std::string(1, static_cast<char>('a' + t % 26)) +
               (t >= 26 && t % 3 == 0 ? std::string(1, static_cast<char>('a' + t / 26 % 26)) : "");
  spec.engine.guide_vocabulary = std::make_shared<const GuideVocabulary>(texts);
  ServeRequest r = greedy(test::random_tokens(rng, 20, 64), 12);
  r.sampling.regex = "(ab|cd)+e?";
  r.stop_token_ids = {0};
  DeploymentSpec batch = spec;
  batch.requests.push_back(r.spec(0));
  const DeploymentReport want = run_deployment(batch).report;
  {
    Running server(spec);
    const StreamUpdate u = drain_stream(*server->submit(r));
    EXPECT_EQ(u.tokens, want.results[0].output_tokens);
    EXPECT_NE(u.tokens, drain_stream(*server->submit(greedy(r.prompt, 12))).tokens);
    std::string text;
    for (std::int32_t t : u.tokens)
      if (t != 0) text += *texts[static_cast<std::size_t>(t)];
    EXPECT_TRUE(text.starts_with("ab") || text.starts_with("cd")) << text;
  }
  // A deployment without the vocabulary's bytes refuses the request and keeps serving.
  Running bare(small_spec(*w, 2, 2, 2));
  try {
    bare->submit(r);
    ADD_FAILURE() << "a regex was accepted without a vocabulary";
  } catch (const RefusedError& e) {
    EXPECT_EQ(e.why(), Refusal::invalid);
    EXPECT_STREQ(e.what(),
                 "'regex' needs the vocabulary's bytes (a tokenizer); this engine has none");
  }
  EXPECT_EQ(drain_stream(*bare->submit(greedy(r.prompt, 3))).tokens.size(), 3u);
}

// guide_after travels with the request too: two at once (one per DP replica) equal a batch run's,
// free through the marker (the unguided reply's first two tokens) and guided after it.
TEST(Serving, GuideAfterReachesEveryRank) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(25);
  DeploymentSpec spec = small_spec(*w, 2, 2, 2);
  std::vector<std::optional<std::string>> texts(
      static_cast<std::size_t>(spec.model.config.vocab_size));
  for (std::size_t t = 1; t < texts.size(); ++t) texts[t] = std::string(1, 'a' + t % 26);
  spec.engine.guide_vocabulary = std::make_shared<const GuideVocabulary>(texts);
  ServeRequest r = greedy({}, 12);
  r.sampling.regex = "(ab|cd)+e?";
  r.stop_token_ids = {0};
  Running server(spec);
  // A prompt whose unguided reply does not open with the stop token, which would end the guided
  // request inside its marker.
  std::vector<std::int32_t> free;
  const auto marker_free_of_stop = [&] { return free.size() >= 2 && free[0] != 0 && free[1] != 0; };
  for (int tries = 0; tries < 20 && !marker_free_of_stop(); ++tries) {
    r.prompt = test::random_tokens(rng, 20, 64);
    free = drain_stream(*server->submit(greedy(r.prompt, 12))).tokens;
  }
  ASSERT_TRUE(marker_free_of_stop());
  r.sampling.guide_after = {free[0], free[1]};
  DeploymentSpec batch = spec;
  batch.requests.push_back(r.spec(0));
  const std::vector<std::int32_t> want = run_deployment(batch).report.results[0].output_tokens;
  ASSERT_GT(want.size(), 2u);
  EXPECT_EQ(want[0], free[0]);
  EXPECT_EQ(want[1], free[1]);
  const std::string after = *texts[static_cast<std::size_t>(want[2])];
  EXPECT_TRUE(after == "a" || after == "c") << after;
  const auto a = server->submit(r), b = server->submit(r);
  EXPECT_EQ(drain_stream(*a).tokens, want);
  EXPECT_EQ(drain_stream(*b).tokens, want);
}

// Prompt logprobs reach the client whole, with the first tokens: equal to a batch run's.
TEST(Serving, PromptLogprobsArriveWithTheFirstUpdate) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(26);
  ServeRequest r = greedy(test::random_tokens(rng, 37, 64), 4);
  r.prompt_logprobs = 2;
  const DeploymentReport want = batch_run(*w, r);
  const std::vector<StepLogprobs>& expect = want.results[0].prompt_logprobs;
  ASSERT_EQ(expect.size(), r.prompt.size() - 1);
  Running server(small_spec(*w, 2, 2, 2));
  const StreamUpdate u = drain_stream(*server->submit(r));
  EXPECT_EQ(u.tokens, want.results[0].output_tokens);
  ASSERT_EQ(u.prompt_logprobs.size(), expect.size());
  for (std::size_t p = 0; p < expect.size(); ++p) {
    EXPECT_EQ(u.prompt_logprobs[p].chosen.token, r.prompt[p + 1]);
    EXPECT_NEAR(u.prompt_logprobs[p].chosen.logprob, expect[p].chosen.logprob, 1e-4);
    ASSERT_EQ(u.prompt_logprobs[p].top.size(), 2u);
    EXPECT_EQ(u.prompt_logprobs[p].top[0].token, expect[p].top[0].token);
  }
  EXPECT_TRUE(drain_stream(*server->submit(greedy(r.prompt, 2))).prompt_logprobs.empty());
}

TEST(Serving, CancelFreesTheKvWithinAStepAndTheOthersFinish) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(23);
  Running server(small_spec(*w, 2, 2));
  const auto victim = server->submit(greedy(test::random_tokens(rng, 40, 64), 400));
  const auto other = server->submit(greedy(test::random_tokens(rng, 12, 64), 30));
  ASSERT_TRUE(victim->next(10s).has_value());
  victim->cancel();
  const StreamUpdate v = drain_stream(*victim);
  EXPECT_EQ(v.finish_reason, FinishReason::cancelled);
  const StreamUpdate o = drain_stream(*other);
  EXPECT_EQ(o.finish_reason, FinishReason::length);
  EXPECT_EQ(o.tokens.size(), 30u);
  for (int i = 0; i < 200 && server->metrics().kv_rows_used[0] != 0; ++i)
    std::this_thread::sleep_for(5ms);
  const ServeMetrics m = server->metrics();
  for (std::int64_t rows : m.kv_rows_used) EXPECT_EQ(rows, 0) << "KV still held";
  EXPECT_EQ(m.requests_cancelled, 1);
  EXPECT_GT(m.kv_rows_capacity[0], 0);
}

// `r` is refused for `why`, the message holding `text`; the deployment is unchanged.
void expect_refusal(ServingDeployment& server, const ServeRequest& r, Refusal why,
                    const char* text) {
  try {
    server.submit(r);
    ADD_FAILURE() << "accepted: " << text;
  } catch (const RefusedError& e) {
    EXPECT_EQ(e.why(), why) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

// max_model_len bounds a request's prompt and new tokens below the KV cache's capacity, and may
// not pass the model's max_position_embeddings.
TEST(Serving, MaxModelLenBoundsPromptAndNewTokens) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(25);
  ServeOptions o;
  o.max_model_len = 40;
  Running server(small_spec(*w, 1, 1, 1, 512), o);
  EXPECT_EQ(server->context_tokens(), 40);
  expect_refusal(*server, greedy(test::random_tokens(rng, 40, 64), 1), Refusal::past_context,
                 "the prompt holds 40 tokens; the model's context is 40 tokens");
  expect_refusal(*server, greedy(test::random_tokens(rng, 30, 64), 11), Refusal::invalid,
                 "exceeds the context of 40 tokens (at most 10; max_model_len)");
  const auto s = server->submit(greedy(test::random_tokens(rng, 30, 64), 10));
  std::size_t tokens = 0;
  for (int i = 0; i < 2000; ++i) {
    const auto u = s->next(std::chrono::milliseconds(50));
    if (!u) continue;
    tokens += u->tokens.size();
    if (u->finished) break;
  }
  EXPECT_EQ(tokens, 10u);
  const int positions = preset_config("tiny", 2).max_position_embeddings;
  for (std::int64_t bad : {std::int64_t{-1}, std::int64_t{positions} + 1}) {
    ServeOptions too = o;
    too.max_model_len = bad;
    EXPECT_TRUE(test::throws_error([&] { ServingDeployment(small_spec(*w, 1, 1), too); },
                                   ErrorCategory::invalid_argument,
                                   str("max_model_len = ", bad, " must be in [1, ")))
        << bad;
  }
}

TEST(Serving, RefusesWhatItCannotServeAndKeepsServing) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(24);
  ServeOptions o;
  o.max_queued_requests = 1;
  // 512 tokens of KV: the request that fills it then runs for ~480 steps, so it is still running
  // while the next two are submitted, however fast the CPU (with 64, 30 steps were a few ms).
  Running server(small_spec(*w, 1, 1, 1, 512), o);
  const std::int64_t cap = server->kv_capacity_tokens();
  ASSERT_GE(cap, 512);
  expect_refusal(*server, greedy(test::random_tokens(rng, static_cast<int>(cap), 64), 1), Refusal::too_long,
                 "the KV cache holds");
  expect_refusal(*server, greedy(test::random_tokens(rng, 10, 64), static_cast<int>(cap)), Refusal::invalid,
                 "exceeds the context");
  expect_refusal(*server, greedy({}, 3), Refusal::invalid, "at least one token");
  expect_refusal(*server, greedy({server->config().vocab_size}, 3), Refusal::invalid,
                 "outside the vocabulary");
  expect_refusal(*server, greedy({1}, 0), Refusal::invalid, "max_tokens = 0");
  ServeRequest hot = greedy({1, 2}, 3);
  hot.sampling.top_p = 0;
  expect_refusal(*server, hot, Refusal::invalid, "top_p");
  ServeRequest biased = greedy({1, 2}, 3);
  biased.sampling.logit_bias[server->config().vocab_size] = 2;
  expect_refusal(*server, biased, Refusal::invalid, "logit_bias: token 512 is outside the vocabulary");
  ServeRequest held = greedy({1, 2}, 3);
  held.min_tokens = 4;
  expect_refusal(*server, held, Refusal::invalid, "min_tokens = 4 must be in [0, max_tokens = 3]");
  ServeRequest scored = greedy({1, 2}, 3);
  scored.prompt_logprobs = 21;
  expect_refusal(*server, scored, Refusal::invalid, "prompt_logprobs = 21 must be in [0, 20]");
  // One request takes nearly the whole cache; the next waits; a third is past the queue bound.
  const auto big =
      server->submit(greedy(test::random_tokens(rng, 30, 64), static_cast<int>(cap) - 34));
  // Its first update says it runs. On a loaded machine the server may finish it before this
  // thread reads, and then that first update is also its last: draining again would wait on an
  // ended stream.
  const std::optional<StreamUpdate> first = big->next(10s);
  ASSERT_TRUE(first.has_value());
  const auto queued = server->submit(greedy(test::random_tokens(rng, 30, 64), 8));
  expect_refusal(*server, greedy({1, 2}, 2), Refusal::queue_full, "retry later");
  EXPECT_EQ((first->finished ? *first : drain_stream(*big)).finish_reason, FinishReason::length);
  EXPECT_EQ(drain_stream(*queued).tokens.size(), 8u);
  EXPECT_EQ(drain_stream(*server->submit(greedy({5, 6, 7}, 4))).tokens.size(), 4u);
  server.stop(true);
  expect_refusal(*server, greedy({1, 2}, 2), Refusal::shutting_down, "shutting down");
}

// A server keeps no record that grows with its steps: whatever the spec asks, its engines keep
// neither logit rows nor each step's timings (Engine.StepTimingsAreKeptOnlyWhenAsked).
TEST(Serving, KeepsNoRecordThatGrowsWithItsSteps) {
  const auto w = make_synthetic_weights(27);
  DeploymentSpec spec = small_spec(*w, 2, 2);
  spec.engine.record_logits = true;
  spec.engine.record_step_timings = true;
  Running server(spec);
  EXPECT_FALSE(server->engine_options().record_logits);
  EXPECT_FALSE(server->engine_options().record_step_timings);
  const StreamUpdate u = drain_stream(*server->submit(greedy({5, 6, 7}, 4)));
  EXPECT_EQ(u.tokens.size(), 4u);
}

TEST(Serving, ShutdownCancelsOrDrainsTheRequestsInFlight) {
  auto rng = test::make_rng();
  const auto w = make_synthetic_weights(25);
  for (const bool drain : {false, true}) {
    Running server(small_spec(*w, 2, 2));
    // Cancelled: long enough that it cannot end before stop() even when this thread loses its
    // core for a while (60 tokens could, on a loaded machine, and then finish by length).
    const auto s = server->submit(greedy(test::random_tokens(rng, 20, 64), drain ? 60 : 2000));
    ASSERT_TRUE(s->next(10s).has_value());
    server.stop(drain);
    const StreamUpdate u = drain_stream(*s);
    EXPECT_EQ(u.finish_reason, drain ? FinishReason::length : FinishReason::cancelled);
  }
}

}  // namespace
}  // namespace dcp
