// Prefix cache and host tier: shared prefixes reuse KV pages, eviction to host and reload are
// bit-exact, each rank moves 1/N of a page, pages in use are never evicted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dcp/error.h"
#include "dcp/prefix_cache.h"
#include "engine_util.h"
#include "test_util.h"

namespace dcp {
namespace {

// `count` prompts of a random `prefix_len`-token prefix and random tails that part at their first
// token, so that two prompts share exactly the prefix (tails drawn alone sometimes share a token or
// two, and with them a page more).
std::vector<RequestSpec> shared_prefix_requests(test::Rng& rng, int vocab, int prefix_len,
                                                int count) {
  const std::vector<std::int32_t> prefix = test::random_tokens(rng, prefix_len, vocab);
  std::vector<RequestSpec> reqs;
  std::vector<std::int32_t> firsts;
  for (int i = 0; i < count; ++i) {
    std::vector<std::int32_t> prompt = prefix;
    auto tail = test::random_tokens(rng, 5 + 7 * i, vocab);
    while (std::find(firsts.begin(), firsts.end(), tail[0]) != firsts.end())
      tail[0] = static_cast<std::int32_t>(rng.range(0, vocab - 1));
    firsts.push_back(tail[0]);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    reqs.push_back(test::request(i, prompt, 4));
  }
  return reqs;
}

// TP x DCP (a2a) with pages of 8 tokens and prefill chunks of 64: prompts span several of each.
test::EngineSetup small_pages(int tp, int dcp) {
  test::EngineSetup s;
  s.tp = tp;
  s.dcp = dcp;
  s.backend = CombineBackend::a2a;
  s.page_size = 8;
  s.chunk = 64;
  return s;
}

// small_pages(n, n) with a KV of `pages` virtual pages (8 x n tokens each).
test::EngineSetup kv_of_pages(int n, int pages) {
  test::EngineSetup s = small_pages(n, n);
  s.capacity = static_cast<std::int64_t>(pages) * 8 * n;
  return s;
}

// The cache changes what is computed, not the result: the same tokens, and logits within the
// rounding of attention over a cached prefix (an extend) instead of one prefill.
void expect_as_without_cache(const test::EngineRun& got, const test::EngineRun& want,
                             const std::string& what) {
  const int vocab = preset_config("tiny", 1).vocab_size;  // every model of this file's
  ASSERT_EQ(got.results.size(), want.results.size()) << what;
  for (std::size_t i = 0; i < want.results.size(); ++i) {
    EXPECT_TRUE(test::same_greedy_run(got.results[i], want.results[i], vocab, {1e-10, 1e-4}))
        << what << " request " << i;
  }
}

// Runs `phases` as `off` says and again with the prefix cache on, expects the same results, and
// returns the run with the cache.
test::EngineRun run_with_the_cache(const ModelConfig& c, const WeightSource& w,
                                   const test::EngineSetup& off,
                                   const std::vector<std::vector<RequestSpec>>& phases,
                                   const std::string& what) {
  const auto expect = test::run_engine_phases(c, w, off, phases);
  test::EngineSetup on = off;
  on.prefix_cache = true;
  test::EngineRun got = test::run_engine_phases(c, w, on, phases);
  expect_as_without_cache(got, expect, what);
  return got;
}

// `s` with the prefix cache and speculative decoding: 3 tokens a step from a one-layer draft
// sharing the target's weights.
test::EngineSetup cached_and_drafted(test::EngineSetup s, const WeightSource& w) {
  s.prefix_cache = true;
  s.num_draft_tokens = 3;
  s.draft_config = preset_config("tiny", 1);
  s.draft_weights = &w;
  return s;
}

// run_with_the_cache of one phase, which also gives the step after which each request left the
// queue in the run with the cache (world rank 0's engine).
struct AdmittedRun {
  test::EngineRun run;
  std::vector<int> admitted;
};
AdmittedRun run_recording_admissions(const ModelConfig& c, const WeightSource& w,
                                     const test::EngineSetup& off,
                                     const std::vector<RequestSpec>& reqs,
                                     const std::string& what) {
  const auto expect = test::run_engine(c, w, off, reqs);
  test::EngineSetup on = off;
  on.prefix_cache = true;
  std::vector<int> admitted(reqs.size(), -1);
  int steps = 0;
  on.after_step = [&](int rank, const Engine& e) {
    if (rank != 0) return;
    ++steps;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      if (admitted[i] < 0 && e.results()[i].state != RequestState::waiting) admitted[i] = steps;
    }
  };
  AdmittedRun got{test::run_engine(c, w, on, reqs), {}};
  expect_as_without_cache(got.run, expect, what);
  got.admitted = std::move(admitted);
  return got;
}

TEST(PrefixCache, SharedPrefixesGiveIdenticalOutputsWithTheCacheOnAndOff) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(61);
  const auto reqs = shared_prefix_requests(rng, c.vocab_size, 150, 6);
  for (int n : {1, 2, 4}) {
    test::EngineSetup off = small_pages(4, n);
    off.max_running = 2;  // later requests arrive after earlier prompts are cached
    const std::string what = "dcp " + std::to_string(n);
    const auto got = run_with_the_cache(c, *w, off, {reqs}, what);
    // The first request misses; the second, which arrives with it, waits for the prefix's pages
    // to be written, and it and each later one reuse the prefix's whole virtual pages (P x N
    // tokens each), and its result says so.
    const std::int64_t vp = 8LL * n;
    EXPECT_EQ(got.cache_stats[0].hit_tokens, 5 * (150 / vp) * vp) << what;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got.results[i].cached_prompt_tokens, i < 1 ? 0 : 150 / vp * vp) << what << " " << i;
    }
  }
}

