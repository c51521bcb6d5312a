// A disaggregated deployment in one world: a prefill group, then a decode group.
#include <algorithm>

#include "dcp/disagg.h"
#include "dcp/error.h"
#include "dcp/timing.h"

namespace dcp {

ParallelConfig prefill_group_config(int prefill_dcp_size) {
  ParallelConfig p;
  p.tp_size = prefill_dcp_size;
  p.dcp_size = prefill_dcp_size;
  return p;
}

void check_disaggregation(const ParallelConfig& decode, const ModelOptions& m,
                          int prefill_dcp_size) {
  DCP_ARG_CHECK(prefill_dcp_size >= 1, "disaggregation: prefill_dcp_size = ", prefill_dcp_size,
                " must be >= 1");
  resolve(prefill_group_config(prefill_dcp_size));
  make_transfer_plan({prefill_dcp_size, m.page_size, m.kv_dtype, m.kv_interleave},
                     {decode.dcp_size, m.page_size, m.kv_dtype, m.kv_interleave}, 0, 0);
}

std::vector<DisaggRoles> replica_roles(int prefill_dcp_size, const Topology& decode,
                                       const ModelOptions& m, bool decode_first) {
  const int first_prefill = decode_first ? decode.world_size : 0;
  const int first_decode = decode_first ? 0 : prefill_dcp_size;
  std::vector<DisaggRoles> roles(static_cast<std::size_t>(decode.config.dp_size));
  for (DisaggRoles& r : roles) {
    r.prefill = {prefill_dcp_size, m.page_size, m.kv_dtype, m.kv_interleave};
    r.decode = {decode.config.dcp_size, m.page_size, m.kv_dtype, m.kv_interleave};
    for (int k = 0; k < prefill_dcp_size; ++k) r.prefill_ranks.push_back(first_prefill + k);
  }
  for (const RankPlacement& p : decode.ranks) {
    DisaggRoles& r = roles[static_cast<std::size_t>(p.dp_rank)];
    r.decode_ranks.push_back(first_decode + p.global_rank);
    r.decode_dcp_rank.push_back(p.dcp_rank);
  }
  return roles;
}

DisaggOutcome run_disaggregated(Communicator& world, const DisaggConfig& c,
                                const std::vector<RequestSpec>& requests) {
  const auto start = Clock::now();
  const int a = c.prefill_dcp_size;
  for (const RequestSpec& r : requests) {  // the prefill side hands over one token, not the rest
    DCP_ARG_CHECK(r.prompt_logprobs < 0, "disaggregation: request ", r.id,
                  ": prompt_logprobs is not supported (legal: -1)");
  }
  check_disaggregation(c.decode, c.model_options, a);  // before any work
  const Topology prefill_topo = resolve(prefill_group_config(a));
  const Topology decode_topo = resolve(c.decode);
  const int t = decode_topo.world_size;
  DCP_ARG_CHECK(world.size() == a + t, "disaggregation needs ", a + t, " ranks (prefill_dcp_size ",
                a, " + the decode side's ", t, "), the world has ", world.size());

  const bool is_decode = world.rank() >= a;
  const auto side = world.split(is_decode ? 1 : 0, world.rank());
  EngineOptions prefill_options = c.engine;
  prefill_options.record_logits = true;
  prefill_options.num_draft_tokens = 0;
  prefill_options.ngram_draft = 0;
  // The prefix cache (and its host tier) serves the prefill side, which computes prompts: a
  // prompt whose prefix it holds computes the rest only. The decode side receives whole prompts.
  EngineOptions decode_options = c.engine;
  decode_options.enable_prefix_cache = false;
  decode_options.host_kv_capacity_tokens = 0;
  RankSystem sys(*side, is_decode ? decode_topo : prefill_topo, c.model, c.model_options,
                 is_decode ? decode_options : prefill_options,
                 is_decode ? c.draft : std::optional<ModelSource>{});
  MlaModel& model = sys.model();
  if (is_decode && c.poison_decode_pools) {
    for (int l = 0; l < model.config().num_hidden_layers; ++l) model.kv_shard(l).pool().poison();
  }

  DisaggOutcome out;
  out.is_decode = is_decode;
  out.reports_results = is_decode && sys.placement().attn_tp_rank == 0;
  const int vocab = model.config().vocab_size;
  const std::size_t n = requests.size();
  // 1. Prefill: the prompt and the first token; the KV stays for the transfer.
  std::vector<float> first(n * static_cast<std::size_t>(1 + vocab),
                           0.0f);  // [token, logits...] per request
  world.barrier();                 // both sides loaded: the prefill time is the same on both
  out.load_ms = ms_since(start);   // until the slowest rank had its weights
  auto t0 = Clock::now();
  if (!is_decode) {
    Engine& prefill = sys.engine();
    for (const RequestSpec& r : requests) {
      RequestSpec p = r;
      p.max_new_tokens = 1;
      p.min_tokens = std::min(r.min_tokens, 1);  // the first token; the decode side the rest
      p.keep_kv = true;
      p.forced_outputs.clear();
      prefill.submit(p);
    }
    prefill.run();
    for (std::size_t i = 0; i < n; ++i) {
      const RequestResult& r = prefill.results()[i];
      // A request the engine never admitted has no error of its own: the prefill group holds
      // every prompt's KV until the transfer, so all of them must fit at once.
      DCP_CHECK(
          r.state == RequestState::finished, capacity, "prefill could not run request ", r.id, ": ",
          r.error.empty()
              ? str("the prefill group holds every prompt's KV until the transfer, and ", n,
                    " prompts do not fit its KV capacity of ", c.model_options.kv_capacity_tokens,
                    " tokens (raise kv_capacity_tokens: dcp run's --max-total-tokens)")
              : r.error);
      first[i * (1 + vocab)] = static_cast<float>(r.output_tokens[0]);
      std::copy(r.step_logits.begin(), r.step_logits.end(),
                first.begin() + static_cast<std::ptrdiff_t>(i * (1 + vocab) + 1));
    }
    if (prefill.prefix_cache()) out.prefill_cache = prefill.prefix_cache()->stats();
  }
  world.broadcast(first.data(), first.size() * sizeof(float), 0);
  out.prefill_ms = ms_since(t0);  // the decode side's too: it waits for the first tokens

  // 2. Transfer, each request to the decode replica (DP replica or attention group) it is dealt to.
  const int replicas = c.decode.dp_size;
  std::vector<std::int64_t> kv_tokens;
  for (const RequestSpec& r : requests)
    kv_tokens.push_back(static_cast<std::int64_t>(r.prompt.size()) + r.max_new_tokens);
  const std::vector<int> dealt = deal_requests(kv_tokens, replicas);
  const int my_replica = is_decode ? sys.placement().dp_rank : -1;
  std::vector<KvShard*> shards;
  for (int l = 0; l < model.config().num_hidden_layers; ++l) shards.push_back(&model.kv_shard(l));
  t0 = Clock::now();
  std::vector<std::size_t> mine;  // indices of this replica's requests, in the order moved
  const std::vector<DisaggRoles> roles = replica_roles(a, decode_topo, c.model_options);
  for (int g = 0; g < replicas; ++g) {
    std::vector<TransferItem> items;
    for (std::size_t i = 0; i < n; ++i) {
      if (dealt[i] != g) continue;
      items.push_back({requests[i].id, static_cast<std::int64_t>(requests[i].prompt.size())});
      if (g == my_replica) mine.push_back(i);
    }
    if (items.empty()) continue;
    const bool member = g == my_replica;
    std::vector<TransferResult> moved = transfer_kv(
        world, member ? &sys.attn_tp_group() : nullptr, roles[static_cast<std::size_t>(g)], items,
        shards, member ? &model.allocator() : nullptr, c.transport);
    std::move(moved.begin(), moved.end(), std::back_inserter(out.transfers));
  }
  out.transfer_ms = ms_since(t0);
  for (const TransferResult& r : out.transfers) out.bytes_received += r.bytes_received;
  world.barrier();
  if (!is_decode) return out;  // the prefill side's kept KV dies with its model

  // 3. Decode: adopt what arrived, finish it.
  Engine& decode = sys.engine();
  std::vector<RequestResult> merged(mine.size());
  for (std::size_t k = 0; k < mine.size(); ++k) {
    const std::size_t i = mine[k];
    RequestResult& m = merged[k];
    m.id = requests[i].id;
    m.output_tokens.push_back(static_cast<std::int32_t>(first[i * (1 + vocab)]));
    if (c.engine.record_logits) {
      m.step_logits.assign(first.begin() + static_cast<std::ptrdiff_t>(i * (1 + vocab) + 1),
                           first.begin() + static_cast<std::ptrdiff_t>((i + 1) * (1 + vocab)));
    }
    if (!out.transfers[k].ok) {
      m.state = RequestState::rejected;
      m.error = out.transfers[k].error;
      continue;
    }
    try {
      decode.adopt(requests[i], m.output_tokens[0]);
    } catch (const Error& e) {
      m.state = RequestState::rejected;
      m.error = e.what();
    }
  }
  decode.run();
  for (const RequestResult& r : decode.results()) {
    auto it = std::find_if(merged.begin(), merged.end(),
                           [&](const RequestResult& m) { return m.id == r.id; });
    it->state = r.state;
    it->finish_reason = r.finish_reason;
    it->output_tokens = r.output_tokens;
    if (c.engine.record_logits)
      it->step_logits.insert(it->step_logits.end(), r.step_logits.begin(), r.step_logits.end());
  }
  out.results = std::move(merged);
  out.logical_capacity_tokens = model.allocator().capacity_tokens();
  out.decode_stats = decode.stats();
  const std::int64_t peak_rows = decode.stats().peak_kv_rows;
  out.kv = {world.rank(),
            sys.dcp_group().rank(),
            my_replica,
            static_cast<std::int64_t>(mine.size()),
            peak_rows,
            static_cast<std::int64_t>(model.kv_bytes()),
            peak_rows * static_cast<std::int64_t>(model.kv_shard(0).pool().geometry().row_bytes()) *
                model.config().num_hidden_layers,
            static_cast<std::int64_t>(model.weight_bytes() +
                                      (sys.draft() ? sys.draft()->weight_bytes() : 0))};
  return out;
}

Launched<DeploymentReport> run_disaggregated_deployment(const DeploymentSpec& spec,
                                                        int prefill_dcp_size) {
  check_runs_here(spec.parallel);
  DisaggConfig c;
  c.model = spec.model;
  c.prefill_dcp_size = prefill_dcp_size;
  c.decode = spec.parallel;
  c.model_options = spec.model_options;
  c.engine = spec.engine;
  c.draft = spec.draft;
  resolve(prefill_group_config(prefill_dcp_size));
  const Topology decode_topo = resolve(spec.parallel);
  LaunchOptions lo;
  lo.transport = spec.transport;
  lo.world_size = prefill_dcp_size + decode_topo.world_size;
  lo.comm_timeout = spec.comm_timeout;
  const int reporter = prefill_dcp_size;  // the first decode rank
  return launch<DeploymentReport>(lo, reporter, [&](Communicator& world) {
    const DisaggOutcome o = run_disaggregated(world, c, spec.requests);
    DeploymentReport report;
    std::vector<std::int64_t> bytes(static_cast<std::size_t>(world.size()));
    world.all_gather(&o.bytes_received, bytes.data(), sizeof(std::int64_t));
    // Every rank gets every result (a teacher-forced rerun follows in lockstep on all ranks).
    report.results = gather_results(world, o.reports_results, o.results);
    if (spec.engine.enable_prefix_cache) {  // the prefill ranks' caches (the decode side has none)
      const PrefixCacheStats mine = o.prefill_cache.value_or(PrefixCacheStats{});
      report.cache.resize(static_cast<std::size_t>(world.size()));
      world.all_gather(&mine, report.cache.data(), sizeof mine);
      report.cache.resize(static_cast<std::size_t>(prefill_dcp_size));  // world ranks 0.. prefill
    }
    report.ranks.resize(static_cast<std::size_t>(world.size()));  // the decode ranks' KV
    world.all_gather(&o.kv, report.ranks.data(), sizeof o.kv);
    report.ranks.erase(report.ranks.begin(), report.ranks.begin() + prefill_dcp_size);
    report.disaggregated = true;
    report.backend = spec.parallel.dcp_size > 1 ? decode_topo.backend : CombineBackend::ag_rs;
    report.bytes_per_decode_rank.assign(bytes.begin() + prefill_dcp_size, bytes.end());
    report.transfer_ms = o.transfer_ms;
    report.model_load_ms = o.load_ms;
    report.logical_capacity_tokens = o.logical_capacity_tokens;
    report.stats = o.decode_stats;
    report.stats.prefill_ms = o.prefill_ms;
    if (spec.parallel.enable_dp_attention) {  // the groups step together: their tokens add up
      std::vector<std::int64_t> tokens(static_cast<std::size_t>(world.size()));
      const std::int64_t mine = o.reports_results ? o.decode_stats.decode_tokens : 0;
      world.all_gather(&mine, tokens.data(), sizeof mine);
      report.stats.decode_tokens = 0;
      for (const std::int64_t k : tokens) report.stats.decode_tokens += k;
    }
    return report;
  });
}

}  // namespace dcp
