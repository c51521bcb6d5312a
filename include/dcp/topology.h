// Parallel configuration, its validation, and the rank groups it implies.
//
// The DCP group is carved out of an attention-TP group: with attention DP, the TP world of
// tp_size ranks holds dp_size replicas of attn_tp = tp / dp ranks each; without it, each of the
// dp_size replicas is its own TP group of tp_size ranks (attn_tp = tp). DCP groups are
// contiguous slices of each attention-TP group, so dcp_rank = attn_tp_rank % dcp_size and a
// gathered query is a contiguous block of heads. validate() checks containment
// (attn_tp % dcp == 0), which the upstream engine does not check at startup.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dcp {

enum class CombineBackend : std::uint8_t { ag_rs, a2a, fi_a2a };
std::string_view to_string(CombineBackend b) noexcept;
// Parses "ag_rs" / "a2a" / "fi_a2a"; throws naming dcp_comm_backend and the legal values.
CombineBackend parse_combine_backend(std::string_view name);

// What the hardware offers the combine.
struct Platform {
  std::string name = "cpu";
  bool has_all_to_all = true;  // an all-to-all path exists (threads, MPI, NCCL)
  bool blackwell = false;      // Blackwell GPUs
  bool mnnvl = false;          // the DCP group shares one MNNVL domain

  static Platform cpu() { return {}; }
  static Platform cuda() { return {"cuda", true, false, false}; }
  static Platform blackwell_mnnvl() { return {"blackwell-mnnvl", true, true, true}; }
  // Parses "cpu" / "cuda" / "blackwell-mnnvl"; throws naming platform otherwise.
  static Platform parse(std::string_view name);
};

struct ParallelConfig {
  int tp_size = 1;                                 // --tp-size
  int dp_size = 1;                                 // --dp-size
  bool enable_dp_attention = false;                // --enable-dp-attention
  int dcp_size = 1;                                // --dcp-size / --decode-context-parallel-size
  int pcp_size = 1;                                // --pcp-size: prefill context parallelism
  // --ep-size: routed experts partitioned over ep_size ranks of the TP group (each expert sliced
  // over tp_size / ep_size ranks) instead of sliced over all of them
  int ep_size = 1;
  std::optional<CombineBackend> dcp_comm_backend;  // --dcp-comm-backend; empty = auto
  bool replicate_q_proj = false;                   // --dcp-replicate-q-proj
  Platform platform;

  int world_size() const noexcept { return enable_dp_attention ? tp_size : tp_size * dp_size; }
  int attn_tp_size() const noexcept {
    return enable_dp_attention && dp_size > 0 ? tp_size / dp_size : tp_size;
  }
};

// Throws dcp::Error(invalid_argument or unsupported) naming the parameter and the legal values
// ("dcp_size = 3 must divide tp_size = 4"); the command line shows its flags instead.
void validate(const ParallelConfig& c);

// The auto rule: fi_a2a on Blackwell when the group shares one MNNVL domain, else a2a where an
// all-to-all path exists, else ag_rs. DCP size 1 takes no collective and resolves to ag_rs.
CombineBackend effective_backend(const ParallelConfig& c);

struct RankPlacement {
  int global_rank = 0;
  int tp_rank = 0;        // rank in its TP group
  int dp_rank = 0;        // which DP replica
  int attn_tp_rank = 0;   // rank in its attention-TP group
  int attn_tp_group = 0;  // index of its attention-TP group
  int dcp_rank = 0;       // attn_tp_rank % dcp_size
  int dcp_group = 0;      // index of its DCP group
};

struct Topology {
  ParallelConfig config;
  CombineBackend backend = CombineBackend::ag_rs;  // effective
  int world_size = 1;
  int attn_tp_size = 1;
  int num_attn_tp_groups = 1;
  int num_dcp_groups = 1;
  std::vector<RankPlacement> ranks;  // [world_size]

  // Global ranks of every DCP group, each in dcp_rank order.
  std::vector<std::vector<int>> dcp_groups() const;
};

// validate() then build every rank's placement.
Topology resolve(const ParallelConfig& c);

// The resolved configuration, its groups and every rank's placement as one JSON object (indented
// by two): what `dcp topology --json` prints and Python's dcp.topology() returns.
std::string to_json(const Topology& t);

}  // namespace dcp
