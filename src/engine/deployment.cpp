#include "dcp/deployment.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/bytes.h"
#include "dcp/comm_mpi.h"
#include "dcp/comm_threads.h"
#include "dcp/error.h"
#include "dcp/timing.h"
#include "engine/logprobs_bytes.h"

namespace dcp {

std::string_view to_string(RankTransport t) noexcept {
  return t == RankTransport::mpi ? "mpi" : "threads";
}

RankTransport parse_rank_transport(std::string_view name) {
  if (name == "threads") return RankTransport::threads;
  if (name == "mpi") return RankTransport::mpi;
  throw Error(ErrorCategory::invalid_argument,
              str("comm = '", name, "' is not one of: threads, mpi"));
}

namespace {

// A WeightSource the caller owns, handed out behind the same interface as an opened one.
class BorrowedWeights final : public WeightSource {
 public:
  explicit BorrowedWeights(const WeightSource& w) : w_(w) {}
  std::vector<float> load(const std::string& name, const std::vector<std::int64_t>& shape,
                          Range rows, Range cols) const override {
    return w_.load(name, shape, rows, cols);
  }
  WeightMatrix load_matrix(const std::string& name, const std::vector<std::int64_t>& shape,
                           Range rows, Range cols) const override {
    return w_.load_matrix(name, shape, rows, cols);
  }
  bool contains(const std::string& name) const override { return w_.contains(name); }
  std::string describe() const override { return w_.describe(); }

 private:
  const WeightSource& w_;
};

}  // namespace

std::unique_ptr<WeightSource> ModelSource::open() const {
  if (weights) return std::make_unique<BorrowedWeights>(*weights);
  if (!path.empty()) return open_checkpoint(path);
  return make_synthetic_weights(synthetic_seed, config, synthetic_dtype);
}

namespace {

// The N of "<prefix>N": the whole rest must be the number ("target:3x" is refused); 0 when it is
// not.
long long count_after(const std::string& name, std::string_view prefix) {
  const std::string count = name.substr(prefix.size());
  std::size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(count, &used);
  } catch (const std::exception&) {
    return 0;
  }
  return used == count.size() ? n : 0;
}

}  // namespace

ModelSource draft_source(const std::string& name, const ModelSource& target,
                         std::uint64_t preset_seed, std::string_view option) {
  const std::string who = str(option, " '", name, "'");
  ModelSource d;
  if (name.rfind("target:", 0) == 0) {
    const long long layers = count_after(name, "target:");
    DCP_ARG_CHECK(layers >= 1 && layers <= target.config.num_hidden_layers, who,
                  ": target:N needs 1 <= N <= ", target.config.num_hidden_layers);
    d = target;
    d.config.num_hidden_layers = static_cast<int>(layers);
  } else if (std::error_code ec; std::filesystem::is_directory(name, ec)) {
    try {
      d.config = read_checkpoint_config(name);
    } catch (const Error& e) {  // the message names the folder
      throw Error(e.category(), str(option, ": ", e.what()));
    }
    d.path = name;
  } else {
    try {
      d.config = preset_config(name);
      d.synthetic_dtype = preset_weight_dtype(name);
    } catch (const Error&) {
      throw Error(ErrorCategory::invalid_argument,
                  str(who, " is neither ngram:N, target:N, a checkpoint folder nor a preset (",
                      preset_names(), ")"));
    }
    d.synthetic_seed = preset_seed;
  }
  DCP_ARG_CHECK(d.config.vocab_size == target.config.vocab_size, who, " has a vocabulary of ",
                d.config.vocab_size, ", the target ", target.config.vocab_size);
  return d;
}

void set_speculation(DeploymentSpec& spec, int tokens, const std::string& draft,
                     std::uint64_t preset_seed, std::string_view option) {
  DCP_ARG_CHECK(tokens >= 1, "speculative draft tokens = ", tokens, " must be >= 1");
  spec.engine.num_draft_tokens = tokens;
  if (draft.rfind("ngram:", 0) != 0) {
    spec.engine.ngram_draft = 0;
    spec.draft = draft_source(draft, spec.model, preset_seed, option);
    return;
  }
  const long long n = count_after(draft, "ngram:");
  DCP_ARG_CHECK(n >= 1 && n <= 1024, option, " '", draft,
                "': ngram:N needs 1 <= N <= 1024 (the longest suffix looked up)");
  spec.engine.ngram_draft = static_cast<int>(n);
  spec.draft.reset();
}

