// The row-wise SIMD kernel for a few query heads (decode without a large query gather). With
// 1-4 heads the operation is bandwidth-bound: each KV row is read once, every head takes a SIMD
// dot product with it while it sits in L1, then an online softmax per head and
// O[h] += P[h][j] V[j] register-blocked over heads x 4 vectors. bf16 rows are widened in
// registers as they are used (RowElements): a row is never copied. Many heads use
// attention_lanes.h instead.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "attention_tasks.h"
#include "dcp/attention.h"
#include "dcp/attention_state.h"
#include "dcp/layout.h"
#include "dcp/merge.h"
#include "line_vector.h"
#include "simd.h"
#include "tile_prefetch.h"

namespace dcp::kernels {
namespace {

// How the row kernel reads a KV row: 2V elements ("a chunk") at a time as two vectors.
//
// fp32: the chunk's two halves. bf16: one load of 2V words, split into the even elements
// (word << 16) and the odd ones (word & 0xffff0000), which costs one instruction per vector;
// widening in order costs a shuffle per vector, and writing widened rows to a buffer costs a
// store and a reload per element, which keeps bf16 reads far below the bandwidth. The order
// does not matter to a dot product or to an axpy as long as the query copy and the accumulators
// use the same one: `position` maps element d of a row to its place in them.
template <int V, typename Kv>
struct RowElements;

template <int V>
struct RowElements<V, float> {
  using vec = typename Simd<V>::vec;
  static void load_chunk(const float* row, int d, vec& a, vec& b) {
    a = Simd<V>::load(row + d);
    b = Simd<V>::load(row + d + V);
  }
  static vec load_vector(const float* row, int d) { return Simd<V>::load(row + d); }
  static float element(const float* row, int d) { return row[d]; }
  static constexpr bool kReorders = false;  // position(d) = d
  static int position(int d, int /*n*/) { return d; }
};

template <int V>
struct RowElements<V, bf16_t> {
  using vec = typename Simd<V>::vec;
  using uvec = typename Simd<V>::uvec;
  static void load_chunk(const bf16_t* row, int d, vec& even, vec& odd) {
    uvec words;
    std::memcpy(&words, row + d, sizeof words);
    const uvec e = words << 16, o = words & 0xffff0000u;
    std::memcpy(&even, &e, sizeof even);
    std::memcpy(&odd, &o, sizeof odd);
  }
  // V elements in order (past the last whole chunk, where position(d) = d).
  static vec load_vector(const bf16_t* row, int d) { return Simd<V>::widen_bf16(row + d); }
  static float element(const bf16_t* row, int d) { return bf16_to_float(row[d]); }
  static constexpr bool kReorders = true;
  // In each whole chunk of a row of n elements, evens first; a partial last chunk in order.
  static int position(int d, int n) {
    constexpr int kChunk = 2 * V;
    if (d >= n / kChunk * kChunk) return d;
    const int r = d % kChunk;
    return d - r + (r % 2) * V + r / 2;
  }
};

template <int V, typename Kv>
class RowKernel {
 public:
  static constexpr int kRows = 2 * V;  // rows per tile: two vectors
  // Score blocks of heads x rows, each with 2 accumulators: 4 x 2 or 2 x 4 fill AVX-512's 32
  // registers with the query and row chunks, 2 x 2 AVX2's 16. More heads per block means each
  // (bf16) row chunk is widened fewer times, more rows means fewer query loads.
  static constexpr int kScoreHeads = V == 16 ? 4 : 2;
  template <int HB>
  static constexpr int kScoreRows = HB == kScoreHeads ? 2 : (4 / HB) * (V / 8);
  static constexpr int kValueHeads =
      V == 16 ? 6 : 2;  // heads per value block (4 accumulators each)