// Requests that arrive together and share a prompt's prefix (the choices of one prompt, a system
// prompt) compute it once: a request waits while another's prefill writes pages it would hit, and
// requests behind it that share nothing pass it meanwhile. Tokens as with the cache off.
TEST(PrefixCache, ARequestWaitsForThePagesAnotherPrefillIsWriting) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(71);
  const std::vector<std::int32_t> a = test::random_tokens(rng, 200, c.vocab_size);
  std::vector<std::int32_t> b(a.begin(), a.begin() + 170);  // then 10 others
  const std::vector<std::int32_t> tail = test::random_tokens(rng, 10, c.vocab_size);
  b.insert(b.end(), tail.begin(), tail.end());
  b[170] = (a[170] + 1) % c.vocab_size;
  std::vector<RequestSpec> reqs = {test::request(0, a, 4), test::request(1, b, 4),
                                   test::request(2, test::random_tokens(rng, 40, c.vocab_size), 4),
                                   test::request(3, a, 4), test::request(4, a, 4)};
  for (int i : {3, 4}) {  // two more choices of the first prompt, sampled
    reqs[static_cast<std::size_t>(i)].sampling.temperature = 1;
    reqs[static_cast<std::size_t>(i)].sampling.seed = static_cast<std::uint64_t>(i);
  }
  for (int n : {1, 2}) {
    const std::string what = "dcp " + std::to_string(n);
    // The first prompt takes 4 steps.
    const auto [got, admitted] = run_recording_admissions(c, *w, small_pages(2, n), reqs, what);
    const std::int64_t vp = 8LL * n;
    const std::vector<std::int64_t> cached = {0, 170 / vp * vp, 0, 199 / vp * vp, 199 / vp * vp};
    std::int64_t prompts = 0;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got.results[i].cached_prompt_tokens, cached[i]) << what << " request " << i;
      prompts += static_cast<std::int64_t>(reqs[i].prompt.size());
    }
    // A waiting request is looked up once, when it is admitted, and its hit counted once.
    EXPECT_EQ(got.cache_stats[0].lookup_tokens, prompts) << what;
    EXPECT_EQ(got.cache_stats[0].hit_tokens, cached[1] + cached[3] + cached[4]) << what;
    // The unrelated request went first; the others waited for pages the first writes 64 a step.
    EXPECT_EQ(admitted[0], 1) << what;
    EXPECT_EQ(admitted[2], 1) << what;
    for (std::size_t i : {1, 3, 4})
      EXPECT_GE(admitted[i], (cached[i] + 63) / 64 + 1) << what << " request " << i;
  }
}

// A request that hits the cache but waits for KV (another request holds the rest) is matched
// again each step; its lookup and hit count once, when it is admitted, so the hit rate stays a
// rate of prompts. Tokens as with the cache off.
TEST(PrefixCache, ARequestWaitingForKvIsCountedOnceWhenAdmitted) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(72);
  const std::vector<std::int32_t> a = test::random_tokens(rng, 40, c.vocab_size);
  std::vector<std::int32_t> b(a.begin(), a.begin() + 32);  // then 18 others
  const std::vector<std::int32_t> tail = test::random_tokens(rng, 18, c.vocab_size);
  b.insert(b.end(), tail.begin(), tail.end());
  b[32] = (a[32] + 1) % c.vocab_size;
  // 60 and 70 tokens of KV in a cache of 96: the second waits until the first ends.
  const std::vector<RequestSpec> reqs = {test::request(0, a, 20), test::request(1, b, 20)};
  for (int n : {1, 2}) {
    test::EngineSetup off = small_pages(n, n);
    off.capacity = 96;
    const std::string what = "dcp " + std::to_string(n);
    const auto [got, admitted] = run_recording_admissions(c, *w, off, reqs, what);
    EXPECT_GE(admitted[1], 20) << what << ": the second request did not wait for the first";
    EXPECT_EQ(got.results[1].cached_prompt_tokens, 32) << what;
    EXPECT_EQ(got.cache_stats[0].lookup_tokens, 40 + 50) << what;
    EXPECT_EQ(got.cache_stats[0].hit_tokens, 32) << what;
  }
}

// A request waiting for KV that eviction cannot give it evicts nothing: the cache keeps its pages
// while the request waits, and gives up what the request needs when it can be admitted. Pages of
// 8 x DCP tokens, 12 of them: a finished prompt leaves 3; a request of 8 pages runs; the next needs
// 9, which only the end of the first makes possible (with the first's 7 cached pages then unused).
TEST(PrefixCache, AWaitingRequestEvictsNothingUntilEvictionAdmitsIt) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(73);
  for (int n : {1, 2}) {
    const int vp = 8 * n;
    test::EngineSetup setup = kv_of_pages(n, 12);
    const auto prompt = [&](int pages) {
      return test::random_tokens(rng, pages * vp, c.vocab_size);
    };
    const std::vector<std::vector<RequestSpec>> phases = {
        {test::request(0, prompt(3), 1)},
        {test::request(1, prompt(5), 3 * vp), test::request(2, prompt(5), 4 * vp)}};
    std::int64_t dropped_while_waiting = 0;
    int waited = 0;
    setup.after_step = [&](int rank, const Engine& e) {
      if (rank != 0 || !e.prefix_cache() || e.results().size() < 3) return;
      if (e.results()[2].state != RequestState::waiting) return;
      ++waited;
      dropped_while_waiting =
          std::max(dropped_while_waiting, e.prefix_cache()->stats().pages_dropped);
    };
    const std::string what = "dcp " + std::to_string(n);
    const test::EngineRun got = run_with_the_cache(c, *w, setup, phases, what);
    EXPECT_GE(waited, 3 * vp - 1) << what << ": the last request did not wait for the other";
    EXPECT_EQ(dropped_while_waiting, 0) << what;
    // Admitting it: 2 pages free, 7 dropped (the first prompt's 3, then the oldest of the other's).
    EXPECT_EQ(got.cache_stats[0].pages_dropped, 7) << what;
  }
}