RankGroups carve_groups(Communicator& world, const Topology& topology) {
  DCP_ARG_CHECK(world.size() == topology.world_size, "the world has ", world.size(),
                " ranks; the topology needs world_size = ", topology.world_size);
  const RankPlacement& me = topology.ranks[static_cast<std::size_t>(world.rank())];
  RankGroups g;
  // Without attention DP each replica is its own TP group; with it the TP group is the world.
  g.tp = world.split(topology.config.enable_dp_attention ? 0 : me.dp_rank, me.tp_rank);
  g.attn_tp = world.split(me.attn_tp_group, me.attn_tp_rank);
  g.dcp = world.split(me.dcp_group, me.dcp_rank);
  return g;
}

RankGroups solo_groups(Communicator& world) {
  RankGroups g;
  g.tp = world.split(world.rank(), 0);
  g.attn_tp = world.split(world.rank(), 0);
  g.dcp = world.split(world.rank(), 0);
  return g;
}

std::vector<int> deal_requests(const std::vector<std::int64_t>& kv_tokens, int groups) {
  DCP_ARG_CHECK(groups >= 1, "groups = ", groups, " must be >= 1");
  std::vector<std::int64_t> dealt(static_cast<std::size_t>(groups), 0);
  std::vector<int> to;
  to.reserve(kv_tokens.size());
  for (const std::int64_t n : kv_tokens) to.push_back(deal_request(dealt, n));
  return to;
}

int deal_request(std::vector<std::int64_t>& group_load, std::int64_t kv_tokens) {
  DCP_ARG_CHECK(!group_load.empty(), "deal_request needs >= 1 group");
  const auto least = std::min_element(group_load.begin(), group_load.end());
  *least += kv_tokens;
  return static_cast<int>(least - group_load.begin());
}

RankSystem::RankSystem(Communicator& world, const Topology& topology, const ModelSource& model,
                       const ModelOptions& model_options, const EngineOptions& engine_options,
                       const std::optional<ModelSource>& draft)
    : placement_(topology.ranks.at(static_cast<std::size_t>(world.rank()))),
      groups_(carve_groups(world, topology)) {
  const auto t0 = Clock::now();
  ModelOptions mo = model_options;
  const bool striped = groups_.dcp->size() > 1;
  mo.backend = striped ? topology.backend : CombineBackend::ag_rs;
  mo.replicate_q_proj = topology.config.replicate_q_proj && striped;  // the topology decides
  mo.ep_size = topology.config.ep_size;
  {
    const std::unique_ptr<WeightSource> weights = model.open();
    // With DP attention the dense and MoE layers span the whole TP group.
    model_ = std::make_unique<MlaModel>(model.config, *weights, *groups_.attn_tp, *groups_.dcp, mo,
                                        groups_.tp.get());
  }
  if (draft) {  // replicated: TP 1 and DCP 1 on every rank
    draft_groups_ = solo_groups(world);
    ModelOptions dmo = model_options;
    dmo.ep_size = 1;
    dmo.backend = CombineBackend::ag_rs;
    dmo.replicate_q_proj = false;
    const std::unique_ptr<WeightSource> weights = draft->open();
    draft_ = std::make_unique<MlaModel>(draft->config, *weights, *draft_groups_.tp,
                                        *draft_groups_.dcp, dmo);
  }
  load_ms_ = ms_since(t0);
  engine_ = std::make_unique<Engine>(*model_, engine_options, draft_.get());
}

RankSystem::~RankSystem() = default;

// ---- running ranks ----

std::unique_ptr<Communicator> mpi_world() {
  static std::unique_ptr<MpiSession> session;  // one per process, finalised at exit
  if (!session) session = std::make_unique<MpiSession>(nullptr, nullptr);
  return session->world();
}

