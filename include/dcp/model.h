// The MLA decoder, one rank's share of it: TP shards of the weights, one latent KV pool per
// layer striped over the DCP group, the DCP attention step in every layer.
//
// Per layer (DESIGN.md section 3): RMSNorm; q_a_proj -> q_a_layernorm -> q_b_proj (this rank's
// heads) or q_proj; kv_a_proj_with_mqa -> kv_a_layernorm | RoPE(k_pe); absorb q_nope through
// w_kc; the new latent rows go to their owner ranks; attention in latent space (decode: the
// DCP step; extend: the prefix gathered in token order, then causal attention); O through w_vc;
// optional output gate; o_proj (row-parallel, TP all-reduce); RMSNorm; SwiGLU MLP or MoE (TP
// sharded, all-reduce). Embedding and LM head are vocab-parallel over TP.
//
// DP attention: the attention runs over an attention-TP group (one of the D groups that each
// serve their own requests with their own KV), while the dense and MoE layers are sharded over
// the whole TP group. Around them every group's rows are gathered over that group in group order
// (padded to the longest group) and the row-parallel outputs reduce-scattered back; a group with
// no tokens in a step still takes part with zero rows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dcp/comm.h"
#include "dcp/dcp_attention.h"
#include "dcp/feed_forward.h"
#include "dcp/kernel_path.h"
#include "dcp/kv_cache.h"
#include "dcp/model_config.h"
#include "dcp/weights.h"

namespace dcp {

// The most threads one rank may use (ModelOptions::threads).
inline constexpr int kMaxRankThreads = 256;

struct ModelOptions {
  CombineBackend backend = CombineBackend::ag_rs;
  bool replicate_q_proj = false;  // falls back to the query gather for quantized weights
  // Expert parallelism of the MoE layers over the group the dense and MoE layers span (the TP
  // group, or the whole TP group with DP attention); 1: experts sliced over all its ranks.
  int ep_size = 1;
  KvDtype kv_dtype = KvDtype::bf16;
  int page_size = 64;
  // The KV stripe: I consecutive tokens per rank (vLLM's --dcp-kv-cache-interleave-size); must
  // divide page_size.
  int kv_interleave = 1;
  std::int64_t kv_capacity_tokens = 0;  // logical tokens (physical rows x N), rounded up to pages
  // The local attention kernel over the KV pool (KernelPath::amx_bf16 needs bf16 KV). Attention
  // over gathered fp32 copies (the gather extend path, the intra-chunk part) stays automatic.
  KernelPath attention_kernel = KernelPath::automatic;
  // The weight products' path: automatic (the widest this CPU runs), portable, avx2 or avx512;
  // a path this CPU lacks, or a bf16-pair path, is refused when the model is built.
  KernelPath weight_kernel = KernelPath::automatic;
  // Threads of this rank (1-256): the weight products split their output rows over them, the
  // local attention kernel its tokens and KV ranges. Each rank has its own workers.
  int threads = 1;
};

// One forward: the last q_len tokens of each request (already allocated in the allocator).
struct ForwardBatch {
  std::vector<BatchEntry> entries;
  std::vector<std::int32_t> tokens;  // [T] input ids, request-major
  ForwardMode mode = ForwardMode::decode;
  bool all_logits = false;  // logits of every token (else of each request's last token)
};

// Wall time of one forward by phase (milliseconds, summed over layers).
struct ForwardTimings {
  double total_ms = 0;
  double attention_ms = 0;  // local MLA attention
  double dcp_comm_ms = 0;   // DCP query exchange and combine (and the extend gather)
  double tp_comm_ms = 0;    // TP all-reduces and the logits gather
  double mlp_comm_ms = 0;   // DP attention: the row gather and scatter around the dense/MoE layers
  CommStats dcp_comm;       // collectives of the DCP group during this forward
  CommStats tp_comm;        // collectives of the (attention) TP group during this forward
  CommStats mlp_comm;       // DP attention: collectives of the whole TP group
};

// Threads each BLAS call may use. Set 1 when ranks run as threads in one process, so that the
// ranks, not BLAS, use the cores.
void set_blas_threads(int threads);

class MlaModel {
 public:
  // tp: this rank's (attention) TP group; dcp: its DCP group (a contiguous slice of tp). Loads
  // this rank's shards from `weights`. mlp_tp (DP attention): the whole TP group, made of
  // consecutive attention groups (this rank is rank g * tp.size() + tp.rank() in it); the dense
  // and MoE layers are sharded over it. Null, or a group no larger than tp: everything is sharded
  // over tp. Throws dcp::Error naming the problem: heads not divisible by TP, a missing or
  // mis-shaped tensor.
  MlaModel(const ModelConfig& config, const WeightSource& weights, Communicator& tp,
           Communicator& dcp, const ModelOptions& options, Communicator* mlp_tp = nullptr);
  ~MlaModel();
  MlaModel(const MlaModel&) = delete;
  MlaModel& operator=(const MlaModel&) = delete;

