// The SIMD kernel for many query heads (a rank attends N * H_loc heads after a DCP query gather:
// 16 to 128 on real models). Per query token the work is two small matrix products with an
// online softmax between them, and it is compute-bound, so it is laid out as GEMM micro-kernels:
//
//   scores  S[j][h] = sum_d K[j][d] * Qt[d][h]   heads in lanes: broadcast K[j][d], load Qt
//   values  O[h][d] = sum_j P[j][h] * V[j][d]    columns in lanes: broadcast P[j][h], load V
//
// Qt (the token's query, transposed and pre-scaled) is packed once per task and reused by every
// KV tile; rows are read straight from the paged pool (bf16 rows widened once per tile), so
// nothing per row is transposed. A task over a block of tokens (prefill, verification) puts all
// their heads in the lanes, token after token, so each row is read once for the whole block. With
// heads in the lanes of S, the online softmax is elementwise over head vectors (no horizontal
// reductions), and its rescale of O is folded into the value micro-kernel's load of its
// accumulators.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention_tasks.h"
#include "dcp/attention.h"
#include "dcp/merge.h"
#include "line_vector.h"
#include "simd.h"
#include "simd_state.h"
#include "tile_prefetch.h"
#include "transpose.h"

namespace dcp::kernels {
namespace {

template <int V>
class LaneKernel {
 public:
  // Rows per KV tile: a multiple of every score row block below, so a tile splits evenly.
  static constexpr int kRows = 48;

  explicit LaneKernel(const MlaAttentionParams& p)
      : p_(p),
        dc_(p.kv_lora_rank),
        width_(p.kv_lora_rank + p.rope_dim),
        rows_buf_(static_cast<std::size_t>(kRows) * width_),
        zero_row_(width_, 0.0f),
        prefetch_(width_ * static_cast<int>(dtype_size(p.kv_dtype))) {
    size_for(p.num_heads);
  }

  void run(const Task& task) {
    size_for(task.tokens * p_.num_heads);
    pack_query(task.t);
    std::fill(acc_.begin(), acc_.begin() + static_cast<std::ptrdiff_t>(heads_) * dc_, 0.0f);
    std::fill(m_.begin(), m_.begin() + lanes_, kNegInf);
    std::fill(l_.begin(), l_.begin() + lanes_, 0.0f);
    for (std::int64_t start = task.first; start < task.last; start += kRows) {
      const int n = static_cast<int>(std::min<std::int64_t>(kRows, task.last - start));
      load_tile(task.b, task.rows, start, n);
      next_tile(task.b, task.rows, start + kRows, task.last);
      scores(n);
      softmax(n);
      values(n);
      prefetch_.rest();
    }
    write_task_state(p_, task, acc_.data(), dc_, m_.data(), l_.data());
  }

 private:
  using S = Simd<V>;
  using vec = typename S::vec;

  // Query vectors (heads x tokens) of the task at hand; the buffers grow to the largest seen.
  void size_for(int heads) {
    heads_ = heads;
    lanes_ = (heads + V - 1) / V * V;
    const std::size_t lanes = static_cast<std::size_t>(lanes_);
    grow_to(qt_, static_cast<std::size_t>(width_) * lanes);
    grow_to(s_, static_cast<std::size_t>(kRows) * lanes);
    grow_to(acc_, static_cast<std::size_t>(heads_) * dc_);
    grow_to(m_, lanes);
    grow_to(l_, lanes);
    grow_to(corr_, lanes);
  }

  // Qt[d][h] = q[h][d] * scale; padding lanes (h >= heads) are zero and are never written out.
  // 16 heads x 16 columns at a time through a register transpose, so that every store writes a
  // run of heads (one at a time, each store hit a different cache line). A block task's lanes are
  // its tokens' heads (query_lane).
  void pack_query(std::int64_t t) {
    std::fill(qt_.begin(), qt_.begin() + static_cast<std::ptrdiff_t>(width_) * lanes_, 0.0f);
    const float scale = p_.softmax_scale;
    heads_to_lanes(
        heads_, width_,
        [&](int h, int d, Words16& row) {
          const float* qh = query_lane(p_, tokens_, t, h) + d;
          float scaled[16];
          for (int e = 0; e < 16; ++e) scaled[e] = qh[e] * scale;
          std::memcpy(&row, scaled, sizeof scaled);
        },
        [&](int d, int hb, int block, const Words16& row) {
          float* dst = qt_.data() + static_cast<std::size_t>(d) * lanes_ + hb;
          if (block == 16) {
            std::memcpy(dst, &row, sizeof row);  // one vector store
          } else {  // lanes_ may end before 16 heads do (AVX2: a multiple of 8)
            std::memcpy(dst, &row, sizeof(float) * block);
          }
        });
    for (int h = 0; h < heads_; ++h) {  // the last width % 16 columns
      const float* qh = query_lane(p_, tokens_, t, h);
      for (int d = width_ / 16 * 16; d < width_; ++d)
        qt_[static_cast<std::size_t>(d) * lanes_ + h] = qh[d] * scale;
    }
  }

