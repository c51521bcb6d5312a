// The tiled SIMD kernel for local MLA attention, written once over a vector width and compiled
// per instruction set (attention_avx512.cpp, attention_avx2.cpp). Everything here has internal
// linkage so each instruction set keeps its own copy.
//
// Per query token: visible rows in tiles of kRows; the tile is transposed to Kt[d][rows] so that
// scores for a block of heads are broadcast-q FMAs over a vector of rows (no horizontal sums;
// each K element is loaded once per head block); an online softmax per head; then
// O[h] += P[h][j] V[j] register-blocked over 4 heads x 4 vectors. bf16 rows are widened once
// per tile, which every head reuses.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "attention_tasks.h"
#include "dcp/attention.h"
#include "dcp/layout.h"
#include "dcp/merge.h"

namespace dcp::kernels {
namespace {

// GCC vector extensions; a vector_size cannot depend on a template argument, so each width is
// spelled out.
template <int V>
struct Simd;

#define DCP_DEFINE_SIMD(WIDTH)                                              \
  template <>                                                               \
  struct Simd<WIDTH> {                                                      \
    typedef float vec __attribute__((vector_size(WIDTH * 4)));              \
    static vec load(const float* p) {                                       \
      vec v;                                                                \
      std::memcpy(&v, p, sizeof v);                                         \
      return v;                                                             \
    }                                                                       \
    static void store(float* p, vec v) { std::memcpy(p, &v, sizeof v); }    \
    static vec splat(float x) { return vec{} + x; }                         \
  };
#if defined(__AVX2__)
DCP_DEFINE_SIMD(8)
#endif
#if defined(__AVX512F__)
DCP_DEFINE_SIMD(16)
#endif
#undef DCP_DEFINE_SIMD

template <int V>
class TiledKernel {
 public:
  static constexpr int kRows = 2 * V;  // rows per tile: two vectors
  static constexpr int kHeadBlock = 6; // heads per score block (12 accumulators)

  explicit TiledKernel(const MlaAttentionParams& p)
      : p_(p), heads_(p.num_heads), dc_(p.kv_lora_rank), width_(p.kv_lora_rank + p.rope_dim),
        kt_(static_cast<std::size_t>(width_) * kRows), rows_buf_(static_cast<std::size_t>(kRows) * width_),
        scores_(static_cast<std::size_t>(heads_) * kRows), acc_(static_cast<std::size_t>(heads_) * dc_),
        m_(heads_), l_(heads_) {}

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
    finish(task.out, task.lse, task.add_sinks);
  }

 private:
  using S = Simd<V>;
  using vec = typename S::vec;

  const float* row_ptr(int b, std::int64_t local_row, int j) {
    const std::int64_t page = p_.page_table[b * static_cast<std::int64_t>(p_.page_table_stride) + local_row / p_.page_size];
    const std::int64_t phys = page * p_.page_size + local_row % p_.page_size;
    if (p_.kv_dtype == KvDtype::fp32) return static_cast<const float*>(p_.kv) + phys * width_;
    const bf16_t* src = static_cast<const bf16_t*>(p_.kv) + phys * width_;
    float* dst = rows_buf_.data() + static_cast<std::size_t>(j) * width_;
    for (int d = 0; d < width_; ++d) dst[d] = bf16_to_float(src[d]);
    return dst;
  }

  void load_tile(int b, const RowSet& rows, std::int64_t start, int n) {
    for (int j = 0; j < n; ++j) row_[j] = row_ptr(b, rows.at(start + j), j);
    // Transpose into Kt[d][kRows]; rows past n are zero (their scores are masked anyway).
    for (int d = 0; d < width_; ++d) {
      float* dst = kt_.data() + static_cast<std::size_t>(d) * kRows;
      for (int j = 0; j < n; ++j) dst[j] = row_[j][d];
      for (int j = n; j < kRows; ++j) dst[j] = 0.0f;
    }
  }

  // scores_[h][j] = (q_h . k_j) * scale, then softcap; -inf past n.
  void scores(const float* q, int n) {
    for (int h0 = 0; h0 < heads_; h0 += kHeadBlock) {
      const int hb = std::min(kHeadBlock, heads_ - h0);
      vec a0[kHeadBlock], a1[kHeadBlock];
      for (int i = 0; i < kHeadBlock; ++i) a0[i] = a1[i] = S::splat(0.0f);
      const float* qh = q + static_cast<std::size_t>(h0) * width_;
      for (int d = 0; d < width_; ++d) {
        const vec k0 = S::load(kt_.data() + static_cast<std::size_t>(d) * kRows);
        const vec k1 = S::load(kt_.data() + static_cast<std::size_t>(d) * kRows + V);
        for (int i = 0; i < hb; ++i) {
          const vec qv = S::splat(qh[static_cast<std::size_t>(i) * width_ + d]);
          a0[i] += qv * k0;
          a1[i] += qv * k1;
        }
      }
      for (int i = 0; i < hb; ++i) {
        float* s = scores_.data() + static_cast<std::size_t>(h0 + i) * kRows;
        S::store(s, a0[i] * S::splat(p_.softmax_scale));
        S::store(s + V, a1[i] * S::splat(p_.softmax_scale));
        if (p_.softcap > 0) {
          for (int j = 0; j < n; ++j) s[j] = p_.softcap * std::tanh(s[j] / p_.softcap);
        }
        for (int j = n; j < kRows; ++j) s[j] = kNegInf;
      }
    }
  }

