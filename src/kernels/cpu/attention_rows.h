// The row-wise SIMD kernel for a few query heads (decode without a large query gather). With
// 1-4 heads the operation is bandwidth-bound: each KV row is read once, every head takes a SIMD
// dot product with it while it sits in L1, then an online softmax per head and
// O[h] += P[h][j] V[j] register-blocked over heads x 4 vectors. bf16 rows are widened once per
// tile. Many heads use attention_lanes.h instead.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "attention_tasks.h"
#include "dcp/attention.h"
#include "dcp/layout.h"
#include "dcp/merge.h"
#include "simd.h"

namespace dcp::kernels {
namespace {

template <int V>
class RowKernel {
 public:
  static constexpr int kRows = 2 * V;  // rows per tile: two vectors
  static constexpr int kValueHeads =
      V == 16 ? 6 : 2;  // heads per value block (4 accumulators each)

  explicit RowKernel(const MlaAttentionParams& p)
      : p_(p),
        heads_(p.num_heads),
        dc_(p.kv_lora_rank),
        width_(p.kv_lora_rank + p.rope_dim),
        rows_buf_(static_cast<std::size_t>(kRows) * width_),
        scores_(static_cast<std::size_t>(heads_) * kRows),
        acc_(static_cast<std::size_t>(heads_) * dc_),
        m_(heads_),
        l_(heads_) {}

  void run(const Task& task) {
    std::fill(acc_.begin(), acc_.end(), 0.0f);
    std::fill(m_.begin(), m_.end(), kNegInf);
    std::fill(l_.begin(), l_.end(), 0.0f);
    const float* q = p_.q + task.t * heads_ * width_;
    for (std::int64_t start = task.first; start < task.last; start += kRows) {
      const int n = static_cast<int>(std::min<std::int64_t>(kRows, task.last - start));
      load_tile(task.b, task.rows, start, n);
      scores(q, n);
      softmax_and_values(n);
    }
    write_task_state(p_, task, acc_.data(), dc_, m_.data(), l_.data());
  }

 private:
  using S = Simd<V>;
  using vec = typename S::vec;

  const float* row_ptr(int b, std::int64_t local_row, int j) {
    const std::int64_t phys = physical_row(p_, b, local_row);
    if (p_.kv_dtype == KvDtype::fp32) return static_cast<const float*>(p_.kv) + phys * width_;
    float* dst = rows_buf_.data() + static_cast<std::size_t>(j) * width_;
    S::widen_bf16_row(static_cast<const bf16_t*>(p_.kv) + phys * width_, dst, width_);
    return dst;
  }

  void load_tile(int b, const RowSet& rows, std::int64_t start, int n) {
    for (int j = 0; j < n; ++j) row_[j] = row_ptr(b, rows.at(start + j), j);
  }

