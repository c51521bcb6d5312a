// The engine: scheduling, admission by KV capacity, request validation, and the KV it grows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "dcp/deployment.h"
#include "dcp/engine.h"
#include "dcp/error.h"
#include "dcp/layout.h"
#include "dcp/model.h"
#include "dcp/weights.h"
#include "engine_util.h"
#include "test_util.h"

namespace dcp {
namespace {

using test::EngineRun;
using test::EngineSetup;
using test::random_tokens;
using test::request;
using test::run_engine;

TEST(Engine, FullKvCacheQueuesAndRejectsWithoutCorruption) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 1);
  const auto w = make_synthetic_weights(9);
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 5; ++i)
    reqs.push_back(request(i, random_tokens(rng, 40 + 11 * i, c.vocab_size), 6));
  EngineSetup s;
  s.tp = 2;
  s.dcp = 2;
  s.page_size = 8;
  const EngineRun ample = run_engine(c, *w, s, reqs);
  s.capacity = 160;  // room for about two requests at a time
  auto with_huge = reqs;
  with_huge.push_back(request(99, random_tokens(rng, 300, c.vocab_size), 4));  // can never fit
  const EngineRun tight = run_engine(c, *w, s, with_huge);
  EXPECT_GT(tight.stats.max_queue, 0) << "requests should have waited for KV";
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(tight.results[i].state, RequestState::finished);
    EXPECT_TRUE(
        test::same_greedy_run(tight.results[i], ample.results[i], c.vocab_size, {1e-10, 1e-4}))
        << "request " << i;
  }
  EXPECT_EQ(tight.results.back().state, RequestState::rejected);
  EXPECT_NE(tight.results.back().error.find("raise kv_capacity_tokens"), std::string::npos)
      << tight.results.back().error;
}

TEST(Engine, RejectsInvalidRequestsNamingThemAndChangingNothing) {
  const ModelConfig c = preset_config("tiny", 1);
  const auto w = make_synthetic_weights(1);
  const Topology topo = resolve(ParallelConfig{});
  ModelSource src;
  src.config = c;
  src.weights = w.get();
  ModelOptions mo;
  mo.kv_capacity_tokens = 256;
  LaunchOptions lo;
  launch_ranks(lo, [&](Communicator& world, bool) {
    RankSystem sys(world, topo, src, mo, EngineOptions{});
    Engine& engine = sys.engine();
    using test::throws_error;
    const auto bad = ErrorCategory::invalid_argument;
    EXPECT_TRUE(throws_error([&] { engine.submit(request(1, {}, 3)); }, bad,
                             "request 1: the prompt must hold >= 1 token"));
    EXPECT_TRUE(throws_error(
        [&] {
          engine.submit(request(1, {1, 2}, 0));
        },
        bad, "request 1: max_new_tokens = 0 must be >= 1"));
    EXPECT_TRUE(throws_error(
        [&] {
          engine.submit(request(1, {1, c.vocab_size}, 3));
        },
        bad, "is outside the vocabulary"));
    RequestSpec biased = request(1, {1, 2}, 3);
    biased.sampling.logit_bias[c.vocab_size] = 1;
    EXPECT_TRUE(throws_error([&] { engine.submit(biased); }, bad,
                             "request 1: logit_bias: token 512 is outside the vocabulary"));
    RequestSpec scored = request(1, {1, 2}, 3);
    scored.prompt_logprobs = 21;
    EXPECT_TRUE(throws_error([&] { engine.submit(scored); }, bad,
                             "request 1: prompt_logprobs = 21 must be in [0, 20] (-1: none)"));
    scored.prompt_logprobs = 0;
    scored.prompt_logprobs_start = 3;
    EXPECT_TRUE(throws_error([&] { engine.submit(scored); }, bad,
                             "request 1: prompt_logprobs_start = 3 must be in [0, 2]"));
    RequestSpec continued = request(1, {1, 2}, 3);
    continued.continue_from = 0;
    continued.sampling.repetition_penalty = 1.1;
    EXPECT_TRUE(throws_error([&] { engine.submit(continued); }, bad,
                             "request 1: repetition_penalty does not combine with continue_from"));
    continued.sampling.repetition_penalty = 1;
    continued.prompt_logprobs = 0;
    EXPECT_TRUE(throws_error([&] { engine.submit(continued); }, bad,
                             "request 1: prompt_logprobs does not combine with continue_from"));
    EXPECT_TRUE(engine.results().empty()) << "a refused request left a result behind";
    EXPECT_EQ(engine.waiting(), 0);
    engine.submit(request(1, {1, 2}, 2));
    EXPECT_TRUE(throws_error([&] { engine.submit(request(1, {3}, 2)); }, bad,
                             "request id 1 was already submitted"));
    EXPECT_EQ(engine.waiting(), 1);
    EXPECT_EQ(engine.prompt_tokens_total(), 2);
    engine.run();
    ASSERT_EQ(engine.results().size(), 1u);
    EXPECT_EQ(engine.results()[0].output_tokens.size(), 2u);
    EXPECT_TRUE(sys.model().allocator().requests().empty()) << "finished requests hold KV";
  });
}