  // Row pointers for the tile; past n they point at a zero row, so score blocks never run short.
  void load_tile(int b, const RowSet& rows, std::int64_t start, int n) {
    std::int64_t phys[kRows];
    physical_rows(p_, b, rows, start, n, phys);
    for (int j = 0; j < n; ++j) {
      if (p_.kv_dtype == KvDtype::fp32) {
        row_[j] = static_cast<const float*>(p_.kv) + phys[j] * width_;
      } else {
        float* dst = rows_buf_.data() + static_cast<std::size_t>(j) * width_;
        S::widen_bf16_row(static_cast<const bf16_t*>(p_.kv) + phys[j] * width_, dst, width_);
        row_[j] = dst;
      }
    }
    for (int j = n; j < kRows; ++j) row_[j] = zero_row_.data();
  }

  // The next tile's rows, which the passes prefetch a few lines at a time (tile_prefetch.h).
  void next_tile(int b, const RowSet& rows, std::int64_t start, std::int64_t last) {
    const int n = static_cast<int>(std::clamp<std::int64_t>(last - start, 0, kRows));
    std::int64_t phys[kRows];
    physical_rows(p_, b, rows, start, n, phys);
    prefetch_.restart(p_.kv, phys, n);
  }

  // With up to 32 heads a tile takes about as long to read as to compute, and the score pass
  // takes its share of the prefetching (its share of the FMAs), a few lines per cache line of
  // its rows: with the value pass alone asking, its first head blocks stall on full line-fill
  // buffers and the memory idles during the scores. With more heads the reads hide behind the
  // value pass alone, and prefetching in the score micro-kernel only adds work there.
  bool prefetch_in_scores() const { return lanes_ <= 32; }
  double score_share() const {
    return prefetch_in_scores() ? static_cast<double>(width_) / (width_ + dc_) : 0.0;
  }

  // ---- scores: S[j][h] for j < n (rounded up to the row block) -------------------------------
  void scores(int n) {
    const int vecs = lanes_ / V;
    int v0 = 0;
    // Register blocks (accumulators RB x HB, plus HB query vectors and one broadcast) sized for
    // 32 vector registers with AVX-512 and 16 with AVX2.
    if constexpr (V == 16) {
      for (; v0 + 4 <= vecs; v0 += 4) score_rows<6, 4>(v0, n);
      if (vecs - v0 == 3) score_rows<8, 3>(v0, n);
      if (vecs - v0 == 2) score_rows<6, 2, 12>(v0, n);
      if (vecs - v0 == 1) score_rows<8, 1, 16>(v0, n);
    } else {
      for (; v0 + 2 <= vecs; v0 += 2) score_rows<6, 2>(v0, n);
      if (vecs - v0 == 1) score_rows<8, 1>(v0, n);
    }
    if (p_.softcap > 0) {
      for (int j = 0; j < n; ++j) {
        float* s = s_.data() + static_cast<std::size_t>(j) * lanes_;
        for (int h = 0; h < heads_; ++h) s[h] = p_.softcap * std::tanh(s[h] / p_.softcap);
      }
    }
  }

  // Blocks of RB rows through row pointers. With kWideRows, blocks of kWideRows rows instead where
  // the width is kMlaWidth (known at compile time: each row at a constant displacement from one
  // base pointer, where other widths need a pointer per row in the general registers) and the
  // block's rows lie one after another (a block that crosses a page, or holds the padding of the
  // last tile, still takes RB at a time). One head vector has only 8 accumulators per 8 rows, just
  // enough to cover the FMA latency, and 12 row pointers spill the general registers; from one
  // base pointer 16 rows (one head vector) or 12 rows (two) fit, and run faster.
  template <int RB, int HB, int kWideRows = 0>
  void score_rows(int v0, int n) {
    static_assert(kRows % RB == 0 && (kWideRows == 0 || kRows % kWideRows == 0));
    static_assert(kWideRows % RB == 0);
    // Every block prefetches when there are at most 32 heads; `lines` is per RB rows.
    const bool prefetch = HB <= 2 && prefetch_in_scores();
    const int lines =
        prefetch ? prefetch_.lines_per_step(score_share(), (n + RB - 1) / RB * lines_per_row()) : 0;
    int j0 = 0;
    if constexpr (kWideRows > 0) {
      if (width_ == kMlaWidth) {
        for (; j0 < n; j0 += kWideRows) {
          if (!contiguous(j0, kWideRows)) {
            for (int j = j0; j < j0 + kWideRows; j += RB) score_block<RB, HB>(j, v0, lines);
          } else if (prefetch) {
            score_block<kWideRows, HB, true, kMlaWidth>(j0, v0, lines * (kWideRows / RB));
          } else {
            score_block<kWideRows, HB, false, kMlaWidth>(j0, v0, 0);
          }
        }
        return;
      }
    }
    for (; j0 < n; j0 += RB) score_block<RB, HB>(j0, v0, lines);
  }

