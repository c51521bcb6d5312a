// Speculative decoding with DCP target verification, and the two extend paths.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dcp/error.h"
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
}

}  // namespace
}  // namespace dcp
