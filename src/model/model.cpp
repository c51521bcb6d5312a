#include "dcp/model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "dcp/error.h"
#include "dcp/timing.h"
#include "ops.h"

namespace dcp {
namespace {

constexpr double kLatentNormEps = 1e-6;  // q_a_layernorm / kv_a_layernorm (DeepSeek's default)

}  // namespace

void set_blas_threads(int threads) {
  ops::set_blas_threads(threads);
}

struct MlaModel::Layer {
  std::vector<float> input_norm, post_norm;
  WeightMatrix q_a;              // [q_lora, hidden] (q_lora models)
  std::vector<float> q_a_norm;   // [q_lora]
  WeightMatrix q_b;              // [H_loc * qhd, q_in]   q_in = q_lora or hidden
  WeightMatrix q_b_group;        // [N * H_loc * qhd, q_in] replicated query projection
  WeightMatrix kv_a;             // [kv_lora + rope, hidden]
  std::vector<float> kv_a_norm;  // [kv_lora]
  // kv_b_proj per head of this rank, in the checkpoint's dtype: its w_kc rows [nope, kv_lora]
  // (absorbed into the query) held transposed, so that the absorption q_nope @ w_kc is a product
  // like every other (linear against [kv_lora, nope]) and decode reads them in their dtype; its
  // w_vc rows [v, kv_lora] (applied to O).
  std::vector<WeightMatrix> w_kc_t, w_vc;
  std::vector<WeightMatrix> w_kc_t_group;  // the DCP group's heads (replicated query projection)
  WeightMatrix g_proj;                     // [H_loc * v, hidden] (output gate)
  WeightMatrix o_proj;                     // [hidden, H_loc * v]
  SwiGluMlp mlp;                           // dense layers
  std::unique_ptr<MoeLayer> moe;           // mixture-of-experts layers
  std::unique_ptr<LatentPool> pool;
  std::unique_ptr<KvShard> shard;
  ops::Rope rope;
};

MlaModel::MlaModel(const ModelConfig& config, const WeightSource& w, Communicator& tp,
                   Communicator& dcp, const ModelOptions& options, Communicator* mlp_tp)
    : config_(config),
      options_(options),
      tp_(tp),
      dcp_(dcp),
      mlp_(mlp_tp && mlp_tp->size() > tp.size() ? mlp_tp : &tp) {
  config.validate();
  const ModelConfig& c = config_;
  const int tp_size = tp.size(), n = dcp.size();
  DCP_ARG_CHECK(mlp_->size() % tp_size == 0 && mlp_->rank() % tp_size == tp.rank(),
                "the attention TP group (rank ", tp.rank(), " of ", tp_size,
                ") must be a contiguous slice of the whole TP group (rank ", mlp_->rank(), " of ",
                mlp_->size(), ")");
  DCP_ARG_CHECK(c.num_attention_heads % tp_size == 0, "tp_size = ", tp_size,
                " must divide the model's num_attention_heads ", c.num_attention_heads);
  ParallelConfig groups;  // the one containment rule: a DCP group is a slice of the TP group
  groups.tp_size = tp_size;
  groups.dcp_size = n;
  validate(groups);
  DCP_ARG_CHECK(options.ep_size == 1 || c.n_routed_experts > 0, "ep_size = ", options.ep_size,
                " needs a mixture-of-experts model; this one has no routed experts (legal: 1)");
  DCP_ARG_CHECK(options.threads >= 1 && options.threads <= kMaxRankThreads,
                "threads = ", options.threads, " must be in [1, ", kMaxRankThreads, "]");
  try {
    weight_kernel_label(options.weight_kernel);  // refuses amx_bf16 and a path this CPU lacks
  } catch (const Error& e) {
    throw Error(e.category(), str("weight_kernel = ", to_string(options.weight_kernel), ": ",
                                  e.what()));
  }
  DCP_ARG_CHECK(options.page_size >= 1, "page_size = ", options.page_size, " must be >= 1");
  DCP_ARG_CHECK(options.kv_capacity_tokens >= 1, "KV capacity ", options.kv_capacity_tokens,
                " tokens must be >= 1");
  h_loc_ = c.num_attention_heads / tp_size;
  head0_ = tp.rank() * h_loc_;
  const int qhd = c.q_head_dim(), nope = c.qk_nope_head_dim, v = c.v_head_dim, kvl = c.kv_lora_rank;
  const std::int64_t hidden = c.hidden_size, q_in = c.q_lora_rank ? *c.q_lora_rank : hidden;
  const bool replicate = replicated_q();
  if (options.replicate_q_proj && !replicate && tp.rank() == 0) {
    std::fprintf(stderr,
                 "dcp: note: replicating the query projection needs unquantized 16-bit or fp32 "
                 "weights; "
                 "this checkpoint is quantized, so the query all-gather is used instead\n");
  }
  const int group_head0 = (tp.rank() - dcp.rank()) * h_loc_;  // first head of the DCP group

  vocab_chunk_ = (c.vocab_size + tp_size - 1) / tp_size;
  vocab_begin_ = std::min<std::int64_t>(c.vocab_size, tp.rank() * vocab_chunk_);
  vocab_end_ = std::min<std::int64_t>(c.vocab_size, vocab_begin_ + vocab_chunk_);
  const std::vector<std::int64_t> vocab_shape{c.vocab_size, hidden};
  embed_ = w.load_matrix("model.embed_tokens.weight", vocab_shape, {vocab_begin_, vocab_end_});
  // Tied: lm_head is the embedding's rows this rank holds, held once.
  lm_head_tied_ = c.ties(w.contains("lm_head.weight"));
  if (!lm_head_tied_)
    lm_head_ = w.load_matrix("lm_head.weight", vocab_shape, {vocab_begin_, vocab_end_});
  final_norm_ = w.load("model.norm.weight", {hidden});

  const std::int64_t vp = static_cast<std::int64_t>(options.page_size) * n;
  const std::int64_t pages = (options.kv_capacity_tokens + vp - 1) / vp;
  allocator_ = std::make_unique<KvAllocator>(n, options.page_size, pages, options.kv_interleave);

  // Per head of [h0, h0 + count): its w_kc rows of kv_b_proj transposed (vc = false), or its
  // w_vc rows (vc = true).
  const auto load_kv_b = [&](const std::string& p, int h0, int count, bool vc) {
    std::vector<WeightMatrix> heads;
    for (std::int64_t h = h0; h < h0 + count; ++h) {
      const std::int64_t r0 = h * (nope + v) + (vc ? nope : 0);
      WeightMatrix m =
          w.load_matrix(p + "self_attn.kv_b_proj.weight",
                        {static_cast<std::int64_t>(c.num_attention_heads) * (nope + v), kvl},
                        {r0, r0 + (vc ? v : nope)});
      heads.push_back(vc ? std::move(m) : m.transposed());
    }
    return heads;
  };
  // The dense and MoE layers are sharded over the whole TP group (the attention's, without DP
  // attention).
  const std::int64_t inter = c.intermediate_size;
  const int mlp_rank = mlp_->rank(), mlp_size = mlp_->size();
  const std::int64_t i0 = inter * mlp_rank / mlp_size, i1 = inter * (mlp_rank + 1) / mlp_size;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    auto L = std::make_unique<Layer>();
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const std::int64_t heads_all = c.num_attention_heads;
    L->input_norm = w.load(p + "input_layernorm.weight", {hidden});
    L->post_norm = w.load(p + "post_attention_layernorm.weight", {hidden});
    const std::string q_name =
        c.q_lora_rank ? p + "self_attn.q_b_proj.weight" : p + "self_attn.q_proj.weight";
    // Attention projections stay in 16 bits (Kimi-K2-Thinking ignores re:.*self_attn.*): the
    // absorbed attention transposes kv_b_proj, which packed INT4 columns cannot be.
    for (const char* proj : {"q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_b_proj",
                             "g_proj", "o_proj"}) {
      const std::string name = p + "self_attn." + proj + ".weight";
      DCP_CHECK(!is_int4_weight(c, name), unsupported,
                "model config: quantization_config.ignore leaves ", p, "self_attn.", proj,
                " quantized; dcp runs INT4 MLP and expert weights only (legal: ignore every "
                "self_attn projection, e.g. \"re:.*self_attn.*\")");
    }
    if (c.q_lora_rank) {
      L->q_a = w.load_matrix(p + "self_attn.q_a_proj.weight", {q_in, hidden});
      L->q_a_norm = w.load(p + "self_attn.q_a_layernorm.weight", {q_in});
    }
    L->q_b = w.load_matrix(q_name, {heads_all * qhd, q_in},
                           {static_cast<std::int64_t>(head0_) * qhd,
                            static_cast<std::int64_t>(head0_ + h_loc_) * qhd});
    if (replicate) {
      L->q_b_group = w.load_matrix(q_name, {heads_all * qhd, q_in},
                                   {static_cast<std::int64_t>(group_head0) * qhd,
                                    static_cast<std::int64_t>(group_head0 + n * h_loc_) * qhd});
      L->w_kc_t_group = load_kv_b(p, group_head0, n * h_loc_, false);
    }
    L->kv_a = w.load_matrix(p + "self_attn.kv_a_proj_with_mqa.weight", {c.latent_width(), hidden});
    L->kv_a_norm = w.load(p + "self_attn.kv_a_layernorm.weight", {kvl});
    L->w_kc_t = load_kv_b(p, head0_, h_loc_, false);
    L->w_vc = load_kv_b(p, head0_, h_loc_, true);
    if (c.attn_output_gate) {
      L->g_proj = w.load_matrix(
          p + "self_attn.g_proj.weight", {heads_all * v, hidden},
          {static_cast<std::int64_t>(head0_) * v, static_cast<std::int64_t>(head0_ + h_loc_) * v});
    }
    L->o_proj = w.load_matrix(
        p + "self_attn.o_proj.weight", {hidden, heads_all * v}, {},
        {static_cast<std::int64_t>(head0_) * v, static_cast<std::int64_t>(head0_ + h_loc_) * v});
    if (c.is_moe_layer(i)) {
      L->moe = std::make_unique<MoeLayer>(c, w, i, mlp_rank, mlp_size,
                                          ExpertParallel{options.ep_size, mlp_});
    } else {
      L->mlp = SwiGluMlp(w, p + "mlp.", hidden, inter, i0, i1);
    }
    L->pool = std::make_unique<LatentPool>(
        pages, options.page_size, LatentGeometry{kvl, c.qk_rope_head_dim, options.kv_dtype});
    L->shard = std::make_unique<KvShard>(*allocator_, *L->pool, dcp.rank());
    if (!c.skip_rope) L->rope = ops::Rope(c);
    layers_.push_back(std::move(L));
  }
  DCP_ARG_CHECK(options.weight_kernel != KernelPath::avx512_bf16 ||
                    lm_head().dtype != WeightDtype::f32 || weight_dtype() != WeightDtype::f32,
                "weight_kernel = avx512_bf16 multiplies bf16 and FP8 weights in pairs; this model "
                "holds neither (its weights are ",
                to_string(weight_dtype()), ", its lm_head ", to_string(lm_head().dtype),
                "): use automatic, portable, avx2 or avx512");
  DcpAttentionOptions step;
  step.backend = n == 1 ? CombineBackend::ag_rs : options.backend;
  step.replicated_q = replicate;
  step.local_heads = h_loc_;
  step.softmax_scale = static_cast<float>(c.softmax_scale());
  step.kernel = options.attention_kernel;
  step.threads = options.threads;
  dcp_step_ = std::make_unique<DcpAttention>(dcp, step);
}

