#include "dcp/serving.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "core/bytes.h"
#include "dcp/disagg.h"
#include "dcp/prefix_router.h"
#include "engine/logprobs_bytes.h"
#include "engine/serving_wire.h"

namespace dcp {

RequestSpec ServeRequest::spec(RequestId id) const {
  RequestSpec r;
  r.id = id;
  r.prompt = prompt;
  r.max_new_tokens = max_new_tokens;
  r.sampling = sampling;
  r.stop_token_ids = stop_token_ids;
  r.min_tokens = min_tokens;
  r.logprobs = logprobs;
  r.prompt_logprobs = prompt_logprobs;
  r.prompt_logprobs_start = prompt_logprobs_start;
  return r;
}

RefusedError::RefusedError(Refusal why, const std::string& message)
    : Error(why == Refusal::invalid || why == Refusal::past_context
                ? ErrorCategory::invalid_argument
                : ErrorCategory::capacity,
            message),
      why_(why) {}

void LatencyHistogram::observe(double seconds) {
  std::size_t b = 0;
  while (b < std::size(kBounds) && seconds > kBounds[b]) ++b;
  ++counts[b];
  sum_s += seconds;
  ++count;
}

PrefixCacheTokens& PrefixCacheTokens::operator+=(const PrefixCacheTokens& o) {
  lookup += o.lookup;
  hit += o.hit;
  on_device += o.on_device;
  on_host += o.on_host;
  offloaded += o.offloaded;
  reloaded += o.reloaded;
  dropped += o.dropped;
  return *this;
}

std::optional<StreamUpdate> RequestStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (delivered_end_) return std::nullopt;
  ready_.wait_for(lock, timeout, [&] { return has_news_; });
  if (!has_news_) return std::nullopt;
  StreamUpdate out = std::move(pending_);
  pending_ = StreamUpdate{};
  has_news_ = false;
  delivered_end_ = out.finished;
  return out;
}

void RequestStream::cancel() {
  std::lock_guard lock(mutex_);
  cancel_asked_ = true;
}

StreamTiming RequestStream::timing() {
  std::lock_guard lock(mutex_);
  return timing_;
}

ServingDeployment::ServingDeployment(DeploymentSpec spec, ServeOptions options)
    : spec_(std::move(spec)),
      options_(options),
      topology_((check_runs_here(spec_.parallel), resolve(spec_.parallel))) {
  DCP_ARG_CHECK(spec_.requests.empty(), "a served deployment takes its requests through submit()");
  DCP_ARG_CHECK(options_.max_queued_requests >= 1, "max_queued_requests = ",
                options_.max_queued_requests, " must be >= 1");
  DCP_ARG_CHECK(options_.idle_tick.count() >= 1, "idle_tick must be >= 1 ms");
  const int positions = spec_.model.config.max_position_embeddings;
  if (options_.max_model_len == 0) options_.max_model_len = positions;
  DCP_ARG_CHECK(options_.max_model_len >= 1 && options_.max_model_len <= positions,
                "max_model_len = ", options_.max_model_len,
                " must be in [1, max_position_embeddings = ", positions, "] (the model's context)");
  spec_.engine.record_logits = false;  // a server never keeps whole logit rows
  spec_.engine.record_step_timings = false;  // nor a record of every step it ran
  DCP_ARG_CHECK(options_.prefill_dcp_size >= 0, "prefill_dcp_size = ", options_.prefill_dcp_size,
                " must be >= 0 (0: prefill and decode on the same ranks)");
  world_size_ = topology_.world_size;
  if (options_.prefill_dcp_size > 0) {
    check_disaggregation(spec_.parallel, spec_.model_options, options_.prefill_dcp_size);
    world_size_ += options_.prefill_dcp_size;
  }
  metrics_.kv_rows_used.assign(static_cast<std::size_t>(world_size_), 0);
  metrics_.kv_rows_capacity.assign(static_cast<std::size_t>(world_size_), 0);
}

ServingDeployment::~ServingDeployment() = default;