// A request that writes into a page it shares (a prefix page, after a rollback into it) gets a
// private copy first, in every layer: MlaModel::extend applies the allocator's copies.
TEST(Engine, GrowingIntoASharedPageCopiesItInEveryLayer) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(3);
  ParallelConfig pc;
  pc.tp_size = 2;
  pc.dcp_size = 2;
  const Topology topo = resolve(pc);
  ModelSource src;
  src.config = c;
  src.weights = w.get();
  ModelOptions mo;
  mo.kv_dtype = KvDtype::fp32;
  mo.page_size = 4;  // virtual pages of 8 tokens
  mo.kv_capacity_tokens = 64;
  const std::vector<std::int32_t> prompt = random_tokens(rng, 8, c.vocab_size);
  const std::vector<std::int32_t> more = random_tokens(rng, 2, c.vocab_size);
  launch_ranks({RankTransport::threads, 2, {}}, [&](Communicator& world, bool) {
    RankSystem sys(world, topo, src, mo, EngineOptions{});
    MlaModel& model = sys.model();
    KvAllocator& alloc = model.allocator();
    alloc.allocate(1, 0);
    model.extend(1, 8);
    ForwardBatch fill;
    fill.mode = ForwardMode::extend;
    fill.entries = {{1, 8}};
    fill.tokens = prompt;
    model.forward(fill);
    alloc.share_prefix(1, 2, 8);  // request 2 holds the same page
    std::vector<std::vector<float>> before;
    for (int l = 0; l < c.num_hidden_layers; ++l) before.push_back(model.kv_shard(l).local_rows(2));
    alloc.truncate(1, 6);  // request 1 rolls back into the shared page...
    model.extend(1, 2);    // ...and grows again: it must write a copy
    ForwardBatch step;
    step.mode = ForwardMode::decode;
    step.entries = {{1, 2}};
    step.tokens = more;
    model.forward(step);
    const std::size_t kept =
        static_cast<std::size_t>(layout::count(6, sys.dcp_group().rank(), 2) * c.latent_width());
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      EXPECT_EQ(model.kv_shard(l).local_rows(2), before[l])
          << "layer " << l << ": the sharer's prefix was overwritten";
      const std::vector<float> mine = model.kv_shard(l).local_rows(1);
      EXPECT_TRUE(std::equal(before[l].begin(), before[l].begin() + kept, mine.begin()))
          << "layer " << l << ": the private copy lacks the prefix rows";
    }
    EXPECT_NE(alloc.pages(1)[0], alloc.pages(2)[0]) << "no private copy was made";
    alloc.check_invariants();
  });
}