MlaModel::~MlaModel() = default;

bool MlaModel::replicated_q() const noexcept {
  return options_.replicate_q_proj && dcp_.size() > 1 && !config_.quantized;
}

KvShard& MlaModel::kv_shard(int layer) {
  DCP_ARG_CHECK(layer >= 0 && layer < static_cast<int>(layers_.size()), "layer ", layer,
                " out of range");
  return *layers_[layer]->shard;
}

std::size_t MlaModel::weight_bytes() const noexcept {
  const auto vec = [](const std::vector<float>& v) { return v.size() * sizeof(float); };
  const auto heads = [](const std::vector<WeightMatrix>& v) {
    std::size_t b = 0;
    for (const WeightMatrix& m : v) b += m.bytes();
    return b;
  };
  std::size_t b = embed_.bytes() + lm_head_.bytes() + vec(final_norm_);
  for (const auto& L : layers_) {
    b += vec(L->input_norm) + vec(L->post_norm) + L->q_a.bytes() + vec(L->q_a_norm) +
         L->q_b.bytes() + L->q_b_group.bytes() + L->kv_a.bytes() + vec(L->kv_a_norm) +
         heads(L->w_kc_t) + heads(L->w_vc) + heads(L->w_kc_t_group) + L->g_proj.bytes() +
         L->o_proj.bytes() + L->mlp.bytes() + (L->moe ? L->moe->bytes() : 0);
  }
  return b;
}