bool ServingDeployment::ready() const {
  std::lock_guard lock(mutex_);
  return ready_;
}

std::int64_t ServingDeployment::kv_capacity_tokens() const {
  std::lock_guard lock(mutex_);
  return capacity_tokens_;
}

std::int64_t ServingDeployment::context_tokens() const {
  return std::min(kv_capacity_tokens(), options_.max_model_len);
}

ServeMetrics ServingDeployment::metrics() const {
  std::lock_guard lock(mutex_);
  ServeMetrics m = metrics_;
  m.queued += static_cast<std::int64_t>(incoming_.size());
  return m;
}

void ServingDeployment::reset_prefix_cache() {
  DCP_ARG_CHECK(spec_.engine.enable_prefix_cache,
                "reset_prefix_cache: the prefix cache is off (enable_prefix_cache = false)");
  std::lock_guard lock(mutex_);
  reset_cache_ = true;
  wake_.notify_all();
}

void ServingDeployment::shutdown(bool drain) {
  std::lock_guard lock(mutex_);
  if (!stopping_) drain_ = drain;
  drain_ = drain_ && drain;  // a second, harder shutdown cancels
  stopping_ = true;
  wake_.notify_all();
}

std::shared_ptr<RequestStream> ServingDeployment::submit(const ServeRequest& req) {
  const ModelConfig& c = spec_.model.config;
  const auto refuse_if = [](bool bad, Refusal why, const std::string& message) {
    if (bad) throw RefusedError(why, message);
  };
  refuse_if(req.prompt.empty(), Refusal::invalid, "the prompt must hold at least one token");
  for (std::int32_t t : req.prompt) {
    refuse_if(t < 0 || t >= c.vocab_size, Refusal::invalid,
              str("prompt token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")"));
  }
  refuse_if(req.max_new_tokens < 1, Refusal::invalid,
            str("max_tokens = ", req.max_new_tokens, " must be >= 1"));
  try {  // what every rank's engine would refuse, refused here before it reaches them
    check_request_choice(req.spec(0), c.vocab_size, "max_tokens");
    request_guide(req.spec(0), spec_.engine.guide_vocabulary);
  } catch (const Error& e) {
    throw RefusedError(Refusal::invalid, e.what());
  }
  std::lock_guard lock(mutex_);
  refuse_if(stopping_, Refusal::shutting_down, "the server is shutting down");
  refuse_if(!ready_, Refusal::shutting_down, "the model is still loading");
  const std::int64_t prompt = static_cast<std::int64_t>(req.prompt.size());
  const std::int64_t model_len = options_.max_model_len;
  refuse_if(prompt >= model_len, Refusal::past_context,
            str("the prompt holds ", prompt, " tokens; the model's context is ", model_len,
                " tokens (max_model_len; prompt and new tokens together)"));
  refuse_if(prompt >= capacity_tokens_, Refusal::too_long,
            str("the prompt holds ", prompt, " tokens; the KV cache holds ", capacity_tokens_,
                " (prompt and new tokens together)"));
  const std::int64_t context = std::min(capacity_tokens_, model_len);
  refuse_if(prompt + req.max_new_tokens > context, Refusal::invalid,
            str("max_tokens = ", req.max_new_tokens, " with a prompt of ", prompt,
                " tokens exceeds the context of ", context, " tokens (at most ", context - prompt,
                "; ", context == model_len ? "max_model_len" : "the KV cache", ")"));
  const std::int64_t queued = metrics_.queued + static_cast<std::int64_t>(incoming_.size());
  refuse_if(queued >= options_.max_queued_requests, Refusal::queue_full,
            str(queued, " requests wait for KV already (the bound is ",
                options_.max_queued_requests, "); retry later"));
  auto stream = std::shared_ptr<RequestStream>(new RequestStream(next_id_++));
  stream->timing_.submitted = std::chrono::steady_clock::now();
  incoming_.emplace_back(req, stream);
  live_.push_back(stream);
  metrics_.prompt_tokens += prompt;
  wake_.notify_all();
  return stream;
}

// Frontend: what the ranks apply before the next step. Waits up to `idle_wait` when nothing
// runs anywhere and nothing arrived.
std::vector<std::uint8_t> ServingDeployment::take_control(bool busy,
                                                          std::chrono::milliseconds idle_wait) {
  std::unique_lock lock(mutex_);
  const auto news = [&] {
    if (!incoming_.empty() || stopping_ || reset_cache_) return true;
    for (const auto& s : live_) {
      std::lock_guard sl(s->mutex_);
      if (s->cancel_asked_) return true;
    }
    return false;
  };
  if (!busy && !news())
    wake_.wait_for(lock, idle_wait,
                   [&] { return !incoming_.empty() || stopping_ || reset_cache_; });
  std::vector<std::uint8_t> bytes;
  ByteWriter w(bytes);
  w.i64(stopping_);
  w.i64(drain_);
  w.i64(reset_cache_);
  reset_cache_ = false;
  w.i64(static_cast<std::int64_t>(incoming_.size()));
  for (const auto& [req, stream] : incoming_) {
    write_spec(w, req.spec(stream->id()));
  }
  metrics_.queued += static_cast<std::int64_t>(incoming_.size());  // until the next report
  incoming_.clear();
  std::vector<std::int64_t> cancels;
  for (const auto& s : live_) {
    std::lock_guard sl(s->mutex_);
    if (s->cancel_asked_) cancels.push_back(s->id());
  }
  w.vec(cancels);
  return bytes;
}

// Frontend: every rank's report of the step that just ran.
void ServingDeployment::publish(const std::vector<std::vector<std::uint8_t>>& reports,
                                bool counts_step) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  metrics_.running = metrics_.queued = 0;
  metrics_.prefix_cache = {};
  metrics_.kv_transfers = metrics_.kv_transfer_bytes = metrics_.awaiting_transfer = 0;
  metrics_.spec_verifications = metrics_.spec_proposed = metrics_.spec_accepted = 0;
  if (counts_step) ++metrics_.steps;
  for (std::size_t rank = 0; rank < reports.size(); ++rank) {
    ByteReader in(reports[rank]);
    RankLoad load;
    in.raw(&load, sizeof load);
    metrics_.kv_rows_used[rank] = load.kv_rows;
    metrics_.kv_rows_capacity[rank] = load.kv_capacity_rows;
    metrics_.kv_transfer_bytes += load.moved_bytes;
    const std::int64_t news = in.i64();
    if (news < 0) continue;  // not a replica's first rank: load only
    metrics_.running += load.running;
    metrics_.queued += load.waiting;
    metrics_.prefix_cache += load.cache;  // each DP group's cache once
    metrics_.kv_transfers += load.moved_requests;
    metrics_.awaiting_transfer += load.awaiting_transfer;
    metrics_.spec_verifications += load.spec_verifications;  // each replica's engine once
    metrics_.spec_proposed += load.spec_proposed;
    metrics_.spec_accepted += load.spec_accepted;
    for (std::int64_t k = 0; k < news; ++k) {
      StreamUpdate u;
      const RequestId id = in.i64();
      const auto state = static_cast<RequestState>(in.i64());
      u.finish_reason = static_cast<FinishReason>(in.i64());
      u.tokens = in.vec<std::int32_t>();
      u.logprobs = read_logprobs(in);
      u.prompt_logprobs = read_logprobs(in);
      const std::vector<char> error = in.vec<char>();
      u.error.assign(error.begin(), error.end());
      u.cached_prompt_tokens = in.i64();
      u.spec_verify_steps = in.i64();
      u.finished = state == RequestState::finished || state == RequestState::rejected;
      const auto it = std::find_if(live_.begin(), live_.end(),
                                   [&](const auto& s) { return s->id() == id; });
      if (it == live_.end()) continue;
      RequestStream& s = **it;
      metrics_.generation_tokens += static_cast<std::int64_t>(u.tokens.size());
      {
        std::lock_guard sl(s.mutex_);
        if (!u.tokens.empty()) {
          if (!s.timing_.first_token) {
            metrics_.time_to_first_token.observe(
                std::chrono::duration<double>(now - s.timing_.submitted).count());
            s.timing_.first_token = now;
            for (std::size_t t = 1; t < u.tokens.size(); ++t)
              metrics_.inter_token_latency.observe(0);
          } else {
            const double gap = std::chrono::duration<double>(now - s.last_token_).count() /
                               static_cast<double>(u.tokens.size());
            for (std::size_t t = 0; t < u.tokens.size(); ++t)
              metrics_.inter_token_latency.observe(gap);
          }
          s.last_token_ = now;
        }
        StreamUpdate& p = s.pending_;
        p.tokens.insert(p.tokens.end(), u.tokens.begin(), u.tokens.end());
        std::move(u.logprobs.begin(), u.logprobs.end(), std::back_inserter(p.logprobs));
        std::move(u.prompt_logprobs.begin(), u.prompt_logprobs.end(),
                  std::back_inserter(p.prompt_logprobs));
        p.finished = u.finished;
        p.finish_reason = u.finish_reason;
        p.error = u.error;
        p.cached_prompt_tokens = u.cached_prompt_tokens;
        p.spec_verify_steps = u.spec_verify_steps;
        if (u.finished) s.timing_.finished = now;
        s.has_news_ = true;
      }
      s.ready_.notify_all();
      if (u.finished) {
        if (state == RequestState::rejected) {
          ++metrics_.requests_rejected;
        } else if (u.finish_reason == FinishReason::cancelled) {
          ++metrics_.requests_cancelled;
        } else {
          ++metrics_.requests_finished;
          metrics_.request_latency.observe(
              std::chrono::duration<double>(now - s.timing_.submitted).count());
        }
        live_.erase(it);
      }
    }
  }
}

