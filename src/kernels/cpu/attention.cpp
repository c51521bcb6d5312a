// Local absorbed-MLA attention on the CPU: validation, the visible rows of each query token,
// the work split (tokens, and KV ranges for split-KV), and the choice of kernel path: the
// portable baseline here, the SIMD kernels (attention_rows.h for few heads, attention_lanes.h
// for many) built for AVX2 and AVX-512 and chosen at run time, or an opt-in bf16-pair path, AMX
// or AVX512-BF16 (attention_bf16_pairs.cpp).
#include "dcp/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention_tasks.h"
#include "dcp/attention_state.h"
#include "dcp/error.h"
#include "dcp/layout.h"
#include "dcp/merge.h"
#include "dcp/worker_pool.h"
#include "line_vector.h"

namespace dcp {

std::int64_t num_query_tokens(const MlaAttentionParams& p) {
  return p.num_requests > 0 ? p.q_start[p.num_requests] : 0;
}

void validate(const MlaAttentionParams& p) {
  DCP_ARG_CHECK(p.num_heads >= 1, "num_heads = ", p.num_heads, " must be >= 1");
  DCP_ARG_CHECK(p.kv_lora_rank >= 1, "kv_lora_rank = ", p.kv_lora_rank, " must be >= 1");
  DCP_ARG_CHECK(p.rope_dim >= 0, "rope_dim = ", p.rope_dim, " must be >= 0");
  DCP_ARG_CHECK(std::isfinite(p.softmax_scale) && p.softmax_scale > 0,
                "softmax_scale = ", p.softmax_scale, " must be finite and > 0");
  DCP_ARG_CHECK(p.num_requests >= 0, "num_requests = ", p.num_requests, " must be >= 0");
  DCP_ARG_CHECK(p.dcp_size >= 1, "dcp_size = ", p.dcp_size, " must be >= 1");
  DCP_ARG_CHECK(p.dcp_rank >= 0 && p.dcp_rank < p.dcp_size, "dcp_rank = ", p.dcp_rank,
                " must be in [0, dcp_size = ", p.dcp_size, ")");
  DCP_ARG_CHECK(p.interleave >= 1, "interleave = ", p.interleave, " must be >= 1");
  DCP_ARG_CHECK(p.window >= 0, "window = ", p.window, " must be >= 0 (0 = no window)");
  DCP_ARG_CHECK(std::isfinite(p.softcap) && p.softcap >= 0, "softcap = ", p.softcap,
                " must be finite and >= 0 (0 = off)");
  DCP_ARG_CHECK(p.topk_k >= 0, "topk_k = ", p.topk_k, " must be >= 0");
  DCP_ARG_CHECK(p.page_size >= 1, "page_size = ", p.page_size, " must be >= 1");
  DCP_ARG_CHECK(p.num_pages >= 0, "num_pages = ", p.num_pages, " must be >= 0");
  DCP_ARG_CHECK(p.page_table_stride >= 0, "page_table_stride = ", p.page_table_stride,
                " must be >= 0");
  if (p.num_requests == 0) return;
  DCP_ARG_CHECK(p.q_start != nullptr, "q_start must not be null when num_requests > 0");
  DCP_ARG_CHECK(p.local_len != nullptr, "local_len must not be null when num_requests > 0");
  DCP_ARG_CHECK(p.q_start[0] == 0, "q_start[0] = ", p.q_start[0], " must be 0");
  for (int b = 0; b < p.num_requests; ++b) {
    DCP_ARG_CHECK(p.q_start[b + 1] > p.q_start[b], "request ", b, " has q_len ",
                  p.q_start[b + 1] - p.q_start[b], " (q_start[", b + 1, "] - q_start[", b,
                  "]); every request needs >= 1 query token");
  }
  const std::int64_t tokens = num_query_tokens(p);
  DCP_ARG_CHECK(p.q && p.q_pos && p.out && p.lse, "q, q_pos, out and lse must not be null");
  DCP_ARG_CHECK(
      p.out_head_block >= 0 && (p.out_head_block == 0 || p.num_heads % p.out_head_block == 0),
      "out_head_block = ", p.out_head_block,
      " must be 0 (plain outputs) or divide num_heads = ", p.num_heads);
  DCP_ARG_CHECK(
      p.out_head_block == 0 || p.out_block_stride >= tokens * p.out_head_block * p.kv_lora_rank,
      "out_block_stride = ", p.out_block_stride, " must hold a block's output (T * ",
      "out_head_block * kv_lora_rank = ", tokens * p.out_head_block * p.kv_lora_rank, ")");
  DCP_ARG_CHECK(p.lse_block_stride == 0 || p.lse_block_stride >= tokens * p.out_head_block,
                "lse_block_stride = ", p.lse_block_stride,
                " must be 0 (the LSEs follow out_block_stride) or hold a block's LSEs (T * ",
                "out_head_block = ", tokens * p.out_head_block, ")");
  DCP_ARG_CHECK(p.q_head_block >= 0 && (p.q_head_block == 0 || p.num_heads % p.q_head_block == 0),
                "q_head_block = ", p.q_head_block, " must be 0 (plain [T, Hq, W] query) or divide ",
                "num_heads = ", p.num_heads);
  DCP_ARG_CHECK(p.topk_k == 0 || p.topk != nullptr,
                "topk must not be null when topk_k = ", p.topk_k);
  for (std::int64_t t = 0; t < tokens; ++t) {
    DCP_ARG_CHECK(p.q_pos[t] >= 0, "q_pos[", t, "] = ", p.q_pos[t], " must be >= 0");
  }
  if (p.sinks) {
    for (int h = 0; h < p.num_heads; ++h) {
      DCP_ARG_CHECK(!std::isnan(p.sinks[h]) && p.sinks[h] != std::numeric_limits<float>::infinity(),
                    "sinks[", h, "] = ", p.sinks[h], " must be finite or -inf");
    }
  }
  bool any_rows = false;
  for (int b = 0; b < p.num_requests; ++b) {
    const std::int64_t len = p.local_len[b];
    const std::int64_t max_rows = static_cast<std::int64_t>(p.page_table_stride) * p.page_size;
    DCP_ARG_CHECK(len >= 0 && len <= max_rows, "local_len[", b, "] = ", len,
                  " must be in [0, page_table_stride * page_size = ", max_rows, "]");
    const std::int64_t pages = (len + p.page_size - 1) / p.page_size;
    for (std::int64_t j = 0; j < pages; ++j) {
      const std::int32_t page =
          p.page_table[b * static_cast<std::int64_t>(p.page_table_stride) + j];
      DCP_ARG_CHECK(page >= 0 && page < p.num_pages, "page_table[", b, "][", j, "] = ", page,
                    " is outside the pool [0, num_pages = ", p.num_pages, ")");
    }
    any_rows = any_rows || len > 0;
    if (p.topk_k == 0) continue;
    for (std::int32_t t = p.q_start[b]; t < p.q_start[b + 1]; ++t) {
      for (int i = 0; i < p.topk_k; ++i) {
        const std::int64_t pos = p.topk[static_cast<std::int64_t>(t) * p.topk_k + i];
        DCP_ARG_CHECK(pos >= -1, "topk[", t, "][", i, "] = ", pos, " must be >= -1 (-1 = none)");
        if (pos < 0 || layout::owner(pos, p.dcp_size, p.interleave) != p.dcp_rank) continue;
        DCP_ARG_CHECK(layout::row(pos, p.dcp_size, p.interleave) < len, "topk[", t, "][", i,
                      "] = ", pos, " is beyond request ", b, "'s sequence (local_len ", len,
                      " on dcp rank ", p.dcp_rank, ")");
      }
    }
  }
  DCP_ARG_CHECK(!any_rows || p.kv != nullptr, "kv must not be null when a request has rows");
}

namespace kernels {
namespace {

constexpr int kTileRows = 32;

// Eight independent partial sums so the compiler can vectorise without reassociation flags.
float dot(const float* a, const float* b, int n) noexcept {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  }
  float total = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

void axpy(float* y, float a, const float* x, int n) noexcept {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

void scale_inplace(float* y, float a, int n) noexcept {
  for (int i = 0; i < n; ++i) y[i] *= a;
}

// The baseline: a tile of rows, a dot product per (head, row), an online softmax per head.
class PortableKernel {
 public:
  explicit PortableKernel(const MlaAttentionParams& p)
      : p_(p),
        width_(p.kv_lora_rank + p.rope_dim),
        tile_(static_cast<std::size_t>(kTileRows) * width_),
        row_ptr_(kTileRows),
        scores_(static_cast<std::size_t>(kTileRows) * p.num_heads),
        acc_(static_cast<std::size_t>(p.num_heads) * p.kv_lora_rank),
        m_(p.num_heads),
        l_(p.num_heads) {}

  void run(const Task& task) {
    const int heads = p_.num_heads, dc = p_.kv_lora_rank;
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    std::fill(m_.begin(), m_.end(), kNegInf);
    std::fill(l_.begin(), l_.end(), 0.0f);
    for (std::int64_t start = task.first; start < task.last; start += kTileRows) {
      const int n = static_cast<int>(std::min<std::int64_t>(kTileRows, task.last - start));
      for (int j = 0; j < n; ++j)
        row_ptr_[j] = load_row(task.b, task.rows.at(start + j), tile_.data() + j * width_);
      for (int h = 0; h < heads; ++h) {
        const float* qh = query_head(p_, tokens_, task.t, h);
        float* s = scores_.data() + h * kTileRows;
        float tile_max = kNegInf;
        for (int j = 0; j < n; ++j) {
          float v = dot(qh, row_ptr_[j], width_) * p_.softmax_scale;
          if (p_.softcap > 0) v = p_.softcap * std::tanh(v / p_.softcap);
          s[j] = v;
          tile_max = std::max(tile_max, v);
        }
        const float m_new = std::max(m_[h], tile_max);
        float* acc = acc_.data() + h * dc;
        if (m_[h] != m_new) {
          const float c = attention_state::rescale(m_[h], m_new);
          l_[h] *= c;
          scale_inplace(acc, c, dc);
        }
        m_[h] = m_new;
        const float base = attention_state::base(m_new);
        for (int j = 0; j < n; ++j) {
          const float e = std::exp(s[j] - base);
          l_[h] += e;
          axpy(acc, e, row_ptr_[j], dc);
        }
      }
    }
    write_task_state(p_, task, acc_.data(), dc, m_.data(), l_.data());
  }

 private:
  const float* load_row(int b, std::int64_t local_row, float* convert_to) const {
    const std::int64_t physical = physical_row(p_, b, local_row);
    if (p_.kv_dtype == KvDtype::fp32) return static_cast<const float*>(p_.kv) + physical * width_;
    const bf16_t* src = static_cast<const bf16_t*>(p_.kv) + physical * width_;
    for (int d = 0; d < width_; ++d) convert_to[d] = bf16_to_float(src[d]);
    return convert_to;
  }

  const MlaAttentionParams& p_;
  int width_;
  std::int64_t tokens_ = num_query_tokens(p_);  // T, for query_head
  std::vector<float> tile_;
  std::vector<const float*> row_ptr_;
  std::vector<float> scores_, acc_, m_, l_;
};

}  // namespace

void write_task_state(const MlaAttentionParams& p, const Task& task, const float* acc,
                      std::size_t acc_stride, const float* m, const float* l) {
  const int heads = p.num_heads, dc = p.kv_lora_rank, hb = task.head_block;
  if (task.tokens > 1) {
    for (int i = 0; i < task.tokens; ++i) {
      const std::size_t h = static_cast<std::size_t>(i) * heads;
      write_task_state(p, token_of(task, i), acc ? acc + h * acc_stride : nullptr, acc_stride,
                       m + h, l + h);
    }
    return;
  }
  for (int h0 = 0; h0 < heads; h0 += hb) {
    float* out = task.out + (h0 / hb) * task.block_stride;
    float* lse = task.lse + (h0 / hb) * task.lse_block_stride;
    for (int i = 0; i < hb; ++i) {
      const int h = h0 + i;
      float* o = out + static_cast<std::size_t>(i) * dc;
      // acc is null for tasks that saw no rows (l = 0 then).
      lse[i] = l[h] > 0.0f ? attention_state::finish(acc + h * acc_stride, m[h], l[h], dc, o)
                           : attention_state::finish(nullptr, m[h], 0.0f, dc, o);
    }
    if (task.add_sinks && p.sinks) merge_sink(out, lse, p.sinks + h0, hb, dc);
  }
}

void run_portable(const MlaAttentionParams& p, const Task* tasks, std::size_t n) {
  PortableKernel k(p);
  for (std::size_t i = 0; i < n; ++i) for_each_token(k, tasks[i]);
}

}  // namespace kernels

namespace {

using kernels::RowSet;
using kernels::Task;

// Floats between the LSE blocks of a blocked output (0 in the params: those of O).
std::int64_t lse_block_stride(const MlaAttentionParams& p) {
  return p.lse_block_stride > 0 ? p.lse_block_stride : p.out_block_stride;
}

// Visible rows of one query token: a range (positions grow with the local row), or for top-k a
// list of owned local rows appended to `lists`.
RowSet visible_rows(const MlaAttentionParams& p, int b, std::int64_t t,
                    std::vector<std::int64_t>& lists, std::vector<std::size_t>& list_at) {
  const std::int64_t qpos = p.q_pos[t];
  if (p.topk_k > 0) {
    list_at.push_back(lists.size());
    std::int64_t count = 0;
    for (int i = 0; i < p.topk_k; ++i) {
      const std::int64_t pos = p.topk[t * p.topk_k + i];
      if (pos < 0 || layout::owner(pos, p.dcp_size, p.interleave) != p.dcp_rank) continue;
      if (p.causal && pos > qpos) continue;
      if (p.window > 0 && qpos - pos >= p.window) continue;
      lists.push_back(layout::row(pos, p.dcp_size, p.interleave));
      ++count;
    }
    return {nullptr, 0, count};  // list pointer fixed up once `lists` stops growing
  }
  std::int64_t hi = p.local_len[b];
  if (p.causal) hi = std::min(hi, layout::count(qpos + 1, p.dcp_rank, p.dcp_size, p.interleave));
  std::int64_t lo = 0;
  if (p.window > 0) lo = layout::count(qpos - p.window + 1, p.dcp_rank, p.dcp_size, p.interleave);
  return {nullptr, lo, std::max<std::int64_t>(0, hi - lo)};
}

using RunFn = void (*)(const MlaAttentionParams&, const Task*, std::size_t);

RunFn select(KernelPath k, KvDtype kv_dtype) {
  if (is_bf16_pair_path(k)) {
    require_bf16_pair_path(k);
    DCP_ARG_CHECK(kv_dtype == KvDtype::bf16, "kernel path ", to_string(k),
                  " needs kv_dtype bf16, got ", to_string(kv_dtype));
    return k == KernelPath::amx_bf16 ? kernels::run_amx_bf16 : kernels::run_avx512_bf16;
  }
  switch (resolve_exact_path(k)) {
    case KernelPath::avx512: return kernels::run_avx512;
    case KernelPath::avx2: return kernels::run_avx2;
    default: return kernels::run_portable;
  }
}

constexpr std::int64_t kMinRowsPerSplit = 1024;  // below this a split costs more than it saves
// Below this many shared rows a token block saves less than its extra merge costs.
constexpr std::int64_t kMinBlockRows = 16;

struct SplitParts {  // split-KV partial states, [splits, T, Hq, D_c] and [splits, T, Hq]
  std::vector<float> out, lse;
};

// Token blocks (prefill, verification): consecutive query tokens of one request whose visible
// rows all start at row 0 (no window, no top-k) share the rows below the smallest of their limits.
// One task attends those rows for the whole block (each row read once for all its tokens, heads x
// tokens in the lanes), and each token's remaining rows (under one per N tokens after the block's
// first, from the causal mask) are a task of their own; mla_attention LSE-merges the two parts.
struct TokenBlocks {
  std::vector<std::int64_t> shared;  // [T] rows the token shares with its block, -1 outside one;
                                     // empty: no block at all
  std::vector<std::int64_t> size;    // [T] the block's tokens, at its first token (else 0)
};

TokenBlocks plan_token_blocks(const MlaAttentionParams& p, const std::vector<RowSet>& rows) {
  // From 64 heads one token fills the lanes kernel: blocks of two tokens only add parts and
  // merges there, for no gain in rows read per FLOP.
  const int block_tokens = kernels::kMaxBlockLanes / p.num_heads;
  TokenBlocks blocks;
  if (block_tokens < 4 || p.topk_k > 0 || p.window > 0) return blocks;
  const std::size_t tokens = rows.size();
  for (int b = 0; b < p.num_requests; ++b) {
    for (std::int64_t t0 = p.q_start[b]; t0 < p.q_start[b + 1]; t0 += block_tokens) {
      const std::int64_t t1 = std::min<std::int64_t>(t0 + block_tokens, p.q_start[b + 1]);
      std::int64_t common = rows[t0].count;
      for (std::int64_t t = t0; t < t1; ++t) common = std::min(common, rows[t].count);
      if (t1 - t0 < 2 || common < kMinBlockRows) continue;
      if (blocks.shared.empty()) {
        blocks.shared.assign(tokens, -1);
        blocks.size.assign(tokens, 0);
      }
      for (std::int64_t t = t0; t < t1; ++t) blocks.shared[t] = common;
      blocks.size[t0] = t1 - t0;
    }
  }
  return blocks;
}

// Where to cut a task list into `workers` contiguous runs of about equal work (rows x tokens: a
// block task does the work of many one-token tasks). Run i is tasks [cut[i], cut[i + 1]).
std::vector<std::size_t> cut_by_work(const std::vector<Task>& tasks, int workers) {
  const auto work = [](const Task& task) {
    return static_cast<double>(task.last - task.first) * task.tokens;
  };
  double total = 0;
  for (const Task& task : tasks) total += work(task);
  std::vector<std::size_t> cut(static_cast<std::size_t>(workers) + 1, tasks.size());
  cut[0] = 0;
  double sum = 0;
  int next = 1;
  for (std::size_t i = 0; i < tasks.size() && next < workers; ++i) {
    sum += work(tasks[i]);
    while (next < workers && sum >= total * next / workers) cut[next++] = i + 1;
  }
  return cut;
}

}  // namespace

void mla_attention(const MlaAttentionParams& p) {
  validate(p);
  DCP_ARG_CHECK(p.num_threads >= 1, "num_threads = ", p.num_threads, " must be >= 1");
  const RunFn run = select(p.kernel, p.kv_dtype);
  const int heads = p.num_heads, dc = p.kv_lora_rank;
  const std::int64_t tokens = num_query_tokens(p);
  const int out_block = p.out_head_block > 0 ? p.out_head_block : heads;

  std::vector<std::int64_t> lists;
  std::vector<std::size_t> list_at;
  std::vector<RowSet> rows(static_cast<std::size_t>(tokens));
  std::vector<int> request_of(static_cast<std::size_t>(tokens));
  for (int b = 0; b < p.num_requests; ++b) {
    for (std::int64_t t = p.q_start[b]; t < p.q_start[b + 1]; ++t) {
      rows[t] = visible_rows(p, b, t, lists, list_at);
      request_of[t] = b;
    }
  }
  if (p.topk_k > 0) {
    for (std::int64_t t = 0; t < tokens; ++t) rows[t].list = lists.data() + list_at[t];
  }
  // Split-KV: with fewer tokens than threads, cut long row ranges so every thread has work;
  // each part writes a partial state that is LSE-merged below.
  const int threads = p.num_threads;
  std::int64_t splits = 1;
  if (threads > 1 && tokens < threads) {
    std::int64_t longest = 0;
    for (const RowSet& r : rows) longest = std::max(longest, r.count);
    splits = std::clamp<std::int64_t>(longest / kMinRowsPerSplit, 1,
                                      (threads + tokens - 1) / std::max<std::int64_t>(tokens, 1));
  }
  // Split-KV and token blocks exclude each other: blocks need several tokens of a request,
  // splits fewer tokens than threads.
  const TokenBlocks blocks = splits == 1 ? plan_token_blocks(p, rows) : TokenBlocks{};
  const bool any_block = !blocks.shared.empty();
  const std::vector<std::int64_t>& shared = blocks.shared;
  const std::vector<std::int64_t>& block_size = blocks.size;
  const std::int64_t parts = any_block ? 2 : splits;  // part states per token, where merged
  // The parts' states, kept per calling thread: a fresh 2 x 128 x 512 buffer per call would be
  // zero-filled for nothing (every part is written).
  SplitParts& split_parts = kernels::thread_buffers<SplitParts>();
  std::vector<float>& part_out = split_parts.out;
  std::vector<float>& part_lse = split_parts.lse;
  if (parts > 1) {
    part_out.resize(static_cast<std::size_t>(parts * tokens) * heads * dc);
    part_lse.resize(static_cast<std::size_t>(parts * tokens) * heads);
  }
  // Part s of token t in the plain layout.
  const auto to_part = [&](Task& task, std::int64_t s, std::int64_t t) {
    task.out = part_out.data() + static_cast<std::size_t>(s * tokens + t) * heads * dc;
    task.lse = part_lse.data() + static_cast<std::size_t>(s * tokens + t) * heads;
    task.head_block = heads;
    task.out_token_stride = static_cast<std::int64_t>(heads) * dc;
    task.lse_token_stride = heads;
  };
  std::vector<Task> tasks;
  // A task that sees no rows (a rank holding none of a short request, an empty split) is written
  // here: zeros, LSE -inf, plus the sink. Kernels would pack the query for nothing.
  const std::vector<float> no_rows(static_cast<std::size_t>(heads), 0.0f);  // l = 0 for all heads
  const auto add = [&](const Task& task) {
    if (task.first == task.last) {
      kernels::write_task_state(p, task, nullptr, 0, no_rows.data(), no_rows.data());
    } else {
      tasks.push_back(task);
    }
  };
  for (std::int64_t t = 0; t < tokens; ++t) {
    const RowSet& r = rows[t];
    if (any_block && shared[t] >= 0) {
      if (block_size[t] > 0) {  // the block's shared rows, for all its tokens
        Task block;
        block.b = request_of[t];
        block.t = t;
        block.tokens = static_cast<int>(block_size[t]);
        block.rows = r;
        block.first = 0;
        block.last = shared[t];
        block.add_sinks = true;
        to_part(block, 0, t);
        add(block);
      }
      Task own;  // this token's rows past the shared ones
      own.b = request_of[t];
      own.t = t;
      own.rows = r;
      own.first = shared[t];
      own.last = r.count;
      to_part(own, 1, t);
      add(own);
      continue;
    }
    for (std::int64_t s = 0; s < splits; ++s) {
      Task task;
      task.b = request_of[t];
      task.t = t;
      task.rows = r;
      task.first = r.count * s / splits;
      task.last = r.count * (s + 1) / splits;
      task.add_sinks = s == 0;  // the sink counts once
      if (splits > 1) {         // parts in the plain layout; merged into p's below
        to_part(task, s, t);
      } else {
        task.out = p.out + t * out_block * dc;
        task.lse = p.lse + t * out_block;
        task.head_block = out_block;
        task.block_stride = p.out_block_stride;
        task.lse_block_stride = lse_block_stride(p);
      }
      add(task);
    }
  }
  if (threads == 1 || tasks.size() <= 1) {
    if (!tasks.empty()) run(p, tasks.data(), tasks.size());
  } else {
    // Contiguous runs of tasks, one per thread, on this thread and its kept workers.
    const int workers = static_cast<int>(std::min<std::size_t>(threads, tasks.size()));
    const std::vector<std::size_t> cut = cut_by_work(tasks, workers);
    this_thread_worker_pool(workers - 1).run(workers, [&](int i) {
      if (cut[i] < cut[i + 1]) run(p, tasks.data() + cut[i], cut[i + 1] - cut[i]);
    });
  }
  if (parts > 1) {  // the parts of each token and output block into their place
    for (std::int64_t t = 0; t < tokens; ++t) {
      if (any_block && shared[t] < 0) continue;  // written in place
      for (int h0 = 0; h0 < heads; h0 += out_block) {
        const std::int64_t row = t * heads + h0, block = h0 / out_block;
        merge_attention_states(part_out.data() + row * dc,
                               static_cast<std::int64_t>(tokens) * heads * dc,
                               part_lse.data() + row, static_cast<std::int64_t>(tokens) * heads,
                               static_cast<int>(parts), out_block, dc, LseBase::e,
                               p.out + block * p.out_block_stride + t * out_block * dc,
                               p.lse + block * lse_block_stride(p) + t * out_block);
      }
    }
  }
}

}  // namespace dcp
