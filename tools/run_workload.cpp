#include "run_workload.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "dcp/comm_mpi.h"
#include "dcp/comm_threads.h"
#include "dcp/disagg.h"
#include "dcp/error.h"
#include "dcp/model.h"
#include "dcp/weights.h"

namespace dcp::cli {
namespace {

using Clock = std::chrono::steady_clock;

void print_progress(const Engine& e, int dcp_size) {
  const std::int64_t done = e.prompt_tokens_done(), total = e.prompt_tokens_total();
  std::fprintf(
      stderr,
      "\r\033[K[dcp %d] prefill %lld/%lld tokens | decode steps %zu | running %lld | queued %lld",
      dcp_size, static_cast<long long>(done), static_cast<long long>(total),
      e.stats().decode_step_ms.size(), static_cast<long long>(e.running()),
      static_cast<long long>(e.waiting()));
  std::fflush(stderr);
}

// Every rank gets every replica's results (tokens, logits, errors), in request-id order: each DP
// replica's TP rank 0 contributes its own, packed as floats (ids, tokens and bytes are exact).
std::vector<RequestResult> gather_results(Communicator& world, bool contribute,
                                          const std::vector<RequestResult>& mine) {
  std::vector<float> packed;
  if (contribute) {
    for (const RequestResult& r : mine) {
      packed.push_back(static_cast<float>(r.id));
      packed.push_back(static_cast<float>(r.state));
      packed.push_back(static_cast<float>(r.output_tokens.size()));
      for (std::int32_t t : r.output_tokens) packed.push_back(static_cast<float>(t));
      packed.push_back(static_cast<float>(r.step_logits.size()));
      packed.insert(packed.end(), r.step_logits.begin(), r.step_logits.end());
      packed.push_back(static_cast<float>(r.error.size()));  // why it was rejected, a byte each
      for (const char c : r.error)
        packed.push_back(static_cast<float>(static_cast<unsigned char>(c)));
    }
  }
  std::int64_t size = static_cast<std::int64_t>(packed.size());
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(world.size()));
  world.all_gather(&size, sizes.data(), sizeof size);
  const std::int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  packed.resize(static_cast<std::size_t>(longest));
  std::vector<float> all(static_cast<std::size_t>(longest) * sizes.size());
  world.all_gather(packed.data(), all.data(), packed.size() * sizeof(float));
  std::vector<RequestResult> out;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const float* p = all.data() + k * static_cast<std::size_t>(longest);
    const float* end = p + sizes[k];
    while (p < end) {
      RequestResult r;
      r.id = static_cast<RequestId>(*p++);
      r.state = static_cast<RequestState>(static_cast<int>(*p++));
      const std::size_t n = static_cast<std::size_t>(*p++);
      for (std::size_t i = 0; i < n; ++i)
        r.output_tokens.push_back(static_cast<std::int32_t>(*p++));
      const std::size_t m = static_cast<std::size_t>(*p++);
      r.step_logits.assign(p, p + m);
      p += m;
      const std::size_t e = static_cast<std::size_t>(*p++);
      for (std::size_t i = 0; i < e; ++i)
        r.error.push_back(static_cast<char>(static_cast<int>(*p++)));
      out.push_back(std::move(r));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const RequestResult& a, const RequestResult& b) { return a.id < b.id; });
  return out;
}

