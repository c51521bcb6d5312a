#include "plan_model.h"

#include <algorithm>
#include <cmath>

#include "dcp/dcp_attention.h"
#include "dcp/error.h"
#include "dcp/weights.h"

namespace dcp::cli {

Hardware hardware_preset(const std::string& name) {
  if (name == "this-cpu") {
    // A 2-vCPU development VM, one rank per core with every core busy, which is how `dcp run`
    // and `dcp bench step` run. Calibrate on another host with the same commands:
    // - attention GFLOP/s per rank: `dcp bench attention --threads 2 --contexts 2048,8192
    //   --heads 64,128 --dtypes bf16 --batches 1`, halved;
    // - KV read GB/s per rank: the read ceiling of that run, halved;
    // - the cost of one collective inside a decode step: `dcp bench step` (the rank that waited
    //   least, minus the bytes at the link rate). Alone, as `dcp bench comm` times them, the same
    //   collectives are several times cheaper than between the dense layers' BLAS calls.
    return {name,
            145e9,
            9.5e9,
            5e9,
            45e-6,
            24.0 * (1ull << 30) / 4,
            "measured here: dcp bench attention --threads 2, dcp bench step"};
  }
  if (name == "h200-nvlink") {
    // Assumed, not measured: ~4 TB/s of the 4.8 TB/s HBM3e, ~400 TFLOP/s effective bf16 for
    // absorbed MLA decode, NVLink 4 at ~350 GB/s per rank for all-to-all, ~15 us per collective.
    return {name,
            400e12,
            4.0e12,
            350e9,
            15e-6,
            141.0 * (1ull << 30),
            "assumed datasheet-level figures (8x H200, NVLink 4)"};
  }
  throw Error(ErrorCategory::invalid_argument,
              str("--hardware '", name, "' is not one of: this-cpu, h200-nvlink"));
}

LayerPrediction predict_layer(const ModelConfig& c, const Hardware& hw, int h_loc, int dcp,
                              CombineBackend backend, bool replicated_q, int batch,
                              std::int64_t context, KvDtype dtype) {
  LayerPrediction r;
  const double row_bytes = static_cast<double>(c.latent_width()) * dtype_size(dtype);
  const double flops = 2.0 * (c.latent_width() + c.kv_lora_rank) * h_loc * dcp *
                       (static_cast<double>(context) / dcp) * batch;
  r.kv_bytes = static_cast<double>(batch) * context / dcp * row_bytes;
  r.attn_ms = 1e3 * std::max(flops / hw.compute_flops, r.kv_bytes / hw.bandwidth);
  if (dcp > 1) {
    const DcpAttentionOptions opt{backend, replicated_q, h_loc};
    r.comm_bytes = static_cast<double>(
        DcpAttention::expected_bytes_sent(opt, dcp, batch, c.kv_lora_rank, c.qk_rope_head_dim));
    r.collectives = (replicated_q ? 0 : 1) + (backend == CombineBackend::ag_rs ? 2 : 1);
    r.comm_ms = 1e3 * (r.collectives * hw.link_latency + r.comm_bytes / hw.link_bandwidth);
  }
  if (replicated_q && dcp > 1) {
    const double q_in = c.q_lora_rank ? *c.q_lora_rank : c.hidden_size;
    const double group_heads = static_cast<double>(dcp) * h_loc;
    const double elem = 2.0;  // replication needs 16-bit weights (FP8 ones gather the query)
    r.replicated_weight_bytes = group_heads *
                                (c.q_head_dim() * q_in + (c.qk_nope_head_dim + c.v_head_dim) *
                                                             static_cast<double>(c.kv_lora_rank)) *
                                elem;
    const double extra =
        (dcp - 1.0) * h_loc *
        (c.q_head_dim() * q_in + c.qk_nope_head_dim * static_cast<double>(c.kv_lora_rank));
    r.replicated_gemm_ms =
        1e3 * std::max(2.0 * batch * extra / hw.compute_flops, extra * elem / hw.bandwidth);
  }
  return r;
}

WeightTraffic weight_traffic(const ModelConfig& c, int tp, double tokens,
                             const std::function<double(const std::string&)>& element_bytes) {
  WeightTraffic t;
  const double experts = c.n_routed_experts, k = c.num_experts_per_tok;
  const double touched = experts > 0 ? 1.0 - std::pow(1.0 - k / experts, tokens) : 0.0;
  const double used = experts > 0 ? k / experts : 0.0;
  for (const auto& [name, shape] : checkpoint_tensors(c)) {
    double values = 1;
    for (const std::int64_t d : shape) values *= static_cast<double>(d);
    const double share = is_replicated_weight(name, shape) ? 1.0 : 1.0 / tp;
    const bool expert = name.find(".mlp.experts.") != std::string::npos;
    const bool head =
        name == "lm_head.weight" || (c.ties(true) && name == "model.embed_tokens.weight");
    if (name == "model.embed_tokens.weight" && !head) {  // a row per token
      t.bytes +=
          std::min(tokens, static_cast<double>(shape[0])) * shape[1] * element_bytes(name) * share;
      continue;
    }
    t.bytes += values * element_bytes(name) * share * (expert ? touched : 1.0);
    if (shape.size() == 2) t.params += values * share * (expert ? used : 1.0);
    if (head) t.head_params += values * share;
  }
  return t;
}

}  // namespace dcp::cli