WeightDtype MlaModel::weight_dtype() const noexcept {
  return layers_.empty() ? WeightDtype::f32 : layers_.front()->o_proj.dtype;
}

WeightDtype MlaModel::expert_dtype() const noexcept {
  for (const auto& L : layers_) {
    if (L->moe) return L->moe->dtype();
  }
  return weight_dtype();
}

void MlaModel::extend(RequestId request, std::int64_t n) {
  const std::vector<PageCopy> copies = allocator_->extend(request, n);
  for (const auto& L : layers_) L->shard->apply(copies);
}

std::size_t MlaModel::kv_bytes() const noexcept {
  std::size_t b = 0;
  for (const auto& L : layers_) b += L->pool->bytes();
  return b;
}

void MlaModel::attention(Layer& L, const float* x, const ForwardBatch& batch,
                         const ForwardPlan& plan, float* out, ForwardTimings& t) {
  const ModelConfig& c = config_;
  const std::int64_t T = plan.num_tokens();
  const int qhd = c.q_head_dim(), nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim,
            v = c.v_head_dim;
  const int kvl = c.kv_lora_rank, width = c.latent_width();
  const bool decode = batch.mode == ForwardMode::decode;
  const bool native = batch.mode == ForwardMode::extend_native;
  const bool group_q =
      (decode || native) && replicated_q();  // the whole DCP group's heads, computed here
  const int heads_q = group_q ? dcp_.size() * h_loc_ : h_loc_;
  const WeightMatrix& wq = group_q ? L.q_b_group : L.q_b;
  const std::vector<WeightMatrix>& w_kc_t = group_q ? L.w_kc_t_group : L.w_kc_t;

  // Query: [T, heads_q, qhd].
  std::vector<float> q(static_cast<std::size_t>(T) * heads_q * qhd);
  if (c.q_lora_rank) {
    const std::int64_t ql = *c.q_lora_rank;
    std::vector<float> qa(static_cast<std::size_t>(T * ql));
    ops::linear(x, T, L.q_a, qa.data());
    ops::rms_norm(qa.data(), T, ql, L.q_a_norm.data(), kLatentNormEps);
    ops::linear(qa.data(), T, wq, q.data());
  } else {
    ops::linear(x, T, wq, q.data());
  }
  // Latent: [T, kv_lora + rope] = kv_a_layernorm(c_kv) | RoPE(k_pe): the rows the cache stores.
  std::vector<float> latent(static_cast<std::size_t>(T) * width);
  ops::linear(x, T, L.kv_a, latent.data());
  ops::rms_norm(latent.data(), T, kvl, L.kv_a_norm.data(), kLatentNormEps, width);
  if (!c.skip_rope) {
    for (std::int64_t i = 0; i < T; ++i)
      L.rope.apply(latent.data() + i * width + kvl, plan.q_pos[i]);
  }
  for (int b = 0; b < plan.num_requests(); ++b) {  // each rank stores only the rows it owns
    const std::int64_t len = plan.global_len[b], q_len = batch.entries[b].q_len;
    L.shard->write(batch.entries[b].request, len - q_len, q_len,
                   latent.data() + plan.q_start[b] * width);
  }
  // Absorbed query [T, heads_q, kv_lora + rope] = q_nope @ w_kc | RoPE(q_pe).
  std::vector<float> qa(static_cast<std::size_t>(T) * heads_q * width);
  for (int h = 0; h < heads_q; ++h) {
    ops::linear(q.data() + h * qhd, T, w_kc_t[h], qa.data() + h * width,
                static_cast<std::int64_t>(heads_q) * qhd,
                static_cast<std::int64_t>(heads_q) * width);
    for (std::int64_t i = 0; i < T; ++i) {
      float* pe = qa.data() + (i * heads_q + h) * width + kvl;
      std::copy_n(q.data() + (i * heads_q + h) * qhd + nope, rope, pe);
      if (!c.skip_rope) L.rope.apply(pe, plan.q_pos[i]);
    }
  }
  // Attention in latent space -> O [T, H_loc, kv_lora] (decode, gather- or native extend).
  std::vector<float> o(static_cast<std::size_t>(T) * h_loc_ * kvl);
  dcp_step_->attend(batch.mode, qa.data(), latent.data(), *L.shard, plan, o.data());
  const DcpStepTimings& st = dcp_step_->last_timings();
  t.attention_ms += st.attention_ms;
  t.dcp_comm_ms += st.comm_ms;
  // Values: [T, H_loc, v] = O @ w_vc^T per head; optional gate; o_proj (row-parallel partial).
  std::vector<float> vals(static_cast<std::size_t>(T) * h_loc_ * v);
  for (int h = 0; h < h_loc_; ++h) {
    ops::linear(o.data() + h * kvl, T, L.w_vc[h], vals.data() + h * v,
                static_cast<std::int64_t>(h_loc_) * kvl, static_cast<std::int64_t>(h_loc_) * v);
  }
  if (c.attn_output_gate) {
    std::vector<float> g(vals.size());
    ops::linear(x, T, L.g_proj, g.data());
    for (std::size_t i = 0; i < g.size(); ++i) vals[i] *= 1.0f / (1.0f + std::exp(-g[i]));
  }
  ops::linear(vals.data(), T, L.o_proj, out);
}