void ServingDeployment::become_ready(std::int64_t capacity_tokens) {
  {
    std::lock_guard lock(mutex_);
    capacity_tokens_ = capacity_tokens;
    ready_ = true;
  }
  if (on_ready_) on_ready_();
}

void ServingDeployment::rank_loop(Communicator& world) {
  RankSystem sys(world, topology_, spec_.model, spec_.model_options, spec_.engine, spec_.draft);
  Engine& engine = sys.engine();
  MlaModel& model = sys.model();
  const RankPlacement& me = sys.placement();
  const bool reporter = me.attn_tp_rank == 0;  // the first rank of its replica / attention group
  const int replicas = spec_.parallel.dp_size;
  // Per DP group, the KV tokens its unfinished requests will hold, as of the last reports; and
  // this rank's own group's unfinished requests with their tokens.
  std::vector<std::int64_t> group_load(static_cast<std::size_t>(replicas), 0);
  std::unordered_map<RequestId, std::int64_t> mine;
  const bool frontend = world.rank() == 0;
  if (frontend) become_ready(model.allocator().capacity_tokens());
  // With the prefix cache, a request goes to the group whose cache likely holds its prefix,
  // unless that group holds a quarter of a group's KV more than the least loaded one.
  std::optional<PrefixRouter> router;
  if (spec_.engine.enable_prefix_cache && replicas > 1) {
    router.emplace(model.allocator().virtual_page_size(), model.allocator().capacity_tokens() / 4);
  }
  std::unordered_map<RequestId, std::size_t> reported;  // tokens already reported, per request
  std::vector<RequestResult> refused;                    // submit() threw this step
  bool busy_anywhere = false;
  for (;;) {
    std::vector<std::uint8_t> control;
    if (frontend) control = take_control(busy_anywhere, options_.idle_tick);
    broadcast_bytes(world, control, 0, true);  // an idle server's next step may be a tick away
    ByteReader in(control);
    const bool stopping = in.i64() != 0;
    const bool drain = in.i64() != 0;
    if (in.i64() != 0) {  // before this step's arrivals, which then find nothing cached
      engine.prefix_cache()->clear();
      if (router) router->clear();
    }
    const std::int64_t arrivals = in.i64();
    for (std::int64_t k = 0; k < arrivals; ++k) {
      const RequestSpec spec = read_spec(in);
      // To the group with the most free KV: the fewest tokens dealt and unfinished (ties to
      // the lower group), or the router's; the same choice on every rank.
      const std::int64_t tokens =
          static_cast<std::int64_t>(spec.prompt.size()) + spec.max_new_tokens;
      const int group = router ? router->route(group_load, spec.prompt, tokens)
                               : deal_request(group_load, tokens);
      if (group != me.dp_rank) continue;
      mine[spec.id] = tokens;
      try {
        engine.submit(spec);
      } catch (const Error& e) {  // every rank of the replica refuses it alike
        RequestResult r;
        r.id = spec.id;
        r.state = RequestState::rejected;
        r.error = e.what();
        refused.push_back(std::move(r));
      }
    }
    for (const std::int64_t id : in.vec<std::int64_t>()) engine.cancel(id);
    if (stopping && !drain) engine.cancel_all();
    engine.step();

    std::vector<std::uint8_t> report;
    ByteWriter w(report);
    RankLoad load = current_load(model, engine, spec_.model_options.page_size);
    for (const RequestResult& r : engine.results()) {  // finished ones no longer hold KV
      if (r.state == RequestState::finished || r.state == RequestState::rejected) mine.erase(r.id);
    }
    for (const RequestResult& r : refused) mine.erase(r.id);
    for (const auto& entry : mine) load.dealt_tokens += entry.second;
    w.raw(&load, sizeof load);
    std::vector<RequestId> done;
    if (reporter) {
      std::vector<std::uint8_t> news;
      ByteWriter nw(news);
      std::int64_t count = 0;
      for (const RequestResult& r : engine.results()) {
        const bool over = r.state == RequestState::finished || r.state == RequestState::rejected;
        std::size_t& from = reported[r.id];
        if (r.output_tokens.size() > from || over) {
          write_news(nw, r, from);
          ++count;
        }
        from = r.output_tokens.size();
        if (over) done.push_back(r.id);
      }
      for (const RequestResult& r : refused) {
        write_news(nw, r, 0);
        ++count;
      }
      w.i64(count);
      w.raw(news.data(), news.size());
    } else {
      w.i64(-1);
      for (const RequestResult& r : engine.results()) {
        if (r.state == RequestState::finished || r.state == RequestState::rejected)
          done.push_back(r.id);
      }
    }
    refused.clear();
    for (const RequestId id : done) {
      engine.forget(id);
      reported.erase(id);
    }
    const std::vector<std::vector<std::uint8_t>> reports = all_gather_bytes(world, report);
    if (frontend) publish(reports);
    busy_anywhere = false;
    for (std::size_t rank = 0; rank < reports.size(); ++rank) {
      RankLoad l;
      std::memcpy(&l, reports[rank].data(), sizeof l);
      busy_anywhere = busy_anywhere || l.running > 0 || l.waiting > 0;
      const RankPlacement& p = topology_.ranks[rank];
      if (p.attn_tp_rank == 0) group_load[static_cast<std::size_t>(p.dp_rank)] = l.dealt_tokens;
    }
    if (stopping && !busy_anywhere) break;
  }
}

void ServingDeployment::run(const std::function<void()>& on_ready) {
  on_ready_ = on_ready;
  LaunchOptions lo;
  lo.transport = spec_.transport;
  lo.world_size = world_size_;
  lo.comm_timeout = spec_.comm_timeout;
  try {
    launch_ranks(lo, [&](Communicator& world, bool) {
      if (options_.prefill_dcp_size > 0) {
        disaggregated_rank_loop(world);
      } else {
        rank_loop(world);
      }
    });
  } catch (const std::exception& e) {
    // Nothing will answer the open requests: end them with the reason, then report it.
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (const auto& s : live_) {
      {
        std::lock_guard sl(s->mutex_);
        s->pending_.finished = true;
        s->pending_.error = str("the deployment failed: ", e.what());
        s->has_news_ = true;
      }
      s->ready_.notify_all();
    }
    live_.clear();
    throw;
  }
}

}  // namespace dcp
