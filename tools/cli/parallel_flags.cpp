#include "parallel_flags.h"

namespace dcp::cli {

ParallelConfig ParallelFlags::to_config() const {
  ParallelConfig c;
  c.tp_size = tp_size;
  c.dp_size = dp_size;
  c.enable_dp_attention = enable_dp_attention;
  c.dcp_size = dcp_size;
  c.pcp_size = pcp_size;
  c.ep_size = ep_size;
  if (!dcp_comm_backend.empty()) c.dcp_comm_backend = parse_combine_backend(dcp_comm_backend);
  c.replicate_q_proj = replicate_q_proj.value_or(false);
  c.platform = Platform::parse(platform);
  return c;
}

void add_parallel_flags(CLI::App* cmd, ParallelFlags& f) {
  cmd->add_option("--tp-size", f.tp_size, "tensor parallel size")->capture_default_str();
  cmd->add_option("--dp-size", f.dp_size, "data parallel size")->capture_default_str();
  cmd->add_flag("--enable-dp-attention", f.enable_dp_attention,
                "attention data parallelism: DP replicas share the TP world (attn_tp = tp / dp)");
  cmd->add_option("--dcp-size,--decode-context-parallel-size", f.dcp_size,
                  "decode context parallel size N")
      ->capture_default_str();
  cmd->add_option("--pcp-size", f.pcp_size, "prefill context parallel size (exclusive with DCP)")
      ->capture_default_str();
  cmd->add_option("--ep-size", f.ep_size,
                  "expert parallel size: routed experts partitioned over this many ranks of the TP "
                  "group (divides --tp-size), tokens sent to them by all-to-all")
      ->capture_default_str();
  cmd->add_option("--dcp-comm-backend", f.dcp_comm_backend,
                  "combine backend: ag_rs, a2a or fi_a2a (default: auto)");
  CLI::Option* on = cmd->add_flag_callback(
      "--dcp-replicate-q-proj", [&f] { f.replicate_q_proj = true; },
      "replicate the query projection over the DCP group (no query all-gather; the default for "
      "Kimi-K3 with an all-to-all combine)");
  CLI::Option* off = cmd->add_flag_callback(
      "--no-dcp-replicate-q-proj", [&f] { f.replicate_q_proj = false; },
      "gather the query over the DCP group instead (turns Kimi-K3's default off)");
  on->excludes(off);
  cmd->add_option("--platform", f.platform, "cpu, cuda or blackwell-mnnvl (for the backend rules)")
      ->capture_default_str();
}

}  // namespace dcp::cli