void MlaModel::feed_forward(Layer& L, const float* x, std::int64_t T, float* y, ForwardTimings& t) {
  const std::int64_t hidden = config_.hidden_size;
  const auto run = [&](const float* in, std::int64_t rows, float* out) {
    if (L.moe) {
      L.moe->forward(in, rows, out);
    } else {
      L.mlp.forward(in, rows, out);
    }
  };
  if (!dp_attention()) {
    run(x, T, y);
    const auto t0 = Clock::now();
    if (tp_.size() > 1 && T > 0)
      tp_.all_reduce(y, y, static_cast<std::size_t>(T * hidden), ScalarType::f32);
    t.tp_comm_ms += ms_since(t0);
    return;
  }
  // DP attention. Padded layout over the whole TP group: attention group g holds slots
  // [g * A * S, (g + 1) * A * S) (A = attention TP size, S = rows per rank), its rows first.
  const int A = tp_.size(), me = tp_.rank();
  const std::size_t groups = group_tokens_.size();
  const std::int64_t longest = *std::max_element(group_tokens_.begin(), group_tokens_.end());
  const std::int64_t S = (longest + A - 1) / A;
  const std::size_t slice = static_cast<std::size_t>(S * hidden);
  // Gather: each rank sends rows [me * S, (me + 1) * S) of its group, zero-padded.
  auto t0 = Clock::now();
  std::vector<float> send(slice, 0.0f), padded(slice * mlp_->size());
  const std::int64_t from = std::min(T, me * S), to = std::min(T, (me + 1) * S);
  std::copy(x + from * hidden, x + to * hidden, send.begin());
  mlp_->all_gather(send.data(), padded.data(), slice * sizeof(float));
  std::int64_t total = 0;
  for (std::int64_t n : group_tokens_) total += n;
  std::vector<float> rows(static_cast<std::size_t>(total * hidden)), out(rows.size());
  std::int64_t at = 0;
  for (std::size_t g = 0; g < groups; ++g) {
    const float* src = padded.data() + g * static_cast<std::size_t>(A) * slice;
    std::copy_n(src, group_tokens_[g] * hidden, rows.data() + at * hidden);
    at += group_tokens_[g];
  }
  t.mlp_comm_ms += ms_since(t0);
  run(rows.data(), total, out.data());  // row-parallel partial sums over the whole TP group
  // Scatter: the partial sums back into the padded layout, reduce-scattered (each rank gets its
  // S rows summed over the group), then the attention group reassembles its rows.
  t0 = Clock::now();
  std::fill(padded.begin(), padded.end(), 0.0f);
  at = 0;
  for (std::size_t g = 0; g < groups; ++g) {
    float* dst = padded.data() + g * static_cast<std::size_t>(A) * slice;
    std::copy_n(out.data() + at * hidden, group_tokens_[g] * hidden, dst);
    at += group_tokens_[g];
  }
  mlp_->reduce_scatter(padded.data(), send.data(), slice, ScalarType::f32);
  if (A == 1) {
    std::copy_n(send.data(), T * hidden, y);
  } else {
    std::vector<float> mine(slice * static_cast<std::size_t>(A));
    tp_.all_gather(send.data(), mine.data(), slice * sizeof(float));
    std::copy_n(mine.data(), T * hidden, y);
  }
  t.mlp_comm_ms += ms_since(t0);
}

