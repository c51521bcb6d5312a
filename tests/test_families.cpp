// Every MLA family as published (DeepSeek-V2-Lite, V2, V3, Kimi-K2, Moonlight): mixture-of-experts
// routing as the Hugging Face code does it, against an independent float64 model, at every TP and
// DCP size.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dcp/error.h"
#include "dcp/model_config.h"
#include "dcp/weights.h"
#include "engine_util.h"
#include "naive_model.h"
#include "test_util.h"

namespace dcp {
namespace {

const char* const kFamilies[] = {"deepseek-v2-lite", "deepseek-v2", "deepseek-v3", "kimi-k2",
                                 "moonlight"};

// Step logits of the engine (fp32 KV, teacher-forced) against the float64 model at the same
// positions, to 1e-4 relative to the largest logit.
void expect_family_matches_float64(const ModelConfig& c, const WeightSource& w, int tp, int dcp,
                                   test::Rng& rng) {
  const int steps = 3;
  const std::vector<std::int32_t> prompt = test::random_tokens(rng, 19, c.vocab_size);
  RequestSpec r = test::request(0, prompt, steps, test::random_tokens(rng, steps, c.vocab_size));
  test::EngineSetup s;
  s.tp = tp;
  s.dcp = dcp;
  s.backend = dcp > 1 ? CombineBackend::a2a : CombineBackend::ag_rs;
  s.chunk = 7;  // prefill in chunks over a cached prefix
  const test::EngineRun run = test::run_engine(c, w, s, {r});
  ASSERT_EQ(run.results[0].state, RequestState::finished) << run.results[0].error;
  std::vector<std::int32_t> seq = prompt;
  seq.insert(seq.end(), r.forced_outputs.begin(), r.forced_outputs.end() - 1);
  const std::vector<double> naive = test::naive_logits(c, w, seq);
  const std::vector<double> expect(naive.end() - static_cast<std::ptrdiff_t>(steps) * c.vocab_size,
                                   naive.end());
  const std::string what = c.name + " tp " + std::to_string(tp) + " dcp " + std::to_string(dcp);
  EXPECT_TRUE(test::close(run.results[0].step_logits, expect, {1e-9, 1e-4}, what.c_str()));
}

TEST(Families, MixtureOfExpertsEqualsFloat64AtEveryTpAndDcp) {
  auto rng = test::make_rng();
  for (const char* family : kFamilies) {
    const ModelConfig c = family_config(family);
    ASSERT_TRUE(c.is_moe_layer(1) && !c.is_moe_layer(0)) << family;
    const auto w = make_synthetic_weights(rng.range(1, 1000));
    for (const auto& [tp, dcp] : {std::pair{1, 1}, {2, 1}, {2, 2}, {4, 2}, {4, 4}}) {
      expect_family_matches_float64(c, *w, tp, dcp, rng);
    }
  }
}

TEST(Families, ConfigsRoundTripAndKeepTheirFields) {
  for (const char* family : kFamilies) {
    const ModelConfig c = family_config(family);
    const ModelConfig back = parse_model_config(model_config_to_json(c));
    EXPECT_EQ(back.model_type, c.model_type) << family;
    EXPECT_EQ(back.architecture, c.architecture) << family;
    EXPECT_EQ(back.topk_method, c.topk_method) << family;
    EXPECT_EQ(back.scoring_func, c.scoring_func) << family;
    EXPECT_EQ(back.n_routed_experts, c.n_routed_experts) << family;
    EXPECT_EQ(back.n_group, c.n_group) << family;
    EXPECT_EQ(back.topk_group, c.topk_group) << family;
    EXPECT_EQ(back.num_experts_per_tok, c.num_experts_per_tok) << family;
    EXPECT_EQ(back.norm_topk_prob, c.norm_topk_prob) << family;
    EXPECT_DOUBLE_EQ(back.routed_scaling_factor, c.routed_scaling_factor) << family;
    EXPECT_EQ(back.quant_method, c.quant_method) << family;
    EXPECT_EQ(back.q_lora_rank.has_value(), c.q_lora_rank.has_value()) << family;
  }
  EXPECT_TRUE(test::throws_error([] { family_config("llama"); }, ErrorCategory::invalid_argument,
                                 "family = 'llama' is not one of: deepseek-v2-lite"));
}

}  // namespace
}  // namespace dcp