// A waiting request's hit on host pages takes no page a running request will still need: while
// only reserved pages are free, each page it brings back replaces an unused one. Pages of 8 x DCP
// tokens, 12 of them, a host tier of 4: a prompt leaves 3 pages; then, together, a request that
// will grow to 5 pages, one whose 6 push the prompt's first 2 pages to the host tier, and one that
// opens with the prompt, which waits for the first to end and then finds all 3 pages.
TEST(PrefixCache, AWaitingRequestsHitTakesNoPageARunningRequestNeeds) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(74);
  for (int n : {1, 2}) {
    const int vp = 8 * n;
    test::EngineSetup off = kv_of_pages(n, 12);
    const auto prompt = [&](int tokens) { return test::random_tokens(rng, tokens, c.vocab_size); };
    const std::vector<std::int32_t> x = prompt(3 * vp);
    std::vector<std::int32_t> wx = x;
    const std::vector<std::int32_t> more = prompt(5 * vp);
    wx.insert(wx.end(), more.begin(), more.end());
    const std::vector<std::vector<RequestSpec>> phases = {
        {test::request(0, x, 1)},
        {test::request(1, prompt(2 * vp), 3 * vp), test::request(2, prompt(5 * vp), 1),
         test::request(3, wx, 3 * vp)}};
    const std::string what = "dcp " + std::to_string(n);
    test::EngineSetup on = off;
    on.prefix_cache = true;
    on.host_tokens = 4 * vp;
    const test::EngineRun got = test::run_engine_phases(c, *w, on, phases);
    expect_as_without_cache(got, test::run_engine_phases(c, *w, off, phases), what);
    EXPECT_EQ(got.results[3].cached_prompt_tokens, 3 * vp) << what;
    EXPECT_EQ(got.cache_stats[0].pages_reloaded, 2) << what;
  }
}

// Random workloads under KV pressure: prompts sharing random prefixes of a few others, arriving
// in waves, in a KV of a few pages, with and without a host tier, under DCP 1 and 2, some in DP
// attention groups, some with speculative decoding, some with prompt_logprobs from a random
// position (a hit stops before it). Nothing fails, every request gives the tokens (and prompt
// logprobs) of the cache off, and each hit is whole pages short of its prompt.
TEST(PrefixCache, RandomWorkloadsUnderKvPressureGiveTheTokensOfTheCacheOff) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(75);
  std::int64_t hits = 0, reloaded = 0, scored_hits = 0;
  for (int round = 0; round < 40; ++round) {
    const int n = round % 2 == 0 ? 1 : 2;
    const int vp = 4 * n;
    test::EngineSetup off = small_pages(n, n);
    off.page_size = 4;
    off.chunk = static_cast<int>(rng.range(1, 4)) * vp;
    const int pages = static_cast<int>(rng.range(10, 16));
    off.capacity = pages * vp;
    off.max_running = static_cast<int>(rng.range(1, 4));
    const bool attention_groups = round % 4 == 1;  // DP attention: two groups of TP n
    if (attention_groups) {
      off.tp = 2 * n;
      off.dp_attention = 2;
    }
    const bool drafted = round % 3 == 2;
    if (drafted) {  // the draft, on both sides; the cache only on the second
      off = cached_and_drafted(off, *w);
      off.prefix_cache = false;
    }
    std::vector<std::vector<std::int32_t>> bases;
    for (int b = 0; b < 3; ++b)
      bases.push_back(
          test::random_tokens(rng, static_cast<int>(rng.range(vp, 5 * vp)), c.vocab_size));
    std::vector<std::vector<RequestSpec>> phases(static_cast<std::size_t>(rng.range(1, 3)));
    std::vector<std::size_t> prompts;
    std::vector<bool> scored;  // with prompt_logprobs: a hit only before the first scored token
    std::vector<const RequestSpec*> specs;
    RequestId id = 0;
    for (auto& phase : phases) {
      for (std::int64_t k = rng.range(1, 5); k > 0; --k) {
        const auto& base = bases[static_cast<std::size_t>(rng.range(0, 2))];
        std::vector<std::int32_t> p(
            base.begin(), base.begin() + rng.range(1, static_cast<std::int64_t>(base.size())));
        const auto tail =
            test::random_tokens(rng, static_cast<int>(rng.range(0, 2 * vp)), c.vocab_size);
        p.insert(p.end(), tail.begin(), tail.end());
        const std::int64_t room = off.capacity - static_cast<std::int64_t>(p.size()) - 4;
        prompts.push_back(p.size());
        phase.push_back(test::request(
            id++, p, static_cast<int>(rng.range(1, std::min<std::int64_t>(room, 3 * vp)))));
        if (!drafted && rng.coin(0.25)) {  // computed from the token before the first scored
          phase.back().prompt_logprobs = 1;
          const auto length = static_cast<std::int64_t>(p.size());
          if (rng.coin(0.8))  // mostly late in the prompt, where a shared prefix may hit
            phase.back().prompt_logprobs_start =
                rng.coin(0.25) ? rng.range(0, length) : rng.range(length / 2, length);
        }
        scored.push_back(phase.back().prompt_logprobs >= 0);
      }
    }
    for (const auto& phase : phases)
      for (const RequestSpec& r : phase) specs.push_back(&r);
    const std::string what = "round " + std::to_string(round) + " dcp " + std::to_string(n) +
                             (drafted ? " drafted" : "") +
                             (attention_groups ? " dp attention" : "");
    const test::EngineRun want = test::run_engine_phases(c, *w, off, phases);
    test::EngineSetup on = off;
    on.prefix_cache = true;
    on.host_tokens = (round % 4 == 3 ? 0 : rng.range(1, 4)) * vp;
    const test::EngineRun got = test::run_engine_phases(c, *w, on, phases);
    ASSERT_EQ(got.results.size(), want.results.size()) << what;
    for (std::size_t i = 0; i < want.results.size(); ++i) {
      const RequestResult& r = got.results[i];
      ASSERT_EQ(r.state, RequestState::finished) << what << " request " << i << ": " << r.error;
      EXPECT_TRUE(test::same_greedy_run(r, want.results[i], c.vocab_size, {1e-10, 1e-4}))
          << what << " request " << i;
      EXPECT_EQ(r.cached_prompt_tokens % vp, 0) << what << " request " << i;
      EXPECT_LT(r.cached_prompt_tokens, static_cast<std::int64_t>(prompts[i])) << what;
      if (scored[i]) {  // the logprobs of the cache off, from the first scored position on
        const std::int64_t first = std::max<std::int64_t>(specs[i]->prompt_logprobs_start, 1);
        EXPECT_LT(r.cached_prompt_tokens, first) << what << " request " << i;
        ASSERT_EQ(r.prompt_logprobs.size(), prompts[i] - static_cast<std::size_t>(first))
            << what << " request " << i;
        ASSERT_EQ(want.results[i].prompt_logprobs.size(), r.prompt_logprobs.size()) << what;
        for (std::size_t k = 0; k < r.prompt_logprobs.size(); ++k) {
          EXPECT_EQ(r.prompt_logprobs[k].chosen.token,
                    want.results[i].prompt_logprobs[k].chosen.token);
          EXPECT_NEAR(r.prompt_logprobs[k].chosen.logprob,
                      want.results[i].prompt_logprobs[k].chosen.logprob, 1e-4)
              << what << " request " << i << " position " << first + static_cast<std::int64_t>(k);
        }
        scored_hits += r.cached_prompt_tokens > 0;
      }
      hits += r.cached_prompt_tokens > 0;
    }
    reloaded += got.cache_stats[0].pages_reloaded;
  }
  EXPECT_GT(hits, 0);  // the workloads did share prefixes
  EXPECT_GT(scored_hits, 0);  // and some scored from a later position hit
  std::printf("requests that hit: %lld (scored: %lld), pages reloaded: %lld\n",
              static_cast<long long>(hits), static_cast<long long>(scored_hits),
              static_cast<long long>(reloaded));
}

