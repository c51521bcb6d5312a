#include "dcp/feed_forward.h"

#include <algorithm>
#include <cstring>

#include "dcp/error.h"
#include "moe_router.h"
#include "ops.h"

namespace dcp {
namespace {

// Runs `expert` once over the rows src[list[j]] (gathered into one product, in scratch buffers
// reused across experts), counts it in `s`, and hands output row j to put(j, row).
template <class Put>
void run_expert(const SwiGluMlp& expert, const float* src, const std::vector<std::int64_t>& list,
                std::int64_t hidden, std::vector<float>& in, std::vector<float>& out, MoeStats& s,
                Put&& put) {
  ++s.experts_run;
  s.weight_bytes_read += expert.bytes();
  const std::int64_t m = static_cast<std::int64_t>(list.size());
  in.resize(static_cast<std::size_t>(m * hidden));
  out.resize(in.size());
  for (std::int64_t j = 0; j < m; ++j)
    std::copy_n(src + list[j] * hidden, hidden, in.data() + j * hidden);
  expert.forward(in.data(), m, out.data());
  for (std::int64_t j = 0; j < m; ++j) put(static_cast<std::size_t>(j), out.data() + j * hidden);
}

}  // namespace

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
                   int tp_size, ExpertParallel ep)
    : config_(config), ep_(ep), tp_rank_(tp_rank), tp_size_(tp_size) {
  const ModelConfig& c = config_;
  DCP_ARG_CHECK(c.is_moe_layer(layer), "layer ", layer, " of this config is not a MoE layer");
  DCP_ARG_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size, "tp_rank = ", tp_rank,
                " must be in [0, tp_size = ", tp_size, ")");
  const std::int64_t hidden = c.hidden_size, experts = c.n_routed_experts;
  DCP_ARG_CHECK(ep.size >= 1 && tp_size % ep.size == 0 && experts % ep.size == 0, "ep_size = ",
                ep.size, " must divide tp_size = ", tp_size, " and the model's n_routed_experts = ",
                experts, "; legal ep_size values: ", [&] {
                  std::string legal;
                  for (int d = 1; d <= tp_size; ++d)
                    if (tp_size % d == 0 && experts % d == 0)
                      legal += (legal.empty() ? "" : ", ") + std::to_string(d);
                  return legal;
                }());
  DCP_ARG_CHECK(ep.size == 1 || (ep.group && ep.group->size() == tp_size &&
                                 ep.group->rank() == tp_rank),
                "expert parallelism needs the layer's group of tp_size = ", tp_size, " ranks");
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.";
  const std::int64_t mi = c.moe_intermediate_size;
  router_ = w.load_matrix(p + "gate.weight", {experts, hidden});
  if (c.topk_method == "noaux_tc") bias_ = w.load(p + "gate.e_score_correction_bias", {experts});
  // This rank's experts, and its slice of each: all experts over all ranks without EP.
  ranks_per_expert_ = tp_size / ep.size;
  const int ep_rank = tp_rank / ranks_per_expert_, slice = tp_rank % ranks_per_expert_;
  const std::int64_t per_rank = experts / ep.size;
  first_expert_ = static_cast<int>(ep_rank * per_rank);
  const std::int64_t e0 = mi * slice / ranks_per_expert_, e1 = mi * (slice + 1) / ranks_per_expert_;
  experts_.reserve(static_cast<std::size_t>(per_rank));
  for (std::int64_t e = first_expert_; e < first_expert_ + per_rank; ++e)
    experts_.emplace_back(w, p + "experts." + std::to_string(e) + ".", hidden, mi, e0, e1);
  if (c.n_shared_experts > 0) {
    const std::int64_t si = mi * c.n_shared_experts;
    shared_.emplace(w, p + "shared_experts.", hidden, si, si * tp_rank / tp_size,
                    si * (tp_rank + 1) / tp_size);
  }
}