TEST(Engine, SampledTokensAreTheSameUnderAnyDcpSize) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(5);
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 3; ++i) {
    RequestSpec r = request(i, random_tokens(rng, 20 + 9 * i, c.vocab_size), 12);
    r.sampling.temperature = 0.9;
    r.sampling.top_p = 0.95;
    r.sampling.seed = 1000 + static_cast<std::uint64_t>(i);
    reqs.push_back(r);
  }
  EngineSetup s;
  s.tp = 2;
  s.page_size = 4;
  const EngineRun one = run_engine(c, *w, s, reqs);
  s.dcp = 2;
  const EngineRun two = run_engine(c, *w, s, reqs);
  auto reseeded = reqs;
  for (auto& r : reseeded) r.sampling.seed += 77;
  const EngineRun other = run_engine(c, *w, s, reseeded);
  int differ = 0;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(two.results[i].output_tokens, one.results[i].output_tokens) << "request " << i;
    EXPECT_EQ(two.results[i].finish_reason, FinishReason::length);
    differ += other.results[i].output_tokens != two.results[i].output_tokens;
  }
  EXPECT_GT(differ, 0) << "another seed drew the same tokens for every request";
}

// Penalties, biases and masks: each step's token is the greedy choice of that step's recorded
// logits adjusted as a float64 reference does it, given the prompt and the tokens before; the
// same tokens under DCP 2 and under speculative decoding (whose acceptance applies them too).
TEST(Engine, PenaltiesBiasAndMasksChooseFromTheAdjustedLogitsAtEveryStep) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(8);
  std::vector<RequestSpec> reqs, plain;
  for (int i = 0; i < 4; ++i) {
    RequestSpec r = request(i, random_tokens(rng, 5 + 23 * i, c.vocab_size), 14);
    plain.push_back(r);
    // Greedy decoding of a random model seldom repeats a token: penalties below 1 or 0 make it
    // favour the prompt's tokens (0) or its own (1), so that they change the tokens chosen.
    const double repetition[] = {0.5, 1.0, 1.6, 1.2}, presence[] = {0.0, -2.0, 0.7, 0.4},
                 frequency[] = {0.3, -1.5, 2.0, 0.0};
    r.sampling.repetition_penalty = repetition[i];
    r.sampling.presence_penalty = presence[i];
    r.sampling.frequency_penalty = frequency[i];
    if (i == 3) r.sampling.logit_bias = {{r.prompt[0], 30.0}, {7, -100.0}};
    reqs.push_back(r);
  }
  for (int i = 4; i < 6; ++i) {
    plain.push_back(request(i, random_tokens(rng, 17 + 9 * i, c.vocab_size), 14));
    reqs.push_back(plain.back());
  }
  EngineSetup s;
  s.tp = 2;
  s.page_size = 4;
  const EngineRun base = run_engine(c, *w, s, plain);
  // Masks taken from the unmasked tokens, so that they must change them: request 4 bans its
  // third token and the pair of its 7th and 8th; request 5 allows half the vocabulary, without
  // its first token.
  const std::vector<std::int32_t>& b4 = base.results[4].output_tokens;
  reqs[4].sampling.bad_words = {{b4[2]}, {b4[6], b4[7]}};
  for (int t = 0; t < c.vocab_size; t += 2) {
    if (t != base.results[5].output_tokens[0]) reqs[5].sampling.allowed_token_ids.push_back(t);
  }
  const EngineRun one = run_engine(c, *w, s, reqs);
  const int vocab = c.vocab_size;
  int changed = 0;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const RequestResult& r = one.results[i];
    const SamplingParams& p = reqs[i].sampling;
    ASSERT_EQ(r.step_logits.size(), r.output_tokens.size() * static_cast<std::size_t>(vocab));
    changed += r.output_tokens != base.results[i].output_tokens;
    for (std::size_t k = 0; k < r.output_tokens.size(); ++k) {
      std::vector<double> adjusted(r.step_logits.begin() + k * vocab,
                                   r.step_logits.begin() + (k + 1) * vocab);
      const std::vector<std::int32_t> before(r.output_tokens.begin(), r.output_tokens.begin() + k);
      for (int t = 0; t < vocab; ++t) {
        double& x = adjusted[static_cast<std::size_t>(t)];
        if (p.logit_bias.count(t)) x += p.logit_bias.at(t);
        const auto n = std::count(before.begin(), before.end(), t);
        if (n > 0 || std::count(reqs[i].prompt.begin(), reqs[i].prompt.end(), t) > 0)
          x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
        x -= p.frequency_penalty * static_cast<double>(n) + p.presence_penalty * (n > 0);
        const auto& allowed = p.allowed_token_ids;
        if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), t) == allowed.end())
          x = -INFINITY;
        for (const auto& word : p.bad_words) {
          if (word.back() == t && (word.size() == 1 || (k > 0 && before.back() == word[0])))
            x = -INFINITY;  // the test's words hold one or two tokens
        }
      }
      const auto best = std::max_element(adjusted.begin(), adjusted.end()) - adjusted.begin();
      EXPECT_EQ(r.output_tokens[k], best) << "request " << i << " step " << k;
    }
  }
  EXPECT_GT(changed, 4) << changed
                        << ": the adjustments changed too few requests' tokens to be tested";
  s.dcp = 2;
  const EngineRun two = run_engine(c, *w, s, reqs);
  s.num_draft_tokens = 3;
  s.draft_weights = w.get();
  s.draft_config = preset_config("tiny", 1);
  const EngineRun spec = run_engine(c, *w, s, reqs);
  EXPECT_GT(spec.stats.spec_accepted, 0);
  // A draft equal to the target proposes with the same penalties: every proposal is accepted.
  s.draft_config = c;
  const EngineRun exact = run_engine(c, *w, s, reqs);
  EXPECT_EQ(exact.stats.spec_accepted, exact.stats.spec_proposed);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(two.results[i].output_tokens, one.results[i].output_tokens) << "request " << i;
    EXPECT_EQ(spec.results[i].output_tokens, one.results[i].output_tokens) << "request " << i;
    EXPECT_EQ(exact.results[i].output_tokens, one.results[i].output_tokens) << "request " << i;
  }
}