  const ModelConfig& config() const noexcept { return config_; }
  const ModelOptions& options() const noexcept { return options_; }
  // Whether the query projection is replicated (replicate_q_proj asked and the weights allow it).
  bool replicated_q() const noexcept;
  int local_heads() const noexcept { return h_loc_; }

  // The allocator replica of this rank (all layers share its token slots). Grow requests through
  // extend(), which applies copy-on-write page copies to every layer.
  KvAllocator& allocator() noexcept { return *allocator_; }
  // Grows `request` by n tokens and copies any shared page it will write into a private one, in
  // every layer's pool. Throws like KvAllocator::extend (nothing changes then).
  void extend(RequestId request, std::int64_t n);
  // This rank's shard of layer `layer`'s latent KV.
  KvShard& kv_shard(int layer);
  std::size_t kv_bytes() const noexcept;  // all layers, this rank
  // Bytes of weights this rank holds, in their dtypes (FP8 scales included), and the dtype of
  // its projection weights (what the checkpoint ships: fp32 for synthetic weights).
  std::size_t weight_bytes() const noexcept;
  WeightDtype weight_dtype() const noexcept;
  // The routed experts' dtype (the first MoE layer's; INT4 in Kimi-K2-Thinking beside bf16
  // projections), or weight_dtype() without MoE layers.
  WeightDtype expert_dtype() const noexcept;

  // Runs the batch and returns logits [rows, vocab] (rows = tokens if all_logits, else requests).
  // With DP attention every rank of the whole TP group must call it together; an attention group
  // with nothing to run passes an empty batch (no entries, no tokens) and gets no logits.
  std::vector<float> forward(const ForwardBatch& batch, ForwardTimings* timings = nullptr);

  // Collective statistics of the DCP group and of the TP group.
  Communicator& dcp_group() noexcept { return dcp_; }
  Communicator& tp_group() noexcept { return tp_; }
  // The group the dense and MoE layers are sharded over: tp_group(), or with DP attention the
  // whole TP group (every forward is collective over it).
  Communicator& mlp_group() noexcept { return *mlp_; }
  bool dp_attention() const noexcept { return mlp_ != &tp_; }

 private:
  struct Layer;
  void attention(Layer& layer, const float* x, const ForwardBatch& batch, const ForwardPlan& plan,
                 float* out, ForwardTimings& t);
  // The dense or MoE layer over this rank's rows x [T, hidden] -> y (summed over the TP group).
  void feed_forward(Layer& layer, const float* x, std::int64_t T, float* y, ForwardTimings& t);

  ModelConfig config_;
  ModelOptions options_;
  Communicator& tp_;
  Communicator& dcp_;
  Communicator* mlp_;  // &tp_ unless DP attention
  // DP attention: tokens of every attention group this forward (whole-TP-group rank / tp size).
  std::vector<std::int64_t> group_tokens_;
  int h_loc_ = 0;  // heads per TP rank
  int head0_ = 0;  // first head of this rank
  std::int64_t vocab_begin_ = 0, vocab_end_ = 0, vocab_chunk_ = 0;
  WeightMatrix embed_;         // [vocab_end - vocab_begin, hidden]
  WeightMatrix lm_head_;       // same rows; empty when tied
  bool lm_head_tied_ = false;  // lm_head is embed_
  const WeightMatrix& lm_head() const noexcept { return lm_head_tied_ ? embed_ : lm_head_; }
  std::vector<float> final_norm_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<KvAllocator> allocator_;
  std::unique_ptr<DcpAttention> dcp_step_;
};

}  // namespace dcp
