#include "dcp/topology.h"

#include <nlohmann/json.hpp>

#include "dcp/error.h"

namespace dcp {
namespace {

std::string divisors(int n) {
  std::string s;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) s += (s.empty() ? "" : ", ") + std::to_string(d);
  }
  return s;
}

void reject(const std::string& message) {
  throw Error(ErrorCategory::invalid_argument, message);
}

}  // namespace

std::string_view to_string(CombineBackend b) noexcept {
  switch (b) {
    case CombineBackend::ag_rs: return "ag_rs";
    case CombineBackend::a2a: return "a2a";
    case CombineBackend::fi_a2a: return "fi_a2a";
  }
  return "?";
}

CombineBackend parse_combine_backend(std::string_view name) {
  if (name == "ag_rs") return CombineBackend::ag_rs;
  if (name == "a2a") return CombineBackend::a2a;
  if (name == "fi_a2a") return CombineBackend::fi_a2a;
  reject(str("dcp_comm_backend = '", std::string(name), "' is not one of: ag_rs, a2a, fi_a2a"));
  return CombineBackend::ag_rs;
}

Platform Platform::parse(std::string_view name) {
  if (name == "cpu") return cpu();
  if (name == "cuda") return cuda();
  if (name == "blackwell-mnnvl") return blackwell_mnnvl();
  reject(str("platform = '", std::string(name), "' is not one of: cpu, cuda, blackwell-mnnvl"));
  return cpu();
}

void validate(const ParallelConfig& c) {
  if (c.tp_size < 1) reject(str("tp_size = ", c.tp_size, " must be >= 1"));
  if (c.dp_size < 1) reject(str("dp_size = ", c.dp_size, " must be >= 1"));
  if (c.dcp_size < 1) reject(str("dcp_size = ", c.dcp_size, " must be >= 1"));
  if (c.pcp_size < 1) reject(str("pcp_size = ", c.pcp_size, " must be >= 1"));
  if (c.ep_size < 1 || c.tp_size % c.ep_size != 0) {
    reject(str("ep_size = ", c.ep_size, " must divide tp_size = ", c.tp_size,
               "; legal ep_size values: ", divisors(c.tp_size)));
  }
  if (c.enable_dp_attention && c.tp_size % c.dp_size != 0) {
    reject(str("dp_size = ", c.dp_size, " must divide tp_size = ", c.tp_size,
               " with enable_dp_attention; legal dp_size values: ", divisors(c.tp_size)));
  }
  if (c.tp_size % c.dcp_size != 0) {
    reject(str("dcp_size = ", c.dcp_size, " must divide tp_size = ", c.tp_size,
               "; legal dcp_size values: ", divisors(c.tp_size)));
  }
  const int attn_tp = c.attn_tp_size();
  if (attn_tp % c.dcp_size != 0) {
    reject(str("dcp_size = ", c.dcp_size, " must divide the attention TP size ", attn_tp,
               " (tp_size = ", c.tp_size, " / dp_size = ", c.dp_size,
               " with enable_dp_attention): a DCP group may not cross a DP replica; legal "
               "dcp_size values: ",
               divisors(attn_tp)));
  }
  if (c.dcp_size > 1 && c.pcp_size > 1) {
    reject(str("dcp_size = ", c.dcp_size,
               " cannot be combined with prefill context parallelism (pcp_size = ", c.pcp_size,
               "); use one of them"));
  }
  if (c.dcp_comm_backend && *c.dcp_comm_backend != CombineBackend::ag_rs && c.dcp_size == 1) {
    reject(str("dcp_comm_backend = ", to_string(*c.dcp_comm_backend),
               " needs dcp_size > 1 (legal with dcp_size = 1: ag_rs, or leave it unset)"));
  }
  if (c.dcp_comm_backend == CombineBackend::fi_a2a && !(c.platform.blackwell && c.platform.mnnvl)) {
    throw Error(ErrorCategory::unsupported,
                str("dcp_comm_backend = fi_a2a needs Blackwell GPUs whose DCP group shares one "
                    "MNNVL domain; platform '",
                    c.platform.name, "' has none (legal here: ag_rs",
                    c.platform.has_all_to_all ? ", a2a" : "", ")"));
  }
  if (c.dcp_comm_backend == CombineBackend::a2a && !c.platform.has_all_to_all) {
    throw Error(ErrorCategory::unsupported, str("dcp_comm_backend = a2a needs an all-to-all path; "
                                                "platform '",
                                                c.platform.name, "' has none (legal: ag_rs)"));
  }
  if (c.replicate_q_proj) {
    if (c.dcp_size == 1) reject("replicate_q_proj needs dcp_size > 1");
    const CombineBackend b = effective_backend(c);
    if (b == CombineBackend::ag_rs) {
      reject(
          str("replicate_q_proj needs an all-to-all combine (dcp_comm_backend = a2a or "
              "fi_a2a); the effective backend is ag_rs"));
    }
  }
}