// Guided choices: each step's token is the greedy choice among the tokens that continue a choice
// (of that step's recorded logits), the output is a choice and ends there (finish stop); the same
// under DCP 2 and under speculative decoding.
TEST(Engine, ChoicesEndTheOutputAtOneOfThemChosenStepByStep) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(9);
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 6; ++i) {
    RequestSpec r = request(i, random_tokens(rng, 7 + 19 * i, c.vocab_size), 12);
    // Shared beginnings, so that later steps choose too; lengths 1 to 6.
    // Three distinct tokens: with a repeat, the fixed choices below would begin one another.
    std::vector<std::int32_t> a = random_tokens(rng, 3, c.vocab_size);
    while (a[0] == a[1] || a[0] == a[2] || a[1] == a[2]) a = random_tokens(rng, 3, c.vocab_size);
    r.sampling.choices = {{a[0], a[1], a[2], 7, 9, 11},
                          {a[0], a[2]},
                          {a[1]},
                          {a[0], a[1], a[2], 8},
                          random_tokens(rng, 4, c.vocab_size)};
    if (prefix_pair(r.sampling.choices)) r.sampling.choices.pop_back();
    if (i == 4) {  // every choice longer than max_new_tokens: ends by length
      r.sampling.choices = {{a[0], 1, 2}, {(a[0] + 1) % c.vocab_size, 3, 4, 5}};
      r.max_new_tokens = 2;
    }
    if (i == 5) r.sampling.choices = {random_tokens(rng, 6, c.vocab_size)};  // forced: drafted
    reqs.push_back(r);
  }
  EngineSetup s;
  s.tp = 2;
  s.page_size = 4;
  const EngineRun one = run_engine(c, *w, s, reqs);
  const int vocab = c.vocab_size;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const RequestResult& r = one.results[i];
    const auto& choices = reqs[i].sampling.choices;
    for (std::size_t k = 0; k < r.output_tokens.size(); ++k) {
      std::int32_t best = -1;
      for (const auto& ch : choices) {
        if (ch.size() <= k ||
            !std::equal(r.output_tokens.begin(), r.output_tokens.begin() + k, ch.begin()))
          continue;
        const float x = r.step_logits[k * vocab + static_cast<std::size_t>(ch[k])];
        if (best < 0 || x > r.step_logits[k * vocab + static_cast<std::size_t>(best)] ||
            (x == r.step_logits[k * vocab + static_cast<std::size_t>(best)] && ch[k] < best))
          best = ch[k];
      }
      EXPECT_EQ(r.output_tokens[k], best) << "request " << i << " step " << k;
    }
    if (i != 4) {
      EXPECT_NE(std::find(choices.begin(), choices.end(), r.output_tokens), choices.end())
          << "request " << i;
      EXPECT_EQ(r.finish_reason, FinishReason::stop) << "request " << i;
    } else {
      EXPECT_EQ(r.output_tokens.size(), 2u);
      EXPECT_EQ(r.finish_reason, FinishReason::length);
    }
  }
  test::expect_same_under_dcp2_and_a_draft(c, *w, s, reqs, one);
}