void launch_ranks(const LaunchOptions& o, const std::function<void(Communicator&, bool)>& fn) {
  DCP_ARG_CHECK(o.world_size >= 1, "world_size = ", o.world_size, " must be >= 1");
  DCP_ARG_CHECK(o.comm_timeout.count() >= 0, "comm_timeout = ", o.comm_timeout.count() / 1000.0,
                " s must be >= 0 (0: wait forever)");
  if (o.transport == RankTransport::threads) {
    DCP_ARG_CHECK(o.world_size <= kMaxThreadRanks, "the configuration needs ", o.world_size,
                  " ranks; comm = threads runs at most ", kMaxThreadRanks,
                  " in one process (use comm = mpi, one process per rank)");
    set_blas_threads(1);  // ranks are the parallelism; BLAS threads would oversubscribe
    ThreadsOptions to;
    // "Forever" as a deadline that a steady clock cannot reach in practice (a century).
    to.timeout = o.comm_timeout.count() > 0 ? o.comm_timeout
                                            : std::chrono::milliseconds(std::chrono::hours(876000));
    run_threads(o.world_size, [&](Communicator& world) { fn(world, o.world_size == 1); }, to);
    return;
  }
  set_mpi_timeout(o.comm_timeout);
  std::unique_ptr<Communicator> world = mpi_world();
  if (!o.first_active_rank) {
    DCP_ARG_CHECK(world->size() == o.world_size, "comm = mpi: mpirun started ", world->size(),
                  " processes but the configuration needs world_size = ", o.world_size);
    set_blas_threads(1);
    fn(*world, true);
    return;
  }
  const int first = *o.first_active_rank;
  DCP_ARG_CHECK(first >= 0 && first + o.world_size <= world->size(), "comm = mpi: ranks [", first,
                ", ", first + o.world_size, ") do not fit the ", world->size(),
                " processes mpirun started");
  const bool active = world->rank() >= first && world->rank() < first + o.world_size;
  std::unique_ptr<Communicator> part = world->split(active ? 0 : 1, world->rank());
  world->barrier();
  if (active) {
    set_blas_threads(1);
    fn(*part, true);
  }
  world->barrier();  // the idle processes wait for the active ones
}

// ---- results as bytes ----


std::vector<std::uint8_t> pack_results(const std::vector<RequestResult>& results) {
  std::vector<std::uint8_t> bytes;
  ByteWriter w(bytes);
  for (const RequestResult& r : results) {
    w.i64(r.id);
    w.i64(static_cast<std::int64_t>(r.state));
    w.i64(static_cast<std::int64_t>(r.finish_reason));
    w.i64(static_cast<std::int64_t>(r.output_tokens.size()));
    w.raw(r.output_tokens.data(), r.output_tokens.size() * sizeof(std::int32_t));
    w.i64(static_cast<std::int64_t>(r.step_logits.size()));
    w.raw(r.step_logits.data(), r.step_logits.size() * sizeof(float));
    w.i64(static_cast<std::int64_t>(r.error.size()));
    w.raw(r.error.data(), r.error.size());
    write_logprobs(w, r.logprobs);
    write_logprobs(w, r.prompt_logprobs);
    w.i64(r.cached_prompt_tokens);
    w.i64(r.spec_verify_steps);
  }
  return bytes;
}

