// The mixture-of-experts gate as the Hugging Face DeepSeek modeling code computes it: which
// experts each token goes to, and with which weights.
//
//   scores = softmax(logits) (deepseek_v2) or sigmoid(logits) (deepseek_v3, kimi_k2)
//   choice = scores, plus e_score_correction_bias under noaux_tc
//   greedy:               the top-k of choice
//   group_limited_greedy: groups scored by their best choice, the top topk_group groups kept
//   noaux_tc:             groups scored by the sum of their two best choices, likewise
//   (experts of the other groups score 0), then the top-k of what is left
//   weights = scores of the chosen experts (never the biased ones); normalised over the k when
//   norm_topk_prob (k > 1); times routed_scaling_factor: always for v3 and kimi_k2, and for
//   deepseek_v2 only when it did not normalise.
// Ties go to the lower expert or group index, so every rank chooses alike.
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/model_config.h"

namespace dcp::moe {

struct Routing {
  int k = 0;                          // experts per token
  std::vector<std::int32_t> experts;  // [T, k]
  std::vector<float> weights;         // [T, k]
};

// logits [T, n_routed_experts] (hidden @ gate.weight^T in fp32); bias [n_routed_experts] or
// null (noaux_tc needs it).
Routing route(const ModelConfig& c, const float* logits, std::int64_t tokens, const float* bias);

}  // namespace dcp::moe
