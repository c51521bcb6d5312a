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

#include "dcp/comm.h"
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
// the shared experts and the routed experts run, this rank's slices); with expert parallelism,
// the (token, expert, rank) entries it dispatched to other ranks and the bytes of the dispatch
// and of the return.
struct MoeStats {
  int experts_run = 0;
  std::size_t weight_bytes_read = 0;
  std::int64_t entries = 0;       // dispatched, its own rank included
  std::int64_t entries_sent = 0;  // dispatched to other ranks
  std::size_t dispatch_bytes_sent = 0, return_bytes_sent = 0;
};

// Expert parallelism over the layer's group of tp_size ranks: the routed experts are partitioned
// over `size` EP ranks (rank / (tp_size / size)), each expert sliced over the tp_size / size ranks
// that share it; shared experts stay sliced over all tp_size ranks. size 1: every routed expert
// sliced over all ranks (no expert parallelism).
struct ExpertParallel {
  int size = 1;
  Communicator* group = nullptr;  // size > 1: the layer's group (rank tp_rank of tp_size)
};

// A mixture-of-experts layer as the Hugging Face DeepSeek code defines it: the router
// (replicated), the routed experts (each rank's TP slice of every expert, or with expert
// parallelism its EP rank's experts) and the shared experts as one MLP of width
// moe_intermediate_size x n_shared_experts. Tokens are grouped by expert, so each expert runs
// once per forward over the tokens routed to it.
//
// With expert parallelism each rank routes 1/tp_size of the tokens (a contiguous slice of the
// rows) and sends each (token, expert) to the ranks holding that expert: the entry counts first
// (one all_to_all), then the rows (one all_to_all_v, nothing padded); they run the expert and the
// outputs come back the same way, weighted and summed at the token's rank.
class MoeLayer {
 public:
  // Layer `layer` of `config` (config.is_moe_layer(layer) must hold). Throws dcp::Error naming
  // the tensor on a missing or mis-shaped weight, or ep_size on a partition that does not divide
  // tp_size or n_routed_experts.
  MoeLayer(const ModelConfig& config, const WeightSource& w, int layer, int tp_rank, int tp_size,
           ExpertParallel ep = {});
  // y[tokens, hidden] = this rank's partial output: summed over the tp_size ranks it is the
  // layer's output. Every rank passes the same x (the whole hidden state); the router runs in
  // fp32. With expert parallelism this is a collective over ep.group.
  void forward(const float* x, std::int64_t tokens, float* y, MoeStats* stats = nullptr) const;
  std::size_t bytes() const noexcept;
  WeightDtype dtype() const noexcept { return experts_.front().dtype(); }
  int ep_size() const noexcept { return ep_.size; }
  int first_expert() const noexcept { return first_expert_; }  // this rank's experts_[0]
  int local_experts() const noexcept { return static_cast<int>(experts_.size()); }

 private:
  void forward_expert_parallel(const float* x, std::int64_t tokens, float* y, MoeStats& s) const;
  // y = this rank's slice of the shared experts over every token (or zeros); counts the router's
  // and the shared experts' bytes in `s`.
  void start_with_shared(const float* x, std::int64_t tokens, float* y, MoeStats& s) const;
  // Runs expert experts_[l] over rows[i] for each (i, l) in the list; out[i] = its output.
  void run_grouped(const float* rows, const std::int32_t* local_expert, std::int64_t n,
                   float* out, MoeStats& s) const;

  ModelConfig config_;
  ExpertParallel ep_;
  int tp_rank_ = 0, tp_size_ = 1;
  int first_expert_ = 0;      // global index of experts_[0]
  int ranks_per_expert_ = 1;  // tp_size / ep.size: the ranks holding slices of one expert
  WeightMatrix router_;      // [E, hidden]
  std::vector<float> bias_;  // [E] e_score_correction_bias (noaux_tc), else empty
  std::vector<SwiGluMlp> experts_;
  std::optional<SwiGluMlp> shared_;
};

}  // namespace dcp
