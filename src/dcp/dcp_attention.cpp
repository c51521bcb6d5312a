#include "dcp/dcp_attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "dcp/error.h"
#include "dcp/merge.h"

namespace dcp {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

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
  timings_ = {};

  MlaAttentionParams p = shard;
  p.num_heads = heads;
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
    const float l_r = lse_local_[row], l = lse_global_[row];
    const float w = (l_r == kNegInf || l == kNegInf) ? 0.0f : std::exp(l_r - l);
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
