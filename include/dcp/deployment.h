// A deployment: the one place that turns a resolved Topology into a running system. Per rank it
// carves the communicators from the topology, loads the model (and the replicated draft) and
// builds the engine; it runs the ranks as threads of this process or as MPI processes; and it
// brings every rank's results back as bytes with integer headers. The command line, the
// benchmarks, the disaggregated runner and the tests all start ranks through it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/comm.h"
#include "dcp/engine.h"
#include "dcp/model.h"
#include "dcp/model_config.h"
#include "dcp/prefix_cache.h"
#include "dcp/topology.h"
#include "dcp/weights.h"

namespace dcp {

// How ranks run: threads of this process (the embedded default) or one MPI process per rank.
enum class RankTransport : std::uint8_t { threads, mpi };
std::string_view to_string(RankTransport t) noexcept;
// Parses "threads" / "mpi"; throws naming the parameter `comm` and the legal values.
RankTransport parse_rank_transport(std::string_view name);

// Where a model's weights come from: a checkpoint directory, a WeightSource the caller owns, or
// deterministic synthetic values.
struct ModelSource {
  ModelConfig config;
  std::string path;                       // a checkpoint directory; empty: see below
  const WeightSource* weights = nullptr;  // borrowed (must outlive the deployment)
  std::uint64_t synthetic_seed = 1234;    // neither given: synthetic weights of this seed,
  WeightDtype synthetic_dtype = WeightDtype::f32;  // in this dtype (FP8 projections if quantized)
  // Opens the weights (a borrowed source is wrapped, not copied).
  std::unique_ptr<WeightSource> open() const;
};

// The speculative draft model `name` names, beside `target`: "target:N" (the target's first N
// layers, its weights), a checkpoint folder, or a preset (synthetic weights of `preset_seed`, in
// the preset's dtype). Throws dcp::Error starting with `option`: invalid_argument for N outside [1,
// the target's layers], an unknown preset or a vocabulary other than the target's; io for an
// unreadable checkpoint.
ModelSource draft_source(const std::string& name, const ModelSource& target,
                         std::uint64_t preset_seed, std::string_view option);

struct DeploymentSpec {
  ModelSource model;
  ParallelConfig parallel;
  // Page size, KV dtype, capacity, kernel. Backend, replicate_q_proj and ep_size come from
  // `parallel` (the deployment overwrites them), so each is set in one place.
  ModelOptions model_options;
  EngineOptions engine;
  std::optional<ModelSource> draft;   // speculative decoding: replicated on every rank
  std::vector<RequestSpec> requests;  // dealt over the DP groups by deal_requests
  RankTransport transport = RankTransport::threads;
  std::chrono::milliseconds comm_timeout{std::chrono::seconds(300)};  // see LaunchOptions
  // Called on world rank 0 after every engine step (a progress line, say).
  std::function<void(const Engine&)> on_step;
};

// Speculative decoding in `spec`: `tokens` draft tokens a step (>= 1) from `draft`: "ngram:N"
// (prompt lookup, no draft model: EngineOptions::ngram_draft = N) or a model draft_source reads
// (`preset_seed` for a preset's weights). Errors as draft_source's, starting with `option`.
void set_speculation(DeploymentSpec& spec, int tokens, const std::string& draft,
                     std::uint64_t preset_seed, std::string_view option);

// The communicators one rank of a topology needs, carved from the world by the topology's
// placement (never re-derived from rank arithmetic elsewhere).
struct RankGroups {
  // The rank's TP group: its DP replica, or with DP attention the whole world (the dense and MoE
  // layers are sharded over it).
  std::unique_ptr<Communicator> tp;
  // Its attention TP group: the TP group itself, or with DP attention its attention group (a
  // contiguous slice of the TP group, ordered by attention-TP rank).
  std::unique_ptr<Communicator> attn_tp;
  std::unique_ptr<Communicator> dcp;  // its DCP group, a contiguous slice of the attention group
};
// Collective over `world` (world.size() == topology.world_size).
RankGroups carve_groups(Communicator& world, const Topology& topology);
// A group of one: the replicated draft's TP and DCP groups. Collective over `world`.
RankGroups solo_groups(Communicator& world);

// What one rank runs: its groups, its model shard, the draft (if any) and the engine.
class RankSystem {
 public:
  // Collective over `world`. Throws dcp::Error naming the parameter on a bad configuration.
  RankSystem(Communicator& world, const Topology& topology, const ModelSource& model,
             const ModelOptions& model_options, const EngineOptions& engine_options,
             const std::optional<ModelSource>& draft = std::nullopt);
  ~RankSystem();
  RankSystem(const RankSystem&) = delete;
  RankSystem& operator=(const RankSystem&) = delete;

  const RankPlacement& placement() const noexcept { return placement_; }
  Communicator& tp_group() noexcept { return *groups_.tp; }
  Communicator& attn_tp_group() noexcept { return *groups_.attn_tp; }
  Communicator& dcp_group() noexcept { return *groups_.dcp; }
  MlaModel& model() noexcept { return *model_; }
  MlaModel* draft() noexcept { return draft_.get(); }
  Engine& engine() noexcept { return *engine_; }
  double load_ms() const noexcept { return load_ms_; }