void MoeLayer::forward(const float* x, std::int64_t tokens, float* y, MoeStats* stats) const {
  if (ep_.size > 1) {
    MoeStats s;
    forward_expert_parallel(x, tokens, y, s);
    if (stats) *stats = s;
    return;
  }
  const std::int64_t hidden = config_.hidden_size, experts = config_.n_routed_experts;
  std::vector<float> logits(static_cast<std::size_t>(tokens * experts));
  ops::linear(x, tokens, router_, logits.data());
  const moe::Routing r =
      moe::route(config_, logits.data(), tokens, bias_.empty() ? nullptr : bias_.data());
  MoeStats s;
  start_with_shared(x, tokens, y, s);
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
    if (rows[e].empty()) continue;
    run_expert(experts_[e], x, rows[e], hidden, in, out, s, [&](std::size_t j, const float* res) {
      float* dst = y + rows[e][j] * hidden;
      const float w = weights[e][j];
      for (std::int64_t d = 0; d < hidden; ++d) dst[d] += w * res[d];
    });
  }
  if (stats) *stats = s;
}

void MoeLayer::run_grouped(const float* rows, const std::int32_t* local_expert, std::int64_t n,
                           float* out, MoeStats& s) const {
  const std::int64_t hidden = config_.hidden_size;
  std::vector<std::vector<std::int64_t>> by_expert(experts_.size());
  for (std::int64_t i = 0; i < n; ++i)
    by_expert[static_cast<std::size_t>(local_expert[i])].push_back(i);
  std::vector<float> in, res;
  for (std::size_t l = 0; l < experts_.size(); ++l) {
    const std::vector<std::int64_t>& list = by_expert[l];
    if (list.empty()) continue;
    run_expert(experts_[l], rows, list, hidden, in, res, s, [&](std::size_t j, const float* row) {
      std::copy_n(row, hidden, out + list[j] * hidden);
    });
  }
}

void MoeLayer::start_with_shared(const float* x, std::int64_t tokens, float* y,
                                 MoeStats& s) const {
  s.weight_bytes_read = router_.bytes() + bias_.size() * sizeof(float);
  if (shared_) {
    shared_->forward(x, tokens, y);
    s.weight_bytes_read += shared_->bytes();
  } else {
    std::fill(y, y + tokens * config_.hidden_size, 0.0f);
  }
}

