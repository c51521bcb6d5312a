#include "dcp/feed_forward.h"

#include <algorithm>

#include "dcp/error.h"
#include "moe_router.h"
#include "ops.h"

namespace dcp {

SwiGluMlp::SwiGluMlp(const WeightSource& w, const std::string& prefix, std::int64_t hidden,
                     std::int64_t intermediate, std::int64_t i0, std::int64_t i1)
    : gate_(w.load_matrix(prefix + "gate_proj.weight", {intermediate, hidden}, {i0, i1})),
      up_(w.load_matrix(prefix + "up_proj.weight", {intermediate, hidden}, {i0, i1})),
      down_(w.load_matrix(prefix + "down_proj.weight", {hidden, intermediate}, {}, {i0, i1})),
      i_loc_(i1 - i0) {}

void SwiGluMlp::forward(const float* x, std::int64_t tokens, float* y) const {
  std::vector<float> g(static_cast<std::size_t>(tokens * i_loc_)), u(g.size());
  ops::linear(x, tokens, gate_, g.data());
  ops::linear(x, tokens, up_, u.data());
  ops::silu_mul(g.data(), u.data(), g.data(), static_cast<std::int64_t>(g.size()));
  ops::linear(g.data(), tokens, down_, y);
}

std::size_t SwiGluMlp::bytes() const noexcept {
  return gate_.bytes() + up_.bytes() + down_.bytes();
}

MoeLayer::MoeLayer(const ModelConfig& config, const WeightSource& w, int layer, int tp_rank,
                   int tp_size)
    : config_(config) {
  const ModelConfig& c = config_;
  DCP_ARG_CHECK(c.is_moe_layer(layer), "layer ", layer, " of this config is not a MoE layer");
  DCP_ARG_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "tp_rank = ", tp_rank,
                " must be in [0, tp_size = ", tp_size, ")");
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
  const std::int64_t hidden = c.hidden_size, experts = c.n_routed_experts;
  const std::int64_t mi = c.moe_intermediate_size;
  router_ = w.load_matrix(p + "gate.weight", {experts, hidden});
  if (c.topk_method == "noaux_tc") bias_ = w.load(p + "gate.e_score_correction_bias", {experts});
  const std::int64_t e0 = mi * tp_rank / tp_size, e1 = mi * (tp_rank + 1) / tp_size;
  experts_.reserve(static_cast<std::size_t>(experts));
  for (std::int64_t e = 0; e < experts; ++e)
    experts_.emplace_back(w, p + "experts." + std::to_string(e) + ".", hidden, mi, e0, e1);
  if (c.n_shared_experts > 0) {
    const std::int64_t si = mi * c.n_shared_experts;
    shared_.emplace(w, p + "shared_experts.", hidden, si, si * tp_rank / tp_size,
                    si * (tp_rank + 1) / tp_size);
  }
}

void MoeLayer::forward(const float* x, std::int64_t tokens, float* y, MoeStats* stats) const {
  const std::int64_t hidden = config_.hidden_size, experts = config_.n_routed_experts;
  std::vector<float> logits(static_cast<std::size_t>(tokens * experts));
  ops::linear(x, tokens, router_, logits.data());
  const moe::Routing r =
      moe::route(config_, logits.data(), tokens, bias_.empty() ? nullptr : bias_.data());
  MoeStats s;
  s.weight_bytes_read = router_.bytes() + bias_.size() * sizeof(float);
  if (shared_) {
    shared_->forward(x, tokens, y);
    s.weight_bytes_read += shared_->bytes();
  } else {
    std::fill(y, y + tokens * hidden, 0.0f);
  }
  // Tokens grouped by expert: each expert runs once over the rows routed to it.
  std::vector<std::vector<std::int64_t>> rows(static_cast<std::size_t>(experts));
  std::vector<std::vector<float>> weights(static_cast<std::size_t>(experts));
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (int i = 0; i < r.k; ++i) {
      const std::int32_t e = r.experts[t * r.k + i];
      rows[e].push_back(t);
      weights[e].push_back(r.weights[t * r.k + i]);
    }
  }
  std::vector<float> in, out;
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t n = static_cast<std::int64_t>(rows[e].size());
    if (n == 0) continue;
    ++s.experts_run;
    s.weight_bytes_read += experts_[e].bytes();
    in.resize(static_cast<std::size_t>(n * hidden));
    out.resize(in.size());
    for (std::int64_t j = 0; j < n; ++j)
      std::copy_n(x + rows[e][j] * hidden, hidden, in.data() + j * hidden);
    experts_[e].forward(in.data(), n, out.data());
    for (std::int64_t j = 0; j < n; ++j) {
      float* dst = y + rows[e][j] * hidden;
      const float* src = out.data() + j * hidden;
      const float w = weights[e][j];
      for (std::int64_t d = 0; d < hidden; ++d) dst[d] += w * src[d];
    }
  }
  if (stats) *stats = s;
}

std::size_t MoeLayer::bytes() const noexcept {
  std::size_t b = router_.bytes() + bias_.size() * sizeof(float);
  for (const SwiGluMlp& e : experts_) b += e.bytes();
  if (shared_) b += shared_->bytes();
  return b;
}

}  // namespace dcp
