// A disaggregated deployment in one world: a prefill group, then a decode group.
#include <chrono>

#include "dcp/disagg.h"
#include "dcp/error.h"

namespace dcp {

DisaggOutcome run_disaggregated(Communicator& world, const DisaggConfig& c,
                                const std::vector<RequestSpec>& requests) {
  using Clock = std::chrono::steady_clock;
  const int a = c.prefill_dcp_size, t = c.decode_tp_size;
  DCP_ARG_CHECK(world.size() == a + t, "disaggregation needs ", a + t,
                " ranks (--prefill-dcp-size ", a, " + --tp-size ", t, "), the world has ",
                world.size());
  DCP_ARG_CHECK(t % c.decode_dcp_size == 0, "--dcp-size ", c.decode_dcp_size,
                " must divide --tp-size ", t);
  DCP_ARG_CHECK(c.weights != nullptr, "disaggregation needs weights");
  const KvLayoutSpec pre{a, c.model_options.page_size, c.model_options.kv_dtype};
  const KvLayoutSpec dec{c.decode_dcp_size, c.model_options.page_size, c.model_options.kv_dtype};
  make_transfer_plan(pre, dec, 0, 0);  // refuses unsupported pairs before any work

  const bool is_decode = world.rank() >= a;
  auto side = world.split(is_decode ? 1 : 0, world.rank());  // the side's TP group
  const int side_rank = side->rank();
  auto dcp = side->split(side_rank / (is_decode ? c.decode_dcp_size : a), side_rank);
  ModelOptions mo = c.model_options;
  mo.backend = dcp->size() > 1 ? c.backend : CombineBackend::ag_rs;
  mo.replicate_q_proj = mo.replicate_q_proj && dcp->size() > 1;
  MlaModel model(c.model, *c.weights, *side, *dcp, mo);
  if (is_decode && c.poison_decode_pools) {
    for (int l = 0; l < c.model.num_hidden_layers; ++l) model.kv_shard(l).pool().poison();
  }

  DisaggOutcome out;
  out.is_decode = is_decode;
  const int vocab = c.model.vocab_size;
  const std::size_t n = requests.size();
  // 1. Prefill: the prompt and the first token; the KV stays for the transfer.
  std::vector<float> first(n * static_cast<std::size_t>(1 + vocab),
                           0.0f);  // [token, logits...] per request
  auto t0 = Clock::now();
  if (!is_decode) {
    EngineOptions eo = c.engine;
    eo.record_logits = true;
    eo.num_draft_tokens = 0;
    Engine prefill(model, eo);
    for (const RequestSpec& r : requests) {
      RequestSpec p = r;
      p.max_new_tokens = 1;
      p.keep_kv = true;
      p.forced_outputs.clear();
      prefill.submit(p);
    }
    prefill.run();
    for (std::size_t i = 0; i < n; ++i) {
      const RequestResult& r = prefill.results()[i];
      DCP_CHECK(r.state == RequestState::finished, capacity, "prefill could not run request ", r.id,
                ": ", r.error);
      first[i * (1 + vocab)] = static_cast<float>(r.output_tokens[0]);
      std::copy(r.step_logits.begin(), r.step_logits.end(),
                first.begin() + static_cast<std::ptrdiff_t>(i * (1 + vocab) + 1));
    }
  }
  out.prefill_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  world.broadcast(first.data(), first.size() * sizeof(float), 0);

  // 2. Transfer.
  DisaggRoles roles;
  roles.prefill = pre;
  roles.decode = dec;
  for (int r = 0; r < a; ++r) roles.prefill_ranks.push_back(r);
  for (int r = 0; r < t; ++r) {
    roles.decode_ranks.push_back(a + r);
    roles.decode_dcp_rank.push_back(r % c.decode_dcp_size);
  }
  std::vector<TransferItem> items;
  for (const RequestSpec& r : requests)
    items.push_back({r.id, static_cast<std::int64_t>(r.prompt.size())});
  std::vector<KvShard*> shards;
  for (int l = 0; l < c.model.num_hidden_layers; ++l) shards.push_back(&model.kv_shard(l));
  t0 = Clock::now();
  out.transfers = transfer_kv(world, is_decode ? dcp.get() : nullptr, roles, items, shards,
                              is_decode ? &model.allocator() : nullptr, c.transport);
  out.transfer_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  for (const TransferResult& r : out.transfers) out.bytes_received += r.bytes_received;
  world.barrier();
  if (!is_decode) return out;  // the prefill side's kept KV dies with its model

  // 3. Decode: adopt what arrived, finish it.
  Engine decode(model, c.engine);
  std::vector<RequestResult> merged(n);
  for (std::size_t i = 0; i < n; ++i) {
    merged[i].id = requests[i].id;
    merged[i].output_tokens.push_back(static_cast<std::int32_t>(first[i * (1 + vocab)]));
    if (c.engine.record_logits) {
      merged[i].step_logits.assign(
          first.begin() + static_cast<std::ptrdiff_t>(i * (1 + vocab) + 1),
          first.begin() + static_cast<std::ptrdiff_t>((i + 1) * (1 + vocab)));
    }
    if (!out.transfers[i].ok) {
      merged[i].state = RequestState::rejected;
      merged[i].error = out.transfers[i].error;
      continue;
    }
    try {
      decode.adopt(requests[i], merged[i].output_tokens[0]);
    } catch (const Error& e) {
      merged[i].state = RequestState::rejected;
      merged[i].error = e.what();
    }
  }
  decode.run();
  for (const RequestResult& r : decode.results()) {
    auto it = std::find_if(merged.begin(), merged.end(),
                           [&](const RequestResult& m) { return m.id == r.id; });
    it->state = r.state;
    it->output_tokens = r.output_tokens;
    if (c.engine.record_logits)
      it->step_logits.insert(it->step_logits.end(), r.step_logits.begin(), r.step_logits.end());
  }
  out.results = std::move(merged);
  out.logical_capacity_tokens = model.allocator().capacity_tokens();
  out.decode_stats = decode.stats();
  return out;
}

}  // namespace dcp