  // scores_[h][j] = (q_h . k_j) * scale, then softcap; -inf past n. Row-outer so each row stays
  // in L1 while two heads at a time read it.
  void scores(const float* q, int n) {
    for (int j = 0; j < n; ++j) {
      const float* k = row_[j];
      int h = 0;
      for (; h + 2 <= heads_; h += 2) {
        const float* q0 = q + static_cast<std::size_t>(h) * width_;
        const float* q1 = q0 + width_;
        vec a0 = S::splat(0.0f), a1 = S::splat(0.0f), b0 = S::splat(0.0f), b1 = S::splat(0.0f);
        int d = 0;
        for (; d + 2 * V <= width_; d += 2 * V) {
          const vec k0 = S::load(k + d), k1 = S::load(k + d + V);
          a0 += S::load(q0 + d) * k0;
          a1 += S::load(q0 + d + V) * k1;
          b0 += S::load(q1 + d) * k0;
          b1 += S::load(q1 + d + V) * k1;
        }
        float x = S::sum(a0 + a1), y = S::sum(b0 + b1);
        for (; d < width_; ++d) {
          x += q0[d] * k[d];
          y += q1[d] * k[d];
        }
        scores_[static_cast<std::size_t>(h) * kRows + j] = x;
        scores_[static_cast<std::size_t>(h + 1) * kRows + j] = y;
      }
      if (h < heads_) {
        const float* q0 = q + static_cast<std::size_t>(h) * width_;
        vec a0 = S::splat(0.0f), a1 = S::splat(0.0f);
        int d = 0;
        for (; d + 2 * V <= width_; d += 2 * V) {
          a0 += S::load(q0 + d) * S::load(k + d);
          a1 += S::load(q0 + d + V) * S::load(k + d + V);
        }
        float x = S::sum(a0 + a1);
        for (; d < width_; ++d) x += q0[d] * k[d];
        scores_[static_cast<std::size_t>(h) * kRows + j] = x;
      }
    }
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

  void softmax_and_values(int n) {
    // Online softmax: new running max per head, rescale, probabilities in scores_.
    for (int h = 0; h < heads_; ++h) {
      float* s = scores_.data() + static_cast<std::size_t>(h) * kRows;
      const vec s0 = S::load(s), s1 = S::load(s + V);
      const float tile_max = S::max(s0 > s1 ? s0 : s1);  // rows past n hold -inf
      const float m_new = std::max(m_[h], tile_max);
      if (m_[h] != kNegInf && m_[h] != m_new) {
        const float c = std::exp(m_[h] - m_new);
        l_[h] *= c;
        float* o = acc_.data() + static_cast<std::size_t>(h) * dc_;
        const vec cv = S::splat(c);
        int d = 0;
        for (; d + V <= dc_; d += V) S::store(o + d, S::load(o + d) * cv);
        for (; d < dc_; ++d) o[d] *= c;
      }
      m_[h] = m_new;
      const vec e0 = S::exp(s0 - m_new), e1 = S::exp(s1 - m_new);
      S::store(s, e0);
      S::store(s + V, e1);
      for (int j = n; j < kRows; ++j) s[j] = 0.0f;  // rows past n: exactly nothing
      l_[h] += n == kRows ? S::sum(e0 + e1) : std::accumulate(s, s + n, 0.0f);
    }
    // O[h][d] += sum_j P[h][j] V[j][d], 4 heads x 4 vectors at a time.
    constexpr int kDB = 4 * V;
    int d0 = 0;
    for (; d0 + kDB <= dc_; d0 += kDB) {
      int h0 = 0;
      for (; h0 + kValueHeads <= heads_; h0 += kValueHeads) value_block<kValueHeads>(h0, d0, n);
      for (; h0 + 2 <= heads_; h0 += 2) value_block<2>(h0, d0, n);
      for (; h0 < heads_; ++h0) value_block<1>(h0, d0, n);
    }
    for (; d0 < dc_; ++d0) {  // a width that is not a multiple of 4 vectors
      for (int h = 0; h < heads_; ++h) {
        float a = 0;
        for (int j = 0; j < n; ++j)
          a += scores_[static_cast<std::size_t>(h) * kRows + j] * row_[j][d0];
        acc_[static_cast<std::size_t>(h) * dc_ + d0] += a;
      }
    }
  }

  template <int HB>
  void value_block(int h0, int d0, int n) {
    vec a[HB][4];
    for (int i = 0; i < HB; ++i) {
      for (int k = 0; k < 4; ++k)
        a[i][k] = S::load(acc_.data() + static_cast<std::size_t>(h0 + i) * dc_ + d0 + k * V);
    }
    for (int j = 0; j < n; ++j) {
      const float* v = row_[j] + d0;
      const vec v0 = S::load(v), v1 = S::load(v + V), v2 = S::load(v + 2 * V),
                v3 = S::load(v + 3 * V);
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
  std::vector<float> rows_buf_;  // [kRows, width] widened bf16 rows
  const float* row_[kRows] = {};
  std::vector<float> scores_;  // [heads, kRows]
  std::vector<float> acc_;     // [heads, dc]
  std::vector<float> m_, l_;   // [heads]
};

}  // namespace
}  // namespace dcp::kernels