  // Whether rows j0 .. j0 + count - 1 of the tile lie one after another in memory.
  bool contiguous(int j0, int count) const {
    for (int r = 1; r < count; ++r) {
      if (row_[j0 + r] != row_[j0] + static_cast<std::ptrdiff_t>(r) * width_) return false;
    }
    return true;
  }

  template <int RB, int HB>
  void score_block(int j0, int v0, int prefetch_lines) {
    if (prefetch_lines > 0) {
      score_block<RB, HB, true, 0>(j0, v0, prefetch_lines);
    } else {
      score_block<RB, HB, false, 0>(j0, v0, 0);
    }
  }

  // The micro-kernels (score_block, value_block) are out of line on purpose: inlined into the
  // task loop, GCC spills their accumulators.
  static constexpr int kLineFloats = 16;  // a cache line of the rows the score pass reads
  int lines_per_row() const { return (width_ + kLineFloats - 1) / kLineFloats; }

  // With kPrefetch, `prefetch_lines` lines of the next tile after each cache line of the rows.
  // kWidth = 0: row j0 + r at row_[j0 + r]; else at row_[j0] + r * kWidth (contiguous rows).
  template <int RB, int HB, bool kPrefetch, int kWidth>
  __attribute__((noinline)) void score_block(int j0, int v0, int prefetch_lines) {
    vec acc[RB][HB];
    for (int r = 0; r < RB; ++r) {
      for (int i = 0; i < HB; ++i) acc[r][i] = S::splat(0.0f);
    }
    const float* k[RB];
    for (int r = 0; r < RB; ++r) k[r] = kWidth > 0 ? row_[j0] : row_[j0 + r];
    const int width = kWidth > 0 ? kWidth : width_;
    const float* qt = qt_.data() + static_cast<std::size_t>(v0) * V;
    for (int d0 = 0; d0 < width; d0 += kPrefetch ? kLineFloats : width) {
      if constexpr (kPrefetch) prefetch_.lines(prefetch_lines);
      const int d1 = kPrefetch ? std::min(d0 + kLineFloats, width) : width;
      // GCC bumps each row pointer separately (RB adds per step): unrolled by four, those adds
      // are spread over four steps of FMAs (eight gains nothing more).
#pragma GCC unroll 4
      for (int d = d0; d < d1; ++d, qt += lanes_) {
        vec qv[HB];
        for (int i = 0; i < HB; ++i) qv[i] = S::load(qt + i * V);
        for (int r = 0; r < RB; ++r) {
          const vec kb = S::splat(k[r][kWidth * r + d]);
          for (int i = 0; i < HB; ++i) acc[r][i] += kb * qv[i];
        }
      }
    }
    for (int r = 0; r < RB; ++r) {
      float* s = s_.data() + static_cast<std::size_t>(j0 + r) * lanes_ + v0 * V;
      for (int i = 0; i < HB; ++i) S::store(s + i * V, acc[r][i]);
    }
  }

  // ---- online softmax, elementwise over head vectors ------------------------------------------
  // After it: s_[j] holds P[j] = exp(S[j] - m_new) for j < n; corr_ = exp(m_old - m_new), which
  // the value pass applies to O as it loads it (the state's rule for -inf: simd_state.h).
  void softmax(int n) {
    for (int v = 0; v < lanes_; v += V) {
      const vec m_old = S::load(m_.data() + v);
      const vec m_new = state_max<S>(m_old, s_.data() + v, n, lanes_);
      const vec c = state_rescale<S>(m_old, m_new);
      const vec base = state_base<S>(m_new);
      vec sum = S::splat(0.0f);
      for (int j = 0; j < n; ++j) {
        float* s = s_.data() + static_cast<std::size_t>(j) * lanes_ + v;
        const vec e = S::exp(S::load(s) - base);
        S::store(s, e);
        sum += e;
      }
      S::store(m_.data() + v, m_new);
      S::store(l_.data() + v, S::load(l_.data() + v) * c + sum);
      S::store(corr_.data() + v, c);
    }
  }