// A finished request leaves its reply's whole pages in the cache beside its prompt's: the next
// turn of a conversation (the prompt, the reply, a new message) finds both. Its last token never
// entered the KV, so the cache holds the prompt and the reply but that token. The reply here is
// teacher-forced: the cache holds the tokens fed, not those the model would have chosen.
TEST(PrefixCache, AConversationsNextTurnFindsTheReplyCached) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(73);
  const std::vector<std::int32_t> prompt = test::random_tokens(rng, 101, c.vocab_size);
  const std::vector<std::int32_t> reply = test::random_tokens(rng, 40, c.vocab_size);
  std::vector<std::int32_t> next = prompt;
  next.insert(next.end(), reply.begin(), reply.end());
  const std::vector<std::int32_t> message = test::random_tokens(rng, 10, c.vocab_size);
  next.insert(next.end(), message.begin(), message.end());
  const std::vector<std::vector<RequestSpec>> turns = {{test::request(0, prompt, 40, reply)},
                                                       {test::request(1, next, 4)}};
  for (int n : {1, 2, 4}) {
    const test::EngineSetup off = small_pages(std::max(n, 2), n);
    const std::string what = "dcp " + std::to_string(n);
    const auto got = run_with_the_cache(c, *w, off, turns, what);
    const std::int64_t vp = 8LL * n, written = 101 + 40 - 1;  // the prompt's alone: 96
    EXPECT_EQ(got.results[1].cached_prompt_tokens, written / vp * vp) << what;

    // A greedy reply under speculative decoding: the KV the cache keeps is that of the tokens
    // verified, which are the greedy ones.
    const RequestSpec first = test::request(0, prompt, 40);
    const auto greedy = test::run_engine(c, *w, off, {first});
    std::vector<std::int32_t> again = prompt;
    const std::vector<std::int32_t>& said = greedy.results[0].output_tokens;
    again.insert(again.end(), said.begin(), said.end());
    again.insert(again.end(), message.begin(), message.end());
    const std::vector<std::vector<RequestSpec>> greedy_turns = {{first},
                                                                {test::request(1, again, 4)}};
    const auto plain = test::run_engine_phases(c, *w, off, greedy_turns);
    const auto drafted = test::run_engine_phases(c, *w, cached_and_drafted(off, *w), greedy_turns);
    for (std::size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(
          test::same_greedy_run(drafted.results[i], plain.results[i], c.vocab_size, {1e-10, 1e-4}))
          << what << " drafted, turn " << i + 1;
    }
    EXPECT_GT(drafted.stats.spec_accepted, 0) << what;
    EXPECT_EQ(drafted.results[1].cached_prompt_tokens, written / vp * vp) << what << " drafted";
  }
}