// Everything one rank does; rank 0 fills `report`.
void run_rank(const Workload& w, Communicator& world, RunReport* report) {
  const Topology topo = resolve(w.parallel);
  const RankPlacement& me = topo.ranks[world.rank()];
  // Each DP replica is its own TP group serving every dp_size-th request; DCP groups are
  // contiguous slices of it (their indices are global, so one split forms them all).
  std::unique_ptr<Communicator> replica = world.split(me.dp_rank, me.tp_rank);
  std::unique_ptr<Communicator> dcp = world.split(me.dcp_group, me.dcp_rank);
  const auto t0 = Clock::now();
  std::unique_ptr<WeightSource> weights =
      w.model_path.empty() ? make_synthetic_weights(w.weight_seed) : open_checkpoint(w.model_path);
  ModelOptions mo = w.model_options;
  mo.backend = topo.backend;
  MlaModel model(w.model, *weights, *replica, *dcp, mo);
  weights.reset();
  std::unique_ptr<Communicator> solo_tp, solo_dcp;
  std::unique_ptr<MlaModel> draft;
  if (w.draft_model) {
    solo_tp = world.split(world.rank(), 0);
    solo_dcp = world.split(world.rank(), 0);
    const auto draft_weights =
        w.draft_path.empty() ? make_synthetic_weights(w.draft_seed) : open_checkpoint(w.draft_path);
    ModelOptions dmo = w.model_options;
    dmo.replicate_q_proj = false;
    draft = std::make_unique<MlaModel>(*w.draft_model, *draft_weights, *solo_tp, *solo_dcp, dmo);
  }
  const double load_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();

  Engine engine(model, w.engine, draft.get());
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    if (static_cast<int>(i % static_cast<std::size_t>(w.parallel.dp_size)) == me.dp_rank)
      engine.submit(w.requests[i]);
  }
  std::int64_t peak_rows = 0;
  const bool root = world.rank() == 0;
  engine.run([&](const Engine& e) {
    std::int64_t rows = 0;
    for (RequestId id : model.allocator().requests()) rows += model.kv_shard(0).local_length(id);
    peak_rows = std::max(peak_rows, rows);
    if (root && w.progress) print_progress(e, dcp->size());
  });
  if (root && w.progress) std::fprintf(stderr, "\n");

  // Per-rank KV figures to rank 0 (one small all-gather on the world).
  const std::int64_t row_bytes =
      static_cast<std::int64_t>(model.kv_shard(0).pool().geometry().row_bytes());
  const std::int64_t layers = model.config().num_hidden_layers;
  RankKv mine{world.rank(), dcp->rank(), peak_rows, static_cast<std::int64_t>(model.kv_bytes()),
              peak_rows * row_bytes * layers};
  std::vector<RankKv> all(static_cast<std::size_t>(world.size()));
  world.all_gather(&mine, all.data(), sizeof(RankKv));
  std::vector<PrefixCacheStats> cache(static_cast<std::size_t>(world.size()));
  if (engine.prefix_cache()) {
    const PrefixCacheStats cs = engine.prefix_cache()->stats();
    world.all_gather(&cs, cache.data(), sizeof cs);
  }
  std::vector<RequestResult> results = gather_results(world, me.tp_rank == 0, engine.results());
  // Ranks run in lockstep, so every rank holds the same results; rank 0 alone writes `report`
  // when ranks are threads, every process fills its own under MPI.
  if (!root && world.backend() == "threads") return;
  report->backend = dcp->size() > 1 ? topo.backend : CombineBackend::ag_rs;
  report->replicated_q = model.replicated_q();
  report->logical_capacity_tokens = model.allocator().capacity_tokens();
  report->ranks = std::move(all);
  if (engine.prefix_cache()) report->cache = std::move(cache);
  report->stats = engine.stats();
  report->results = std::move(results);
  report->model_load_ms = load_ms;
}

