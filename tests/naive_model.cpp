#include "naive_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numbers>
#include <string>

namespace dcp::test {
namespace {

using Vec = std::vector<double>;

struct Mat {
  std::int64_t rows = 0, cols = 0;
  Vec v;
  Mat(const WeightSource& w, const std::string& name, std::int64_t r, std::int64_t c)
      : rows(r), cols(c) {
    const std::vector<float> f = w.load(name, {r, c});
    v.assign(f.begin(), f.end());
  }
  Vec apply(const Vec& x) const {  // y = W x
    Vec y(static_cast<std::size_t>(rows), 0.0);
    for (std::int64_t i = 0; i < rows; ++i) {
      double s = 0;
      for (std::int64_t j = 0; j < cols; ++j) s += v[i * cols + j] * x[j];
      y[i] = s;
    }
    return y;
  }
};

// DeepSeek's YaRN magnitude factor, written out here rather than taken from dcp.
double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// 1/sqrt(q_head_dim), times mscale(factor, mscale_all_dim)^2 under YaRN (DeepSeek's attention).
double naive_softmax_scale(const ModelConfig& c) {
  double s = 1.0 / std::sqrt(static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim));
  if (c.rope_scaling && c.rope_scaling->mscale_all_dim != 0) {
    const double m = yarn_mscale(c.rope_scaling->factor, c.rope_scaling->mscale_all_dim);
    s *= m * m;
  }
  return s;
}

Vec load_vec(const WeightSource& w, const std::string& name, std::int64_t n) {
  const std::vector<float> f = w.load(name, {n});
  return Vec(f.begin(), f.end());
}

Vec rms_norm(Vec x, const Vec& weight, double eps) {
  double ss = 0;
  for (double a : x) ss += a * a;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] *= inv * weight[i];
  return x;
}

// HF DeepSeek rope written out directly: de-interleave pairs, then rotate-half. MiniCPM3's
// (model_type minicpm3) rotates the halves as they are, with LongRoPE's per-frequency factors.
Vec rope(const Vec& x, std::int64_t pos, const ModelConfig& c) {
  if (c.skip_rope) return x;
  const int d = static_cast<int>(x.size()), half = d / 2;
  Vec inv(half);
  double mscale = 1.0;
  for (int i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(c.rope_theta, 2.0 * i / d);
  if (c.model_type == "minicpm3") {
    if (c.longrope) {
      const LongRope& r = *c.longrope;
      const bool long_range = static_cast<double>(pos) >= r.original_max_position_embeddings;
      for (int i = 0; i < half; ++i)
        inv[i] = 1.0 / ((long_range ? r.long_factor[i] : r.short_factor[i]) *
                        std::pow(c.rope_theta, 2.0 * i / d));
      mscale = r.attention_factor;
    }
    Vec out(d);
    for (int i = 0; i < d; ++i) {  // x * cos + rotate_half(x) * sin
      const double angle = static_cast<double>(pos) * inv[i % half];
      const double rotated = i < half ? -x[i + half] : x[i - half];
      out[i] = (x[i] * std::cos(angle) + rotated * std::sin(angle)) * mscale;
    }
    return out;
  }
  if (c.rope_scaling && c.rope_scaling->factor > 1) {
    const RopeScaling& s = *c.rope_scaling;
    const auto corr = [&](double rot) {
      return d * std::log(s.original_max_position_embeddings / (rot * 2 * std::numbers::pi)) /
             (2 * std::log(c.rope_theta));
    };
    const double low = std::max(0.0, std::floor(corr(s.beta_fast)));
    double high = std::min<double>(d - 1, std::ceil(corr(s.beta_slow)));
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      const double ramp = std::min(1.0, std::max(0.0, (i - low) / (high - low)));
      const double extra_weight = 1.0 - ramp;
      inv[i] = (inv[i] / s.factor) * (1 - extra_weight) + inv[i] * extra_weight;
    }
    mscale = yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  }
  Vec perm(d), out(d);
  for (int i = 0; i < half; ++i) {
    perm[i] = x[2 * i];
    perm[i + half] = x[2 * i + 1];
  }
  for (int i = 0; i < d; ++i) {
    const double angle = static_cast<double>(pos) * inv[i % half];
    const double rotated = i < half ? -perm[i + half] : perm[i - half];
    out[i] = perm[i] * std::cos(angle) * mscale + rotated * std::sin(angle) * mscale;
  }
  return out;
}

