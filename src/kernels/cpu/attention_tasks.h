// Internal: the unit of work the local attention kernels share. A task attends one query token, or
// a block of consecutive tokens of one request, over part of their visible rows and writes an
// (O, LSE) state per token; the parts of one token (split-KV, or a block's shared rows and the
// token's own) are merged afterwards with the LSE merge.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dcp/attention.h"

namespace dcp::kernels {

// The visible local rows of a token: a range (causal, window: positions grow with the row), or a
// list (top-k). Rows are at(first) .. at(last - 1).
struct RowSet {
  const std::int64_t* list = nullptr;  // null: the range [0, count) offset by `base`
  std::int64_t base = 0;
  std::int64_t count = 0;
  std::int64_t at(std::int64_t i) const noexcept { return list ? list[i] : base + i; }
};

struct Task {
  int b = 0;           // request
  std::int64_t t = 0;  // query token (the first of the block)
  // Query tokens t .. t + tokens - 1, all over the same rows (prefill and verification: a block's
  // rows are read once for all its tokens): the lanes and AMX kernels put heads x tokens in their
  // lanes, the portable one runs the tokens one by one (for_each_token). Token i writes at
  // out + i * out_token_stride, lse + i * lse_token_stride.
  int tokens = 1;
  std::int64_t out_token_stride = 0, lse_token_stride = 0;
  RowSet rows;
  std::int64_t first = 0, last = 0;   // the part of `rows` this task covers
  float* out = nullptr;               // [Hq, D_c] (heads of block k at + k * block_stride)
  float* lse = nullptr;               // [Hq] natural log (likewise)
  int head_block = 0;                 // heads per output block (Hq: one block)
  std::int64_t block_stride = 0;      // floats between output blocks
  std::int64_t lse_block_stride = 0;  // floats between LSE blocks
  bool add_sinks = false;
};

// The physical row of request b's local row in the paged pool. Internal linkage: the per-ISA
// files include this, and one shared inline copy could carry another file's instructions.
namespace {
inline std::int64_t physical_row(const MlaAttentionParams& p, int b, std::int64_t local_row) {
  const std::int64_t page =
      p.page_table[b * static_cast<std::int64_t>(p.page_table_stride) + local_row / p.page_size];
  return page * p.page_size + local_row % p.page_size;
}

// The physical rows of entries first .. first + n - 1 of `rows` into phys. A range walks its
// pages with one division per call instead of one per row; a top-k list maps row by row.
inline void physical_rows(const MlaAttentionParams& p, int b, const RowSet& rows,
                          std::int64_t first, int n, std::int64_t* phys) {
  if (rows.list || n <= 0) {
    for (int j = 0; j < n; ++j) phys[j] = physical_row(p, b, rows.at(first + j));
    return;
  }
  const std::int32_t* table = p.page_table + b * static_cast<std::int64_t>(p.page_table_stride);
  const std::int64_t local = rows.base + first;
  std::int64_t page = local / p.page_size, offset = local % p.page_size;
  std::int64_t start = static_cast<std::int64_t>(table[page]) * p.page_size;
  for (int j = 0;;) {
    phys[j] = start + offset;
    if (++j == n) return;
    if (++offset == p.page_size) {  // the next row is on the request's next page
      offset = 0;
      start = static_cast<std::int64_t>(table[++page]) * p.page_size;
    }
  }
}
}  // namespace

// Writes a task's (O, LSE) from the online-softmax state every kernel ends with: running max m,
// denominator l and unnormalised output acc ([heads, acc_stride]) per head, the heads of token i
// of a block at i * num_heads. out = acc / l and lse = m + log l, or 0 and -inf where no row was
// visible; then the sink, if the task carries it, as the merge of a valueless state (merge_sink).
void write_task_state(const MlaAttentionParams& p, const Task& task, const float* acc,
                      std::size_t acc_stride, const float* m, const float* l);

// At most this many heads x tokens in one block task (the heads-in-lanes kernel's 128-head shape).
constexpr int kMaxBlockLanes = 128;

// The width of every released MLA model's latent row (kv_lora_rank 512 + rope_dim 64): the lanes
// kernel reads contiguous rows of it from one base pointer, and the kernel switch is tuned for
// it.
constexpr int kMlaWidth = 512 + 64;

// Lane h of a block task: head h % H of token t + h / H (T query tokens in all, for query_head).
// Internal linkage, as physical_row.
namespace {
inline const float* query_lane(const MlaAttentionParams& p, std::int64_t tokens, std::int64_t t,
                               int h) {
  return query_head(p, tokens, t + h / p.num_heads, h % p.num_heads);
}
}  // namespace

// Token i of a block task as a task of its own.
inline Task token_of(const Task& block, int i) {
  Task one = block;
  one.tokens = 1;
  one.t = block.t + i;
  one.out = block.out + i * block.out_token_stride;
  one.lse = block.lse + i * block.lse_token_stride;
  return one;
}

// Runs a task on a kernel that attends one token at a time.
template <typename Kernel>
void for_each_token(Kernel& kernel, const Task& task) {
  if (task.tokens == 1) {
    kernel.run(task);
    return;
  }
  for (int i = 0; i < task.tokens; ++i) kernel.run(token_of(task, i));
}

// Each runs tasks sequentially on the calling thread.
void run_portable(const MlaAttentionParams& p, const Task* tasks, std::size_t n);
void run_avx2(const MlaAttentionParams& p, const Task* tasks, std::size_t n);
void run_avx512(const MlaAttentionParams& p, const Task* tasks, std::size_t n);
void run_amx_bf16(const MlaAttentionParams& p, const Task* tasks, std::size_t n);
void run_avx512_bf16(const MlaAttentionParams& p, const Task* tasks, std::size_t n);
bool amx_bf16_supported();

}  // namespace dcp::kernels