TEST(Engine, StopTokenEndsTheRequestAtItsFirstOccurrenceAfterMinTokens) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 1);
  const auto w = make_synthetic_weights(6);
  const std::vector<std::int32_t> prompt = random_tokens(rng, 30, c.vocab_size);
  EngineSetup s;
  s.tp = 2;
  s.dcp = 2;
  s.page_size = 4;
  const std::vector<std::int32_t> full =
      run_engine(c, *w, s, {request(0, prompt, 10)}).results[0].output_tokens;
  const std::int32_t stop = full[4];
  const std::size_t first = static_cast<std::size_t>(
      std::find(full.begin(), full.end(), stop) - full.begin());
  RequestSpec r = request(0, prompt, 10);
  r.stop_token_ids = {stop};
  r.logprobs = 2;
  for (int draft_tokens : {0, 3}) {  // plain decode, and speculative with the stop inside a run
    EngineSetup e = s;
    e.num_draft_tokens = draft_tokens;
    const ModelConfig draft = preset_config("tiny", 1);
    if (draft_tokens > 0) {
      e.draft_config = draft;
      e.draft_weights = w.get();
    }
    const RequestResult got = run_engine(c, *w, e, {r}).results[0];
    EXPECT_EQ(got.output_tokens, std::vector<std::int32_t>(full.begin(), full.begin() + first + 1))
        << "draft tokens " << draft_tokens;
    EXPECT_EQ(got.finish_reason, FinishReason::stop);
    ASSERT_EQ(got.logprobs.size(), got.output_tokens.size());
    for (std::size_t k = 0; k < got.logprobs.size(); ++k) {
      EXPECT_EQ(got.logprobs[k].chosen.token, got.output_tokens[k]);
      ASSERT_EQ(got.logprobs[k].top.size(), 2u);
      EXPECT_EQ(got.logprobs[k].top[0].token, got.output_tokens[k]) << "greedy picks the top";
    }
  }

  // min_tokens: the stop tokens are masked for the first min_tokens steps (each step then the
  // greedy choice among the others), then end the request as before; speculation agrees.
  r = request(0, prompt, 10);
  r.stop_token_ids = {full[1], full[2]};  // the plain run would stop at step 1
  r.min_tokens = 6;
  for (int draft_tokens : {0, 3}) {
    EngineSetup e = s;
    e.num_draft_tokens = draft_tokens;
    if (draft_tokens > 0) {
      e.draft_config = c;
      e.draft_weights = w.get();
    }
    const RequestResult got = run_engine(c, *w, e, {r}).results[0];
    const std::string what = "draft tokens " + std::to_string(draft_tokens);
    ASSERT_GE(got.output_tokens.size(), 6u) << what;
    for (std::size_t k = 0; k < got.output_tokens.size(); ++k) {
      const bool is_stop = got.output_tokens[k] == full[1] || got.output_tokens[k] == full[2];
      EXPECT_TRUE(!is_stop || (k >= 6 && k + 1 == got.output_tokens.size()))
          << what << " step " << k;
      // The greedy choice of the step's logits, the stop tokens left out before step 6.
      std::vector<float> logits(got.step_logits.begin() + k * c.vocab_size,
                                got.step_logits.begin() + (k + 1) * c.vocab_size);
      if (k < 6) {
        for (std::int32_t t : r.stop_token_ids) logits[static_cast<std::size_t>(t)] = -1e30f;
      }
      EXPECT_EQ(got.output_tokens[k],
                std::max_element(logits.begin(), logits.end()) - logits.begin())
          << what << " step " << k;
    }
    const std::int32_t last = got.output_tokens.back();
    EXPECT_EQ(got.finish_reason,
              last == full[1] || last == full[2] ? FinishReason::stop : FinishReason::length)
        << what;
  }
  RequestSpec too_many = r;
  too_many.min_tokens = 11;
  EXPECT_TRUE(test::throws_error([&] { run_engine(c, *w, s, {too_many}); },
                                 ErrorCategory::invalid_argument,
                                 "request 0: min_tokens = 11 must be in [0, max_new_tokens = 10]"));
}

