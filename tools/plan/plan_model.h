// The cost model behind `dcp plan` and the plan columns of `dcp bench step`: a roofline per
// component of one MLA decode layer on one rank.
//   local attention   max(FLOPs / compute rate, KV bytes / bandwidth)
//   query + combine   collectives x latency + bytes sent / link bandwidth (the formulas of
//                     DcpAttention::expected_bytes_sent)
//   capacity          (memory - weights) / (layers x latent row bytes) rows per rank, x N tokens
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "dcp/dtype.h"
#include "dcp/model_config.h"
#include "dcp/topology.h"

namespace dcp::cli {

struct Hardware {
  std::string name;
  double compute_flops = 0;   // attention kernel rate per rank (FLOP/s)
  double bandwidth = 0;       // KV read bandwidth per rank (B/s)
  double link_bandwidth = 0;  // per-rank collective bandwidth (B/s)
  double link_latency = 0;    // per collective (s)
  double memory_bytes = 0;    // per rank
  std::string source;
};

// "this-cpu" (measured here) or "h200-nvlink" (assumed); dcp::Error naming both otherwise.
Hardware hardware_preset(const std::string& name);

struct LayerPrediction {
  double attn_ms = 0, comm_ms = 0;  // per MLA layer and rank
  double kv_bytes = 0, comm_bytes = 0;
  int collectives = 0;
  // Replicated query projection: the DCP group's q_b_proj and kv_b_proj rows each rank holds
  // besides its own (bytes per layer), and the time of the extra query products per step (the
  // other N - 1 ranks' heads: their q_b_proj rows and w_kc read, batch rows each).
  double replicated_weight_bytes = 0, replicated_gemm_ms = 0;
};

// One decode step of one MLA layer on one rank: N = dcp ranks each attend N * h_loc heads over
// context / N rows for each of `batch` requests.
LayerPrediction predict_layer(const ModelConfig& c, const Hardware& hw, int h_loc, int dcp,
                              CombineBackend backend, bool replicated_q, int batch,
                              std::int64_t context, KvDtype dtype);

// The weights a forward of `tokens` tokens reads per rank of a TP group of `tp` ranks, in their
// dtype (element_bytes: checkpoint_element_bytes), and the weight parameters each token
// multiplies there. A routed expert is read once however many tokens chose it: a batch is
// expected to touch E (1 - (1 - k/E)^tokens) of the E experts under uniform routing; each token
// multiplies k. The embedding reads one row per token; replicated tensors are whole on every rank.
struct WeightTraffic {
  double bytes = 0;        // per rank
  double params = 0;       // per rank and token (FLOPs: 2 x params x tokens), the LM head included
  double head_params = 0;  // the LM head's, which a prefill applies to its last token only
};
WeightTraffic weight_traffic(const ModelConfig& c, int tp, double tokens,
                             const std::function<double(const std::string&)>& element_bytes);

}  // namespace dcp::cli