// Speculative decoding over cached prefixes: the target shares the prefix's pages, the draft (no
// cache of its own) computes their KV itself; greedy verification gives the plain greedy tokens.
TEST(PrefixCache, SpeculativeDecodingOverACachedPrefixEqualsGreedy) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(67);
  const auto draw = [&] {
    auto reqs = shared_prefix_requests(rng, c.vocab_size, 150, 6);
    for (RequestSpec& r : reqs) r.max_new_tokens = 7;
    return reqs;
  };
  const auto setup = [](int n) {
    test::EngineSetup s = small_pages(2, n);
    s.max_running = 2;
    return s;
  };
  // Prompts whose drafts are accepted without the cache, so that the comparisons below cover
  // accepted tokens: now and then a random draw has the one-layer draft accept none.
  const auto accepts = [&](const std::vector<RequestSpec>& reqs) {
    test::EngineSetup s = cached_and_drafted(setup(1), *w);
    s.prefix_cache = false;
    return test::run_engine(c, *w, s, reqs).stats.spec_accepted > 0;
  };
  std::vector<RequestSpec> reqs = draw();
  for (int tries = 0; !accepts(reqs) && tries < 10; ++tries) reqs = draw();
  for (int n : {1, 2}) {
    const test::EngineSetup plain = setup(n);
    const auto expect = test::run_engine(c, *w, plain, reqs);
    const test::EngineSetup spec = cached_and_drafted(plain, *w);
    const auto got = test::run_engine(c, *w, spec, reqs);
    const std::string what = "dcp " + std::to_string(n);
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(got.results[i].state, RequestState::finished)
          << what << ": " << got.results[i].error;
      EXPECT_TRUE(
          test::same_greedy_run(got.results[i], expect.results[i], c.vocab_size, {1e-10, 1e-4}))
          << what << " request " << i;
    }
    const std::int64_t vp = 8LL * n;  // every request but the first hits
    EXPECT_EQ(got.cache_stats[0].hit_tokens, 5 * (150 / vp) * vp) << what;
    // The draft's KV of the cached prefix is right: it proposes what it proposes without the
    // cache (same draft, same tokens), so as many drafts are accepted (compared where the two
    // runs' texts did not part at a near-tie).
    test::EngineSetup spec_only = spec;
    spec_only.prefix_cache = false;
    const auto uncached = test::run_engine(c, *w, spec_only, reqs);
    EXPECT_GT(uncached.stats.spec_accepted, 0) << what;
    bool same_texts = true;
    for (std::size_t i = 0; i < reqs.size(); ++i)
      same_texts = same_texts && got.results[i].output_tokens == uncached.results[i].output_tokens;
    if (same_texts) {
      EXPECT_EQ(got.stats.spec_proposed, uncached.stats.spec_proposed) << what;
      EXPECT_EQ(got.stats.spec_accepted, uncached.stats.spec_accepted) << what;
    }
    // Where the target shares the prefix but the draft holds every token: a cache that fits all
    // six requests in the target (one prefix) but about two in the draft. Admission waits for
    // the draft instead of overrunning it.
    test::EngineSetup tight = spec;
    tight.capacity = 480;
    tight.max_running = 6;
    const auto waited = test::run_engine(c, *w, tight, reqs);
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(waited.results[i].state, RequestState::finished)
          << what << ": " << waited.results[i].error;
      EXPECT_TRUE(
          test::same_greedy_run(waited.results[i], expect.results[i], c.vocab_size, {1e-10, 1e-4}))
          << what << " request " << i << " (tight)";
    }
    EXPECT_LT(waited.stats.peak_running, 6) << what << ": the draft's capacity limited admission";
  }
}

TEST(PrefixCache, UnderPressurePagesGoToTheHostTierAndComeBackExactly) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(63);
  // Two groups of requests with different prefixes, interleaved, in a cache too small for both:
  // the idle group's pages are offloaded and reloaded on its next hit.
  auto a = shared_prefix_requests(rng, c.vocab_size, 96, 3);
  auto b = shared_prefix_requests(rng, c.vocab_size, 96, 3);
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 3; ++i) {
    a[i].id = 2 * i;
    b[i].id = 2 * i + 1;
    reqs.push_back(a[i]);
    reqs.push_back(b[i]);
  }
  test::EngineSetup off;
  off.tp = 2;
  off.dcp = 2;
  off.page_size = 8;  // virtual pages of 16 tokens
  off.max_running = 1;
  off.capacity = 208;  // 13 pages: one request plus one prefix, not two prefixes
  const auto expect = test::run_engine(c, *w, off, reqs);
  for (std::int64_t host : {0, 512}) {
    test::EngineSetup on = off;
    on.prefix_cache = true;
    on.host_tokens = host;
    const auto got = test::run_engine(c, *w, on, reqs);
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_TRUE(
          test::same_greedy_run(got.results[i], expect.results[i], c.vocab_size, {1e-10, 1e-4}))
          << "host " << host << " request " << i;
    }
    const PrefixCacheStats& st = got.cache_stats[0];
    if (host > 0) {
      EXPECT_GT(st.pages_offloaded, 0);
      EXPECT_GT(st.pages_reloaded, 0);
    } else {
      EXPECT_EQ(st.pages_offloaded, 0);
      EXPECT_GT(st.pages_dropped, 0);
    }
    // Each rank moves its own rows only: exactly P rows x row bytes x layers per page.
    const std::int64_t per_page = 8 * 80 * 4 * 2;  // P x (kv_lora + rope) x fp32 x layers
    for (const PrefixCacheStats& r : got.cache_stats) {
      EXPECT_EQ(r.bytes_to_host, r.pages_offloaded * per_page);
      EXPECT_EQ(r.bytes_to_device, r.pages_reloaded * per_page);
    }
  }
}

