// Slow, obviously-correct float64 references. Tests compare every fast path against these
// on fresh random inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/attention.h"

namespace dcp::ref {

struct AttentionResult {
  std::vector<double> out;  // [T, Hq, D_c]
  std::vector<double> lse;  // [T, Hq] natural log; -inf where nothing is visible
};

// Exactly what mla_attention computes on one shard (same params, paged, layout-aware), in
// float64, with a two-pass softmax.
AttentionResult mla_attention_local(const MlaAttentionParams& p);

// Full, non-sharded attention: every request's whole context as contiguous rows.
struct FullAttentionInput {
  int num_heads = 0;
  int kv_lora_rank = 512;
  int rope_dim = 64;
  double softmax_scale = 0;
  std::vector<std::int32_t> q_start;   // [B + 1]
  std::vector<float> q;                // [T, Hq, D_c + D_r]
  std::vector<std::int64_t> q_pos;     // [T]
  std::vector<std::vector<float>> kv;  // per request: [len_b, D_c + D_r], row i at position i
  bool causal = true;
  std::int64_t window = 0;
  double softcap = 0;
  std::vector<float> sinks;        // [Hq] or empty
  std::vector<std::int32_t> topk;  // [T, topk_k] or empty
  int topk_k = 0;
};

AttentionResult full_attention(const FullAttentionInput& in);

// Float64 merge of K parts ([K, rows, dim] and [K, rows], natural log).
AttentionResult merge(const std::vector<double>& o_parts, const std::vector<double>& lse_parts,
                      int num_parts, std::int64_t rows, int dim);

}  // namespace dcp::ref