void MoeLayer::forward_expert_parallel(const float* x, std::int64_t tokens, float* y,
                                       MoeStats& s) const {
  Communicator& group = *ep_.group;
  const std::int64_t hidden = config_.hidden_size, experts = config_.n_routed_experts;
  const int ranks = tp_size_;
  start_with_shared(x, tokens, y, s);  // this rank's slice of the shared experts, every token
  // This rank routes and dispatches tokens [t0, t1); each token's routed output comes back here,
  // complete, so that the sum over ranks holds it exactly once.
  const std::int64_t t0 = tokens * tp_rank_ / ranks, t1 = tokens * (tp_rank_ + 1) / ranks;
  std::vector<float> logits(static_cast<std::size_t>((t1 - t0) * experts));
  ops::linear(x + t0 * hidden, t1 - t0, router_, logits.data());
  const moe::Routing r =
      moe::route(config_, logits.data(), t1 - t0, bias_.empty() ? nullptr : bias_.data());
  // Entries per destination rank, in (token, choice) order: expert e lives on EP rank
  // e / per_rank, whose ranks_per_expert_ ranks each hold a slice of it.
  const std::int64_t per_rank = experts / ep_.size;
  struct Entry {
    std::int64_t token;
    std::int32_t local_expert;
    float weight;
  };
  std::vector<std::vector<Entry>> to(static_cast<std::size_t>(ranks));
  for (std::int64_t t = 0; t < t1 - t0; ++t) {
    for (int i = 0; i < r.k; ++i) {
      const std::int32_t e = r.experts[t * r.k + i];
      const int first = static_cast<int>(e / per_rank) * ranks_per_expert_;
      for (int d = first; d < first + ranks_per_expert_; ++d) {
        to[static_cast<std::size_t>(d)].push_back(
            {t0 + t, static_cast<std::int32_t>(e % per_rank), r.weights[t * r.k + i]});
      }
    }
  }
  // Counts first, then the rows: one int32 (the expert, local to the receiver) and the hidden
  // state per entry.
  std::vector<std::int64_t> send_n(static_cast<std::size_t>(ranks)), recv_n(send_n.size());
  for (int d = 0; d < ranks; ++d) send_n[d] = static_cast<std::int64_t>(to[d].size());
  group.all_to_all(send_n.data(), recv_n.data(), sizeof(std::int64_t));
  const std::size_t entry_floats = static_cast<std::size_t>(hidden) + 1;
  std::vector<std::size_t> send_b(send_n.size()), recv_b(send_n.size());
  std::int64_t sent = 0, received = 0;
  for (int d = 0; d < ranks; ++d) {
    send_b[d] = static_cast<std::size_t>(send_n[d]) * entry_floats * sizeof(float);
    recv_b[d] = static_cast<std::size_t>(recv_n[d]) * entry_floats * sizeof(float);
    sent += send_n[d];
    received += recv_n[d];
    s.entries += send_n[d];
    if (d != tp_rank_) {
      s.entries_sent += send_n[d];
      s.dispatch_bytes_sent += send_b[d];
    }
  }
  std::vector<float> out_rows(static_cast<std::size_t>(sent) * entry_floats);
  float* at = out_rows.data();
  for (const std::vector<Entry>& list : to) {
    for (const Entry& e : list) {
      std::memcpy(at, &e.local_expert, sizeof e.local_expert);
      std::copy_n(x + e.token * hidden, hidden, at + 1);
      at += entry_floats;
    }
  }
  std::vector<float> in_rows(static_cast<std::size_t>(received) * entry_floats);
  group.all_to_all_v(out_rows.data(), send_b.data(), in_rows.data(), recv_b.data());
  // Run this rank's experts over what arrived; the outputs go back in arrival order.
  std::vector<std::int32_t> local(static_cast<std::size_t>(received));
  std::vector<float> rows(static_cast<std::size_t>(received * hidden));
  for (std::int64_t i = 0; i < received; ++i) {
    const float* e = in_rows.data() + i * static_cast<std::int64_t>(entry_floats);
    std::memcpy(&local[i], e, sizeof local[i]);
    DCP_CHECK(local[i] >= 0 && local[i] < local_experts(), internal, "expert ", local[i],
              " dispatched to a rank holding ", local_experts());
    std::copy_n(e + 1, hidden, rows.data() + i * hidden);
  }
  std::vector<float> results(rows.size());
  run_grouped(rows.data(), local.data(), received, results.data(), s);
  const std::size_t row_bytes = static_cast<std::size_t>(hidden) * sizeof(float);
  for (int d = 0; d < ranks; ++d) {  // the reverse exchange: outputs of what each rank sent
    send_b[d] = static_cast<std::size_t>(recv_n[d]) * row_bytes;
    recv_b[d] = static_cast<std::size_t>(send_n[d]) * row_bytes;
    if (d != tp_rank_) s.return_bytes_sent += send_b[d];
  }
  std::vector<float> back(static_cast<std::size_t>(sent * hidden));
  group.all_to_all_v(results.data(), send_b.data(), back.data(), recv_b.data());
  // Weighted sum at the token's rank, in (rank, token, choice) order.
  const float* b = back.data();
  for (const std::vector<Entry>& list : to) {
    for (const Entry& e : list) {
      float* dst = y + e.token * hidden;
      for (std::int64_t d = 0; d < hidden; ++d) dst[d] += e.weight * b[d];
      b += hidden;
    }
  }
}

std::size_t MoeLayer::bytes() const noexcept {
  std::size_t b = router_.bytes() + bias_.size() * sizeof(float);
  for (const SwiGluMlp& e : experts_) b += e.bytes();
  if (shared_) b += shared_->bytes();
  return b;
}

}  // namespace dcp
