// `dcp topology`: validate a parallel configuration and print the groups it implies.
#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.h"
#include "dcp/error.h"
#include "dcp/topology.h"
#include "parallel_flags.h"

namespace dcp::cli {
namespace {

struct TopologyOptions {
  ParallelFlags parallel;
  bool json = false;
};

void print_text(const Topology& t) {
  const ParallelConfig& c = t.config;
  std::printf("world size %d: tp %d, dp %d%s, attention TP %d (%d group%s); experts %s\n",
              t.world_size, c.tp_size, c.dp_size, c.enable_dp_attention ? " (DP attention)" : "",
              t.attn_tp_size, t.num_attn_tp_groups, t.num_attn_tp_groups == 1 ? "" : "s",
              c.ep_size == 1 ? "sliced over TP"
                             : str("over ", c.ep_size, " EP ranks, each sliced over ",
                                   c.tp_size / c.ep_size)
                                   .c_str());
  std::printf(
      "DCP size %d: %d group%s; combine backend %s%s; query %s; platform %s\n", c.dcp_size,
      t.num_dcp_groups, t.num_dcp_groups == 1 ? "" : "s", std::string(to_string(t.backend)).c_str(),
      c.dcp_comm_backend ? "" : " (auto)",
      c.replicate_q_proj ? "replicated projection" : (c.dcp_size > 1 ? "all-gather" : "local"),
      c.platform.name.c_str());
  std::printf("%6s %6s %6s %10s %10s %8s %9s\n", "rank", "tp", "dp", "attn_tp", "attn_grp", "dcp",
              "dcp_grp");
  for (const RankPlacement& p : t.ranks) {
    std::printf("%6d %6d %6d %10d %10d %8d %9d\n", p.global_rank, p.tp_rank, p.dp_rank,
                p.attn_tp_rank, p.attn_tp_group, p.dcp_rank, p.dcp_group);
  }
}

}  // namespace

void add_topology_command(CLI::App& app) {
  auto opt = std::make_shared<TopologyOptions>();
  CLI::App* cmd =
      app.add_subcommand("topology", "Validate a parallel configuration and print its rank groups");
  add_parallel_flags(cmd, opt->parallel);
  cmd->add_flag("--json", opt->json, "print one JSON object instead of a table");
  cmd->callback([opt] {
    const Topology t = resolve(opt->parallel.to_config());
    if (opt->json) {
      std::cout << to_json(t) << "\n";
    } else {
      print_text(t);
    }
  });
}

}  // namespace dcp::cli
