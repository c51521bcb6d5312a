// The DCP attention step for one rank of a DCP group of N ranks.
//
//   gathered Q:   q [T, H_loc, W] (this rank's TP heads) --AllGather--> [N, T, H_loc, W],
//                 which the kernel reads in place (q_head_block = H_loc)
//   replicated Q: q [T, N*H_loc, W] computed locally (no collective)
//   local MLA attention over this rank's KV shard for all N*H_loc heads -> O_r, LSE_r
//   combine, heads return to their TP owner:
//     ag_rs: the kernel writes O_r by destination head block (out_head_block = H_loc) and LSE_r
//            beside it; AllGather LSE, global LSE, rescale O_r in place by exp(LSE_r - LSE),
//            ReduceScatter by head
//     a2a:   the kernel writes O_r and LSE_r by destination head block straight into the send
//            buffer (out_head_block = H_loc), one packed All-to-All, local merge
//   -> out [T, H_loc, D_c], lse [T, H_loc]: exactly attention without DCP.
//
// Head g of the group's N*H_loc heads belongs to dcp rank g / H_loc (contiguous blocks).
// W = D_c + D_r. With N = 1 no collective runs and the output is the local kernel's, bitwise.
//
// A model layer calls attend(), which runs one of the three ways a forward attends:
//   decode         the step above over each rank's shard (q_len 1, or k+1 for verification)
//   extend         gather-extend, the upstream way: every request's whole sequence gathered in
//                  token order (an all-gather whose size grows with the prefix), then causal
//                  attention locally for this rank's heads
//   extend_native  the step over each rank's prefix shard (lengths cut at the chunk start), plus
//                  the intra-chunk causal part computed locally from the chunk's rows (which
//                  every rank computed), LSE-merged; traffic grows with the chunk only
// Every kernel parameter is built here, from the ForwardPlan's metadata and the pool.
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/attention.h"
#include "dcp/comm.h"
#include "dcp/kernel_path.h"
#include "dcp/kv_cache.h"
#include "dcp/topology.h"

namespace dcp {

enum class ForwardMode : std::uint8_t { decode, extend, extend_native };

struct DcpAttentionOptions {
  CombineBackend backend = CombineBackend::ag_rs;
  bool replicated_q = false;  // q holds the whole group's heads; needs an a2a-family backend
  int local_heads = 0;        // H_loc: query heads per rank (the TP shard)
  // For attend(): the layer's score scale and the kernel path over the KV pool (the attention
  // over gathered fp32 copies stays automatic).
  float softmax_scale = 0.0f;
  KernelPath kernel = KernelPath::automatic;
  int threads = 1;  // the local kernels' num_threads
};

// Wall time of the last forward, split by phase (milliseconds).
struct DcpStepTimings {
  double attention_ms = 0;  // local MLA kernel
  double comm_ms = 0;       // query gather + combine collectives
  double other_ms = 0;      // packing, rescaling, merging
};

class DcpAttention {
 public:
  // `group` is the DCP group (N = group.size(); it must outlive this object). Throws on an
  // unsupported backend, replicated Q without a2a, or local_heads < 1.
  DcpAttention(Communicator& group, DcpAttentionOptions options);

  // shard: this rank's KV shard and forward metadata (num_requests, q_start, q_pos, kv, pages,
  //        local_len, dcp_size == N, dcp_rank == group.rank(), masks, kernel). The step owns the
  //        query, head and output fields (q, q_head_block, num_heads, out*, lse*, sinks): it
  //        sets them from the arguments below, whatever `shard` holds there.
  // q:     gathered Q [T, H_loc, W]; replicated Q [T, N*H_loc, W]; fp32
  // sinks: [N*H_loc] natural-log sink logit of each of the group's heads, or null; counted once
  // out:   [T, H_loc, D_c] fp32;  lse: [T, H_loc] natural log (may be null)
  void forward(const float* q, const MlaAttentionParams& shard, const float* sinks, float* out,
               float* lse);

  // One layer's attention for a forward whose new latent rows are already in `shard`:
  //   q      [T, H, W] absorbed queries: H = N*H_loc when replicated_q (decode and
  //          extend_native), else H_loc
  //   chunk  [T, W] the batch's new latent rows as computed, fp32 (extend_native's local part)
  //   out    [T, H_loc, D_c]
  // Timings of the call in last_timings(): the gather of `extend` counts as communication.
  void attend(ForwardMode mode, const float* q, const float* chunk, const KvShard& shard,
              const ForwardPlan& plan, float* out);

  const DcpStepTimings& last_timings() const noexcept { return timings_; }
  const DcpAttentionOptions& options() const noexcept { return options_; }

  // Bytes this rank sends per forward, by the formulas (for checks and the cost model).
  //   query gather (gathered Q only): (N-1) * T*H_loc*W*4
  //   ag_rs: LSE gather (N-1) * T*N*H_loc*4 + reduce-scatter (N-1) * T*H_loc*D_c*4
  //   a2a:   (N-1) * T*H_loc*(D_c + 1)*4, one collective
  static std::uint64_t expected_bytes_sent(const DcpAttentionOptions& options, int dcp_size,
                                           std::int64_t tokens, int kv_lora_rank, int rope_dim);

 private:
  // forward() without resetting the timings.
  void step(const float* q, const MlaAttentionParams& shard, const float* sinks, float* out,
            float* lse);
  // The kernel's view of this rank's shard for `plan`, with the layer's scale and kernel path.
  MlaAttentionParams shard_params(const ForwardPlan& plan, const LatentPool& pool) const;
  void gather_extend(const float* q, const KvShard& shard, const ForwardPlan& plan, float* out);
  void native_extend(const float* q, const float* chunk, const KvShard& shard,
                     const ForwardPlan& plan, float* out);
  // Causal attention of this rank's heads over one contiguous fp32 sequence per request, row j
  // at position j (no sharding): the gather path's whole sequences, the native path's chunks.
  //   q [T, H_loc, W], seqs[b] [lens[b], W], q_pos [T], out [T, H_loc, D_c], lse [T, H_loc]
  void attend_contiguous(const float* q, const std::vector<const float*>& seqs,
                         const std::vector<std::int64_t>& lens, const std::int32_t* q_start,
                         const std::int64_t* q_pos, int kv_lora_rank, int rope_dim, float* out,
                         float* lse) const;
  void combine_ag_rs(std::int64_t tokens, int dc, float* out, float* lse);
  void combine_a2a(std::int64_t tokens, int dc, float* out, float* lse);
  // One destination's part of the a2a send buffer: [O T*H_loc*dc | LSE T*H_loc] floats.
  std::size_t a2a_chunk_floats(std::int64_t tokens, int dc) const;

  Communicator& group_;
  DcpAttentionOptions options_;
  DcpStepTimings timings_;
  // Buffers reused across forwards.
  // Both backends have the kernel write its O into send_, laid out by destination.
  std::vector<float> q_gathered_, lse_local_, lse_all_, lse_global_, send_, recv_;
};

}  // namespace dcp