  explicit RowKernel(const MlaAttentionParams& p)
      : p_(p),
        heads_(p.num_heads),
        dc_(p.kv_lora_rank),
        width_(p.kv_lora_rank + p.rope_dim),
        q_(static_cast<std::size_t>(heads_) * width_),
        unsplit_(static_cast<std::size_t>(dc_)),
        prefetch_(width_ * static_cast<int>(sizeof(Kv))),
        scores_(static_cast<std::size_t>(heads_) * kRows),
        acc_(static_cast<std::size_t>(heads_) * dc_),
        m_(heads_),
        l_(heads_) {}

  void run(const Task& task) {
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    std::fill(m_.begin(), m_.end(), kNegInf);
    std::fill(l_.begin(), l_.end(), 0.0f);
    // The token's query in the order the rows are read in.
    for (int h = 0; h < heads_; ++h) {
      const float* qh = query_head(p_, tokens_, task.t, h);
      for (int d = 0; d < width_; ++d)
        q_[static_cast<std::size_t>(h) * width_ + E::position(d, width_)] = qh[d];
    }
    for (std::int64_t start = task.first; start < task.last; start += kRows) {
      const int n = static_cast<int>(std::min<std::int64_t>(kRows, task.last - start));
      load_tile(task.b, task.rows, start, n);
      next_tile(task.b, task.rows, start + kRows, task.last);
      scores(q_.data(), n);
      softmax_and_values(n);
      prefetch_.rest();
    }
    if constexpr (E::kReorders) {  // accumulators back into row order
      for (int h = 0; h < heads_; ++h) {
        float* a = acc_.data() + static_cast<std::size_t>(h) * dc_;
        for (int d = 0; d < dc_; ++d) unsplit_[d] = a[E::position(d, dc_)];
        std::copy(unsplit_.begin(), unsplit_.end(), a);
      }
    }
    write_task_state(p_, task, acc_.data(), dc_, m_.data(), l_.data());
  }

 private:
  using S = Simd<V>;
  using E = RowElements<V, Kv>;
  using vec = typename S::vec;

  void load_tile(int b, const RowSet& rows, std::int64_t start, int n) {
    const auto* kv = static_cast<const Kv*>(p_.kv);
    std::int64_t phys[kRows];
    physical_rows(p_, b, rows, start, n, phys);
    for (int j = 0; j < n; ++j) row_[j] = kv + phys[j] * width_;
  }

  // The next tile's rows, which both passes prefetch a few lines at a time (tile_prefetch.h).
  // With 4 heads a row takes about as long to compute as to read; without prefetching the two
  // do not overlap and the call takes their sum.
  void next_tile(int b, const RowSet& rows, std::int64_t start, std::int64_t last) {
    const int n = static_cast<int>(std::clamp<std::int64_t>(last - start, 0, kRows));
    std::int64_t phys[kRows];
    physical_rows(p_, b, rows, start, n, phys);
    prefetch_.restart(p_.kv, phys, n);
  }

  // The share of a tile's prefetching done by the score pass. It asks between blocks of rows,
  // so its requests come in bursts, while the value pass asks a few lines per row: a quarter
  // beats its share of the FMAs (about half), and much less leaves the value pass too much.
  static constexpr double kScoreShare = 0.25;

  // scores_[h][j] = (q_h . k_j) * scale, then softcap; -inf past n. Blocks of rows, so each
  // row stays in L1 while every head reads it.
  void scores(const float* q, int n) {
    int h0 = 0;
    for (; h0 + kScoreHeads <= heads_; h0 += kScoreHeads) score_heads<kScoreHeads>(q, h0, n);
    if constexpr (kScoreHeads > 2) {
      if (h0 + 2 <= heads_) score_heads<2>(q, h0, n), h0 += 2;
    }
    if (h0 < heads_) score_heads<1>(q, h0, n);
    for (int h = 0; h < heads_; ++h) {
      float* s = scores_.data() + static_cast<std::size_t>(h) * kRows;
      for (int j = 0; j < n; ++j) {
        float v = s[j] * p_.softmax_scale;
        if (p_.softcap > 0) v = p_.softcap * std::tanh(v / p_.softcap);
        s[j] = v;
      }
      for (int j = n; j < kRows; ++j) s[j] = kNegInf;
    }
  }

