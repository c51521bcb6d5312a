// A naive float64 DeepSeek-V2/V3 forward for tests: no absorption, no latent cache, no DCP.
// K and V are decompressed per head with kv_b_proj and attended with ordinary causal MHA.
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/model_config.h"
#include "dcp/weights.h"

namespace dcp::test {

// Logits [tokens.size(), vocab] for every position of one sequence. With `route_margin`, also
// the smallest gap, over every token of every MoE layer, between the last expert (and group) the
// router chose and the first it did not: routing is discontinuous, so where that gap is within
// float rounding an fp32 model may rightly choose the other expert.
std::vector<double> naive_logits(const ModelConfig& config, const WeightSource& weights,
                                 const std::vector<std::int32_t>& tokens,
                                 double* route_margin = nullptr);

}  // namespace dcp::test
