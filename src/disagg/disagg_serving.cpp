// A served deployment split in two, each side stepping at its own pace. World ranks [0, D) are
// the decode side (as the deployment's topology places them; world rank 0, the frontend, is its
// first rank), the next N ranks the prefill group (TP = DCP = N).
//
// The prefill group computes each prompt and its first token and keeps the KV. After every step
// its first rank (the prefill leader) sends the frontend its news and the prompts it computed,
// and waits for the frontend's answer: arrivals, cancels, and which computed prompts move now to
// which decode replica (those the replica can hold whole: prompt + max_new_tokens, beside what it
// holds). The frontend never waits for the prefill side: it looks for the leader's message
// (probe) between decode steps and answers at once, so a decode step never waits for a prefill
// chunk, and a prefill step waits at most for the decode step in progress. A move is
// transfer_kv between the prefill group and that replica's ranks, which then adopt the request.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/bytes.h"
#include "dcp/disagg.h"
#include "dcp/serving.h"
#include "engine/serving_wire.h"

namespace dcp {

// What both loops share: the rank's group on its side and its engine.
struct ServingDeployment::DisaggregatedSide {
  Communicator& group;  // the decode ranks, or the prefill group
  RankSystem& sys;
  std::vector<DisaggRoles> roles;  // per decode replica: who takes part in a move
  std::vector<KvShard*> shards;    // this rank's, one per layer
  int decode_size = 0;             // world ranks of the decode side; the prefill leader's rank
  std::int64_t decode_capacity = 0, decode_page = 0;  // per decode replica, whole pages
};

namespace {

// Prefill leader <-> frontend, over the world (each a size then bytes: tags t and t + 1).
constexpr int kTagNews = 7101, kTagControl = 7103;
// The frontend's wait for the prefill leader's next message while the prefill side computes.
constexpr std::chrono::milliseconds kPrefillPoll{1};

// A prompt the prefill group has computed, whose KV waits there to move.
struct Handoff {
  RequestSpec spec;  // as submitted (max_new_tokens the whole request's)
  std::int32_t first_token = 0;
  std::int64_t cached_prompt_tokens = 0;  // the prefill group's prefix cache held these
  std::int64_t reserve = 0;  // decode KV tokens it takes: prompt + max_new_tokens, whole pages
};

void write_handoff(ByteWriter& w, const Handoff& h) {
  write_spec(w, h.spec);
  w.i64(h.first_token);
  w.i64(h.cached_prompt_tokens);
  w.i64(h.reserve);
}

Handoff read_handoff(ByteReader& in) {
  Handoff h;
  h.spec = read_spec(in);
  h.first_token = static_cast<std::int32_t>(in.i64());
  h.cached_prompt_tokens = in.i64();
  h.reserve = in.i64();
  return h;
}

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

RankLoad load_of(const std::vector<std::uint8_t>& report) {
  RankLoad l;
  std::memcpy(&l, report.data(), sizeof l);
  return l;
}

// A report with its news taken out (the load stays): what a rank that did not step this time
// contributes to a publish.
std::vector<std::uint8_t> without_news(const std::vector<std::uint8_t>& report) {
  ByteReader in(report);
  RankLoad l;
  in.raw(&l, sizeof l);
  std::vector<std::uint8_t> out;
  ByteWriter w(out);
  w.raw(&l, sizeof l);
  w.i64(in.i64() < 0 ? -1 : 0);
  return out;
}

}  // namespace

void ServingDeployment::disaggregated_rank_loop(Communicator& world) {
  const int prefill_size = options_.prefill_dcp_size;
  const int decode_size = topology_.world_size;
  const bool is_decode = world.rank() < decode_size;
  const auto group = world.split(is_decode ? 0 : 1, world.rank());
  const Topology prefill_topology = resolve(prefill_group_config(prefill_size));
  // The prefix cache (and its host tier) serves the group that computes prompts; the draft the
  // group that decodes, where it computes each adopted prompt's draft KV itself.
  EngineOptions options = spec_.engine;
  if (is_decode) {
    options.enable_prefix_cache = false;
    options.host_kv_capacity_tokens = 0;
  } else {
    options.num_draft_tokens = 0;
    options.ngram_draft = 0;
  }
  RankSystem sys(*group, is_decode ? topology_ : prefill_topology, spec_.model, spec_.model_options,
                 options, is_decode ? spec_.draft : std::optional<ModelSource>{});
  MlaModel& model = sys.model();

  // Each group's logical capacity (the decode group's draft's too) and virtual page: a request
  // must fit both groups, and the decode group's reservations count whole pages.
  std::int64_t sized[2] = {model.allocator().capacity_tokens(),
                           model.allocator().virtual_page_size()};
  if (MlaModel* draft = sys.draft())
    sized[0] = std::min(sized[0], draft->allocator().capacity_tokens());
  std::vector<std::int64_t> sizes(2 * static_cast<std::size_t>(world.size()));
  world.all_gather(sized, sizes.data(), sizeof sized);
  DisaggregatedSide side{*group,
                         sys,
                         replica_roles(prefill_size, topology_, spec_.model_options,
                                       /*decode_first=*/true),
                         {},
                         decode_size,
                         0,
                         sizes[1]};
  // Whole pages (a draft's capacity need not be), so that every request that fits is moved.
  side.decode_capacity = sizes[0] / side.decode_page * side.decode_page;
  for (int l = 0; l < model.config().num_hidden_layers; ++l)
    side.shards.push_back(&model.kv_shard(l));
  if (world.rank() == 0)
    become_ready(std::min(sizes[2 * static_cast<std::size_t>(decode_size)], side.decode_capacity));
  if (is_decode) {
    disaggregated_decode_loop(world, side);
  } else {
    disaggregated_prefill_loop(world, side);
  }
}

// The prefill group: news to the frontend, its answer, the moves it names, a step; again.
void ServingDeployment::disaggregated_prefill_loop(Communicator& world, DisaggregatedSide& d) {
  Engine& engine = d.sys.engine();
  MlaModel& model = d.sys.model();
  const bool leader = d.group.rank() == 0;
  // What arrived, until it leaves; results already handed off or reported.
  std::unordered_map<RequestId, RequestSpec> arrived;
  std::unordered_set<RequestId> settled;
  std::vector<RequestResult> endings;  // refused at submission, reported after the next step
  std::vector<std::uint8_t> reports_bytes, handoffs;
  std::int64_t handoff_count = 0, report_count = 0;
  bool busy = false;
  // A request the group no longer holds (moved, or ended here).
  const auto leave = [&](RequestId id, bool kept) {
    if (kept) engine.release(id);
    engine.forget(id);
    arrived.erase(id);
    settled.erase(id);
  };
  for (;;) {
    std::vector<std::uint8_t> control;
    if (leader) {
      std::vector<std::uint8_t> news;
      ByteWriter w(news);
      w.i64(busy);
      w.i64(report_count);
      w.raw(reports_bytes.data(), reports_bytes.size());
      w.i64(handoff_count);
      w.raw(handoffs.data(), handoffs.size());
      send_bytes(world, news, 0, kTagNews);
      control = recv_bytes(world, 0, kTagControl, /*patiently=*/true);
    }
    broadcast_bytes(d.group, control, 0, /*patiently=*/true);
    ByteReader in(control);
    const bool stopping = in.i64() != 0;
    const bool drain = in.i64() != 0;
    if (in.i64() != 0) engine.prefix_cache()->clear();
    if (in.i64() != 0) break;  // the frontend saw this group idle and stopping
    for (std::int64_t k = in.i64(); k > 0; --k) {
      RequestSpec spec = read_spec(in);
      RequestSpec prefill = spec;  // the first token; the decode side chooses the rest
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
    for (const RequestId id : in.vec<std::int64_t>()) engine.cancel(id);
    if (stopping && !drain) engine.cancel_all();
    // Computed prompts the frontend ended while they waited to move (cancelled): their KV goes.
    for (const RequestId id : in.vec<std::int64_t>()) leave(id, true);
    for (std::int64_t g = in.i64(); g > 0; --g) {
      const auto replica = static_cast<std::size_t>(in.i64());
      std::vector<TransferItem> items(static_cast<std::size_t>(in.i64()));
      for (TransferItem& item : items) {
        item.request = in.i64();
        item.tokens = in.i64();
      }
      transfer_kv(world, nullptr, d.roles[replica], items, d.shards, nullptr);
      for (const TransferItem& item : items) leave(item.request, true);
    }
    if (options_.prefill_step_hook) options_.prefill_step_hook();
    engine.step();

    // Each prompt computed this step moves on, or ends here (its first token ended it, it asked
    // for one token, it was cancelled or refused).
    std::vector<std::uint8_t> report, news;
    ByteWriter w(report), nw(news);
    handoffs.clear();
    ByteWriter hw(handoffs);
    handoff_count = 0;
    std::int64_t count = 0;
    std::vector<std::pair<RequestId, bool>> ended;  // and whether it kept its KV
    for (const RequestResult& r : engine.results()) {
      if (!over(r) || !settled.insert(r.id).second) continue;
      const RequestSpec& spec = arrived.at(r.id);
      const bool kept =
          r.state == RequestState::finished && r.finish_reason != FinishReason::cancelled;
      const bool moves = kept && r.finish_reason == FinishReason::length && spec.max_new_tokens > 1;
      write_split_news(nw, r, 0, 0, moves ? RequestState::decode : r.state, r.cached_prompt_tokens);
      ++count;
      if (!moves) {
        ended.emplace_back(r.id, kept);
        continue;
      }
      const std::int64_t tokens =
          static_cast<std::int64_t>(spec.prompt.size()) + spec.max_new_tokens;
      write_handoff(hw, {spec, r.output_tokens[0], r.cached_prompt_tokens,
                         (tokens + d.decode_page - 1) / d.decode_page * d.decode_page});
      ++handoff_count;
    }
    for (const auto& [id, kept] : ended) leave(id, kept);
    for (const RequestResult& r : endings) {
      write_news(nw, r, 0);
      ++count;
    }
    endings.clear();
    const RankLoad load = current_load(model, engine, spec_.model_options.page_size);
    w.raw(&load, sizeof load);
    w.i64(leader ? count : -1);
    if (leader) w.raw(news.data(), news.size());
    const std::vector<std::vector<std::uint8_t>> reports = all_gather_bytes(d.group, report);
    busy = false;
    report_count = static_cast<std::int64_t>(reports.size());
    reports_bytes.clear();
    ByteWriter rw(reports_bytes);
    for (const std::vector<std::uint8_t>& bytes : reports) {
      const RankLoad l = load_of(bytes);
      busy = busy || l.running > 0 || l.waiting > 0;
      rw.vec(bytes);
    }
  }
}

// The decode side: world rank 0 (the frontend) hears the prefill leader when it has spoken,
// answers it, and leads the decode ranks' steps; every decode rank adopts what moves to its
// replica and decodes.
void ServingDeployment::disaggregated_decode_loop(Communicator& world, DisaggregatedSide& d) {
  Engine& engine = d.sys.engine();
  MlaModel& model = d.sys.model();
  const bool frontend = world.rank() == 0;
  const bool reporter = d.sys.placement().attn_tp_rank == 0;  // its replica's first rank
  const int my_replica = d.sys.placement().dp_rank;
  const auto replicas = static_cast<std::size_t>(spec_.parallel.dp_size);
  const auto leader = static_cast<std::size_t>(d.decode_size);  // the prefill leader's world rank

  // The frontend's view: computed prompts waiting to move, in order; each decode replica's
  // reservations; every world rank's last report with its news taken out; the prefill side.
  std::deque<Handoff> ready;
  std::vector<std::int64_t> reserved(replicas, 0);
  std::vector<std::vector<std::uint8_t>> latest(static_cast<std::size_t>(world.size()));
  for (std::size_t rank = 0; rank < latest.size(); ++rank) {
    const RankLoad none;
    ByteWriter w(latest[rank]);
    w.raw(&none, sizeof none);
    w.i64(rank == leader ? 0 : -1);
  }
  std::vector<RequestSpec> arrivals;           // not yet sent to the prefill side
  std::unordered_set<RequestId> cancels_seen;  // a cancel is news once (those still open)
  std::vector<RequestId> releases;             // computed prompts cancelled while waiting
  bool news_due = true;  // the prefill leader has not spoken since our last answer
  bool prefill_busy = true, prefill_gone = false, reset_due = false;
  bool stopping = false, drain = true;
  std::vector<RequestResult> endings;  // the frontend's, and moves that failed on this replica

  // Every decode rank: adopted requests' reservations, and per request the tokens reported so
  // far and its cached prompt tokens (the prefill group's count).
  std::unordered_map<RequestId, std::int64_t> held;
  std::unordered_map<RequestId, std::pair<std::size_t, std::int64_t>> reported;
  std::int64_t moved_requests = 0, moved_bytes = 0;  // into this rank, so far
  bool decode_busy = false;

  // Prompts not yet computed or moved wait as queued requests do.
  const auto publish_with = [&](std::vector<std::vector<std::uint8_t>> reports, bool step) {
    RankLoad lead = load_of(reports[leader]);
    lead.awaiting_transfer = static_cast<std::int64_t>(ready.size());
    lead.waiting += lead.awaiting_transfer + static_cast<std::int64_t>(arrivals.size());
    std::memcpy(reports[leader].data(), &lead, sizeof lead);
    publish(reports, step);
  };
  const auto end_waiting = [&] {  // a cancelling shutdown: nothing computed moves
    for (const Handoff& h : ready) {
      releases.push_back(h.spec.id);
      endings.push_back(ending(h.spec.id, FinishReason::cancelled, ""));
    }
    ready.clear();
  };

  for (;;) {
    std::vector<std::uint8_t> control;
    if (frontend) {
      std::vector<RequestId> cancels;
      std::vector<std::vector<Handoff>> moving(replicas);
      for (bool step_due = false; !step_due;) {
        const auto started = std::chrono::steady_clock::now();
        // What the HTTP side asked for.
        const std::vector<std::uint8_t> asked =
            take_control(decode_busy, news_due && prefill_busy ? kPrefillPoll : options_.idle_tick);
        ByteReader in(asked);
        const bool stop_asked = in.i64() != 0, drain_asked = in.i64() != 0;
        const bool stop_news = stop_asked && (!stopping || drain != drain_asked);
        stopping = stop_asked;
        drain = drain_asked;
        reset_due = in.i64() != 0 || reset_due;
        for (std::int64_t k = in.i64(); k > 0; --k) arrivals.push_back(read_spec(in));
        cancels = in.vec<std::int64_t>();
        bool cancel_news = false;
        std::unordered_set<RequestId> open(cancels.begin(), cancels.end());
        for (const RequestId id : cancels) {
          cancel_news = cancel_news || !cancels_seen.contains(id);
          const auto waits = std::find_if(ready.begin(), ready.end(),
                                          [&](const Handoff& h) { return h.spec.id == id; });
          if (waits == ready.end()) continue;
          releases.push_back(id);
          endings.push_back(ending(id, FinishReason::cancelled, ""));
          ready.erase(waits);
        }
        cancels_seen = std::move(open);
        if (stopping && !drain) end_waiting();

        // The prefill leader's news, if it has spoken: its first tokens are published at once.
        const bool heard = news_due && world.probe(static_cast<int>(leader), kTagNews);
        if (heard) {
          const std::vector<std::uint8_t> news =
              recv_bytes(world, static_cast<int>(leader), kTagNews);
          ByteReader nr(news);
          prefill_busy = nr.i64() != 0;
          std::vector<std::vector<std::uint8_t>> reports = latest;
          const std::int64_t ranks = nr.i64();
          for (std::int64_t k = 0; k < ranks; ++k)
            reports[leader + static_cast<std::size_t>(k)] = nr.vec<std::uint8_t>();
          for (std::int64_t k = nr.i64(); k > 0; --k) ready.push_back(read_handoff(nr));
          if (stopping && !drain) end_waiting();
          if (ranks > 0) {
            publish_with(reports, false);
            for (std::size_t rank = leader; rank < latest.size(); ++rank)
              latest[rank] = without_news(reports[rank]);
          }
          news_due = false;
        }

        // While the leader waits: what moves now, in order, each to the replica with the fewest
        // tokens reserved among those that can hold it whole (ties to the lower).
        bool any_move = false;
        while (!news_due && !ready.empty()) {
          const std::int64_t need = ready.front().reserve;
          std::size_t to = replicas;
          for (std::size_t g = 0; g < replicas; ++g) {
            if (reserved[g] + need <= d.decode_capacity &&
                (to == replicas || reserved[g] < reserved[to]))
              to = g;
          }
          if (to == replicas) break;
          reserved[to] += need;
          moving[to].push_back(std::move(ready.front()));
          ready.pop_front();
          any_move = true;
        }

        bool answered = false;
        // The answer, when the leader waits and has more to compute or something to hear; the
        // last one (exit) once it is idle, stopping, and holds nothing waiting to move.
        const bool exit_now = !news_due && !prefill_gone && stopping && !prefill_busy &&
                              ready.empty() && arrivals.empty() && releases.empty() && !any_move;
        if (!news_due && !prefill_gone &&
            (prefill_busy || exit_now || any_move || stop_news || cancel_news || reset_due ||
             !arrivals.empty() || !releases.empty())) {
          std::vector<std::uint8_t> answer;
          ByteWriter w(answer);
          w.i64(stopping);
          w.i64(drain);
          w.i64(reset_due);
          w.i64(exit_now);
          w.i64(static_cast<std::int64_t>(arrivals.size()));
          for (const RequestSpec& spec : arrivals) write_spec(w, spec);
          w.vec(cancels);
          w.vec(releases);
          std::int64_t groups = 0;
          for (const auto& m : moving) groups += m.empty() ? 0 : 1;
          w.i64(groups);
          for (std::size_t g = 0; g < replicas; ++g) {
            if (moving[g].empty()) continue;
            w.i64(static_cast<std::int64_t>(g));
            w.i64(static_cast<std::int64_t>(moving[g].size()));
            for (const Handoff& h : moving[g]) {
              w.i64(h.spec.id);
              w.i64(static_cast<std::int64_t>(h.spec.prompt.size()));
            }
          }
          send_bytes(world, answer, static_cast<int>(leader), kTagControl);
          arrivals.clear();
          releases.clear();
          reset_due = false;
          news_due = true;
          prefill_busy = true;  // until its news says otherwise: listen closely for it
          prefill_gone = exit_now;
          answered = true;
        }
        step_due = decode_busy || any_move || !endings.empty() || stop_news || cancel_news ||
                   (stopping && prefill_gone);
        // Nothing to do yet (take_control returns at once while a cancel is pending, which the
        // prefill side may take a chunk to act on): look again after a poll's time.
        if (!step_due && !answered && !heard) {
          const auto spent = std::chrono::steady_clock::now() - started;
          if (spent < kPrefillPoll) std::this_thread::sleep_for(kPrefillPoll - spent);
        }
      }
      ByteWriter w(control);
      w.i64(stopping);
      w.i64(drain);
      w.i64(prefill_gone);
      w.vec(cancels);
      for (const auto& m : moving) {
        w.i64(static_cast<std::int64_t>(m.size()));
        for (const Handoff& h : m) write_handoff(w, h);
      }
    }
    broadcast_bytes(d.group, control, 0, /*patiently=*/true);
    ByteReader in(control);
    const bool stop = in.i64() != 0;
    const bool drained = in.i64() != 0;
    const bool prefill_done = in.i64() != 0;
    for (const RequestId id : in.vec<std::int64_t>()) engine.cancel(id);
    if (stop && !drained) engine.cancel_all();
    // The moves, replica by replica: only the prefill group and that replica's ranks take part.
    for (std::size_t g = 0; g < replicas; ++g) {
      std::vector<Handoff> moving(static_cast<std::size_t>(in.i64()));
      for (Handoff& h : moving) h = read_handoff(in);
      if (moving.empty()) continue;
      const bool mine = my_replica == static_cast<int>(g);
      std::vector<TransferItem> items;
      for (const Handoff& h : moving)
        items.push_back({h.spec.id, static_cast<std::int64_t>(h.spec.prompt.size())});
      const std::vector<TransferResult> results =
          transfer_kv(world, mine ? &d.sys.attn_tp_group() : nullptr, d.roles[g], items, d.shards,
                      mine ? &model.allocator() : nullptr);
      for (std::size_t i = 0; mine && i < moving.size(); ++i) {
        const Handoff& h = moving[i];
        const RequestId id = h.spec.id;
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
    engine.step();

    std::vector<std::uint8_t> report, news;
    ByteWriter w(report), nw(news);
    std::int64_t count = 0;
    std::vector<RequestId> ended;
    for (const RequestResult& r : engine.results()) {
      auto it = reported.find(r.id);
      if (it == reported.end()) continue;
      auto& [from, cached] = it->second;
      if (r.output_tokens.size() > from || over(r)) {
        write_split_news(nw, r, from, from - 1, r.state, cached);
        ++count;
      }
      from = r.output_tokens.size();
      if (over(r)) ended.push_back(r.id);
    }
    for (const RequestId id : ended) {
      engine.forget(id);
      reported.erase(id);
      held.erase(id);
    }
    for (const RequestResult& r : endings) {
      write_news(nw, r, 0);
      ++count;
    }
    endings.clear();
    RankLoad load = current_load(model, engine, spec_.model_options.page_size);
    load.moved_requests = moved_requests;
    load.moved_bytes = moved_bytes;
    for (const auto& entry : held) load.dealt_tokens += entry.second;
    w.raw(&load, sizeof load);
    w.i64(reporter ? count : -1);
    if (reporter) w.raw(news.data(), news.size());
    const std::vector<std::vector<std::uint8_t>> reports = all_gather_bytes(d.group, report);
    decode_busy = false;
    for (const std::vector<std::uint8_t>& bytes : reports) {
      const RankLoad l = load_of(bytes);
      decode_busy = decode_busy || l.running > 0 || l.waiting > 0;
    }
    if (frontend) {
      std::vector<std::vector<std::uint8_t>> all = latest;
      for (std::size_t rank = 0; rank < reports.size(); ++rank) {
        all[rank] = reports[rank];
        latest[rank] = without_news(reports[rank]);
        const RankPlacement& p = topology_.ranks[rank];
        if (p.attn_tp_rank == 0)
          reserved[static_cast<std::size_t>(p.dp_rank)] = load_of(reports[rank]).dealt_tokens;
      }
      publish_with(std::move(all), true);
    }
    if (stop && prefill_done && !decode_busy) break;
  }
}

}  // namespace dcp