// Prompt logprobs: the logprob of prompt token p (and the top k there) equals the log-softmax, in
// float64, of the logits that decoding reaches after being fed the first p tokens (teacher
// forcing); across prefill chunks (the 256-token cap), beside a request without them in the same
// steps, under DCP 2, and with a cached copy of the prompt in the prefix cache. A request scored
// from a later position (prompt_logprobs_start) takes the cached pages before it and gets the same
// logprobs from there.
TEST(Engine, PromptLogprobsAreTheLogSoftmaxOfEachPrefix) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(12);
  const int vocab = c.vocab_size;
  const std::vector<std::int32_t> prompt = random_tokens(rng, 300, vocab);
  EngineSetup s;
  s.tp = 2;
  s.dcp = 2;
  s.page_size = 8;
  s.chunk = 300;
  s.prefix_cache = true;
  RequestSpec asked = request(1, prompt, 2);
  asked.prompt_logprobs = 3;
  RequestSpec late = asked;
  late.id = 3;
  late.prompt_logprobs_start = 203;
  // Request 0 puts the prompt into the prefix cache first; 2 runs beside 1 without logprobs.
  const test::EngineRun run = test::run_engine_phases(
      c, *w, s,
      {{request(0, prompt, 1)}, {asked, request(2, random_tokens(rng, 40, vocab), 3), late}});
  const RequestResult& got = run.results[1];
  ASSERT_EQ(got.prompt_logprobs.size(), prompt.size() - 1);
  EXPECT_EQ(got.cached_prompt_tokens, 0) << "scored from position 1: computed whole";
  const RequestResult& cut = run.results[3];
  // Virtual pages of 16 tokens (page 8 x DCP 2): those wholly before position 202, whose logits
  // score position 203.
  EXPECT_EQ(cut.cached_prompt_tokens, 202 / 16 * 16);
  ASSERT_EQ(cut.prompt_logprobs.size(), prompt.size() - 203);
  for (std::size_t i = 0; i < cut.prompt_logprobs.size(); ++i) {
    const StepLogprobs &a = cut.prompt_logprobs[i], &b = got.prompt_logprobs[202 + i];
    EXPECT_EQ(a.chosen.token, b.chosen.token) << "position " << 203 + i;
    EXPECT_NEAR(a.chosen.logprob, b.chosen.logprob, 1e-4) << "position " << 203 + i;
  }
  EXPECT_TRUE(run.results[0].prompt_logprobs.empty());
  EXPECT_TRUE(run.results[2].prompt_logprobs.empty());
  EXPECT_EQ(got.output_tokens[0], run.results[0].output_tokens[0]) << "the same first token";
  // The reference: the first token alone, then the rest forced one decode step at a time.
  s.prefix_cache = false;
  s.dcp = 1;
  const std::vector<std::int32_t> rest(prompt.begin() + 1, prompt.end());
  const RequestResult ref =
      run_engine(c, *w, s, {request(0, {prompt[0]}, static_cast<int>(rest.size()), rest)})
          .results[0];
  ASSERT_EQ(ref.step_logits.size(), rest.size() * static_cast<std::size_t>(vocab));
  for (std::size_t p = 0; p < rest.size(); ++p) {
    const float* l = ref.step_logits.data() + p * static_cast<std::size_t>(vocab);
    double m = *std::max_element(l, l + vocab), z = 0;
    for (int t = 0; t < vocab; ++t) z += std::exp(static_cast<double>(l[t]) - m);
    const double lse = m + std::log(z);
    const StepLogprobs& lp = got.prompt_logprobs[p];
    EXPECT_EQ(lp.chosen.token, rest[p]) << "position " << p + 1;
    EXPECT_NEAR(lp.chosen.logprob, l[rest[p]] - lse, 1e-3) << "position " << p + 1;
    ASSERT_EQ(lp.top.size(), 3u);
    std::vector<int> order(static_cast<std::size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
    // Rank k holds a token whose reference logit is the k-th largest: the very token, or one
    // whose logit is within the two runs' rounding of it (such a pair may come in either order).
    std::set<std::int32_t> distinct;
    for (std::size_t k = 0; k < 3; ++k) {
      const std::int32_t t = lp.top[k].token;
      ASSERT_TRUE(t >= 0 && t < vocab && distinct.insert(t).second) << "position " << p + 1;
      if (t != order[k]) {
        EXPECT_NEAR(l[t], l[order[k]], 1e-4) << "position " << p + 1 << " rank " << k;
      }
      EXPECT_NEAR(lp.top[k].logprob, l[order[k]] - lse, 1e-3) << "position " << p + 1;
    }
  }
}