 private:
  RankPlacement placement_;
  RankGroups groups_;
  RankGroups draft_groups_;
  std::unique_ptr<MlaModel> model_;
  std::unique_ptr<MlaModel> draft_;
  std::unique_ptr<Engine> engine_;
  double load_ms_ = 0;
};

// ---- running ranks ----

// The most ranks one process runs as threads: beyond it a configuration is a cluster's, and
// thousands of threads would only exhaust the process.
inline constexpr int kMaxThreadRanks = 256;

struct LaunchOptions {
  RankTransport transport = RankTransport::threads;
  int world_size = 1;  // ranks the job needs
  // MPI only: when set, mpirun may start more processes than world_size; processes
  // [first_active_rank, first_active_rank + world_size) run the job and the rest wait for it.
  // Unset: mpirun must start exactly world_size processes.
  std::optional<int> first_active_rank;
  // How long a collective may wait for the other ranks before the job fails naming it (a rank
  // that stalled or died); zero waits forever. Both transports.
  std::chrono::milliseconds comm_timeout{std::chrono::seconds(300)};
};

// This process's MPI world (MPI is initialised on the first call and finalised at exit). Throws
// dcp::Error(unsupported) when dcp was built without MPI.
std::unique_ptr<Communicator> mpi_world();

// Runs fn(world, sole) on every rank: as threads of this process, or as this MPI process's rank.
// `sole` is true when the rank is the only one in its process (MPI). Processes outside the active
// range (first_active_rank) run nothing and wait for the job. Any rank's exception fails the call
// (threads: the others are released, the first error is rethrown).
void launch_ranks(const LaunchOptions& options,
                  const std::function<void(Communicator& world, bool sole)>& fn);

// What a launched job returns to this process.
template <class Report>
struct Launched {
  Report report;           // the reporter's (threads) or this process's rank's (MPI)
  bool reporting = false;  // this process holds world rank `reporter`'s report: print it
  bool active = false;     // this process ran a rank
};

// launch_ranks, keeping the value `fn` returns on world rank `reporter` (and, under MPI, each
// process's own, so that a teacher-forced rerun can read the results everywhere).
template <class Report, class Fn>
Launched<Report> launch(const LaunchOptions& options, int reporter, Fn&& fn) {
  Launched<Report> out;
  launch_ranks(options, [&](Communicator& world, bool sole) {
    Report r = fn(world);
    if (sole || world.rank() == reporter) {  // with threads only the reporter writes
      out.report = std::move(r);
      out.reporting = world.rank() == reporter;
      out.active = true;
    }
  });
  return out;
}

// ---- results as bytes ----

// Serialises results with 64-bit integer headers (ids, states, counts, lengths), logits as raw
// floats and errors as raw bytes: exact at any size.
std::vector<std::uint8_t> pack_results(const std::vector<RequestResult>& results);
std::vector<RequestResult> unpack_results(const std::vector<std::uint8_t>& bytes);
// Every rank gets the results of the ranks that contribute, concatenated in rank order and then
// sorted by request id. Collective over `world`.
std::vector<RequestResult> gather_results(Communicator& world, bool contribute,
                                          const std::vector<RequestResult>& mine);

// ---- a whole run ----

struct RankKv {
  std::int64_t rank = 0;
  std::int64_t dcp_rank = 0;
  std::int64_t dp_rank = 0;        // its DP replica or attention group
  std::int64_t requests = 0;       // requests its group served
  std::int64_t kv_rows_used = 0;   // peak rows held per layer
  std::int64_t kv_bytes = 0;       // pool bytes allocated, all layers
  std::int64_t kv_bytes_used = 0;  // peak rows x row bytes x layers
  std::int64_t weight_bytes = 0;   // weights held, in their dtypes (draft included)
};

struct DeploymentReport {
  CombineBackend backend = CombineBackend::ag_rs;  // the combine that ran (ag_rs at DCP 1)
  bool replicated_q = false;
  WeightDtype weight_dtype = WeightDtype::f32;  // the projection weights' dtype in memory
  WeightDtype expert_weight_dtype = WeightDtype::f32;  // the routed experts' (MlaModel's)
  std::int64_t logical_capacity_tokens = 0;
  std::vector<RankKv> ranks;  // every rank
  EngineStats stats;          // world rank 0's (ranks run in lockstep)
  std::int64_t peak_running = 0;
  std::vector<RequestResult> results;  // every request, by id
  double model_load_ms = 0;
  std::vector<PrefixCacheStats> cache;  // per rank, when the prefix cache is on
  // Disaggregated runs (prefill group -> KV transfer -> decode group).
  bool disaggregated = false;
  std::vector<std::int64_t> bytes_per_decode_rank;
  double transfer_ms = 0;
};

// The DP group (replica, or attention group with DP attention) each request goes to, given the
// KV tokens each will hold (prompt + max_new_tokens): in order, to the group with the most free
// KV, i.e. the fewest tokens dealt so far; ties to the lower group. Every rank computes the same.
std::vector<int> deal_requests(const std::vector<std::int64_t>& kv_tokens, int groups);
// One step of that deal: the group with the least load (ties to the lower group) gets a request
// of kv_tokens, and its load grows by them. A server keeps the loads of unfinished requests.
int deal_request(std::vector<std::int64_t>& group_load, std::int64_t kv_tokens);

// Refuses (unsupported, naming the field) a configuration that `dcp topology` and `dcp plan` may
// describe but this build cannot run: prefill context parallelism (pcp_size > 1) and a platform
// other than cpu (ranks run on this machine's CPU).
void check_runs_here(const ParallelConfig& parallel);

// Runs spec.requests on every rank of spec.parallel's topology; the report is world rank 0's.
// Throws dcp::Error naming the parameter on a configuration it cannot run. `first_active_rank`:
// see LaunchOptions.
Launched<DeploymentReport> run_deployment(const DeploymentSpec& spec,
                                          std::optional<int> first_active_rank = std::nullopt);

}  // namespace dcp