std::vector<RequestResult> unpack_results(const std::vector<std::uint8_t>& bytes) {
  std::vector<RequestResult> out;
  ByteReader in(bytes);
  while (!in.done()) {
    RequestResult r;
    r.id = in.i64();
    r.state = static_cast<RequestState>(in.i64());
    r.finish_reason = static_cast<FinishReason>(in.i64());
    r.output_tokens.resize(in.count(sizeof(std::int32_t)));
    in.raw(r.output_tokens.data(), r.output_tokens.size() * sizeof(std::int32_t));
    r.step_logits.resize(in.count(sizeof(float)));
    in.raw(r.step_logits.data(), r.step_logits.size() * sizeof(float));
    r.error.resize(in.count(1));
    in.raw(r.error.data(), r.error.size());
    r.logprobs = read_logprobs(in);
    r.prompt_logprobs = read_logprobs(in);
    r.cached_prompt_tokens = in.i64();
    r.spec_verify_steps = in.i64();
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<RequestResult> gather_results(Communicator& world, bool contribute,
                                          const std::vector<RequestResult>& mine) {
  const std::vector<std::vector<std::uint8_t>> parts = all_gather_bytes(
      world, contribute ? pack_results(mine) : std::vector<std::uint8_t>{});
  std::vector<RequestResult> out;
  for (const std::vector<std::uint8_t>& bytes : parts) {
    std::vector<RequestResult> part = unpack_results(bytes);
    std::move(part.begin(), part.end(), std::back_inserter(out));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const RequestResult& a, const RequestResult& b) { return a.id < b.id; });
  return out;
}

// ---- a whole run ----

namespace {

DeploymentReport run_rank(const DeploymentSpec& spec, const Topology& topo, Communicator& world) {
  RankSystem sys(world, topo, spec.model, spec.model_options, spec.engine, spec.draft);
  MlaModel& model = sys.model();
  Engine& engine = sys.engine();
  const RankPlacement& me = sys.placement();
  std::vector<std::int64_t> kv_tokens;
  for (const RequestSpec& r : spec.requests)
    kv_tokens.push_back(static_cast<std::int64_t>(r.prompt.size()) + r.max_new_tokens);
  std::vector<int> group = deal_requests(kv_tokens, spec.parallel.dp_size);
  for (std::size_t i = 0; i < spec.requests.size(); ++i) {  // a continuation stays with its KV
    if (!spec.requests[i].continue_from) continue;
    for (std::size_t j = 0; j < i; ++j)
      if (spec.requests[j].id == *spec.requests[i].continue_from) group[i] = group[j];
  }
  std::int64_t served = 0;
  for (std::size_t i = 0; i < spec.requests.size(); ++i) {
    if (group[i] != me.dp_rank) continue;
    engine.submit(spec.requests[i]);
    ++served;
  }
  engine.run([&](const Engine& e) {
    if (world.rank() == 0 && spec.on_step) spec.on_step(e);
  });

  // Per-rank figures to every rank (small all-gathers on the world).
  const std::int64_t row_bytes =
      static_cast<std::int64_t>(model.kv_shard(0).pool().geometry().row_bytes());
  const std::int64_t layers = model.config().num_hidden_layers;
  const std::int64_t weights = static_cast<std::int64_t>(
      model.weight_bytes() + (sys.draft() ? sys.draft()->weight_bytes() : 0));
  const std::int64_t peak_rows = engine.stats().peak_kv_rows;
  const RankKv mine{world.rank(),
                    sys.dcp_group().rank(),
                    me.dp_rank,
                    served,
                    peak_rows,
                    static_cast<std::int64_t>(model.kv_bytes()),
                    peak_rows * row_bytes * layers,
                    weights};
  DeploymentReport report;
  report.ranks.resize(static_cast<std::size_t>(world.size()));
  world.all_gather(&mine, report.ranks.data(), sizeof(RankKv));
  if (engine.prefix_cache()) {
    const PrefixCacheStats cs = engine.prefix_cache()->stats();
    report.cache.resize(static_cast<std::size_t>(world.size()));
    world.all_gather(&cs, report.cache.data(), sizeof cs);
  }
  // Each replica's (attention group's) first rank contributes its requests; every rank gets all.
  report.results = gather_results(world, me.attn_tp_rank == 0, engine.results());
  report.backend = sys.dcp_group().size() > 1 ? topo.backend : CombineBackend::ag_rs;
  report.replicated_q = model.replicated_q();
  report.weight_dtype = model.weight_dtype();
  report.expert_weight_dtype = model.expert_dtype();
  report.logical_capacity_tokens = model.allocator().capacity_tokens();
  report.stats = engine.stats();
  if (topo.config.enable_dp_attention) {  // the groups step together: their tokens add up
    std::vector<std::int64_t> tokens(static_cast<std::size_t>(world.size()));
    const std::int64_t mine_tokens = me.attn_tp_rank == 0 ? engine.stats().decode_tokens : 0;
    world.all_gather(&mine_tokens, tokens.data(), sizeof mine_tokens);
    report.stats.decode_tokens = 0;
    for (std::int64_t n : tokens) report.stats.decode_tokens += n;
  }
  report.peak_running = engine.stats().peak_running;
  report.model_load_ms = sys.load_ms();
  return report;
}

}  // namespace

void check_runs_here(const ParallelConfig& c) {
  DCP_CHECK(c.pcp_size == 1, unsupported, "pcp_size = ", c.pcp_size,
            ": prefill context parallelism is not implemented by the deployment (legal: 1); "
            "dcp topology shows its layouts");
  DCP_CHECK(c.platform.name == "cpu", unsupported, "platform = '", c.platform.name,
            "' cannot run in this build: its ranks run on this machine's CPU (legal: cpu); "
            "dcp topology and dcp plan describe other platforms");
}

Launched<DeploymentReport> run_deployment(const DeploymentSpec& spec,
                                          std::optional<int> first_active_rank) {
  check_runs_here(spec.parallel);
  const Topology topo = resolve(spec.parallel);
  LaunchOptions lo;
  lo.transport = spec.transport;
  lo.world_size = topo.world_size;
  lo.first_active_rank = first_active_rank;
  lo.comm_timeout = spec.comm_timeout;
  return launch<DeploymentReport>(lo, 0,
                                  [&](Communicator& world) { return run_rank(spec, topo, world); });
}

}  // namespace dcp
