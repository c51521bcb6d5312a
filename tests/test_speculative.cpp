// Speculative decoding with DCP target verification, and the two extend paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "dcp/error.h"
#include "dcp/sampling.h"
#include "dcp/weights.h"
#include "engine_util.h"
#include "test_util.h"

namespace dcp {
namespace {

using test::EngineSetup;
using test::random_tokens;
using test::request;
using test::run_engine;

// fp32 KV: a verification forward (k+1 tokens) and plain decode (1 token) then differ only in
// fp32 rounding, far below the gaps between the top logits of these random models.
std::vector<RequestSpec> mixed_requests(test::Rng& rng, int vocab) {
  std::vector<RequestSpec> reqs;
  const int lengths[] = {1, 3, 45, 90};  // prompts shorter than N too
  const int max_new[] = {9, 7, 11, 8};   // not multiples of k + 1: requests end mid-speculation
  for (int i = 0; i < 4; ++i)
    reqs.push_back(request(i, random_tokens(rng, lengths[i], vocab), max_new[i]));
  return reqs;
}

TEST(Speculative, GreedyAcceptanceEqualsPlainGreedyDecoding) {
  auto rng = test::make_rng();
  const ModelConfig target = preset_config("tiny", 2);
  const auto weights = make_synthetic_weights(21);
  const auto other_weights = make_synthetic_weights(77);
  const auto reqs = mixed_requests(rng, target.vocab_size);
  EngineSetup plain;
  plain.tp = 4;
  plain.chunk = 37;
  const auto reference = run_engine(target, *weights, plain, reqs);

  // Three drafts: the target itself (everything accepted), its first layer, and an unrelated
  // model (almost everything rejected): every acceptance path runs.
  struct Draft {
    const char* name;
    ModelConfig config;
    const WeightSource* w;
  };
  const Draft drafts[] = {{"target copy", target, weights.get()},
                          {"first layer", preset_config("tiny", 1), weights.get()},
                          {"unrelated", preset_config("tiny", 1), other_weights.get()}};
  struct Case {
    int dcp;
    CombineBackend backend;
    int k;
  };
  const Case cases[] = {{1, CombineBackend::ag_rs, 1}, {2, CombineBackend::a2a, 2},
                        {4, CombineBackend::ag_rs, 3}, {4, CombineBackend::a2a, 4},
                        {2, CombineBackend::ag_rs, 4}, {4, CombineBackend::a2a, 1}};
  for (const Draft& d : drafts) {
    for (const Case& c : cases) {
      EngineSetup s = plain;
      s.dcp = c.dcp;
      s.backend = c.backend;
      s.num_draft_tokens = c.k;
      s.draft_config = d.config;
      s.draft_weights = d.w;
      const auto got = run_engine(target, *weights, s, reqs);
      const std::string what = std::string(d.name) + " dcp " + std::to_string(c.dcp) + " " +
                               std::string(to_string(c.backend)) + " k " + std::to_string(c.k);
      for (std::size_t i = 0; i < reqs.size(); ++i) {
        // Each emitted token's logits come from the verification forward: equal to plain decode's.
        EXPECT_TRUE(test::same_greedy_run(got.results[i], reference.results[i], target.vocab_size,
                                          {1e-10, 1e-4}))
            << what << " request " << i;
        // Every token after the first comes from one target step, which emits 1 to k + 1 of them;
        // with an exact draft every step but the last emits k + 1.
        const auto after_first = static_cast<std::int64_t>(got.results[i].output_tokens.size()) - 1;
        const std::int64_t steps = got.results[i].spec_verify_steps;
        EXPECT_GE(steps * (c.k + 1), after_first) << what << " request " << i;
        EXPECT_LE(steps, after_first) << what << " request " << i;
        if (std::string(d.name) == "target copy") {
          EXPECT_EQ(steps, (after_first + c.k) / (c.k + 1)) << what << " request " << i;
        }
        EXPECT_EQ(reference.results[i].spec_verify_steps, 0) << "request " << i;
      }
      EXPECT_GT(got.stats.spec_proposed, 0) << what;
      if (std::string(d.name) == "target copy") {
        EXPECT_EQ(got.stats.spec_accepted, got.stats.spec_proposed)
            << what << ": an exact draft is always accepted";
      }
      EXPECT_GE(got.stats.tokens_per_target_step(), 1.0) << what;
    }
  }
}

// Prompt lookup, written here from its definition: the tokens that followed the latest earlier
// occurrence of the text's last n tokens, for the largest n <= max_n that has one (at most k).
std::vector<std::int32_t> lookup_reference(const std::vector<std::int32_t>& text, int max_n,
                                           int k) {
  const int len = static_cast<int>(text.size());
  for (int n = std::min(max_n, len - 1); n >= 1; --n) {
    for (int at = len - n - 1; at >= 0; --at) {
      bool same = true;
      for (int j = 0; j < n && same; ++j) same = text[at + j] == text[len - n + j];
      if (!same) continue;
      std::vector<std::int32_t> out;
      for (int j = at + n; j < len && static_cast<int>(out.size()) < k; ++j) out.push_back(text[j]);
      return out;
    }
  }
  return {};
}

// N-gram drafts (no draft model): greedy tokens are plain decoding's, and each request's target
// steps, proposals and kept drafts are those a replay of plain decoding's tokens through the
// lookup above predicts: each step proposes from the text so far and keeps the drafts that equal
// the tokens plain decoding chose next.
TEST(Speculative, NgramLookupProposesWhatFollowedTheLastMatchAndKeepsGreedyTokens) {
  auto rng = test::make_rng();
  const ModelConfig target = preset_config("tiny", 2);
  const auto weights = make_synthetic_weights(21);
  std::vector<RequestSpec> reqs;
  const std::vector<std::int32_t> motif = random_tokens(rng, 6, target.vocab_size);
  for (int i = 0; i < 4; ++i) {
    std::vector<std::int32_t> prompt = random_tokens(rng, 1 + 7 * i, target.vocab_size);
    for (int r = 0; r < i; ++r) prompt.insert(prompt.end(), motif.begin(), motif.end());
    reqs.push_back(request(i, prompt, 60 + 7 * i));  // a random model repeats itself: drafts hit
  }
  EngineSetup plain;
  plain.tp = 2;
  const auto reference = run_engine(target, *weights, plain, reqs);
  for (const int max_n : {1, 3}) {
    for (const int k : {1, 3}) {
      for (const int dcp : {1, 2}) {
        EngineSetup s = plain;
        s.dcp = dcp;
        s.num_draft_tokens = k;
        s.ngram_draft = max_n;
        const auto got = run_engine(target, *weights, s, reqs);
        const std::string what = str("ngram ", max_n, " k ", k, " dcp ", dcp);
        std::int64_t proposed = 0, accepted = 0;
        for (std::size_t i = 0; i < reqs.size(); ++i) {
          EXPECT_TRUE(test::same_greedy_run(got.results[i], reference.results[i], target.vocab_size,
                                            {1e-10, 1e-4}))
              << what << " request " << i;
          const std::vector<std::int32_t>& out = reference.results[i].output_tokens;
          std::int64_t steps = 0;
          for (std::size_t done = 1; done < out.size(); ++steps) {
            const int room = std::min<int>(k, static_cast<int>(out.size() - done) - 1);
            std::vector<std::int32_t> text = reqs[i].prompt;
            text.insert(text.end(), out.begin(), out.begin() + static_cast<std::ptrdiff_t>(done));
            const std::vector<std::int32_t> drafts = lookup_reference(text, max_n, room);
            std::size_t kept = 0;
            while (kept < drafts.size() && drafts[kept] == out[done + kept]) ++kept;
            proposed += static_cast<std::int64_t>(drafts.size());
            accepted += static_cast<std::int64_t>(kept);
            done += kept + 1;
          }
          EXPECT_EQ(got.results[i].spec_verify_steps, steps) << what << " request " << i;
        }
        EXPECT_EQ(got.stats.spec_proposed, proposed) << what;
        EXPECT_EQ(got.stats.spec_accepted, accepted) << what;
        EXPECT_GT(accepted, 0) << what << ": no draft was kept";
      }
    }
  }
}

// Sampled requests (temperature > 0, truncation, penalties) with the target as its own draft: every
// draft is kept (it was drawn from the target's own distribution with the step's number), so the
// tokens are plain sampling's, under DCP too.
TEST(Speculative, SampledTokensWithAnExactDraftAreThoseOfPlainSampling) {
  auto rng = test::make_rng();
  const ModelConfig target = preset_config("tiny", 2);
  const auto weights = make_synthetic_weights(21);
  auto reqs = mixed_requests(rng, target.vocab_size);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    SamplingParams& p = reqs[i].sampling;
    p.temperature = 0.6 + 0.2 * static_cast<double>(i);
    p.top_p = i % 2 ? 0.9 : 1.0;
    p.top_k = i == 2 ? 8 : 0;
    p.min_p = i == 3 ? 0.02 : 0.0;
    p.presence_penalty = i == 1 ? 0.7 : 0.0;
    p.seed = test::test_seed() + i;
  }
  // Masks, a guided choice, a stop token held by min_tokens and one that ends a request: the
  // draft's proposals and their
  // verification apply them alike.
  const int vocab = target.vocab_size;
  RequestSpec masked = request(4, random_tokens(rng, 12, vocab), 10);
  masked.sampling.allowed_token_ids = random_tokens(rng, 12, vocab);
  RequestSpec chosen = request(5, random_tokens(rng, 7, vocab), 10);
  for (const int len : {5, 6, 8}) {
    std::vector<std::int32_t> choice = random_tokens(rng, len, vocab);
    choice[0] = len;  // no choice begins another
    chosen.sampling.choices.push_back(choice);
  }
  RequestSpec held = request(6, random_tokens(rng, 9, vocab), 12);  // stops masked at first
  held.min_tokens = 6;
  held.sampling.top_k = 3;
  RequestSpec stopped = request(7, random_tokens(rng, 20, vocab), 12);
  for (RequestSpec* r : {&masked, &chosen, &held, &stopped}) {
    r->sampling.temperature = 1.2;
    r->sampling.seed = test::test_seed() + static_cast<std::uint64_t>(r->id);
    reqs.push_back(*r);
  }
  EngineSetup plain;
  plain.tp = 2;
  // The stop tokens: what the held request draws second without one (it may come again later),
  // what the last draws fifth.
  const auto first = run_engine(target, *weights, plain, reqs);
  reqs[6].stop_token_ids = {first.results[6].output_tokens[1]};
  reqs.back().stop_token_ids = {first.results.back().output_tokens[4]};
  const auto reference = run_engine(target, *weights, plain, reqs);
  EXPECT_EQ(reference.results.back().finish_reason, FinishReason::stop);
  EXPECT_EQ(reference.results[5].finish_reason, FinishReason::stop);  // a choice completed
  for (const int dcp : {1, 2}) {
    for (const int k : {1, 3}) {
      EngineSetup s = plain;
      s.dcp = dcp;
      s.num_draft_tokens = k;
      s.draft_config = target;
      s.draft_weights = weights.get();
      const auto got = run_engine(target, *weights, s, reqs);
      const std::string what = "dcp " + std::to_string(dcp) + " k " + std::to_string(k);
      for (std::size_t i = 0; i < reqs.size(); ++i) {
        EXPECT_EQ(got.results[i].output_tokens, reference.results[i].output_tokens)
            << what << " request " << i;
      }
      // Drafts proposed past a stop are not kept: the requests that end by their length alone.
      const std::vector<RequestSpec> to_length(reqs.begin(), reqs.begin() + 5);
      const auto whole = run_engine(target, *weights, s, to_length);
      EXPECT_GT(whole.stats.spec_proposed, 0) << what;
      EXPECT_EQ(whole.stats.spec_accepted, whole.stats.spec_proposed)
          << what << ": an exact draft is always kept";
    }
  }
}

// The distribution request `spec` draws step `step` from, given the step's recorded logits.
std::vector<double> step_distribution(const RequestSpec& spec, const RequestResult& r,
                                      std::size_t step, int vocab) {
  const std::span<const std::int32_t> before(r.output_tokens.data(), step);
  const std::vector<float> adjusted = adjusted_logits(r.step_logits.data() + step * vocab, vocab,
                                                      spec.sampling, spec.prompt, before);
  return sampling_distribution(adjusted.data(), vocab, spec.sampling);
}

// With drafts that differ from the target, every token of a sampled request after the first (each
// one verified) is distributed as its step's target distribution p, computed here from the step's
// recorded logits with the request's penalties. The draft's distribution q at each step comes
// from the draft alone, teacher-forced along the same tokens. Speculative sampling errs towards the
// draft when it errs (keeping drafts too often, replacing them from p instead of max(0, p - q)):
// over many requests, the tokens where q > p must be emitted as often as p says, and no token
// outside p ever.
TEST(Speculative, SampledTokensFollowTheTargetDistributionWhateverTheDraft) {
  auto rng = test::make_rng();
  const ModelConfig target = preset_config("tiny", 2);
  const auto weights = make_synthetic_weights(21);
  const auto other_weights = make_synthetic_weights(77);
  const int vocab = target.vocab_size;
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 320; ++i) {
    RequestSpec r = request(i, random_tokens(rng, 1 + i % 11, vocab), 9);
    r.sampling.temperature = i % 3 ? 0.7 : 1.2;
    r.sampling.top_k = i % 2 ? 5 : 0;
    r.sampling.repetition_penalty = i % 4 ? 1.0 : 1.5;
    r.sampling.seed = test::test_seed() * 1000 + static_cast<std::uint64_t>(i);
    reqs.push_back(r);
  }
  struct Draft {
    const char* name;
    ModelConfig config;
    const WeightSource* w;
  };
  const Draft drafts[] = {{"first layer", preset_config("tiny", 1), weights.get()},
                          {"unrelated", preset_config("tiny", 1), other_weights.get()}};
  for (const Draft& d : drafts) {
    EngineSetup s;
    s.tp = 2;
    s.dcp = 2;
    s.num_draft_tokens = 3;
    s.draft_config = d.config;
    s.draft_weights = d.w;
    const auto got = run_engine(target, *weights, s, reqs);
    std::vector<RequestSpec> forced = reqs;
    for (std::size_t i = 0; i < reqs.size(); ++i)
      forced[i].forced_outputs = got.results[i].output_tokens;
    const auto draft_run = run_engine(d.config, *d.w, EngineSetup{}, forced);
    double expected = 0, variance = 0;
    int observed = 0;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      const RequestResult& r = got.results[i];
      ASSERT_EQ(r.output_tokens.size(), 9u) << d.name << " request " << i;
      for (std::size_t step = 1; step < r.output_tokens.size(); ++step) {
        const std::vector<double> p = step_distribution(reqs[i], r, step, vocab);
        const std::vector<double> q = step_distribution(reqs[i], draft_run.results[i], step, vocab);
        const auto token = static_cast<std::size_t>(r.output_tokens[step]);
        ASSERT_GT(p[token], 0) << d.name << " request " << i << " step " << step
                               << ": a token outside the target's distribution";
        double favoured = 0;  // p's mass where q > p
        for (std::size_t x = 0; x < p.size(); ++x) favoured += q[x] > p[x] ? p[x] : 0;
        expected += favoured;
        variance += favoured * (1 - favoured);
        observed += q[token] > p[token];
      }
    }
    EXPECT_NEAR(observed, expected, 5 * std::sqrt(variance) + 1)
        << d.name << ": tokens the draft favours, emitted against p's mass on them";
    // Both outcomes of the test ran: drafts kept, and drafts replaced.
    EXPECT_GT(got.stats.spec_accepted, 0) << d.name;
    EXPECT_LT(got.stats.spec_accepted, got.stats.spec_proposed) << d.name;
    std::printf(
        "%s: %lld of %lld drafts kept; tokens the draft favours %d, p's mass on them %.1f\n",
        d.name, static_cast<long long>(got.stats.spec_accepted),
        static_cast<long long>(got.stats.spec_proposed), observed, expected);
  }
}