  // Scores of HB heads from h0 against rows [0, n): blocks of rows, each row chunk loaded once
  // for the HB heads and each query chunk once for the block's rows. The first head block also
  // prefetches the score pass's share of the next tile, a few lines after each block.
  template <int HB>
  void score_heads(const float* q, int h0, int n) {
    constexpr int R = kScoreRows<HB>;
    const int pf = h0 == 0 ? prefetch_.lines_per_step(kScoreShare, n / R + n % R) : 0;
    int j0 = 0;
    for (; j0 + R <= n; j0 += R) {
      score_block<R, HB>(q, h0, j0);
      prefetch_.lines(pf);
    }
    for (; j0 < n; ++j0) {
      score_block<1, HB>(q, h0, j0);
      prefetch_.lines(pf);
    }
  }

  template <int R, int HB>
  void score_block(const float* q, int h0, int j0) {
    const float* qh[HB];
    for (int i = 0; i < HB; ++i) qh[i] = q + static_cast<std::size_t>(h0 + i) * width_;
    vec a[R][HB], b[R][HB];
    for (int r = 0; r < R; ++r) {
      for (int i = 0; i < HB; ++i) a[r][i] = b[r][i] = S::splat(0.0f);
    }
    int d = 0;
    // Unrolled by two: the loop's pointer and counter updates then cost half as much per FMA
    // (four gains nothing more).
#pragma GCC unroll 2
    for (; d + 2 * V <= width_; d += 2 * V) {
      vec q0[HB], q1[HB];
      for (int i = 0; i < HB; ++i) {
        q0[i] = S::load(qh[i] + d);
        q1[i] = S::load(qh[i] + d + V);
      }
      for (int r = 0; r < R; ++r) {
        vec k0, k1;
        E::load_chunk(row_[j0 + r], d, k0, k1);
        for (int i = 0; i < HB; ++i) {
          a[r][i] += q0[i] * k0;
          b[r][i] += q1[i] * k1;
        }
      }
    }
    if (d + V <= width_) {  // half a chunk left (the tiny preset's 80-wide rows: 64 + 16)
      vec qv[HB];
      for (int i = 0; i < HB; ++i) qv[i] = S::load(qh[i] + d);
      for (int r = 0; r < R; ++r) {
        const vec k = E::load_vector(row_[j0 + r], d);
        for (int i = 0; i < HB; ++i) a[r][i] += qv[i] * k;
      }
      d += V;
    }
    for (int r = 0; r < R; ++r) {
      for (int i = 0; i < HB; ++i) {
        float x = S::sum(a[r][i] + b[r][i]);
        for (int e = d; e < width_; ++e)  // past the last whole chunk the order is the row's
          x += qh[i][e] * E::element(row_[j0 + r], e);
        scores_[static_cast<std::size_t>(h0 + i) * kRows + j0 + r] = x;
      }
    }
  }

