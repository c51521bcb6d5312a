// The feed-forward half of an MLA decoder layer, one rank's TP slice of it: the SwiGLU MLP of the
// dense layers (and of the shared experts), and the mixture-of-experts layer.
//
// Both are row-parallel on the way out: forward() writes this rank's partial output and the TP
// all-reduce (a sum over the ranks) completes it. Weights stay in their checkpoint dtype.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dcp/model_config.h"
#include "dcp/weights.h"

namespace dcp {

// down(silu(gate(x)) * up(x)) over a slice [i0, i1) of the intermediate dimension.
class SwiGluMlp {
 public:
  SwiGluMlp() = default;
  // Rows [i0, i1) of `prefix`gate_proj / up_proj, columns [i0, i1) of `prefix`down_proj.
  SwiGluMlp(const WeightSource& w, const std::string& prefix, std::int64_t hidden,
            std::int64_t intermediate, std::int64_t i0, std::int64_t i1);
  // y[tokens, hidden] = this slice's partial output.
  void forward(const float* x, std::int64_t tokens, float* y) const;
  std::size_t bytes() const noexcept;
  WeightDtype dtype() const noexcept { return gate_.dtype; }

 private:
  WeightMatrix gate_, up_, down_;  // [I_loc, hidden], [I_loc, hidden], [hidden, I_loc]
  std::int64_t i_loc_ = 0;
};

// What one MoE forward did: the routed experts it ran and the weight bytes it read (the router,
// the shared experts and the routed experts run, this rank's slices).
struct MoeStats {
  int experts_run = 0;
  std::size_t weight_bytes_read = 0;
};

// A mixture-of-experts layer as the Hugging Face DeepSeek code defines it: the router
// (replicated), every routed expert's TP slice (1/tp_size of its intermediate dimension, the
// layout without expert parallelism) and the shared experts as one MLP of width
// moe_intermediate_size x n_shared_experts. Tokens are grouped by expert, so each expert runs
// once per forward over the tokens routed to it.
class MoeLayer {
 public:
  // Layer `layer` of `config` (config.is_moe_layer(layer) must hold). Throws dcp::Error naming
  // the tensor on a missing or mis-shaped weight.
  MoeLayer(const ModelConfig& config, const WeightSource& w, int layer, int tp_rank, int tp_size);
  // y[tokens, hidden] = this rank's partial output. Every rank routes alike: x is the whole
  // hidden state and the router runs in fp32.
  void forward(const float* x, std::int64_t tokens, float* y, MoeStats* stats = nullptr) const;
  std::size_t bytes() const noexcept;
  WeightDtype dtype() const noexcept { return experts_.front().dtype(); }

 private:
  ModelConfig config_;
  WeightMatrix router_;      // [E, hidden]
  std::vector<float> bias_;  // [E] e_score_correction_bias (noaux_tc), else empty
  std::vector<SwiGluMlp> experts_;
  std::optional<SwiGluMlp> shared_;
};

}  // namespace dcp