// Sampled requests with n-gram drafts: a draft comes with certainty (q holds it alone), so it is
// kept with probability p(draft) and a replacement is never the draft itself. A replay of each
// request's tokens through the lookup above finds every step's drafts; the drafts kept must
// number as p says (5 sigma), each step's first differing token ends its drafts, and no token
// falls outside p.
TEST(Speculative, SampledNgramDraftsAreKeptWithTheTargetsProbability) {
  auto rng = test::make_rng();
  const ModelConfig target = preset_config("tiny", 2);
  const auto weights = make_synthetic_weights(21);
  const int vocab = target.vocab_size;
  // Prompts P + G + P, G the greedy continuation of P: lookup proposes G again, tokens the
  // target often gives a good part of its mass to.
  std::vector<RequestSpec> greedy;
  for (int i = 0; i < 320; ++i)
    greedy.push_back(request(i, random_tokens(rng, 3 + i % 7, vocab), 12));
  const auto continuations = run_engine(target, *weights, EngineSetup{}, greedy);
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 320; ++i) {
    std::vector<std::int32_t> prompt = greedy[static_cast<std::size_t>(i)].prompt;
    const std::vector<std::int32_t> g =
        continuations.results[static_cast<std::size_t>(i)].output_tokens;
    prompt.insert(prompt.end(), g.begin(), g.end());
    prompt.insert(prompt.end(), greedy[static_cast<std::size_t>(i)].prompt.begin(),
                  greedy[static_cast<std::size_t>(i)].prompt.end());
    RequestSpec r = request(i, prompt, 9);
    r.sampling.temperature = i % 3 ? 0.3 : 1.0;  // peaked: G often drawn again
    r.sampling.top_k = i % 2 ? 5 : 0;
    r.sampling.repetition_penalty = i % 4 ? 1.0 : 1.5;
    r.sampling.seed = test::test_seed() * 1000 + static_cast<std::uint64_t>(i);
    reqs.push_back(r);
  }
  EngineSetup s;
  s.tp = 2;
  s.dcp = 2;
  s.num_draft_tokens = 3;
  s.ngram_draft = 2;
  const auto got = run_engine(target, *weights, s, reqs);
  double expected = 0, variance = 0;
  std::int64_t kept = 0, proposed = 0;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const RequestResult& r = got.results[i];
    const std::vector<std::int32_t>& out = r.output_tokens;
    ASSERT_EQ(out.size(), 9u) << "request " << i;
    for (std::size_t step = 0; step < out.size(); ++step) {
      const std::vector<double> p = step_distribution(reqs[i], r, step, vocab);
      ASSERT_GT(p[static_cast<std::size_t>(out[step])], 0)
          << "request " << i << " step " << step << ": a token outside the target's distribution";
    }
    for (std::size_t done = 1; done < out.size();) {
      const int room = std::min<int>(3, static_cast<int>(out.size() - done) - 1);
      std::vector<std::int32_t> text = reqs[i].prompt;
      text.insert(text.end(), out.begin(), out.begin() + static_cast<std::ptrdiff_t>(done));
      const std::vector<std::int32_t> drafts = lookup_reference(text, 2, room);
      proposed += static_cast<std::int64_t>(drafts.size());
      std::size_t j = 0;
      for (; j < drafts.size(); ++j) {
        const double pd =
            step_distribution(reqs[i], r, done + j, vocab)[static_cast<std::size_t>(drafts[j])];
        expected += pd;
        variance += pd * (1 - pd);
        if (out[done + j] != drafts[j]) break;  // replaced, by another token
        ++kept;
      }
      done += j + 1;
    }
  }
  EXPECT_EQ(got.stats.spec_proposed, proposed);
  EXPECT_EQ(got.stats.spec_accepted, kept);
  EXPECT_NEAR(static_cast<double>(kept), expected, 5 * std::sqrt(variance) + 1)
      << "n-gram drafts kept against the target's probability of them";
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, proposed);
  std::printf("n-gram: %lld of %lld drafts kept, %.1f expected (sigma %.1f)\n",
              static_cast<long long>(kept), static_cast<long long>(proposed), expected,
              std::sqrt(variance));
}

