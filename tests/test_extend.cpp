// Prefill chunks over a cached prefix (gather and DCP-native extend) and multi-turn
// continuations, against DCP 1.
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

// Extend: chunk boundaries anywhere, prefixes shorter than N, both paths against DCP 1.
TEST(Extend, GatherAndNativeEqualDcpOne) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(31);
  std::vector<RequestSpec> reqs;
  const int lengths[] = {2, 5, 64, 133};
  for (int i = 0; i < 4; ++i)
    reqs.push_back(request(i, random_tokens(rng, lengths[i], c.vocab_size), 4));
  for (int chunk : {1, 3, 7, 50}) {  // chunks of 1..3 tokens leave prefixes shorter than N
    EngineSetup ref;
    ref.tp = 4;
    ref.chunk = chunk;
    const auto expect = run_engine(c, *w, ref, reqs);
    for (ForwardMode mode : {ForwardMode::extend, ForwardMode::extend_native}) {
      for (int n : {2, 4}) {
        EngineSetup s = ref;
        s.dcp = n;
        s.backend = n == 4 ? CombineBackend::a2a : CombineBackend::ag_rs;
        s.replicate_q = n == 4;
        s.extend_mode = mode;
        const auto got = run_engine(c, *w, s, reqs);
        const std::string what = std::string(mode == ForwardMode::extend ? "gather" : "native") +
                                 " chunk " + std::to_string(chunk) + " dcp " + std::to_string(n);
        for (std::size_t i = 0; i < reqs.size(); ++i) {
          EXPECT_TRUE(
              test::same_greedy_run(got.results[i], expect.results[i], c.vocab_size, {1e-10, 1e-4}))
              << what << " request " << i;
        }
      }
    }
  }
}

TEST(Extend, MultiTurnContinuationEqualsOneLongPrompt) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(41);
  RequestSpec first = request(1, random_tokens(rng, 70, c.vocab_size), 5);
  first.keep_kv = true;
  RequestSpec second = request(2, random_tokens(rng, 23, c.vocab_size), 6);
  second.continue_from = 1;
  for (ForwardMode mode : {ForwardMode::extend, ForwardMode::extend_native}) {
    EngineSetup s;
    s.tp = 4;
    s.dcp = 4;
    s.backend = CombineBackend::a2a;
    s.chunk = 9;
    s.extend_mode = mode;
    const auto turns = test::run_engine_phases(c, *w, s, {{first}, {second}});
    ASSERT_EQ(turns.results.size(), 2u);
    // The same conversation as one prompt: first prompt, first answer, second prompt.
    std::vector<std::int32_t> whole = first.prompt;
    whole.insert(whole.end(), turns.results[0].output_tokens.begin(),
                 turns.results[0].output_tokens.end());
    whole.insert(whole.end(), second.prompt.begin(), second.prompt.end());
    EngineSetup one = s;  // the reference: DCP 1 and the gather path, whatever mode is tested
    one.dcp = 1;
    one.extend_mode = ForwardMode::extend;
    const auto single = run_engine(c, *w, one, {request(3, whole, 6)});
    const char* what = mode == ForwardMode::extend ? "gather" : "native";
    // Tokens alone are a weak check (the residual stream dominates a tiny random model): the
    // second turn's logits must match the single prompt's too.
    EXPECT_TRUE(
        test::same_greedy_run(turns.results[1], single.results[0], c.vocab_size, {1e-10, 1e-4}))
        << what;
  }
}

TEST(Extend, SpeculationAcrossTurns) {
  // Continuation plus speculation: the draft's replicated KV follows the target's across turns.
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(43);
  RequestSpec first = request(1, random_tokens(rng, 30, c.vocab_size), 6);
  first.keep_kv = true;
  RequestSpec second = request(2, random_tokens(rng, 11, c.vocab_size), 7);
  second.continue_from = 1;
  EngineSetup plain;
  plain.tp = 2;
  plain.dcp = 2;
  plain.extend_mode = ForwardMode::extend_native;
  const auto expect = test::run_engine_phases(c, *w, plain, {{first}, {second}});
  // The exact copy accepts every proposal, so a turn often ends with the draft one token behind
  // the target (its last proposal unseen): the continuation must still line both caches up.
  for (const ModelConfig& draft : {preset_config("tiny", 1), c}) {
    EngineSetup spec = plain;
    spec.num_draft_tokens = 3;
    spec.draft_config = draft;
    spec.draft_weights = w.get();
    const auto got = test::run_engine_phases(c, *w, spec, {{first}, {second}});
    for (std::size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(
          test::same_greedy_run(got.results[i], expect.results[i], c.vocab_size, {1e-10, 1e-4}))
          << "turn " << i + 1;
    }
  }
}

}  // namespace
}  // namespace dcp