// Direct: offload is a copy of exactly this rank's rows; reload restores them bit for bit; a page
// a request still uses is never evicted.
TEST(PrefixCache, OffloadAndReloadAreBitExactAndInUsePagesStay) {
  auto rng = test::make_rng();
  const int n = 3, page = 4, layers = 2;
  const std::int64_t vp = page * n;
  const LatentGeometry geo{8, 4, KvDtype::bf16};
  for (int rank = 0; rank < n; ++rank) {
    KvAllocator alloc(n, page, 6);
    std::vector<std::unique_ptr<LatentPool>> pools;
    std::vector<std::unique_ptr<KvShard>> shards;
    std::vector<LatentPool*> raw;
    for (int l = 0; l < layers; ++l) {
      pools.push_back(std::make_unique<LatentPool>(6, page, geo));
      shards.push_back(std::make_unique<KvShard>(alloc, *pools.back(), rank));
      raw.push_back(pools.back().get());
    }
    PrefixCache cache(alloc, raw, rank, 10 * vp);
    const std::vector<std::int32_t> prompt =
        test::random_tokens(rng, static_cast<int>(2 * vp + 1), 100);
    alloc.allocate(1, static_cast<std::int64_t>(prompt.size()));
    std::vector<float> rows(prompt.size() * geo.width());
    for (float& v : rows) v = rng.normal();
    for (auto& s : shards) s->write(1, 0, static_cast<std::int64_t>(prompt.size()), rows.data());
    const std::vector<std::int32_t> pages = alloc.pages(1);
    // Snapshot this rank's raw rows of the two whole pages.
    std::vector<std::vector<std::uint8_t>> before;
    for (int l = 0; l < layers; ++l) {
      for (int k = 0; k < 2; ++k) {
        for (int r = 0; r < page; ++r) {
          const std::uint8_t* p = pools[l]->raw_row(static_cast<std::int64_t>(pages[k]) * page + r);
          before.emplace_back(p, p + geo.row_bytes());
        }
      }
    }
    cache.insert(prompt, 1);
    EXPECT_EQ(cache.device_pages(), 2);
    // Request 1 still uses the pages: nothing can be evicted.
    cache.make_room(6);
    EXPECT_EQ(cache.device_pages(), 2) << "evicted a page in use";
    alloc.free(1);
    cache.make_room(6);  // now they go to the host tier
    EXPECT_EQ(cache.device_pages(), 0);
    EXPECT_EQ(cache.host_pages(), 2);
    EXPECT_EQ(cache.stats().bytes_to_host,
              2LL * page * static_cast<std::int64_t>(geo.row_bytes()) * layers);
    // Scribble over the freed device pages, then reload through a hit.
    for (int l = 0; l < layers; ++l) pools[l]->poison();
    const std::vector<std::int32_t> hit = cache.match(prompt);
    ASSERT_EQ(hit.size(), 2u);
    std::size_t i = 0;
    for (int l = 0; l < layers; ++l) {
      for (int k = 0; k < 2; ++k) {
        for (int r = 0; r < page; ++r, ++i) {
          const std::uint8_t* p = pools[l]->raw_row(static_cast<std::int64_t>(hit[k]) * page + r);
          ASSERT_EQ(std::memcmp(p, before[i].data(), geo.row_bytes()), 0)
              << "rank " << rank << " layer " << l << " page " << k;
        }
      }
    }
    alloc.allocate_shared(2, hit);
    cache.unpin(hit);
    alloc.check_invariants();
    EXPECT_EQ(alloc.length(2), 2 * vp);
  }
}

// A cache over one layer of small pages (N = 2, P = 2: virtual pages of 4 tokens), filled with
// the whole pages of prompts whose requests have finished: only the cache holds them.
struct FinishedPrompts {
  static constexpr int n = 2, page = 2, pages = 12;
  KvAllocator alloc{n, page, pages};
  LatentPool pool{pages, page, LatentGeometry{8, 4, KvDtype::bf16}};
  PrefixCache cache;
  explicit FinishedPrompts(std::int64_t host_tokens) : cache(alloc, {&pool}, 0, host_tokens) {}
  // Three whole pages and one token more: a hit can cover all three pages.
  std::vector<std::int32_t> prompt(std::int32_t first) const {
    std::vector<std::int32_t> t(3 * n * page + 1);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = first + static_cast<std::int32_t>(i);
    return t;
  }
  void finish(RequestId id, const std::vector<std::int32_t>& tokens) {
    alloc.allocate(id, static_cast<std::int64_t>(tokens.size()));
    cache.insert(tokens, id);
    alloc.free(id);
  }
  void touch(const std::vector<std::int32_t>& tokens) { cache.unpin(cache.match(tokens)); }
};

// Without a host tier, pressure drops the least recently used page that no request holds and no
// cached page follows (a page is found only through the pages before it): the oldest prompt
// loses its pages from the end, pages a request shares stay.
TEST(PrefixCache, EvictionDropsTheLeastRecentlyUsedUnsharedPagesFromTheirEnd) {
  FinishedPrompts f(0);
  const auto a = f.prompt(100), b = f.prompt(200), c = f.prompt(300);
  f.finish(1, a);
  f.finish(2, b);
  f.finish(3, c);
  f.touch(a);  // used last: b, then c, then a
  ASSERT_EQ(f.alloc.free_pages(), 3);
  EXPECT_EQ(f.cache.make_room(5), 5);
  EXPECT_EQ(f.cache.cached_pages(b), 1);
  EXPECT_EQ(f.cache.cached_pages(c), 3);
  EXPECT_EQ(f.cache.cached_pages(a), 3);
  EXPECT_EQ(f.cache.make_room(8), 8);
  EXPECT_EQ(f.cache.cached_pages(b), 0);
  EXPECT_EQ(f.cache.cached_pages(c), 1);
  EXPECT_EQ(f.cache.cached_pages(a), 3);
  // A request shares a's pages: they stay under any pressure, c's last page goes.
  const std::vector<std::int32_t> hit = f.cache.match(a);
  f.alloc.allocate_shared(7, hit);
  f.cache.unpin(hit);
  EXPECT_EQ(f.cache.make_room(f.pages), f.pages - 3);
  EXPECT_EQ(f.cache.cached_pages(c), 0);
  EXPECT_EQ(f.cache.cached_pages(a), 3);
  EXPECT_EQ(f.cache.device_pages(), 3);
  f.alloc.free(7);
  EXPECT_EQ(f.cache.make_room(f.pages), f.pages);
  EXPECT_EQ(f.cache.device_pages(), 0);
  EXPECT_EQ(f.cache.stats().pages_dropped, 9);
  f.alloc.check_invariants();
}