// Each decode forward's time and split are kept for reports only when asked: a server, which runs
// for days, turns them off and then the engine keeps no list that grows with its steps. Nothing
// else changes.
TEST(Engine, StepTimingsAreKeptOnlyWhenAsked) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 1);
  const auto w = make_synthetic_weights(12);
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 3; ++i)
    reqs.push_back(request(i, random_tokens(rng, 9 + 7 * i, c.vocab_size), 6 + i));
  EngineSetup s;
  s.tp = 2;
  s.dcp = 2;
  const EngineRun kept = run_engine(c, *w, s, reqs);
  s.step_timings = false;
  const EngineRun dropped = run_engine(c, *w, s, reqs);
  // The longest request decodes 7 more tokens after its prefill's first: 7 decode forwards.
  EXPECT_GE(kept.stats.decode_step_ms.size(), 7u);
  EXPECT_EQ(kept.stats.decode_timings.size(), kept.stats.decode_step_ms.size());
  EXPECT_TRUE(dropped.stats.decode_step_ms.empty());
  EXPECT_TRUE(dropped.stats.decode_timings.empty());
  EXPECT_EQ(dropped.stats.steps, kept.stats.steps);
  EXPECT_EQ(dropped.stats.decode_tokens, kept.stats.decode_tokens);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(dropped.results[i].output_tokens, kept.results[i].output_tokens) << "request " << i;
    EXPECT_EQ(dropped.results[i].step_logits, kept.results[i].step_logits) << "request " << i;
  }
}

