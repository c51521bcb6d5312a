#include "dcp/dcp_attention.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "dcp/attention_state.h"
#include "dcp/dtype.h"
#include "dcp/error.h"
#include "dcp/layout.h"
#include "dcp/merge.h"
#include "dcp/timing.h"

namespace dcp {

DcpAttention::DcpAttention(Communicator& group, DcpAttentionOptions options)
    : group_(group), options_(options) {
  DCP_ARG_CHECK(options.local_heads >= 1, "local_heads = ", options.local_heads, " must be >= 1");
  DCP_CHECK(options.backend != CombineBackend::fi_a2a, unsupported,
            "backend = fi_a2a needs Blackwell GPUs in one MNNVL domain; this build runs "
            "on the CPU (legal: ag_rs, a2a)");
  DCP_ARG_CHECK(!options.replicated_q || options.backend == CombineBackend::a2a,
                "replicated_q needs an all-to-all combine (backend = a2a), got ",
                to_string(options.backend));
}

std::uint64_t DcpAttention::expected_bytes_sent(const DcpAttentionOptions& o, int n,
                                                std::int64_t tokens, int dc, int dr) {
  const std::uint64_t peers = static_cast<std::uint64_t>(n - 1);
  const std::uint64_t rows = static_cast<std::uint64_t>(tokens) * o.local_heads;
  std::uint64_t bytes = o.replicated_q ? 0 : peers * rows * (dc + dr) * 4;
  if (o.backend == CombineBackend::ag_rs) {
    bytes += peers * rows * n * 4 + peers * rows * dc * 4;
  } else {
    bytes += peers * rows * (dc + 1) * 4;
  }
  return bytes;
}

void DcpAttention::forward(const float* q, const MlaAttentionParams& shard, const float* sinks,
                           float* out, float* lse) {
  timings_ = {};
  step(q, shard, sinks, out, lse);
}

void DcpAttention::step(const float* q, const MlaAttentionParams& shard, const float* sinks,
                        float* out, float* lse) {
  const int n = group_.size();
  const int h_loc = options_.local_heads;
  const int heads = n * h_loc;
  const int dc = shard.kv_lora_rank;
  const int width = shard.kv_lora_rank + shard.rope_dim;
  DCP_ARG_CHECK(shard.dcp_size == n, "shard.dcp_size = ", shard.dcp_size,
                " must equal the DCP group size ", n);
  DCP_ARG_CHECK(shard.dcp_rank == group_.rank(), "shard.dcp_rank = ", shard.dcp_rank,
                " must equal this rank's place in the DCP group, ", group_.rank());
  DCP_ARG_CHECK(q != nullptr && out != nullptr, "q and out must not be null");
  DCP_ARG_CHECK(shard.num_requests >= 0 && (shard.num_requests == 0 || shard.q_start != nullptr),
                "shard.q_start must not be null when num_requests > 0");
  const std::int64_t tokens = shard.num_requests > 0 ? shard.q_start[shard.num_requests] : 0;

  MlaAttentionParams p = shard;
  p.num_heads = heads;
  p.out_head_block = 0;
  p.out_block_stride = 0;
  p.lse_block_stride = 0;
  p.sinks = group_.rank() == 0 ? sinks : nullptr;  // one rank adds the sink: counted once

  // 1. The group's query [T, N*H_loc, W].
  auto t0 = Clock::now();
  if (options_.replicated_q || n == 1) {
    p.q = q;
    p.q_head_block = 0;
  } else {
    const std::size_t block = static_cast<std::size_t>(tokens) * h_loc * width;
    q_gathered_.resize(block * n);
    group_.all_gather(q, q_gathered_.data(), block * sizeof(float));
    timings_.comm_ms += ms_since(t0);
    // [N, T, H_loc, W]: head g = rank * H_loc + h; the kernel reads it in place.
    p.q = q_gathered_.data();
    p.q_head_block = h_loc;
  }

  // 2. Local attention over this rank's shard, all N*H_loc heads.
  if (n == 1) {  // no combine: the kernel writes the result directly
    p.out = out;
    p.out_head_block = 0;
    p.lse = lse ? lse
                : (lse_local_.resize(static_cast<std::size_t>(tokens) * heads), lse_local_.data());
    t0 = Clock::now();
    mla_attention(p);
    timings_.attention_ms += ms_since(t0);
    return;
  }
  if (options_.backend == CombineBackend::a2a) {
    // The kernel writes the all-to-all's send buffer itself: block j (heads of rank j) is chunk
    // j, [O rows*dc | LSE rows] with rows = T * H_loc, so nothing is packed.
    const std::int64_t rows = tokens * h_loc;
    const std::size_t chunk = a2a_chunk_floats(tokens, dc);
    send_.resize(chunk * n);
    p.out = send_.data();
    p.lse = send_.data() + rows * dc;
    p.out_head_block = h_loc;
    p.out_block_stride = static_cast<std::int64_t>(chunk);
  } else {
    // ag_rs: O straight into the reduce-scatter's layout [N, T, H_loc, D_c], and the LSEs in the
    // same order [N, T, H_loc] in a buffer of their own, all-gathered before the rescale.
    const std::int64_t rows = tokens * h_loc;
    send_.resize(static_cast<std::size_t>(rows * dc) * n);
    lse_local_.resize(static_cast<std::size_t>(rows) * n);
    p.out = send_.data();
    p.lse = lse_local_.data();
    p.out_head_block = h_loc;
    p.out_block_stride = rows * dc;
    p.lse_block_stride = rows;
  }
  t0 = Clock::now();
  mla_attention(p);
  timings_.attention_ms += ms_since(t0);

  // 3. Combine; heads return to their TP owner.
  if (options_.backend == CombineBackend::ag_rs) {
    combine_ag_rs(tokens, dc, out, lse);
  } else {
    combine_a2a(tokens, dc, out, lse);
  }
}

MlaAttentionParams DcpAttention::shard_params(const ForwardPlan& plan,
                                              const LatentPool& pool) const {
  MlaAttentionParams p = plan.kernel_params(pool);
  p.kernel = options_.kernel;
  p.num_threads = options_.threads;
  p.softmax_scale = options_.softmax_scale;
  p.causal = true;
  return p;
}

void DcpAttention::attend(ForwardMode mode, const float* q, const float* chunk,
                          const KvShard& shard, const ForwardPlan& plan, float* out) {
  timings_ = {};
  DCP_ARG_CHECK(plan.dcp_size == group_.size() && plan.dcp_rank == group_.rank(),
                "attend: the plan is for DCP rank ", plan.dcp_rank, " of ", plan.dcp_size,
                ", this is rank ", group_.rank(), " of ", group_.size());
  switch (mode) {
    case ForwardMode::decode:
      step(q, shard_params(plan, shard.pool()), nullptr, out, nullptr);
      return;
    case ForwardMode::extend: gather_extend(q, shard, plan, out); return;
    case ForwardMode::extend_native: native_extend(q, chunk, shard, plan, out); return;
  }
}

void DcpAttention::gather_extend(const float* q, const KvShard& shard, const ForwardPlan& plan,
                                 float* out) {
  const LatentGeometry& g = shard.pool().geometry();
  auto t0 = Clock::now();
  std::vector<std::vector<float>> seqs;
  for (const RequestId id : plan.requests) seqs.push_back(gather_sequence(group_, shard, id));
  timings_.comm_ms += ms_since(t0);
  std::vector<const float*> rows;
  for (const auto& seq : seqs) rows.push_back(seq.data());
  std::vector<float> lse(static_cast<std::size_t>(plan.num_tokens()) * options_.local_heads);
  t0 = Clock::now();
  attend_contiguous(q, rows, plan.global_len, plan.q_start.data(), plan.q_pos.data(),
                    g.kv_lora_rank, g.rope_dim, out, lse.data());
  timings_.attention_ms += ms_since(t0);
}

void DcpAttention::native_extend(const float* q, const float* chunk_rows, const KvShard& shard,
                                 const ForwardPlan& plan, float* o) {
  const LatentGeometry& g = shard.pool().geometry();
  const int h_loc = options_.local_heads,
            heads_q = options_.replicated_q ? group_.size() * h_loc : h_loc;
  const std::int64_t T = plan.num_tokens();
  const int kvl = g.kv_lora_rank, width = g.width();
  const std::size_t rows = static_cast<std::size_t>(T) * h_loc;
  // 1. The chunk's queries over every rank's prefix shard: the DCP step with rank-local lengths
  //    cut at the chunk start (the chunk's rows follow the prefix in local-row order).
  std::vector<float> lse(rows, kNegInf);
  std::fill(o, o + rows * kvl, 0.0f);
  bool any_prefix = false;
  std::vector<std::int64_t> prefix_len(static_cast<std::size_t>(plan.num_requests()));
  for (int b = 0; b < plan.num_requests(); ++b) {
    const std::int64_t start = plan.global_len[b] - (plan.q_start[b + 1] - plan.q_start[b]);
    prefix_len[b] = layout::count(start, group_.rank(), group_.size(), plan.interleave);
    any_prefix = any_prefix || start > 0;  // the same on every rank: lockstep holds
  }
  if (any_prefix) {
    MlaAttentionParams p = shard_params(plan, shard.pool());
    p.local_len = prefix_len.data();
    step(q, p, nullptr, o, lse.data());
  }
  // 2. The intra-chunk causal part, for this rank's heads: every rank computed the chunk's
  //    latent rows, so no communication. Rows are rounded as the cache stores them, and
  //    positions shift by the chunk start so that row j sits at position j.
  const auto t0 = Clock::now();
  std::vector<float> chunk(chunk_rows, chunk_rows + static_cast<std::size_t>(T) * width);
  if (g.dtype == KvDtype::bf16) {
    for (float& x : chunk) x = bf16_to_float(float_to_bf16(x));
  }
  std::vector<float> q_mine;
  const float* q_own = q;
  if (heads_q != h_loc) {  // replicated query: keep this rank's head block
    q_mine.resize(rows * width);
    for (std::int64_t i = 0; i < T; ++i) {
      std::copy_n(q + (i * heads_q + group_.rank() * h_loc) * width,
                  static_cast<std::size_t>(h_loc) * width, q_mine.data() + i * h_loc * width);
    }
    q_own = q_mine.data();
  }
  std::vector<const float*> chunks;
  std::vector<std::int64_t> lens, rel_pos(static_cast<std::size_t>(T));
  for (int b = 0; b < plan.num_requests(); ++b) {
    chunks.push_back(chunk.data() + static_cast<std::size_t>(plan.q_start[b]) * width);
    lens.push_back(plan.q_start[b + 1] - plan.q_start[b]);
    const std::int64_t start = plan.global_len[b] - lens[b];
    for (std::int64_t i = plan.q_start[b]; i < plan.q_start[b + 1]; ++i)
      rel_pos[i] = plan.q_pos[i] - start;
  }
  std::vector<float> o_chunk(rows * kvl);
  std::vector<float> lse_chunk(rows);
  attend_contiguous(q_own, chunks, lens, plan.q_start.data(), rel_pos.data(), kvl, g.rope_dim,
                    o_chunk.data(), lse_chunk.data());
  // 3. Exact LSE merge of the two parts.
  for (std::size_t r = 0; r < rows; ++r)
    merge_state_into(o + r * kvl, lse[r], o_chunk.data() + r * kvl, lse_chunk[r], kvl);
  timings_.attention_ms += ms_since(t0);
}

void DcpAttention::attend_contiguous(const float* q, const std::vector<const float*>& seqs,
                                     const std::vector<std::int64_t>& lens,
                                     const std::int32_t* q_start, const std::int64_t* q_pos,
                                     int kv_lora_rank, int rope_dim, float* out, float* lse) const {
  const int width = kv_lora_rank + rope_dim;
  const std::size_t requests = seqs.size();
  // One page per request, as long as the longest sequence. A single request is its own page, read
  // in place; otherwise the sequences are copied into one pool. The kernel reads no row past a
  // request's length, so the pool's tails are left uninitialized rather than zero-filled.
  std::int64_t page = 1;
  for (std::int64_t len : lens) page = std::max(page, len);
  std::unique_ptr<float[]> pool;
  const float* kv = seqs.empty() ? nullptr : seqs[0];
  std::vector<std::int32_t> table(requests);
  for (std::size_t b = 0; b < requests; ++b) table[b] = static_cast<std::int32_t>(b);
  if (requests > 1) {
    pool.reset(new float[requests * static_cast<std::size_t>(page) * width]);
    for (std::size_t b = 0; b < requests; ++b) {
      std::copy_n(seqs[b], lens[b] * width,
                  pool.get() + b * static_cast<std::size_t>(page) * width);
    }
    kv = pool.get();
  }
  MlaAttentionParams p;
  p.num_heads = options_.local_heads;
  p.kv_lora_rank = kv_lora_rank;
  p.rope_dim = rope_dim;
  p.softmax_scale = options_.softmax_scale;
  p.num_requests = static_cast<int>(requests);
  p.q_start = q_start;
  p.q = q;
  p.q_pos = q_pos;
  p.kv = kv;
  p.kv_dtype = KvDtype::fp32;  // exact copies of the stored rows (bf16 widens exactly)
  p.num_pages = static_cast<std::int64_t>(requests);
  p.page_size = static_cast<int>(page);
  p.page_table = table.data();
  p.page_table_stride = 1;
  p.local_len = lens.data();
  p.causal = true;
  p.num_threads = options_.threads;
  p.out = out;
  p.lse = lse;
  mla_attention(p);
}

void DcpAttention::combine_ag_rs(std::int64_t tokens, int dc, float* out, float* lse) {
  const int n = group_.size();
  const int r = group_.rank();
  const std::size_t rows = static_cast<std::size_t>(tokens) * options_.local_heads * n;
  auto t0 = Clock::now();
  lse_all_.resize(rows * n);
  group_.all_gather(lse_local_.data(), lse_all_.data(), rows * sizeof(float));
  timings_.comm_ms += ms_since(t0);

  t0 = Clock::now();
  // Every rank holds its rows in the same order (destination, token, head), so the global LSE
  // is row by row. Rescale O_r by exp(L_r - L) in place: send_ is the kernel's output.
  lse_global_.resize(rows);
  global_lse(lse_all_.data(), n, static_cast<std::int64_t>(rows), LseBase::e, lse_global_.data());
  for (std::size_t row = 0; row < rows; ++row) {
    const float w = attention_state::part_weight(lse_local_[row], lse_global_[row]);
    float* o = send_.data() + row * dc;
    // o = w * o, or zeros for an empty shard (whose O may be anything): a sum of 1 or 0 parts.
    const float* src = o;
    weighted_sum(&src, &w, w == 0.0f ? 0 : 1, dc, o);
  }
  timings_.other_ms += ms_since(t0);

  t0 = Clock::now();
  const std::size_t block = rows / n * dc;
  group_.reduce_scatter(send_.data(), out, block, ScalarType::f32, ReduceOp::sum);
  timings_.comm_ms += ms_since(t0);
  if (lse) {  // this rank's block of the global LSEs is [T, H_loc] already
    const float* mine = lse_global_.data() + rows / n * r;
    std::copy(mine, mine + rows / n, lse);
  }
}

std::size_t DcpAttention::a2a_chunk_floats(std::int64_t tokens, int dc) const {
  return static_cast<std::size_t>(tokens) * options_.local_heads * (dc + 1);
}

void DcpAttention::combine_a2a(std::int64_t tokens, int dc, float* out, float* lse) {
  const int n = group_.size();
  const int h_loc = options_.local_heads;
  const std::int64_t rows = tokens * h_loc;  // rows per destination
  const std::size_t chunk = a2a_chunk_floats(tokens, dc);
  // send_ holds the kernel's output already laid out by destination (forward).
  recv_.resize(chunk * n);
  auto t0 = Clock::now();
  group_.all_to_all(send_.data(), recv_.data(), chunk * sizeof(float));
  timings_.comm_ms += ms_since(t0);

  t0 = Clock::now();
  merge_attention_states(recv_.data(), static_cast<std::int64_t>(chunk), recv_.data() + rows * dc,
                         static_cast<std::int64_t>(chunk), n, rows, dc, LseBase::e, out, lse);
  timings_.other_ms += ms_since(t0);
}

}  // namespace dcp
