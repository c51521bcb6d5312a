// A served deployment split in two: the prefill group computes each prompt and its first token
// and keeps the KV; once a decode replica can hold the whole request (prompt + max_new_tokens)
// the KV moves there (transfer_kv) and that replica finishes the request. Both groups follow
// world rank 0's control in lockstep, as the undivided loop does, and each group's first rank
// reports its part of a request's news: the prefill group the first token (and the prompt's
// logprobs), the decode group the rest.
#include <algorithm>
#include <cstring>
#include <deque>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/bytes.h"
#include "dcp/disagg.h"
#include "dcp/serving.h"
#include "engine/serving_wire.h"

namespace dcp {
namespace {

// A prompt the prefill group has computed, whose KV waits there to move.
struct Handoff {
  RequestSpec spec;  // as submitted (max_new_tokens the whole request's)
  std::int32_t first_token = 0;
  std::int64_t cached_prompt_tokens = 0;  // the prefill group's prefix cache held these
  std::int64_t reserve = 0;  // decode KV tokens it takes: prompt + max_new_tokens, whole pages
};

bool over(const RequestResult& r) {
  return r.state == RequestState::finished || r.state == RequestState::rejected;
}

RequestResult ending(RequestId id, FinishReason reason, const std::string& error) {
  RequestResult r;
  r.id = id;
  r.state = error.empty() ? RequestState::finished : RequestState::rejected;
  r.finish_reason = reason;
  r.error = error;
  return r;
}

}  // namespace

void ServingDeployment::disaggregated_rank_loop(Communicator& world) {
  const int prefill_size = options_.prefill_dcp_size;
  const bool is_decode = world.rank() >= prefill_size;
  const auto side = world.split(is_decode ? 1 : 0, world.rank());
  const Topology prefill_topology = resolve(prefill_group_config(prefill_size));
  // The prefix cache (and its host tier) serves the group that computes prompts; the draft the
  // group that decodes, where it computes each adopted prompt's draft KV itself.
  EngineOptions options = spec_.engine;
  if (is_decode) {
    options.enable_prefix_cache = false;
    options.host_kv_capacity_tokens = 0;
  } else {
    options.num_draft_tokens = 0;
  }
  RankSystem sys(*side, is_decode ? topology_ : prefill_topology, spec_.model, spec_.model_options,
                 options, is_decode ? spec_.draft : std::optional<ModelSource>{});
  Engine& engine = sys.engine();
  MlaModel& model = sys.model();
  const bool frontend = world.rank() == 0;
  // The prefill group's first rank, and each decode replica's (DP replica or attention group).
  const bool reporter = world.rank() == 0 || (is_decode && sys.placement().attn_tp_rank == 0);
  const int replicas = spec_.parallel.dp_size;

  // Each group's logical capacity (the decode group's draft's too) and virtual page: a request
  // must fit both groups, and the decode group's reservations count whole pages.
  std::int64_t sized[2] = {model.allocator().capacity_tokens(),
                           model.allocator().virtual_page_size()};
  if (MlaModel* draft = sys.draft())
    sized[0] = std::min(sized[0], draft->allocator().capacity_tokens());
  std::vector<std::int64_t> sizes(2 * static_cast<std::size_t>(world.size()));
  world.all_gather(sized, sizes.data(), sizeof sized);
  const std::int64_t decode_page = sizes[2 * static_cast<std::size_t>(prefill_size) + 1];
  // Whole pages (a draft's capacity need not be), so that every request that fits is moved.
  const std::int64_t decode_capacity =
      sizes[2 * static_cast<std::size_t>(prefill_size)] / decode_page * decode_page;
  if (frontend) become_ready(std::min(sizes[0], decode_capacity));

  const std::vector<DisaggRoles> roles =
      replica_roles(prefill_size, topology_, spec_.model_options);
  std::vector<KvShard*> shards;
  for (int l = 0; l < model.config().num_hidden_layers; ++l) shards.push_back(&model.kv_shard(l));

  // Every rank alike: computed prompts waiting to move, in order, and each decode replica's
  // reservations as its last report gave them.
  std::deque<Handoff> ready;
  std::vector<std::int64_t> decode_reserved(static_cast<std::size_t>(replicas), 0);
  // The prefill group: what arrived, until it leaves; results already handed off or reported.
  std::unordered_map<RequestId, RequestSpec> arrived;
  std::unordered_set<RequestId> settled;
  // The decode group: adopted requests' reservations, and per request the tokens reported so far
  // and its cached prompt tokens (the prefill group's count).
  std::unordered_map<RequestId, std::int64_t> held;
  std::unordered_map<RequestId, std::pair<std::size_t, std::int64_t>> reported;
  std::vector<RequestResult> endings;  // ended outside the engine, reported after the next step
  std::int64_t moved_requests = 0, moved_bytes = 0;  // into this decode rank, so far
  bool busy_anywhere = false;
  // Prefill group: a request it no longer holds (moved, or ended there).
  const auto leave_prefill = [&](RequestId id, bool kept) {
    if (kept) engine.release(id);
    engine.forget(id);
    arrived.erase(id);
    settled.erase(id);
  };
  for (;;) {
    std::vector<std::uint8_t> control;
    if (frontend) control = take_control(busy_anywhere);
    broadcast_bytes(world, control, 0, true);
    ByteReader in(control);
    const bool stopping = in.i64() != 0;
    const bool drain = in.i64() != 0;
    if (in.i64() != 0 && !is_decode) engine.prefix_cache()->clear();
    for (std::int64_t k = in.i64(); k > 0; --k) {
      RequestSpec spec = read_spec(in);
      if (is_decode) continue;     // it comes with its handoff
      RequestSpec prefill = spec;  // the first token; the decode group chooses the rest
      prefill.max_new_tokens = 1;
      prefill.min_tokens = std::min(spec.min_tokens, 1);
      prefill.keep_kv = true;
      try {
        engine.submit(prefill);
        arrived.emplace(spec.id, std::move(spec));
      } catch (const Error& e) {  // every prefill rank refuses it alike
        endings.push_back(ending(spec.id, FinishReason::none, e.what()));
      }
    }
    std::vector<RequestId> cancelled = in.vec<std::int64_t>();
    if (stopping && !drain) {
      for (const RequestResult& r : engine.results())
        if (!over(r)) cancelled.push_back(r.id);
      for (const Handoff& h : ready) cancelled.push_back(h.spec.id);
    }
    for (const RequestId id : cancelled) {
      engine.cancel(id);  // computing or waiting (prefill), decoding (decode)
      const auto waits = std::find_if(ready.begin(), ready.end(),
                                      [&](const Handoff& h) { return h.spec.id == id; });
      if (waits == ready.end()) continue;
      ready.erase(waits);
      if (is_decode) continue;
      leave_prefill(id, true);
      endings.push_back(ending(id, FinishReason::cancelled, ""));
    }
    engine.step();

    // Prefill group: each prompt computed this step moves on, or ends here (its first token
    // ended it, it asked for one token, it was cancelled or refused).
    std::vector<std::uint8_t> report, handoffs;
    ByteWriter w(report), hw(handoffs);
    std::vector<std::uint8_t> news;
    ByteWriter nw(news);
    std::int64_t count = 0, moved = 0;
    std::vector<std::pair<RequestId, bool>> ended;  // and whether it kept its KV
    if (!is_decode) {
      for (const RequestResult& r : engine.results()) {
        if (!over(r) || !settled.insert(r.id).second) continue;
        const RequestSpec& spec = arrived.at(r.id);
        const bool kept =
            r.state == RequestState::finished && r.finish_reason != FinishReason::cancelled;
        const bool moves =
            kept && r.finish_reason == FinishReason::length && spec.max_new_tokens > 1;
        write_split_news(nw, r, 0, 0, moves ? RequestState::decode : r.state,
                         r.cached_prompt_tokens);
        ++count;
        if (!moves) {
          ended.emplace_back(r.id, kept);
          continue;
        }
        const std::int64_t tokens =
            static_cast<std::int64_t>(spec.prompt.size()) + spec.max_new_tokens;
        write_spec(hw, spec);
        hw.i64(r.output_tokens[0]);
        hw.i64(r.cached_prompt_tokens);
        hw.i64((tokens + decode_page - 1) / decode_page * decode_page);
        ++moved;
      }
      for (const auto& [id, kept] : ended) leave_prefill(id, kept);
    } else {
      for (const RequestResult& r : engine.results()) {
        auto it = reported.find(r.id);
        if (it == reported.end()) continue;
        auto& [from, cached] = it->second;
        if (r.output_tokens.size() > from || over(r)) {
          write_split_news(nw, r, from, from - 1, r.state, cached);
          ++count;
        }
        from = r.output_tokens.size();
        if (over(r)) ended.emplace_back(r.id, false);
      }
      for (const auto& entry : ended) {
        engine.forget(entry.first);
        reported.erase(entry.first);
        held.erase(entry.first);
      }
    }
    for (const RequestResult& r : endings) {
      write_news(nw, r, 0);
      ++count;
    }
    endings.clear();

    RankLoad load = current_load(model, engine, spec_.model_options.page_size);
    // Prompts computed but not moved wait for KV as queued requests do.
    if (!is_decode) {
      load.awaiting_transfer = static_cast<std::int64_t>(ready.size()) + moved;
      load.waiting += load.awaiting_transfer;
    }
    load.moved_requests = moved_requests;
    load.moved_bytes = moved_bytes;
    for (const auto& entry : held) load.dealt_tokens += entry.second;
    w.raw(&load, sizeof load);
    w.i64(reporter ? count : -1);
    if (reporter) w.raw(news.data(), news.size());
    const std::vector<std::vector<std::uint8_t>> reports = all_gather_bytes(world, report);
    if (frontend) publish(reports);
    busy_anywhere = false;
    for (const std::vector<std::uint8_t>& bytes : reports) {
      RankLoad l;
      std::memcpy(&l, bytes.data(), sizeof l);
      busy_anywhere = busy_anywhere || l.running > 0 || l.waiting > 0;
    }
    for (const RankPlacement& p : topology_.ranks) {
      if (p.attn_tp_rank != 0) continue;
      RankLoad l;
      std::memcpy(&l, reports[static_cast<std::size_t>(prefill_size + p.global_rank)].data(),
                  sizeof l);
      decode_reserved[static_cast<std::size_t>(p.dp_rank)] = l.dealt_tokens;
    }

    // This step's handoffs, from the prefill group's first rank to every rank.
    {
      std::vector<std::uint8_t> header;
      ByteWriter(header).i64(moved);
      header.insert(header.end(), handoffs.begin(), handoffs.end());
      handoffs = std::move(header);
    }
    broadcast_bytes(world, handoffs, 0);
    ByteReader hr(handoffs);
    for (std::int64_t k = hr.i64(); k > 0; --k) {
      Handoff h;
      h.spec = read_spec(hr);
      h.first_token = static_cast<std::int32_t>(hr.i64());
      h.cached_prompt_tokens = hr.i64();
      h.reserve = hr.i64();
      ready.push_back(std::move(h));
    }

    // Move, in order, what the decode replicas can hold beside what they hold, each to the
    // replica with the fewest tokens reserved (ties to the lower; a cancelling shutdown moves
    // nothing: the next step ends them).
    std::vector<std::vector<Handoff>> moving(static_cast<std::size_t>(replicas));
    bool moved_any = false;
    while (!ready.empty() && !(stopping && !drain)) {
      const std::int64_t need = ready.front().reserve;
      std::size_t to = decode_reserved.size();
      for (std::size_t g = 0; g < decode_reserved.size(); ++g) {
        if (decode_reserved[g] + need <= decode_capacity &&
            (to == decode_reserved.size() || decode_reserved[g] < decode_reserved[to]))
          to = g;
      }
      if (to == decode_reserved.size()) break;
      decode_reserved[to] += need;
      moving[to].push_back(std::move(ready.front()));
      ready.pop_front();
      moved_any = true;
    }
    for (std::size_t g = 0; g < moving.size(); ++g) {
      if (moving[g].empty()) continue;
      const bool mine = is_decode && sys.placement().dp_rank == static_cast<int>(g);
      std::vector<TransferItem> items;
      for (const Handoff& h : moving[g])
        items.push_back({h.spec.id, static_cast<std::int64_t>(h.spec.prompt.size())});
      const std::vector<TransferResult> results =
          transfer_kv(world, mine ? &sys.attn_tp_group() : nullptr, roles[g], items, shards,
                      mine ? &model.allocator() : nullptr);
      for (std::size_t i = 0; i < moving[g].size(); ++i) {
        const Handoff& h = moving[g][i];
        const RequestId id = h.spec.id;
        if (!is_decode) {
          leave_prefill(id, true);
          continue;
        }
        if (!mine) continue;
        moved_bytes += results[i].bytes_received;
        if (!results[i].ok) {
          endings.push_back(
              ending(id, FinishReason::none,
                     str("moving the KV to the decode group failed: ", results[i].error)));
          continue;
        }
        try {
          RequestSpec spec = h.spec;
          spec.prompt_logprobs = -1;  // reported by the prefill group
          engine.adopt(spec, h.first_token);
          ++moved_requests;
          held[id] = h.reserve;
          reported[id] = {1, h.cached_prompt_tokens};
        } catch (const Error& e) {
          if (model.allocator().contains(id)) model.allocator().free(id);
          endings.push_back(ending(id, FinishReason::none, e.what()));
        }
      }
    }
    // (Every rank knows both; a decode rank's endings come from these moves.)
    busy_anywhere = busy_anywhere || !ready.empty() || moved_any;
    if (stopping && !busy_anywhere) break;
  }
}

}  // namespace dcp