  void softmax_and_values(int n) {
    // Online softmax: new running max per head, rescale, probabilities in scores_.
    for (int h = 0; h < heads_; ++h) {
      float* s = scores_.data() + static_cast<std::size_t>(h) * kRows;
      const vec s0 = S::load(s), s1 = S::load(s + V);
      const float tile_max = S::max(s0 > s1 ? s0 : s1);  // rows past n hold -inf
      const float m_new = std::max(m_[h], tile_max);
      if (m_[h] != m_new) {
        const float c = attention_state::rescale(m_[h], m_new);
        l_[h] *= c;
        float* o = acc_.data() + static_cast<std::size_t>(h) * dc_;
        const vec cv = S::splat(c);
        int d = 0;
        for (; d + V <= dc_; d += V) S::store(o + d, S::load(o + d) * cv);
        for (; d < dc_; ++d) o[d] *= c;
      }
      m_[h] = m_new;
      const float base = attention_state::base(m_new);
      const vec e0 = S::exp(s0 - base), e1 = S::exp(s1 - base);
      S::store(s, e0);
      S::store(s + V, e1);
      for (int j = n; j < kRows; ++j) s[j] = 0.0f;  // rows past n: exactly nothing
      l_[h] += n == kRows ? S::sum(e0 + e1) : std::accumulate(s, s + n, 0.0f);
    }
    // O[h][d] += sum_j P[h][j] V[j][d], 4 heads x 4 vectors at a time.
    constexpr int kDB = 4 * V;
    // The first head block of each column block prefetches the rest of the next tile, a few
    // lines per row.
    const int pf = prefetch_.lines_per_step(1 - kScoreShare, dc_ / kDB * n);
    int d0 = 0;
    for (; d0 + kDB <= dc_; d0 += kDB) {
      int h0 = 0, first = pf;
      for (; h0 + kValueHeads <= heads_; h0 += kValueHeads, first = 0)
        value_block<kValueHeads>(h0, d0, n, first);
      if constexpr (kValueHeads > 4) {
        if (h0 + 4 <= heads_) value_block<4>(h0, d0, n, first), h0 += 4, first = 0;
      }
      for (; h0 + 2 <= heads_; h0 += 2, first = 0) value_block<2>(h0, d0, n, first);
      for (; h0 < heads_; ++h0, first = 0) value_block<1>(h0, d0, n, first);
    }
    for (; d0 < dc_; ++d0) {  // a width that is not a multiple of 4 vectors
      for (int h = 0; h < heads_; ++h) {
        float a = 0;
        for (int j = 0; j < n; ++j)
          a += scores_[static_cast<std::size_t>(h) * kRows + j] * E::element(row_[j], d0);
        acc_[static_cast<std::size_t>(h) * dc_ + E::position(d0, dc_)] += a;
      }
    }
  }

  template <int HB>
  void value_block(int h0, int d0, int n, int prefetch_lines) {
    vec a[HB][4];
    for (int i = 0; i < HB; ++i) {
      for (int k = 0; k < 4; ++k)
        a[i][k] = S::load(acc_.data() + static_cast<std::size_t>(h0 + i) * dc_ + d0 + k * V);
    }
    for (int j = 0; j < n; ++j) {
      prefetch_.lines(prefetch_lines);
      vec v0, v1, v2, v3;
      E::load_chunk(row_[j], d0, v0, v1);
      E::load_chunk(row_[j], d0 + 2 * V, v2, v3);
      for (int i = 0; i < HB; ++i) {
        const vec pv = S::splat(scores_[static_cast<std::size_t>(h0 + i) * kRows + j]);
        a[i][0] += pv * v0;
        a[i][1] += pv * v1;
        a[i][2] += pv * v2;
        a[i][3] += pv * v3;
      }
    }
    for (int i = 0; i < HB; ++i) {
      for (int k = 0; k < 4; ++k)
        S::store(acc_.data() + static_cast<std::size_t>(h0 + i) * dc_ + d0 + k * V, a[i][k]);
    }
  }

  const MlaAttentionParams& p_;
  int heads_, dc_, width_;
  std::int64_t tokens_ = num_query_tokens(p_);  // T, for query_head
  LineVector<float> q_;           // [heads, width] the token's query, in E::position order
  LineVector<float> unsplit_;     // [dc] one head's accumulators back in row order
  TilePrefetch<kRows> prefetch_;  // the next tile's rows
  const Kv* row_[kRows] = {};
  LineVector<float> scores_;  // [heads, kRows]
  LineVector<float> acc_;     // [heads, dc] in E::position order
  LineVector<float> m_, l_;   // [heads]
};

}  // namespace
}  // namespace dcp::kernels