TEST(Speculative, RejectsMisuse) {
  const ModelConfig target = preset_config("tiny", 1);
  const auto weights = make_synthetic_weights(1);
  EngineSetup s;
  s.num_draft_tokens = 2;  // no draft model
  EXPECT_TRUE(test::throws_error(
      [&] {
        run_engine(target, *weights, s, {request(0, {1, 2}, 3)});
      },
      ErrorCategory::invalid_argument, "num_draft_tokens > 0 needs a draft model"));
  ModelConfig other_vocab = target;
  other_vocab.vocab_size = 100;
  s.draft_config = other_vocab;
  s.draft_weights = weights.get();
  EXPECT_TRUE(test::throws_error(
      [&] {
        run_engine(target, *weights, s, {request(0, {1, 2}, 3)});
      },
      ErrorCategory::invalid_argument,
      "the draft model's vocabulary (100) differs from the target's"));
  const auto refused = [&](EngineSetup bad, const char* message) {
    return test::throws_error(
        [&] {
          run_engine(target, *weights, bad, {request(0, {1, 2}, 3)});
        },
        ErrorCategory::invalid_argument, message);
  };
  s.draft_config = target;
  s.ngram_draft = 2;
  EXPECT_TRUE(refused(s, "takes a draft model or n-gram lookup (ngram_draft), not both"));
  EngineSetup lookup;
  lookup.ngram_draft = 2;
  EXPECT_TRUE(refused(lookup, "ngram_draft = 2 needs num_draft_tokens >= 1"));
  lookup.num_draft_tokens = 1;
  lookup.ngram_draft = -1;
  EXPECT_TRUE(refused(lookup, "ngram_draft = -1 must be >= 0"));
}

}  // namespace
}  // namespace dcp
