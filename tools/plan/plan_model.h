// The cost model behind `dcp plan` and the plan columns of `dcp bench step`: a roofline per
// component of one MLA decode layer on one rank.
//   local attention   max(FLOPs / compute rate, KV bytes / bandwidth)
//   query + combine   collectives x latency + bytes sent / link bandwidth (the formulas of
//                     DcpAttention::expected_bytes_sent)
//   capacity          (memory - weights) / (layers x latent row bytes) rows per rank, x N tokens
#pragma once

#include <cstdint>
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

}  // namespace dcp::cli