// With a host tier of two pages, the least recently used unshared pages move there; when the
// host tier is full of pages that lead to device pages, the oldest device page with nothing after
// it is dropped instead, and the host page it followed can then make room.
TEST(PrefixCache, EvictionFillsTheHostTierOldestFirstThenDrops) {
  FinishedPrompts f(2 * FinishedPrompts::n * FinishedPrompts::page);
  const auto a = f.prompt(100), b = f.prompt(200), c = f.prompt(300);
  f.finish(1, a);
  f.finish(2, b);
  f.finish(3, c);
  f.touch(a);
  EXPECT_EQ(f.cache.make_room(5), 5);  // b's first two pages to the host tier
  EXPECT_EQ(f.cache.host_pages(), 2);
  EXPECT_EQ(f.cache.device_pages(), 7);
  EXPECT_EQ(f.cache.cached_pages(b), 3);
  EXPECT_EQ(f.cache.make_room(6), 6);  // the host tier is full: b's last page is dropped
  EXPECT_EQ(f.cache.cached_pages(b), 2);
  EXPECT_EQ(f.cache.stats().pages_dropped, 1);
  EXPECT_EQ(f.cache.make_room(7), 7);  // b's second page leaves the host tier for c's first
  EXPECT_EQ(f.cache.cached_pages(b), 1);
  EXPECT_EQ(f.cache.cached_pages(c), 3);
  EXPECT_EQ(f.cache.cached_pages(a), 3);
  EXPECT_EQ(f.cache.host_pages(), 2);
  EXPECT_EQ(f.cache.device_pages(), 5);
  EXPECT_EQ(f.cache.stats().pages_offloaded, 3);
  EXPECT_EQ(f.cache.stats().pages_dropped, 2);
  // c's first page comes back to the device on a hit.
  const std::vector<std::int32_t> hit = f.cache.match(c);
  EXPECT_EQ(hit.size(), 3u);
  EXPECT_EQ(f.cache.stats().pages_reloaded, 1);
  EXPECT_EQ(f.cache.host_pages(), 1);
  f.cache.unpin(hit);
  f.alloc.check_invariants();
}

// A hit on a prompt whose pages all went to a full host tier, with no device page free: each page
// coming back frees the host slot the next evicted page takes, and the hit's own pages are never
// evicted to make room for each other.
TEST(PrefixCache, AHitOnHostPagesSwapsThemWithTheOldestDevicePages) {
  FinishedPrompts f(3 * FinishedPrompts::n * FinishedPrompts::page);
  const auto a = f.prompt(100), b = f.prompt(200), c = f.prompt(300), d = f.prompt(400);
  f.finish(1, a);
  EXPECT_EQ(f.cache.make_room(FinishedPrompts::pages), FinishedPrompts::pages);
  EXPECT_EQ(f.cache.host_pages(), 3);  // the host tier is full of a
  f.finish(2, b);
  f.finish(3, c);
  f.finish(4, d);
  f.alloc.allocate(9, 3 * FinishedPrompts::n * FinishedPrompts::page);  // the last free pages
  ASSERT_EQ(f.alloc.free_pages(), 0);
  const std::vector<std::int32_t> hit = f.cache.match(a);
  EXPECT_EQ(hit.size(), 3u);
  EXPECT_EQ(f.cache.stats().pages_reloaded, 3);
  // The first page back found no host slot: b's last page was dropped; then b's first two pages
  // took the slots a's pages left.
  EXPECT_EQ(f.cache.stats().pages_dropped, 1);
  EXPECT_EQ(f.cache.cached_pages(b), 2);
  EXPECT_EQ(f.cache.host_pages(), 2);
  EXPECT_EQ(f.cache.cached_pages(c), 3);
  EXPECT_EQ(f.cache.cached_pages(d), 3);
  f.cache.unpin(hit);
  f.alloc.check_invariants();
}

// clear() forgets every page: those only the cache held are free again, on the device and in the
// host tier; a page a request shares stays the request's until it ends.
TEST(PrefixCache, ClearFreesEveryPageNoRequestUses) {
  FinishedPrompts f(2 * FinishedPrompts::n * FinishedPrompts::page);
  const auto a = f.prompt(100), b = f.prompt(200), c = f.prompt(300);
  f.finish(1, a);
  f.finish(2, b);
  EXPECT_EQ(f.cache.make_room(8), 8);  // a's first two pages to the host tier
  EXPECT_EQ(f.cache.host_pages(), 2);
  f.finish(3, c);
  const std::vector<std::int32_t> hit = f.cache.match(c);
  f.alloc.allocate_shared(7, hit);  // a request shares c's pages
  f.cache.unpin(hit);
  EXPECT_EQ(f.cache.clear(), 7);  // a's last page, b's three, c's three
  EXPECT_EQ(f.cache.device_pages(), 0);
  EXPECT_EQ(f.cache.host_pages(), 0);
  for (const auto* p : {&a, &b, &c}) EXPECT_EQ(f.cache.cached_pages(*p), 0);
  EXPECT_EQ(f.alloc.free_pages(), FinishedPrompts::pages - 3);
  EXPECT_EQ(f.alloc.pages(7), hit);
  f.alloc.check_invariants();
  f.alloc.free(7);
  EXPECT_EQ(f.alloc.free_pages(), FinishedPrompts::pages);
  // The host slots are free again: a prompt cached anew fills them.
  f.finish(4, a);
  EXPECT_EQ(f.cache.make_room(FinishedPrompts::pages), FinishedPrompts::pages);
  EXPECT_EQ(f.cache.host_pages(), 2);
  EXPECT_EQ(f.cache.cached_pages(a), 2);
  f.alloc.check_invariants();
}

