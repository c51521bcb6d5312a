// Runs one engine workload on every rank of a TP group (threads or MPI) and reports it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dcp/comm.h"
#include "dcp/engine.h"
#include "dcp/model_config.h"
#include "dcp/prefix_cache.h"
#include "dcp/topology.h"

namespace dcp::cli {

struct Workload {
  ModelConfig model;
  std::string model_path;  // empty: synthetic weights
  std::uint64_t weight_seed = 1234;
  ParallelConfig parallel;
  ModelOptions model_options;  // backend, replicated Q, KV dtype, page size, capacity
  EngineOptions engine;
  std::vector<RequestSpec> requests;
  // Speculative decoding: the draft model, replicated on every rank (TP 1, DCP 1).
  std::optional<ModelConfig> draft_model;
  std::string draft_path;  // empty: synthetic weights with draft_seed
  std::uint64_t draft_seed = 1234;
  std::string comm = "threads";  // threads or mpi
  // Disaggregation: prefill on its own group of prefill_dcp_size ranks (TP = DCP), then the KV
  // moves to the decode group (the --tp-size / --dcp-size ranks).
  bool disaggregate = false;
  int prefill_dcp_size = 1;
  bool progress = false;  // progress line on stderr (rank 0)
  // MPI: run on processes [first_active_rank, first_active_rank + world size) and let the rest
  // wait (the --verify reference of a disaggregated run runs on the decode processes only).
  bool allow_idle_ranks = false;
  int first_active_rank = 0;
};

struct RankKv {
  std::int64_t rank = 0;
  std::int64_t dcp_rank = 0;
  std::int64_t kv_rows_used = 0;   // peak rows held per layer
  std::int64_t kv_bytes = 0;       // pool bytes allocated, all layers
  std::int64_t kv_bytes_used = 0;  // peak rows x row bytes x layers
};

struct RunReport {
  CombineBackend backend = CombineBackend::ag_rs;
  bool replicated_q = false;
  std::int64_t logical_capacity_tokens = 0;
  std::vector<RankKv> ranks;
  EngineStats stats;  // rank 0's
  std::vector<RequestResult> results;
  double model_load_ms = 0;
  std::vector<PrefixCacheStats> cache;  // per rank, when the prefix cache is on
  // Disaggregation.
  bool disaggregated = false;
  std::vector<std::int64_t> bytes_per_decode_rank;
  double transfer_ms = 0;
};

// Runs the workload on every rank. The report is complete on every process (ranks run in
// lockstep); `is_root` says whether this process should print it.
RunReport run_workload(const Workload& w, bool* is_root);

}  // namespace dcp::cli
