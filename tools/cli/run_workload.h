// `dcp run`'s options and the deployment they describe: flags in, a library DeploymentSpec out.
#pragma once

#include <cstdint>
#include <string>

#include "cli/parallel_flags.h"
#include "dcp/deployment.h"

namespace dcp::cli {

struct RunOptions {
  ParallelFlags parallel;
  std::string model_path;
  std::string preset = "tiny";
  int num_layers = 0;
  int page_size = 64;
  int kv_interleave = 1;  // --dcp-kv-cache-interleave-size
  std::string kv_cache_dtype = "bf16";
  std::string attention_kernel = "automatic";
  std::string weight_kernel = "automatic";
  int threads_per_rank = 1;
  int chunked_prefill_size = 2048;
  std::int64_t max_total_tokens = 0;  // 0: enough for the workload
  int batch = 4;
  int prompt_len = 4000;
  int max_new_tokens = 32;
  std::uint64_t seed = 1;
  std::string comm = "threads";
  double comm_timeout_s = 300;
  bool verify = true;
  std::string json_path;
  std::string prompt_tokens;
  std::string dump_logits;
  int spec_tokens = 0;
  std::string spec_draft = "target:1";
  std::string dcp_extend = "gather";
  bool disaggregate = false;
  int prefill_dcp_size = 1;
  bool prefix_cache = false;
  std::int64_t host_kv_tokens = 0;
  int shared_prefix_len = 0;
  int max_running = 64;
};

// What `dcp run` runs: the deployment, and where its prefill group goes when disaggregated.
struct Workload {
  DeploymentSpec spec;
  std::string model_label;  // "preset:NAME" or the checkpoint path
  bool disaggregate = false;
  int prefill_dcp_size = 1;
};

// Checks the options against each other and the model, sizes the KV cache (refusing a workload
// larger than this machine's memory before anything is allocated) and makes the prompts.
Workload build_workload(const RunOptions& o);

// The flags `dcp run` and `dcp serve` share: the model, its KV cache, the engine, how ranks run.
void add_deployment_flags(CLI::App* cmd, RunOptions& o);

// The process count and this process's rank in the mpirun (OpenMPI, or MPICH's Hydra) that
// started us, read before MPI starts: 1 and 0 without one.
int launcher_world_size();
int launcher_rank();

// The path that runs: automatic resolved to this CPU's fastest exact path.
std::string kernel_name(KernelPath k);

}  // namespace dcp::cli
