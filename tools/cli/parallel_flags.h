// The parallel-configuration flags, named as the upstream server names them, shared by the
// subcommands that take them (topology, run, bench, plan).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "dcp/topology.h"

namespace dcp::cli {

struct ParallelFlags {
  int tp_size = 1;
  int dp_size = 1;
  bool enable_dp_attention = false;
  int dcp_size = 1;
  int pcp_size = 1;
  int ep_size = 1;
  std::string dcp_comm_backend;  // empty = auto
  // --dcp-replicate-q-proj / --no-dcp-replicate-q-proj; unset: off, except the model's own
  // default where a command knows the model (Kimi-K3: on, as upstream).
  std::optional<bool> replicate_q_proj;
  std::string platform = "cpu";

  // Builds the config; throws dcp::Error naming the flag on a bad backend/platform name.
  ParallelConfig to_config() const;
};

void add_parallel_flags(CLI::App* cmd, ParallelFlags& flags);

}  // namespace dcp::cli