TEST(Engine, CancelFreesTheKvAndLeavesTheOtherRequestsUntouched) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 1);
  const auto w = make_synthetic_weights(8);
  const std::vector<std::int32_t> pa = random_tokens(rng, 25, c.vocab_size),
                                  pb = random_tokens(rng, 19, c.vocab_size),
                                  pc = random_tokens(rng, 33, c.vocab_size);
  EngineSetup s;
  s.tp = 2;
  s.dcp = 2;
  s.page_size = 4;
  const std::vector<std::int32_t> alone =
      run_engine(c, *w, s, {request(0, pa, 8)}).results[0].output_tokens;
  ParallelConfig pcfg;
  pcfg.tp_size = 2;
  pcfg.dcp_size = 2;
  const Topology topo = resolve(pcfg);
  ModelSource src;
  src.config = c;
  src.weights = w.get();
  ModelOptions mo;
  mo.kv_dtype = KvDtype::fp32;
  mo.page_size = 4;
  mo.kv_capacity_tokens = 512;
  EngineOptions eo;
  eo.max_running_requests = 2;  // request 2 waits
  launch_ranks({RankTransport::threads, 2, {}}, [&](Communicator& world, bool) {
    RankSystem sys(world, topo, src, mo, eo);
    Engine& engine = sys.engine();
    engine.submit(request(0, pa, 8));
    engine.submit(request(1, pb, 8));
    engine.submit(request(2, pc, 8));
    engine.step();
    engine.step();
    EXPECT_EQ(engine.running(), 2);
    EXPECT_TRUE(engine.cancel(1));   // running: its KV goes now
    EXPECT_TRUE(engine.cancel(2));   // waiting
    EXPECT_FALSE(engine.cancel(1));  // already finished
    EXPECT_FALSE(engine.cancel(9));  // unknown
    EXPECT_EQ(sys.model().allocator().requests(), std::vector<RequestId>{0});
    EXPECT_FALSE(engine.forget(0)) << "forgot a running request";
    engine.run();
    const auto& res = engine.results();
    ASSERT_EQ(res.size(), 3u);
    EXPECT_EQ(res[0].output_tokens, alone);
    EXPECT_EQ(res[0].finish_reason, FinishReason::length);
    EXPECT_EQ(res[1].finish_reason, FinishReason::cancelled);
    // Step 1 prefilled it (one token) and decoded once; step 2 decoded once more.
    EXPECT_EQ(res[1].output_tokens.size(), 3u) << "a cancelled request keeps its tokens so far";
    EXPECT_EQ(res[2].finish_reason, FinishReason::cancelled);
    EXPECT_TRUE(res[2].output_tokens.empty());
    EXPECT_TRUE(sys.model().allocator().requests().empty());
    EXPECT_TRUE(engine.forget(1));
    EXPECT_FALSE(engine.forget(1));
    EXPECT_TRUE(engine.forget(0));
    EXPECT_TRUE(engine.forget(2));
    EXPECT_TRUE(engine.results().empty());
    engine.submit(request(1, pb, 3));  // a forgotten id may come back
    engine.run();
    EXPECT_EQ(engine.results().at(0).output_tokens.size(), 3u);
  });
}

}  // namespace
}  // namespace dcp

namespace dcp {
namespace {

// The KV striped in runs of I tokens per rank (vLLM's interleave size) through the allocator,
// the writes, the kernels' row mapping and both extend paths: equal to DCP 1, for I up to the
// page size, N not a power of two, prompts over several chunks and partial pages.
TEST(Engine, InterleavedStripesEqualDcpOne) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(71);
  std::vector<RequestSpec> reqs;
  for (const int len : {1, 5, 37, 150})
    reqs.push_back(test::request(len, test::random_tokens(rng, len, c.vocab_size), 6));
  test::EngineSetup one;
  one.tp = 4;
  one.page_size = 16;
  one.chunk = 40;
  const auto expect = test::run_engine(c, *w, one, reqs);
  for (const int n : {2, 4}) {
    for (const int il : {2, 8, 16}) {
      for (const ForwardMode mode : {ForwardMode::extend, ForwardMode::extend_native}) {
        test::EngineSetup s = one;
        s.dcp = n;
        s.backend = CombineBackend::a2a;
        s.interleave = il;
        s.extend_mode = mode;
        const auto got = test::run_engine(c, *w, s, reqs);
        const std::string what = str("dcp ", n, " interleave ", il,
                                     mode == ForwardMode::extend ? " gather" : " native");
        for (std::size_t i = 0; i < reqs.size(); ++i) {
          EXPECT_TRUE(
              test::same_greedy_run(got.results[i], expect.results[i], c.vocab_size, {1e-10, 1e-4}))
              << what << " request " << i;
        }
      }
    }
  }
  // A stripe may not straddle two pages.
  test::EngineSetup bad = one;
  bad.dcp = 2;
  bad.backend = CombineBackend::a2a;
  bad.interleave = 3;
  EXPECT_TRUE(test::throws_error([&] { test::run_engine(c, *w, bad, reqs); },
                                 ErrorCategory::invalid_argument,
                                 "page_size = 16 must be a multiple of interleave = 3"));
}

}  // namespace
}  // namespace dcp