  // ---- values: O[h][d] = O[h][d] * corr[h] + sum_j P[j][h] V[j][d] -----------------------------
  // Here the columns are in the lanes and the probabilities are broadcast: a block of HB heads x
  // 4 vectors of columns needs 4 loads and HB broadcasts per row, whatever the head count (heads
  // in lanes would leave 16 heads a single vector, one load per FMA).
  static constexpr int kValueHeads = V == 16 ? 6 : 2;

  void values(int n) {
    // The rest of the next tile, a few lines per row of the 4-vector column blocks: of every
    // head block when the score pass prefetches too (the requests then spread over the whole
    // tile), else of the first head block only (with 64 and more heads, asking in every block
    // only adds requests the hardware already makes).
    const int blocks = prefetch_in_scores() ? (heads_ + kValueHeads - 1) / kValueHeads : 1;
    const int pf = prefetch_.lines_per_step(1 - score_share(), dc_ / (4 * V) * n * blocks);
    int d0 = 0;
    for (; d0 + 4 * V <= dc_; d0 += 4 * V) value_heads<4>(d0, n, pf);
    for (; d0 + V <= dc_; d0 += V) value_heads<1>(d0, n, 0);
    for (; d0 < dc_; ++d0) value_scalar(d0, n);  // a width that is not a multiple of V
  }

  template <int DV>
  void value_heads(int d0, int n, int prefetch_lines) {
    int h0 = 0;
    const int later = prefetch_in_scores() ? prefetch_lines : 0;  // blocks after the first
    for (; h0 + kValueHeads <= heads_; h0 += kValueHeads, prefetch_lines = later)
      value_block<kValueHeads, DV>(h0, d0, n, prefetch_lines);
    if (h0 < heads_) value_remainder<DV>(heads_ - h0, h0, d0, n, prefetch_lines);
  }

  // The last `left` (< kValueHeads) heads, as one block of a compile-time size.
  template <int DV, int HB = kValueHeads - 1>
  void value_remainder(int left, int h0, int d0, int n, int prefetch_lines) {
    if constexpr (HB >= 1) {
      if (left == HB) {
        value_block<HB, DV>(h0, d0, n, prefetch_lines);
      } else {
        value_remainder<DV, HB - 1>(left, h0, d0, n, prefetch_lines);
      }
    }
  }

  template <int HB, int DV>
  __attribute__((noinline)) void value_block(int h0, int d0, int n, int prefetch_lines) {
    vec acc[HB][DV];
    for (int i = 0; i < HB; ++i) {
      const vec c = S::splat(corr_[h0 + i]);
      const float* o = acc_.data() + static_cast<std::size_t>(h0 + i) * dc_ + d0;
      for (int k = 0; k < DV; ++k) acc[i][k] = S::load(o + k * V) * c;
    }
    const float* pj = s_.data() + h0;
    for (int j = 0; j < n; ++j, pj += lanes_) {
      prefetch_.lines(prefetch_lines);
      const float* vrow = row_[j] + d0;
      vec vv[DV];
      for (int k = 0; k < DV; ++k) vv[k] = S::load(vrow + k * V);
      for (int i = 0; i < HB; ++i) {
        const vec pb = S::splat(pj[i]);
        for (int k = 0; k < DV; ++k) acc[i][k] += pb * vv[k];
      }
    }
    for (int i = 0; i < HB; ++i) {
      float* o = acc_.data() + static_cast<std::size_t>(h0 + i) * dc_ + d0;
      for (int k = 0; k < DV; ++k) S::store(o + k * V, acc[i][k]);
    }
  }

  void value_scalar(int d, int n) {
    for (int h = 0; h < heads_; ++h) {
      float a = acc_[static_cast<std::size_t>(h) * dc_ + d] * corr_[h];
      for (int j = 0; j < n; ++j) a += s_[static_cast<std::size_t>(j) * lanes_ + h] * row_[j][d];
      acc_[static_cast<std::size_t>(h) * dc_ + d] = a;
    }
  }

  const MlaAttentionParams& p_;
  int heads_ = 0, lanes_ = 0;  // query vectors of the current task (size_for), and padded to V
  int dc_, width_;
  std::int64_t tokens_ = num_query_tokens(p_);  // T, for query_lane
  LineVector<float> qt_;                        // [width, lanes] scaled queries, transposed
  LineVector<float> s_;                         // [kRows, lanes] scores, then probabilities
  LineVector<float> acc_;                       // [heads, dc] unnormalised output
  LineVector<float> m_, l_, corr_;  // [lanes] running max, denominator, this tile's rescale
  LineVector<float> rows_buf_;      // [kRows, width] widened bf16 rows
  LineVector<float> zero_row_;      // [width]
  TilePrefetch<kRows> prefetch_;    // the next tile's rows
  const float* row_[kRows] = {};
};

}  // namespace
}  // namespace dcp::kernels
