// Local absorbed-MLA attention over one rank's shard of the latent KV cache.
//
// A latent row is kv_lora_rank + rope_dim wide (512 + 64 for DeepSeek/Kimi): c_kv | k_pe.
// For a query q = q_nope_out | q_pe (q_nope already absorbed through w_kc) the score against
// a row is (q_nope_out . c_kv + q_pe . k_pe) * softmax_scale; the value is c_kv itself.
// The kernel returns O normalised over this shard and its natural-log LSE, which the DCP
// merge combines exactly across ranks.
//
// Every local row knows its global position through the layout, so masks are applied on
// global positions, and one call serves decode (q_len 1), speculative verification (k+1
// tokens) and chunked extend (many tokens).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "dcp/dtype.h"
#include "dcp/kernel_path.h"

namespace dcp {

struct MlaAttentionParams {
  // ---- geometry ----
  int num_heads = 0;           // Hq: heads attended here (N * H_loc after a DCP query gather)
  int kv_lora_rank = 512;      // D_c: latent width, also the output width
  int rope_dim = 64;           // D_r: a latent row is D_c + D_r wide
  float softmax_scale = 0.0f;  // multiplies q.k (before softcap)

  // ---- queries: T tokens over B requests ----
  int num_requests = 0;  // B
  const std::int32_t* q_start =
      nullptr;               // [B + 1] request b has tokens [q_start[b], q_start[b+1]), >= 1 each
  const float* q = nullptr;  // [T, Hq, D_c + D_r] fp32: q_nope_out | q_pe (but see below)
  // > 0: q is [Hq / q_head_block, T, q_head_block, D_c + D_r] instead, blocks of heads one
  // after another: what a DCP query all-gather of each rank's [T, H_loc, W] produces, read in
  // place (no permutation). Must divide num_heads. 0: the plain layout.
  int q_head_block = 0;
  const std::int64_t* q_pos = nullptr;  // [T] global position of each query token in its sequence

  // ---- this rank's shard of the paged latent KV cache ----
  const void* kv = nullptr;  // [num_pages * page_size, D_c + D_r] of kv_dtype
  KvDtype kv_dtype = KvDtype::fp32;
  std::int64_t num_pages = 0;
  int page_size = 0;  // P rows per physical page
  const std::int32_t* page_table =
      nullptr;  // [B, page_table_stride] physical page of local rows [j*P, (j+1)*P)
  int page_table_stride = 0;
  const std::int64_t* local_len =
      nullptr;       // [B] rank-local rows: layout count of the global length
  int dcp_size = 1;  // N: local row j of rank r sits at global position
  int dcp_rank = 0;  //    layout::position(j, r, N, interleave)
  int interleave = 1;

  // ---- masks and logit transforms, all on global positions ----
  bool causal = true;            // a row is visible iff its position <= q_pos
  std::int64_t window = 0;       // > 0: also iff q_pos - position < window
  float softcap = 0.0f;          // > 0: score = softcap * tanh(score / softcap)
  const float* sinks = nullptr;  // [Hq] natural-log sink logit per head, or null. It is added to
                                 // this shard's denominator: pass it on exactly one rank of a
                                 // group (or add it later with merge_sink).
  const std::int32_t* topk =
      nullptr;     // [T, topk_k] globally chosen positions, -1 = none; positions
  int topk_k = 0;  // owned by other ranks are skipped here

  // ---- execution ----
  KernelPath kernel = KernelPath::automatic;  // forcing a path this CPU lacks is an error
  int num_threads = 1;  // threads over tokens, and over KV ranges (split-KV) of
                        // long contexts; partial results are LSE-merged

  // ---- outputs (written in full) ----
  float* out = nullptr;  // [T, Hq, D_c] fp32; 0 where no row is visible
  float* lse = nullptr;  // [T, Hq] fp32 natural log; -inf where no row is visible
  // > 0: the outputs are in blocks of out_head_block heads instead, block k holding
  // [T, out_head_block, D_c] at out + k * out_block_stride and [T, out_head_block] at
  // lse + k * lse_block_stride (floats): one block per destination of a DCP collective, so the
  // kernel's output is the send buffer. Must divide num_heads; the strides must hold a block.
  // lse_block_stride = 0 uses out_block_stride (an all-to-all chunk [O | LSE] per destination);
  // ag_rs keeps its LSEs apart, T * out_head_block floats per block, for their all-gather.
  int out_head_block = 0;
  std::int64_t out_block_stride = 0;
  std::int64_t lse_block_stride = 0;
};

// Total query tokens T = q_start[num_requests] (after validation).
std::int64_t num_query_tokens(const MlaAttentionParams& p);

// Head h of query token t (of `tokens` = num_query_tokens(p)) under either query layout.
inline const float* query_head(const MlaAttentionParams& p, std::int64_t tokens, std::int64_t t,
                               int h) {
  const std::int64_t width = p.kv_lora_rank + p.rope_dim;
  if (p.q_head_block <= 0) return p.q + (t * p.num_heads + h) * width;
  const int block = h / p.q_head_block, in_block = h % p.q_head_block;
  return p.q + ((block * tokens + t) * p.q_head_block + in_block) * width;
}

// Checks every shape, pointer, page id, length and mask argument; throws dcp::Error naming the
// field and its legal range. Called by mla_attention before any computation.
void validate(const MlaAttentionParams& p);

// Computes out and lse. Throws (before writing anything) on invalid params.
void mla_attention(const MlaAttentionParams& p);

}  // namespace dcp
