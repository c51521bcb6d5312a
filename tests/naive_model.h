// A naive float64 DeepSeek-V2/V3 forward for tests: no absorption, no latent cache, no DCP.
// K and V are decompressed per head with kv_b_proj and attended with ordinary causal MHA.
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/model_config.h"
#include "dcp/weights.h"

namespace dcp::test {

// Logits [tokens.size(), vocab] for every position of one sequence.
std::vector<double> naive_logits(const ModelConfig& config, const WeightSource& weights,
                                 const std::vector<std::int32_t>& tokens);

}  // namespace dcp::test