std::vector<float> MlaModel::forward(const ForwardBatch& batch, ForwardTimings* timings) {
  const auto t_start = Clock::now();
  const ScopedWeightThreads threads(options_.threads, options_.weight_kernel);
  const CommStats dcp_before = dcp_.stats(), tp_before = tp_.stats(), mlp_before = mlp_->stats();
  ForwardTimings t;
  const ModelConfig& c = config_;
  const std::int64_t hidden = c.hidden_size;
  const ForwardPlan plan = plan_forward(*allocator_, batch.entries, dcp_.rank());
  const std::int64_t T = plan.num_tokens();
  DCP_ARG_CHECK(static_cast<std::int64_t>(batch.tokens.size()) == T,
                "forward: ", batch.tokens.size(), " token ids for ", T, " query tokens");
  for (std::int32_t id : batch.tokens) {
    DCP_ARG_CHECK(id >= 0 && id < c.vocab_size, "token id ", id, " is outside the vocabulary [0, ",
                  c.vocab_size, ")");
  }
  auto t0 = Clock::now();
  if (dp_attention()) {  // every group's token count, for the gather around the MLP
    std::vector<std::int64_t> per_rank(static_cast<std::size_t>(mlp_->size()));
    mlp_->all_gather(&T, per_rank.data(), sizeof T);
    group_tokens_.clear();
    for (std::size_t r = 0; r < per_rank.size(); r += static_cast<std::size_t>(tp_.size()))
      group_tokens_.push_back(per_rank[r]);
    t.mlp_comm_ms += ms_since(t0);
  }
  // Vocab-parallel embedding: each rank fills its rows, the TP all-reduce completes them. The
  // ranks of an attention group run the same batch, so a group without tokens skips its own
  // collectives together.
  std::vector<float> x(static_cast<std::size_t>(T * hidden), 0.0f);
  for (std::int64_t i = 0; i < T; ++i) {
    const std::int64_t id = batch.tokens[i];
    if (id >= vocab_begin_ && id < vocab_end_) {
      embed_.row_to_float(id - vocab_begin_, x.data() + i * hidden);
    }
  }
  t0 = Clock::now();
  if (tp_.size() > 1 && T > 0) tp_.all_reduce(x.data(), x.data(), x.size(), ScalarType::f32);
  t.tp_comm_ms += ms_since(t0);
  if (c.scale_emb != 1.0) {
    const float scale = static_cast<float>(c.scale_emb);
    for (float& v : x) v *= scale;
  }
  const float residual = static_cast<float>(c.residual_scale());

  std::vector<float> xn(x.size()), y(x.size());
  for (std::size_t li = 0; li < layers_.size(); ++li) {
    Layer& L = *layers_[li];
    if (T > 0) {
      xn = x;
      ops::rms_norm(xn.data(), T, hidden, L.input_norm.data(), c.rms_norm_eps);
      attention(L, xn.data(), batch, plan, y.data(), t);
      t0 = Clock::now();
      if (tp_.size() > 1) tp_.all_reduce(y.data(), y.data(), y.size(), ScalarType::f32);
      t.tp_comm_ms += ms_since(t0);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += residual * y[i];
      xn = x;
      ops::rms_norm(xn.data(), T, hidden, L.post_norm.data(), c.rms_norm_eps);
    }
    feed_forward(L, xn.data(), T, y.data(), t);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += residual * y[i];
  }

  // Rows that need logits, final norm, vocab-parallel LM head, TP gather.
  std::vector<std::int64_t> rows;
  if (batch.all_logits) {
    for (std::int64_t i = 0; i < T; ++i) rows.push_back(i);
  } else {
    for (int b = 0; b < plan.num_requests(); ++b) rows.push_back(plan.q_start[b + 1] - 1);
  }
  const std::int64_t R = static_cast<std::int64_t>(rows.size());
  std::vector<float> h(static_cast<std::size_t>(R * hidden));
  for (std::int64_t r = 0; r < R; ++r)
    std::copy_n(x.data() + rows[r] * hidden, hidden, h.data() + r * hidden);
  ops::rms_norm(h.data(), R, hidden, final_norm_.data(), c.rms_norm_eps);
  if (c.logit_scale() != 1.0) {
    const float scale = static_cast<float>(c.logit_scale());
    for (float& v : h) v *= scale;
  }
  std::vector<float> local(static_cast<std::size_t>(R * vocab_chunk_), 0.0f);
  ops::linear(h.data(), R, lm_head(), local.data(), hidden, vocab_chunk_);
  std::vector<float> logits(static_cast<std::size_t>(R) * c.vocab_size);
  if (tp_.size() == 1 || R == 0) {
    for (std::int64_t r = 0; r < R; ++r)
      std::copy_n(local.data() + r * vocab_chunk_, c.vocab_size, logits.data() + r * c.vocab_size);
  } else {
    std::vector<float> all(local.size() * tp_.size());
    t0 = Clock::now();
    tp_.all_gather(local.data(), all.data(), local.size() * sizeof(float));
    t.tp_comm_ms += ms_since(t0);
    for (int k = 0; k < tp_.size(); ++k) {
      const std::int64_t begin = k * vocab_chunk_;
      const std::int64_t count = std::max<std::int64_t>(
          0, std::min<std::int64_t>(c.vocab_size, begin + vocab_chunk_) - begin);
      for (std::int64_t r = 0; r < R; ++r) {
        std::copy_n(all.data() + (k * R + r) * vocab_chunk_, count,
                    logits.data() + r * c.vocab_size + begin);
      }
    }
  }
  t.total_ms = ms_since(t_start);
  t.dcp_comm = dcp_.stats() - dcp_before;
  t.tp_comm = tp_.stats() - tp_before;
  if (dp_attention()) t.mlp_comm = mlp_->stats() - mlp_before;
  if (timings) *timings = t;
  return logits;
}

}  // namespace dcp