// A SwiGLU MLP of intermediate width `inter`, named `prefix`{gate,up,down}_proj.
struct NaiveMlp {
  Mat gate, up, down;
  NaiveMlp(const WeightSource& w, const std::string& prefix, std::int64_t hidden,
           std::int64_t inter)
      : gate(w, prefix + "gate_proj.weight", inter, hidden),
        up(w, prefix + "up_proj.weight", inter, hidden),
        down(w, prefix + "down_proj.weight", hidden, inter) {}
  Vec apply(const Vec& x) const {
    Vec g = gate.apply(x);
    const Vec u = up.apply(x);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    return down.apply(g);
  }
};

// Indices of the k largest, ties to the lower index (as dcp's router; torch leaves them open).
std::vector<int> naive_top_k(const Vec& v, int k) {
  std::vector<int> idx;
  std::vector<bool> taken(v.size(), false);
  for (int n = 0; n < k; ++n) {
    int best = -1;
    for (int i = 0; i < static_cast<int>(v.size()); ++i) {
      if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    }
    taken[best] = true;
    idx.push_back(best);
  }
  return idx;
}

// The Hugging Face DeepSeek MoE block for one token, in float64: MoEGate (V2's softmax with
// greedy or group-limited greedy, V3's sigmoid with noaux_tc and its correction bias), the routed
// experts' weighted sum and the shared experts.
// The gap between the k-th largest value and the next (infinite when nothing is left out).
double top_k_margin(const Vec& v, int k) {
  if (k >= static_cast<int>(v.size())) return INFINITY;
  Vec sorted = v;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  return sorted[k - 1] - sorted[k];
}

Vec naive_moe(const ModelConfig& c, const WeightSource& w, const std::string& p, const Vec& x,
              const std::vector<NaiveMlp>& experts, const NaiveMlp* shared, double* margin) {
  const int n = c.n_routed_experts, k = c.num_experts_per_tok;
  const Mat router(w, p + "mlp.gate.weight", n, c.hidden_size);
  const Vec logits = router.apply(x);
  Vec scores(n);
  if (c.model_type == "deepseek_v2") {  // softmax
    double m = -INFINITY, z = 0;
    for (double l : logits) m = std::max(m, l);
    for (int e = 0; e < n; ++e) z += scores[e] = std::exp(logits[e] - m);
    for (double& s : scores) s /= z;
  } else {  // sigmoid
    for (int e = 0; e < n; ++e) scores[e] = 1.0 / (1.0 + std::exp(-logits[e]));
  }
  Vec choice = scores;
  const bool noaux = c.topk_method == "noaux_tc";
  if (noaux) {
    const Vec bias = load_vec(w, p + "mlp.gate.e_score_correction_bias", n);
    for (int e = 0; e < n; ++e) choice[e] += bias[e];
  }
  if (c.topk_method != "greedy") {
    const int per = n / c.n_group;
    Vec group(c.n_group);
    for (int g = 0; g < c.n_group; ++g) {
      const Vec members(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      const std::vector<int> best = naive_top_k(members, noaux ? 2 : 1);
      group[g] = noaux ? members[best[0]] + members[best[1]] : members[best[0]];
    }
    const std::vector<int> kept = naive_top_k(group, c.topk_group);
    *margin = std::min(*margin, top_k_margin(group, c.topk_group));
    for (int e = 0; e < n; ++e) {
      if (std::find(kept.begin(), kept.end(), e / per) == kept.end()) choice[e] = 0.0;
    }
  }
  const std::vector<int> chosen = naive_top_k(choice, k);
  *margin = std::min(*margin, top_k_margin(choice, k));
  Vec weight(k);
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += weight[i] = scores[chosen[i]];
  const bool normalise = k > 1 && c.norm_topk_prob;
  for (double& wt : weight) {
    if (normalise) wt /= sum + 1e-20;
    if (c.model_type != "deepseek_v2" || !normalise) wt *= c.routed_scaling_factor;
  }
  Vec y(static_cast<std::size_t>(c.hidden_size), 0.0);
  for (int i = 0; i < k; ++i) {
    const Vec e = experts[chosen[i]].apply(x);
    for (std::size_t d = 0; d < y.size(); ++d) y[d] += weight[i] * e[d];
  }
  if (shared) {
    const Vec s = shared->apply(x);
    for (std::size_t d = 0; d < y.size(); ++d) y[d] += s[d];
  }
  return y;
}

}  // namespace