  void softmax_and_values(int n) {
    // Online softmax: new running max per head, rescale, probabilities in scores_.
    for (int h = 0; h < heads_; ++h) {
      float* s = scores_.data() + static_cast<std::size_t>(h) * kRows;
      float tile_max = kNegInf;
      for (int j = 0; j < n; ++j) tile_max = std::max(tile_max, s[j]);
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
      float sum = 0;
      for (int j = 0; j < n; ++j) {
        s[j] = std::exp(s[j] - m_new);
        sum += s[j];
      }
      l_[h] += sum;
    }
    // O[h][d] += sum_j P[h][j] V[j][d], 4 heads x 4 vectors at a time.
    constexpr int kHB = 4, kDB = 4 * V;
    int d0 = 0;
    for (; d0 + kDB <= dc_; d0 += kDB) {
      int h0 = 0;
      for (; h0 + kHB <= heads_; h0 += kHB) value_block<kHB>(h0, d0, n);
      for (; h0 < heads_; ++h0) value_block<1>(h0, d0, n);
    }
    for (; d0 < dc_; ++d0) {  // a width that is not a multiple of 4 vectors
      for (int h = 0; h < heads_; ++h) {
        float a = 0;
        for (int j = 0; j < n; ++j) a += scores_[static_cast<std::size_t>(h) * kRows + j] * row_[j][d0];
        acc_[static_cast<std::size_t>(h) * dc_ + d0] += a;
      }
    }
  }

  template <int HB>
  void value_block(int h0, int d0, int n) {
    vec a[HB][4];
    for (int i = 0; i < HB; ++i) {
      for (int k = 0; k < 4; ++k) a[i][k] = S::load(acc_.data() + static_cast<std::size_t>(h0 + i) * dc_ + d0 + k * V);
    }
    for (int j = 0; j < n; ++j) {
      const float* v = row_[j] + d0;
      const vec v0 = S::load(v), v1 = S::load(v + V), v2 = S::load(v + 2 * V), v3 = S::load(v + 3 * V);
      for (int i = 0; i < HB; ++i) {
        const vec pv = S::splat(scores_[static_cast<std::size_t>(h0 + i) * kRows + j]);
        a[i][0] += pv * v0;
        a[i][1] += pv * v1;
        a[i][2] += pv * v2;
        a[i][3] += pv * v3;
      }
    }
    for (int i = 0; i < HB; ++i) {
      for (int k = 0; k < 4; ++k) S::store(acc_.data() + static_cast<std::size_t>(h0 + i) * dc_ + d0 + k * V, a[i][k]);
    }
  }

  void finish(float* out, float* lse, bool add_sinks) {
    for (int h = 0; h < heads_; ++h) {
      float* acc = acc_.data() + static_cast<std::size_t>(h) * dc_;
      if (add_sinks && p_.sinks && p_.sinks[h] != kNegInf) {  // one extra logit with no value
        const float s = p_.sinks[h];
        const float m_new = std::max(m_[h], s);
        if (m_[h] != kNegInf) {
          const float c = std::exp(m_[h] - m_new);
          l_[h] *= c;
          for (int d = 0; d < dc_; ++d) acc[d] *= c;
        }
        l_[h] += std::exp(s - m_new);
        m_[h] = m_new;
      }
      float* o = out + static_cast<std::size_t>(h) * dc_;
      if (l_[h] == 0.0f) {
        std::fill(o, o + dc_, 0.0f);
        lse[h] = kNegInf;
        continue;
      }
      const float inv = 1.0f / l_[h];
      for (int d = 0; d < dc_; ++d) o[d] = acc[d] * inv;
      lse[h] = m_[h] + std::log(l_[h]);
    }
  }

  const MlaAttentionParams& p_;
  int heads_, dc_, width_;
  std::vector<float> kt_;        // [width, kRows]
  std::vector<float> rows_buf_;  // [kRows, width] widened bf16 rows
  const float* row_[kRows] = {};
  std::vector<float> scores_;    // [heads, kRows]
  std::vector<float> acc_;       // [heads, dc]
  std::vector<float> m_, l_;     // [heads]
};

}  // namespace
}  // namespace dcp::kernels
