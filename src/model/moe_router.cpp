#include "moe_router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dcp/error.h"

namespace dcp::moe {
namespace {

// The indices of the k largest values, largest first; ties to the lower index.
std::vector<int> top_k(const std::vector<float>& v, int k) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  idx.resize(static_cast<std::size_t>(k));
  return idx;
}

}  // namespace

Routing route(const ModelConfig& c, const float* logits, std::int64_t tokens, const float* bias) {
  const int e_count = c.n_routed_experts, k = c.num_experts_per_tok;
  DCP_CHECK(e_count > 0 && k >= 1, internal, "route: the config has no routed experts");
  const bool noaux = c.topk_method == "noaux_tc";
  DCP_CHECK(!noaux || bias != nullptr, invalid_argument,
            "route: topk_method noaux_tc needs e_score_correction_bias");
  Routing r;
  r.k = k;
  r.experts.resize(static_cast<std::size_t>(tokens * k));
  r.weights.resize(static_cast<std::size_t>(tokens * k));
  std::vector<float> scores(static_cast<std::size_t>(e_count)), choice(scores.size());
  const int per_group = e_count / c.n_group;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * e_count;
    if (c.scoring_func == "softmax") {
      const float m = *std::max_element(l, l + e_count);
      float z = 0.0f;
      for (int e = 0; e < e_count; ++e) z += scores[e] = std::exp(l[e] - m);
      for (float& s : scores) s /= z;
    } else {
      for (int e = 0; e < e_count; ++e) scores[e] = 1.0f / (1.0f + std::exp(-l[e]));
    }
    for (int e = 0; e < e_count; ++e) choice[e] = scores[e] + (noaux ? bias[e] : 0.0f);
    if (c.topk_method != "greedy") {
      std::vector<float> group_score(static_cast<std::size_t>(c.n_group));
      for (int g = 0; g < c.n_group; ++g) {
        std::vector<float> members(choice.begin() + g * per_group,
                                   choice.begin() + (g + 1) * per_group);
        if (noaux) {
          const std::vector<int> two = top_k(members, 2);
          group_score[g] = members[two[0]] + members[two[1]];
        } else {
          group_score[g] = *std::max_element(members.begin(), members.end());
        }
      }
      std::vector<bool> kept(static_cast<std::size_t>(c.n_group), false);
      for (int g : top_k(group_score, c.topk_group)) kept[g] = true;
      for (int e = 0; e < e_count; ++e) {
        if (!kept[e / per_group]) choice[e] = 0.0f;  // masked groups' experts score 0
      }
    }
    const std::vector<int> chosen = top_k(choice, k);
    float* w = r.weights.data() + t * k;
    std::int32_t* ex = r.experts.data() + t * k;
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) {
      ex[i] = chosen[i];
      w[i] = scores[chosen[i]];  // the unbiased score
      sum += w[i];
    }
    const bool normalise = k > 1 && c.norm_topk_prob;
    if (normalise) {
      for (int i = 0; i < k; ++i) w[i] /= sum + 1e-20f;
    }
    if (c.scale_always() || !normalise) {
      for (int i = 0; i < k; ++i) w[i] *= static_cast<float>(c.routed_scaling_factor);
    }
  }
  return r;
}

}  // namespace dcp::moe