std::vector<double> naive_logits(const ModelConfig& c, const WeightSource& w,
                                 const std::vector<std::int32_t>& tokens, double* route_margin) {
  double margin = INFINITY;
  const std::int64_t L = static_cast<std::int64_t>(tokens.size()), hidden = c.hidden_size,
                     H = c.num_attention_heads;
  const int nope = c.qk_nope_head_dim, rp = c.qk_rope_head_dim, vd = c.v_head_dim,
            qhd = c.q_head_dim();
  const Mat embed(w, "model.embed_tokens.weight", c.vocab_size, hidden);
  std::vector<Vec> x(static_cast<std::size_t>(L));
  // MiniCPM's muP: embeddings times scale_emb, branches times scale_depth / sqrt(layers), the
  // final state divided by hidden_size / dim_model_base (1, 1 and 1 for DeepSeek).
  const bool mup = c.model_type == "minicpm3";
  const double branch = mup ? c.scale_depth / std::sqrt(double(c.num_hidden_layers)) : 1.0;
  for (std::int64_t t = 0; t < L; ++t) {
    x[t] = Vec(embed.v.begin() + tokens[t] * hidden, embed.v.begin() + (tokens[t] + 1) * hidden);
    if (mup)
      for (double& e : x[t]) e *= c.scale_emb;
  }
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    const Vec in_norm = load_vec(w, p + "input_layernorm.weight", hidden);
    const Vec post_norm = load_vec(w, p + "post_attention_layernorm.weight", hidden);
    const Mat kv_a(w, p + "self_attn.kv_a_proj_with_mqa.weight", c.latent_width(), hidden);
    const Vec kv_a_norm = load_vec(w, p + "self_attn.kv_a_layernorm.weight", c.kv_lora_rank);
    const Mat kv_b(w, p + "self_attn.kv_b_proj.weight", H * (nope + vd), c.kv_lora_rank);
    const Mat o_proj(w, p + "self_attn.o_proj.weight", hidden, H * vd);
    const std::int64_t q_in = c.q_lora_rank ? *c.q_lora_rank : hidden;
    const Mat q_proj(w,
                     p + (c.q_lora_rank ? "self_attn.q_b_proj.weight" : "self_attn.q_proj.weight"),
                     H * qhd, q_in);
    std::vector<Mat> q_a;  // q_lora models only
    Vec q_a_norm;
    if (c.q_lora_rank) {
      q_a.emplace_back(w, p + "self_attn.q_a_proj.weight", q_in, hidden);
      q_a_norm = load_vec(w, p + "self_attn.q_a_layernorm.weight", q_in);
    }
    // Per position: q [H, qhd], k [H, nope + rope], v [H, vd].
    std::vector<Vec> q(L), k(L), v(L), xn(L);
    for (std::int64_t t = 0; t < L; ++t) {
      xn[t] = rms_norm(x[t], in_norm, c.rms_norm_eps);
      q[t] = c.q_lora_rank ? q_proj.apply(rms_norm(q_a[0].apply(xn[t]), q_a_norm, 1e-6))
                           : q_proj.apply(xn[t]);
      const Vec kva = kv_a.apply(xn[t]);
      const Vec ckv = rms_norm(Vec(kva.begin(), kva.begin() + c.kv_lora_rank), kv_a_norm, 1e-6);
      const Vec k_pe = rope(Vec(kva.begin() + c.kv_lora_rank, kva.end()), t, c);
      const Vec kvb = kv_b.apply(ckv);  // [H, nope + vd]
      k[t].resize(static_cast<std::size_t>(H * (nope + rp)));
      v[t].resize(static_cast<std::size_t>(H * vd));
      for (std::int64_t h = 0; h < H; ++h) {
        for (int i = 0; i < nope; ++i) k[t][h * (nope + rp) + i] = kvb[h * (nope + vd) + i];
        for (int i = 0; i < rp; ++i)
          k[t][h * (nope + rp) + nope + i] = k_pe[i];  // shared by all heads
        for (int i = 0; i < vd; ++i) v[t][h * vd + i] = kvb[h * (nope + vd) + nope + i];
        const Vec q_pe =
            rope(Vec(q[t].begin() + h * qhd + nope, q[t].begin() + (h + 1) * qhd), t, c);
        for (int i = 0; i < rp; ++i) q[t][h * qhd + nope + i] = q_pe[i];
      }
    }
    const double scale = naive_softmax_scale(c);
    std::vector<Mat> gate_proj;
    if (c.attn_output_gate)
      gate_proj.emplace_back(w, p + "self_attn.g_proj.weight", H * vd, hidden);
    for (std::int64_t t = 0; t < L; ++t) {
      Vec attn(static_cast<std::size_t>(H * vd), 0.0);
      for (std::int64_t h = 0; h < H; ++h) {
        Vec s(static_cast<std::size_t>(t + 1));
        double m = -INFINITY;
        for (std::int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int i = 0; i < qhd; ++i) dot += q[t][h * qhd + i] * k[u][h * (nope + rp) + i];
          s[u] = dot * scale;
          m = std::max(m, s[u]);
        }
        double z = 0;
        for (std::int64_t u = 0; u <= t; ++u) z += std::exp(s[u] - m);
        for (std::int64_t u = 0; u <= t; ++u) {
          const double pr = std::exp(s[u] - m) / z;
          for (int i = 0; i < vd; ++i) attn[h * vd + i] += pr * v[u][h * vd + i];
        }
      }
      if (c.attn_output_gate) {
        const Vec g = gate_proj[0].apply(xn[t]);
        for (std::size_t i = 0; i < attn.size(); ++i) attn[i] *= 1.0 / (1.0 + std::exp(-g[i]));
      }
      const Vec o = o_proj.apply(attn);
      for (std::int64_t i = 0; i < hidden; ++i) x[t][i] += branch * o[i];
    }
    // The MLP: dense, or mixture of experts (layer >= first_k_dense_replace, every
    // moe_layer_freq-th), written from the Hugging Face rule rather than taken from dcp.
    const bool moe =
        c.n_routed_experts > 0 && layer >= c.first_k_dense_replace && layer % c.moe_layer_freq == 0;
    std::vector<NaiveMlp> experts;
    std::vector<NaiveMlp> shared;
    if (moe) {
      for (int e = 0; e < c.n_routed_experts; ++e)
        experts.emplace_back(w, p + "mlp.experts." + std::to_string(e) + ".", hidden,
                             c.moe_intermediate_size);
      if (c.n_shared_experts > 0)
        shared.emplace_back(
            w, p + "mlp.shared_experts.", hidden,
            static_cast<std::int64_t>(c.moe_intermediate_size) * c.n_shared_experts);
    } else {
      experts.emplace_back(w, p + "mlp.", hidden, c.intermediate_size);
    }
    for (std::int64_t t = 0; t < L; ++t) {
      const Vec hn = rms_norm(x[t], post_norm, c.rms_norm_eps);
      const Vec d =
          moe ? naive_moe(c, w, p, hn, experts, shared.empty() ? nullptr : &shared[0], &margin)
              : experts[0].apply(hn);
      for (std::int64_t i = 0; i < hidden; ++i) x[t][i] += branch * d[i];
    }
  }
  const Vec final_norm = load_vec(w, "model.norm.weight", hidden);
  const bool tied = c.tie_word_embeddings ? *c.tie_word_embeddings : !w.contains("lm_head.weight");
  const Mat lm_head(w, tied ? "model.embed_tokens.weight" : "lm_head.weight", c.vocab_size, hidden);
  std::vector<double> logits;
  for (std::int64_t t = 0; t < L; ++t) {
    Vec h = rms_norm(x[t], final_norm, c.rms_norm_eps);
    if (mup)
      for (double& e : h) e /= hidden / c.dim_model_base;
    const Vec l = lm_head.apply(h);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  if (route_margin) *route_margin = margin;
  return logits;
}

}  // namespace dcp::test