// One rank of a disaggregated run; the first decode rank fills `report`.
void run_disagg_rank(const Workload& w, Communicator& world, RunReport* report) {
  const std::unique_ptr<WeightSource> weights =
      w.model_path.empty() ? make_synthetic_weights(w.weight_seed) : open_checkpoint(w.model_path);
  DisaggConfig c;
  c.model = w.model;
  c.weights = weights.get();
  c.prefill_dcp_size = w.prefill_dcp_size;
  c.decode_tp_size = w.parallel.tp_size;
  c.decode_dcp_size = w.parallel.dcp_size;
  c.backend = resolve(w.parallel).backend;
  c.model_options = w.model_options;
  c.engine = w.engine;
  const DisaggOutcome o = run_disaggregated(world, c, w.requests);
  std::vector<std::int64_t> bytes(static_cast<std::size_t>(world.size()));
  world.all_gather(&o.bytes_received, bytes.data(), sizeof(std::int64_t));
  // Every process gets every result (a --verify run that follows is teacher-forced in lockstep
  // on all ranks): the first decode rank contributes them.
  const bool reporter = world.rank() == w.prefill_dcp_size;
  std::vector<RequestResult> results = gather_results(world, reporter, o.results);
  if (!reporter && world.backend() == "threads") return;
  report->disaggregated = true;
  report->backend = w.parallel.dcp_size > 1 ? c.backend : CombineBackend::ag_rs;
  report->bytes_per_decode_rank.assign(bytes.begin() + w.prefill_dcp_size, bytes.end());
  report->transfer_ms = o.transfer_ms;
  report->logical_capacity_tokens = o.logical_capacity_tokens;
  report->results = std::move(results);
  report->stats = o.decode_stats;
  report->stats.prefill_ms = o.prefill_ms;
}

}  // namespace

RunReport run_workload(const Workload& w, bool* is_root) {
  const Topology topo = resolve(w.parallel);
  DCP_CHECK(
      !(w.parallel.enable_dp_attention && w.parallel.dp_size > 1), unsupported,
      "--enable-dp-attention with --dp-size ", w.parallel.dp_size,
      " is not supported by `dcp run` yet (its MLP runs TP across replicas over gathered tokens); "
      "without --enable-dp-attention, --dp-size runs independent replicas; `dcp topology` shows "
      "DP-attention layouts");
  DCP_CHECK(!(w.disaggregate && w.parallel.dp_size > 1), unsupported,
            "--disaggregate with --dp-size ", w.parallel.dp_size, " is not supported (legal: 1)");
  RunReport report;
  const int world_size = topo.world_size + (w.disaggregate ? w.prefill_dcp_size : 0);
  const auto rank_fn = [&](Communicator& world) {
    if (w.disaggregate) {
      run_disagg_rank(w, world, &report);
    } else {
      run_rank(w, world, &report);
    }
  };
  if (w.comm == "threads") {
    set_blas_threads(1);  // ranks are the parallelism; BLAS threads would oversubscribe
    run_threads(world_size, rank_fn);
    *is_root = true;
  } else if (w.comm == "mpi") {
    static std::unique_ptr<MpiSession> session;  // one per process, finalised at exit
    if (!session) session = std::make_unique<MpiSession>(nullptr, nullptr);
    std::unique_ptr<Communicator> world = session->world();
    if (w.allow_idle_ranks && world->size() > world_size) {
      const bool active =
          world->rank() >= w.first_active_rank && world->rank() < w.first_active_rank + world_size;
      std::unique_ptr<Communicator> part = world->split(active ? 0 : 1, world->rank());
      world->barrier();
      if (!active) {
        world->barrier();  // wait for the active ranks to finish
        *is_root = false;
        return report;
      }
      set_blas_threads(1);
      rank_fn(*part);
      world->barrier();
      *is_root = part->rank() == 0;
      return report;
    }
    DCP_CHECK(
        world->size() == world_size, invalid_argument, "--comm mpi: mpirun started ", world->size(),
        " processes but the configuration needs ", world_size, " (--tp-size ", w.parallel.tp_size,
        w.disaggregate ? str(" + --prefill-dcp-size ", w.prefill_dcp_size) : std::string(), ")");
    set_blas_threads(1);
    rank_fn(*world);
    *is_root = world->rank() == (w.disaggregate ? w.prefill_dcp_size : 0);
  } else {
    throw Error(ErrorCategory::invalid_argument,
                str("--comm '", w.comm, "' is not one of: threads, mpi"));
  }
  return report;
}

}  // namespace dcp::cli
