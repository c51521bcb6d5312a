#include "dcp/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dcp/error.h"
#include "dcp/layout.h"

namespace dcp::ref {

namespace {

constexpr double kNegInfD = -std::numeric_limits<double>::infinity();

// softmax-weighted sum of `values` rows with `logits`, plus an optional valueless sink.
void softmax_combine(const std::vector<double>& logits, const std::vector<const double*>& values,
                     double sink, int dim, double* out, double* lse) {
  double m = sink;
  for (double s : logits) m = std::max(m, s);
  std::fill(out, out + dim, 0.0);
  if (m == kNegInfD) {
    *lse = kNegInfD;
    return;
  }
  double z = sink == kNegInfD ? 0.0 : std::exp(sink - m);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double w = std::exp(logits[i] - m);
    z += w;
    for (int d = 0; d < dim; ++d) out[d] += w * values[i][d];
  }
  for (int d = 0; d < dim; ++d) out[d] /= z;
  *lse = m + std::log(z);
}

double transform(double raw, double scale, double softcap) {
  const double s = raw * scale;
  return softcap > 0 ? softcap * std::tanh(s / softcap) : s;
}

bool visible(std::int64_t pos, std::int64_t qpos, bool causal, std::int64_t window) {
  if (causal && pos > qpos) return false;
  if (window > 0 && qpos - pos >= window) return false;
  return true;
}

}  // namespace

AttentionResult mla_attention_local(const MlaAttentionParams& p) {
  validate(p);
  const int heads = p.num_heads;
  const int dc = p.kv_lora_rank;
  const int width = p.kv_lora_rank + p.rope_dim;
  const std::int64_t tokens = num_query_tokens(p);
  AttentionResult r;
  r.out.assign(static_cast<std::size_t>(tokens) * heads * dc, 0.0);
  r.lse.assign(static_cast<std::size_t>(tokens) * heads, kNegInfD);

  const auto row_values = [&](int b, std::int64_t j) {
    const std::int64_t page =
        p.page_table[b * static_cast<std::int64_t>(p.page_table_stride) + j / p.page_size];
    const std::int64_t phys = page * p.page_size + j % p.page_size;
    std::vector<double> v(width);
    for (int d = 0; d < width; ++d) {
      v[d] = p.kv_dtype == KvDtype::fp32
                 ? static_cast<const float*>(p.kv)[phys * width + d]
                 : bf16_to_float(static_cast<const bf16_t*>(p.kv)[phys * width + d]);
    }
    return v;
  };

  for (int b = 0; b < p.num_requests; ++b) {
    // Decode every local row once per request.
    std::vector<std::vector<double>> rows(static_cast<std::size_t>(p.local_len[b]));
    for (std::int64_t j = 0; j < p.local_len[b]; ++j) rows[j] = row_values(b, j);
    for (std::int64_t t = p.q_start[b]; t < p.q_start[b + 1]; ++t) {
      // The local rows this token may see: by list (top-k) or by scanning every row.
      std::vector<std::int64_t> candidates;
      if (p.topk_k > 0) {
        for (int i = 0; i < p.topk_k; ++i) {
          const std::int64_t pos = p.topk[t * p.topk_k + i];
          if (pos >= 0 && layout::owner(pos, p.dcp_size, p.interleave) == p.dcp_rank) {
            candidates.push_back(layout::row(pos, p.dcp_size, p.interleave));
          }
        }
      } else {
        for (std::int64_t j = 0; j < p.local_len[b]; ++j) candidates.push_back(j);
      }
      for (int h = 0; h < heads; ++h) {
        const float* qh = query_head(p, tokens, t, h);
        std::vector<double> logits;
        std::vector<const double*> values;
        for (std::int64_t j : candidates) {
          const std::int64_t pos = layout::position(j, p.dcp_rank, p.dcp_size, p.interleave);
          if (!visible(pos, p.q_pos[t], p.causal, p.window)) continue;
          double raw = 0;
          for (int d = 0; d < width; ++d) raw += static_cast<double>(qh[d]) * rows[j][d];
          logits.push_back(transform(raw, p.softmax_scale, p.softcap));
          values.push_back(rows[j].data());
        }
        const double sink = p.sinks ? static_cast<double>(p.sinks[h]) : kNegInfD;
        softmax_combine(logits, values, sink, dc, &r.out[(t * heads + h) * dc],
                        &r.lse[t * heads + h]);
      }
    }
  }
  return r;
}