CombineBackend effective_backend(const ParallelConfig& c) {
  if (c.dcp_comm_backend) return *c.dcp_comm_backend;
  if (c.dcp_size == 1) return CombineBackend::ag_rs;
  if (c.platform.blackwell && c.platform.mnnvl) return CombineBackend::fi_a2a;
  if (c.platform.has_all_to_all) return CombineBackend::a2a;
  return CombineBackend::ag_rs;
}

Topology resolve(const ParallelConfig& c) {
  validate(c);
  Topology t;
  t.config = c;
  t.backend = effective_backend(c);
  t.world_size = c.world_size();
  t.attn_tp_size = c.attn_tp_size();
  t.num_attn_tp_groups = t.world_size / t.attn_tp_size;
  t.num_dcp_groups = t.world_size / c.dcp_size;
  t.ranks.resize(t.world_size);
  for (int g = 0; g < t.world_size; ++g) {
    RankPlacement& p = t.ranks[g];
    p.global_rank = g;
    if (c.enable_dp_attention) {
      p.tp_rank = g;
      p.dp_rank = g / t.attn_tp_size;
    } else {
      p.tp_rank = g % c.tp_size;
      p.dp_rank = g / c.tp_size;
    }
    p.attn_tp_group = g / t.attn_tp_size;
    p.attn_tp_rank = g % t.attn_tp_size;
    p.dcp_rank = p.attn_tp_rank % c.dcp_size;
    p.dcp_group = g / c.dcp_size;  // attention-TP groups are contiguous and divisible by dcp
  }
  return t;
}

std::vector<std::vector<int>> Topology::dcp_groups() const {
  std::vector<std::vector<int>> groups(num_dcp_groups);
  for (const RankPlacement& p : ranks) {
    auto& g = groups[p.dcp_group];
    if (static_cast<int>(g.size()) <= p.dcp_rank) g.resize(p.dcp_rank + 1, -1);
    g[p.dcp_rank] = p.global_rank;
  }
  return groups;
}

std::string to_json(const Topology& t) {
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (const RankPlacement& p : t.ranks) {
    ranks.push_back({{"global_rank", p.global_rank},
                     {"tp_rank", p.tp_rank},
                     {"dp_rank", p.dp_rank},
                     {"attn_tp_rank", p.attn_tp_rank},
                     {"attn_tp_group", p.attn_tp_group},
                     {"dcp_rank", p.dcp_rank},
                     {"dcp_group", p.dcp_group}});
  }
  const ParallelConfig& c = t.config;
  const nlohmann::ordered_json out = {{"tp_size", c.tp_size},
                                      {"dp_size", c.dp_size},
                                      {"enable_dp_attention", c.enable_dp_attention},
                                      {"dcp_size", c.dcp_size},
                                      {"pcp_size", c.pcp_size},
                                      {"ep_size", c.ep_size},
                                      {"dcp_comm_backend", std::string(to_string(t.backend))},
                                      {"dcp_comm_backend_auto", !c.dcp_comm_backend.has_value()},
                                      {"dcp_replicate_q_proj", c.replicate_q_proj},
                                      {"platform", c.platform.name},
                                      {"world_size", t.world_size},
                                      {"attn_tp_size", t.attn_tp_size},
                                      {"num_attn_tp_groups", t.num_attn_tp_groups},
                                      {"num_dcp_groups", t.num_dcp_groups},
                                      {"dcp_groups", t.dcp_groups()},
                                      {"ranks", ranks}};
  return out.dump(2);
}

}  // namespace dcp
