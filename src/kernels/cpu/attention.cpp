// Portable CPU implementation of local absorbed-MLA attention: tiles of KV rows, scores for
// every head of a query token against the tile, an online softmax per head. Faster SIMD paths
// are selected at run time on top of this one (see the performance issue); this file is the
// baseline every fast path is checked against, alongside the float64 reference.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dcp/attention.h"
#include "dcp/error.h"
#include "dcp/layout.h"
#include "dcp/merge.h"

namespace dcp {

std::int64_t num_query_tokens(const MlaAttentionParams& p) {
  return p.num_requests > 0 ? p.q_start[p.num_requests] : 0;
}

void validate(const MlaAttentionParams& p) {
  DCP_ARG_CHECK(p.num_heads >= 1, "num_heads = ", p.num_heads, " must be >= 1");
  DCP_ARG_CHECK(p.kv_lora_rank >= 1, "kv_lora_rank = ", p.kv_lora_rank, " must be >= 1");
  DCP_ARG_CHECK(p.rope_dim >= 0, "rope_dim = ", p.rope_dim, " must be >= 0");
  DCP_ARG_CHECK(std::isfinite(p.softmax_scale) && p.softmax_scale > 0, "softmax_scale = ",
                p.softmax_scale, " must be finite and > 0");
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
  DCP_ARG_CHECK(p.topk_k == 0 || p.topk != nullptr, "topk must not be null when topk_k = ",
                p.topk_k);
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
      const std::int32_t page = p.page_table[b * static_cast<std::int64_t>(p.page_table_stride) + j];
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

// Per-call scratch, sized once.
struct Workspace {
  std::vector<std::int64_t> rows;      // visible local rows of the current token
  std::vector<float> tile;             // [kTileRows, width] bf16 rows converted to fp32
  std::vector<const float*> row_ptr;   // [kTileRows]
  std::vector<float> scores;           // [Hq, kTileRows]
  std::vector<float> acc;              // [Hq, D_c]
  std::vector<float> m, l;             // [Hq] running max and sum
};

// Visible local rows of one query token, in increasing order of position.
void collect_visible_rows(const MlaAttentionParams& p, int b, std::int64_t t, Workspace& ws) {
  ws.rows.clear();
  const std::int64_t len = p.local_len[b];
  const std::int64_t qpos = p.q_pos[t];
  const auto visible = [&](std::int64_t pos) {
    if (p.causal && pos > qpos) return false;
    if (p.window > 0 && qpos - pos >= p.window) return false;
    return true;
  };
  if (p.topk_k > 0) {
    for (int i = 0; i < p.topk_k; ++i) {
      const std::int64_t pos = p.topk[t * p.topk_k + i];
      if (pos < 0 || layout::owner(pos, p.dcp_size, p.interleave) != p.dcp_rank) continue;
      if (visible(pos)) ws.rows.push_back(layout::row(pos, p.dcp_size, p.interleave));
    }
    return;
  }
  // Positions grow with the local row, so the visible rows form one range [lo, hi).
  std::int64_t hi = len;
  if (p.causal) hi = std::min(hi, layout::count(qpos + 1, p.dcp_rank, p.dcp_size, p.interleave));
  std::int64_t lo = 0;
  if (p.window > 0) lo = layout::count(qpos - p.window + 1, p.dcp_rank, p.dcp_size, p.interleave);
  for (std::int64_t j = lo; j < hi; ++j) ws.rows.push_back(j);
}

const float* load_row(const MlaAttentionParams& p, int b, std::int64_t local_row, int width,
                      float* convert_to) {
  const std::int64_t page =
      p.page_table[b * static_cast<std::int64_t>(p.page_table_stride) + local_row / p.page_size];
  const std::int64_t physical = page * p.page_size + local_row % p.page_size;
  if (p.kv_dtype == KvDtype::fp32) {
    return static_cast<const float*>(p.kv) + physical * width;
  }
  const bf16_t* src = static_cast<const bf16_t*>(p.kv) + physical * width;
  for (int d = 0; d < width; ++d) convert_to[d] = bf16_to_float(src[d]);
  return convert_to;
}

void attend_token(const MlaAttentionParams& p, int b, std::int64_t t, Workspace& ws) {
  const int heads = p.num_heads;
  const int dc = p.kv_lora_rank;
  const int width = p.kv_lora_rank + p.rope_dim;
  collect_visible_rows(p, b, t, ws);
  std::fill(ws.acc.begin(), ws.acc.end(), 0.0f);
  std::fill(ws.m.begin(), ws.m.end(), kNegInf);
  std::fill(ws.l.begin(), ws.l.end(), 0.0f);
  const float* q_tok = p.q + t * heads * width;

  const std::int64_t n_rows = static_cast<std::int64_t>(ws.rows.size());
  for (std::int64_t start = 0; start < n_rows; start += kTileRows) {
    const int n = static_cast<int>(std::min<std::int64_t>(kTileRows, n_rows - start));
    for (int j = 0; j < n; ++j) {
      ws.row_ptr[j] = load_row(p, b, ws.rows[start + j], width, ws.tile.data() + j * width);
    }
    for (int h = 0; h < heads; ++h) {
      const float* qh = q_tok + h * width;
      float* s = ws.scores.data() + h * kTileRows;
      float tile_max = kNegInf;
      for (int j = 0; j < n; ++j) {
        float v = dot(qh, ws.row_ptr[j], width) * p.softmax_scale;
        if (p.softcap > 0) v = p.softcap * std::tanh(v / p.softcap);
        s[j] = v;
        tile_max = std::max(tile_max, v);
      }
      const float m_new = std::max(ws.m[h], tile_max);
      float* acc = ws.acc.data() + h * dc;
      if (ws.m[h] != kNegInf && ws.m[h] != m_new) {
        const float c = std::exp(ws.m[h] - m_new);
        ws.l[h] *= c;
        scale_inplace(acc, c, dc);
      }
      ws.m[h] = m_new;
      for (int j = 0; j < n; ++j) {
        const float e = std::exp(s[j] - m_new);
        ws.l[h] += e;
        axpy(acc, e, ws.row_ptr[j], dc);
      }
    }
  }

  float* out = p.out + t * heads * dc;
  for (int h = 0; h < heads; ++h) {
    float* acc = ws.acc.data() + h * dc;
    if (p.sinks && p.sinks[h] != kNegInf) {  // one extra logit with no value
      const float s = p.sinks[h];
      const float m_new = std::max(ws.m[h], s);
      if (ws.m[h] != kNegInf) {
        const float c = std::exp(ws.m[h] - m_new);
        ws.l[h] *= c;
        scale_inplace(acc, c, dc);
      }
      ws.l[h] += std::exp(s - m_new);
      ws.m[h] = m_new;
    }
    float* o = out + h * dc;
    if (ws.l[h] == 0.0f) {
      std::fill(o, o + dc, 0.0f);
      p.lse[t * heads + h] = kNegInf;
      continue;
    }
    const float inv = 1.0f / ws.l[h];
    for (int d = 0; d < dc; ++d) o[d] = acc[d] * inv;
    p.lse[t * heads + h] = ws.m[h] + std::log(ws.l[h]);
  }
}

}  // namespace

void mla_attention(const MlaAttentionParams& p) {
  validate(p);
  const int width = p.kv_lora_rank + p.rope_dim;
  Workspace ws;
  ws.tile.resize(static_cast<std::size_t>(kTileRows) * width);
  ws.row_ptr.resize(kTileRows);
  ws.scores.resize(static_cast<std::size_t>(kTileRows) * p.num_heads);
  ws.acc.resize(static_cast<std::size_t>(p.num_heads) * p.kv_lora_rank);
  ws.m.resize(p.num_heads);
  ws.l.resize(p.num_heads);
  for (int b = 0; b < p.num_requests; ++b) {
    for (std::int64_t t = p.q_start[b]; t < p.q_start[b + 1]; ++t) attend_token(p, b, t, ws);
  }
}

}  // namespace dcp