// Random prompts sharing random prefixes finish, start and end requests over cached prefixes,
// and meet random pressure, with and without a host tier: eviction frees exactly what is asked
// while it can, everything but the pages live requests share when asked for all, and never a
// page a live request shares.
TEST(PrefixCache, RandomPressureFreesWhatIsAskedAndKeepsSharedPages) {
  auto rng = test::make_rng();
  constexpr int n = 2, page = 2, pages = 40, vp = n * page;
  for (const std::int64_t host_pages : {0, 3, 8}) {
    KvAllocator alloc(n, page, pages);
    LatentPool pool(pages, page, LatentGeometry{8, 4, KvDtype::bf16});
    PrefixCache cache(alloc, {&pool}, 0, host_pages * vp);
    std::vector<std::vector<std::int32_t>> prompts;
    std::map<RequestId, std::pair<std::vector<std::int32_t>, std::int64_t>> live;  // prompt, hit
    RequestId next = 1;
    const auto held_by_requests = [&] {
      std::set<std::int32_t> held;
      for (const auto& [id, l] : live) held.insert(alloc.pages(id).begin(), alloc.pages(id).end());
      return static_cast<std::int64_t>(held.size());
    };
    // 400 operations, and more (up to 4000) until the run has dropped pages and, with a host
    // tier, brought some back: a small tier's pages are not always hit in 400.
    const auto covered = [&] {
      const PrefixCacheStats& st = cache.stats();
      return st.pages_dropped > 0 && (host_pages == 0 || st.pages_reloaded > 0);
    };
    for (int op = 0; op < 400 || (!covered() && op < 4000); ++op) {
      const std::string what =
          "host pages " + std::to_string(host_pages) + " op " + std::to_string(op);
      const std::int64_t kind = rng.range(0, 3);
      if (kind == 0) {  // a prompt finishes, sharing a prefix of an earlier one or not
        std::vector<std::int32_t> t;
        if (!prompts.empty() && rng.coin()) {
          const auto& from = prompts[static_cast<std::size_t>(
              rng.range(0, static_cast<std::int64_t>(prompts.size()) - 1))];
          t.assign(from.begin(),
                   from.begin() + vp * rng.range(0, static_cast<std::int64_t>(from.size()) / vp));
        }
        const std::int64_t tail = rng.range(1, 5 * vp);
        for (std::int64_t i = 0; i < tail; ++i)
          t.push_back(static_cast<std::int32_t>(rng.range(0, 3)));
        const std::int64_t need = (static_cast<std::int64_t>(t.size()) + vp - 1) / vp;
        if (cache.make_room(need) < need) continue;
        const RequestId id = next++;
        alloc.allocate(id, static_cast<std::int64_t>(t.size()));
        cache.insert(t, id);
        alloc.free(id);
        prompts.push_back(std::move(t));
      } else if (kind == 1 && !prompts.empty()) {  // a request starts over a cached prefix
        const auto& t = prompts[static_cast<std::size_t>(
            rng.range(0, static_cast<std::int64_t>(prompts.size()) - 1))];
        const std::vector<std::int32_t> hit = cache.match(t);
        if (hit.empty()) continue;
        const RequestId id = next++;
        alloc.allocate_shared(id, hit);
        cache.unpin(hit);
        live[id] = {t, static_cast<std::int64_t>(hit.size())};
      } else if (kind == 2 && !live.empty()) {  // a request ends
        auto it = live.begin();
        std::advance(it, rng.range(0, static_cast<std::int64_t>(live.size()) - 1));
        alloc.free(it->first);
        live.erase(it);
      } else {  // pressure
        const std::int64_t want = rng.coin(0.2) ? pages : rng.range(0, pages);
        const std::int64_t before = alloc.free_pages();
        const std::int64_t reachable = pages - held_by_requests();
        EXPECT_EQ(cache.unused_pages(), reachable - before) << what;
        EXPECT_EQ(cache.make_room(want), before >= want ? before : std::min(want, reachable))
            << what;
      }
      alloc.check_invariants();
      EXPECT_LE(cache.host_pages(), host_pages) << what;
      for (const auto& [id, l] : live)
        ASSERT_GE(cache.cached_pages(l.first), l.second) << what << ": a shared page went";
    }
    // The run met pressure: pages were dropped, and moved through the host tier where it exists.
    const PrefixCacheStats& st = cache.stats();
    std::printf("host pages %lld: dropped %lld, offloaded %lld, reloaded %lld\n",
                static_cast<long long>(host_pages), static_cast<long long>(st.pages_dropped),
                static_cast<long long>(st.pages_offloaded),
                static_cast<long long>(st.pages_reloaded));
    EXPECT_GT(st.pages_dropped, 0);
    if (host_pages > 0) {
      EXPECT_GT(st.pages_reloaded, 0);
    }
  }
}

}  // namespace
}  // namespace dcp