AttentionResult full_attention(const FullAttentionInput& in) {
  const int heads = in.num_heads;
  const int dc = in.kv_lora_rank;
  const int width = in.kv_lora_rank + in.rope_dim;
  const int requests = static_cast<int>(in.q_start.size()) - 1;
  DCP_ARG_CHECK(requests >= 0 && static_cast<int>(in.kv.size()) == requests,
                "full_attention: q_start has ", in.q_start.size(), " entries for ", in.kv.size(),
                " requests");
  const std::int64_t tokens = requests > 0 ? in.q_start.back() : 0;
  AttentionResult r;
  r.out.assign(static_cast<std::size_t>(tokens) * heads * dc, 0.0);
  r.lse.assign(static_cast<std::size_t>(tokens) * heads, kNegInfD);
  for (int b = 0; b < requests; ++b) {
    const std::vector<float>& kv = in.kv[b];
    const std::int64_t len = static_cast<std::int64_t>(kv.size()) / width;
    std::vector<double> kvd(kv.begin(), kv.end());
    for (std::int64_t t = in.q_start[b]; t < in.q_start[b + 1]; ++t) {
      std::vector<std::int64_t> positions;
      if (in.topk_k > 0) {
        for (int i = 0; i < in.topk_k; ++i) {
          const std::int64_t pos = in.topk[t * in.topk_k + i];
          if (pos >= 0) positions.push_back(pos);
        }
      } else {
        for (std::int64_t pos = 0; pos < len; ++pos) positions.push_back(pos);
      }
      for (int h = 0; h < heads; ++h) {
        const float* qh = in.q.data() + (t * heads + h) * width;
        std::vector<double> logits;
        std::vector<const double*> values;
        for (std::int64_t pos : positions) {
          if (!visible(pos, in.q_pos[t], in.causal, in.window)) continue;
          const double* row = kvd.data() + pos * width;
          double raw = 0;
          for (int d = 0; d < width; ++d) raw += static_cast<double>(qh[d]) * row[d];
          logits.push_back(transform(raw, in.softmax_scale, in.softcap));
          values.push_back(row);
        }
        const double sink = in.sinks.empty() ? kNegInfD : static_cast<double>(in.sinks[h]);
        softmax_combine(logits, values, sink, dc, &r.out[(t * heads + h) * dc],
                        &r.lse[t * heads + h]);
      }
    }
  }
  return r;
}

AttentionResult merge(const std::vector<double>& o_parts, const std::vector<double>& lse_parts,
                      int num_parts, std::int64_t rows, int dim) {
  AttentionResult r;
  r.out.assign(static_cast<std::size_t>(rows) * dim, 0.0);
  r.lse.assign(static_cast<std::size_t>(rows), kNegInfD);
  for (std::int64_t row = 0; row < rows; ++row) {
    double m = kNegInfD;
    for (int k = 0; k < num_parts; ++k) m = std::max(m, lse_parts[k * rows + row]);
    if (m == kNegInfD) continue;
    double z = 0;
    for (int k = 0; k < num_parts; ++k) z += std::exp(lse_parts[k * rows + row] - m);
    for (int k = 0; k < num_parts; ++k) {
      const double w = std::exp(lse_parts[k * rows + row] - m) / z;
      if (w == 0) continue;
      for (int d = 0; d < dim; ++d) r.out[row * dim + d] += w * o_parts[(k * rows + row) * dim + d];
    }
    r.lse[row] = m + std::log(z);
  }
  return r;
}

}  // namespace dcp::ref
