// A served deployment: the ranks of a DeploymentSpec run one engine step after another for as
// long as the server lives, and requests arrive from any thread of world rank 0's process.
//
// World rank 0 is the frontend. Before every step it broadcasts what changed (new requests,
// cancellations, shutdown) to every rank, so all engines stay in lockstep under threads and
// under MPI; after the step each DP replica's first rank reports its new tokens back to it.
// When nothing runs it still broadcasts a heartbeat every idle tick, so no rank waits on a
// collective past its timeout while the server is idle.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dcp/deployment.h"
#include "dcp/engine.h"
#include "dcp/error.h"
#include "dcp/sampling.h"

namespace dcp {

struct ServeRequest {
  std::vector<std::int32_t> prompt;  // >= 1 token id
  int max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<std::int32_t> stop_token_ids;  // an EOS, say
  int min_tokens = 0;                        // see RequestSpec::min_tokens
  int logprobs = -1;                         // see RequestSpec::logprobs
  int prompt_logprobs = -1;                  // see RequestSpec::prompt_logprobs
  std::int64_t prompt_logprobs_start = 0;    // see RequestSpec::prompt_logprobs_start

  // The engine request it becomes (every rank builds the same one).
  RequestSpec spec(RequestId id) const;
};

// Why submit() refused a request: HTTP maps each to its status.
enum class Refusal : std::uint8_t {
  invalid,        // a field outside its legal range (400)
  past_context,   // the prompt alone reaches the model's context, max_model_len (400)
  too_long,       // the prompt alone exceeds the KV cache (413)
  queue_full,     // max_queued_requests wait already (503)
  shutting_down,  // shutdown() was called (503)
};
class RefusedError : public Error {
 public:
  RefusedError(Refusal why, const std::string& message);
  Refusal why() const noexcept { return why_; }

 private:
  Refusal why_;
};

// What a request's stream holds after one or more steps, merged.
struct StreamUpdate {
  std::vector<std::int32_t> tokens;  // new tokens, in order
  std::vector<StepLogprobs> logprobs;
  std::vector<StepLogprobs> prompt_logprobs;  // when asked: all of them, in the first update
  bool finished = false;
  FinishReason finish_reason = FinishReason::none;
  std::string error;  // the engine rejected it
  std::int64_t cached_prompt_tokens = 0;  // RequestResult's, as of the latest update
  std::int64_t spec_verify_steps = 0;     // RequestResult's, as of the latest update
};

// When the frontend saw a request arrive, its first token and its end (steady clock).
struct StreamTiming {
  std::chrono::steady_clock::time_point submitted;
  std::optional<std::chrono::steady_clock::time_point> first_token, finished;
};

// One request's results as they come; owned jointly by the caller and the serving loop.
class RequestStream {
 public:
  RequestId id() const noexcept { return id_; }
  // Waits up to `timeout` for news; nullopt when there was none. After the update that says
  // finished, every call returns nullopt at once.
  std::optional<StreamUpdate> next(std::chrono::milliseconds timeout);
  // Asks the loop to end the request at its next step (a client went away); its KV is freed then.
  void cancel();
  StreamTiming timing();

 private:
  friend class ServingDeployment;
  explicit RequestStream(RequestId id) : id_(id) {}
  RequestId id_;
  std::mutex mutex_;
  std::condition_variable ready_;
  StreamUpdate pending_;
  bool has_news_ = false, delivered_end_ = false, cancel_asked_ = false;
  // Frontend-side timing, for the metrics.
  std::chrono::steady_clock::time_point last_token_;
  StreamTiming timing_;
};

struct ServeOptions {
  int max_queued_requests = 256;  // submitted but not yet admitted; beyond: Refusal::queue_full
  // A request's prompt and new tokens together at most; 0: the model's max_position_embeddings,
  // which it may not pass.
  std::int64_t max_model_len = 0;
  std::chrono::milliseconds idle_tick{50};
  // Prefill/decode disaggregation: > 0 puts a prefill group of this DCP (= TP) size after the
  // deployment's ranks (which decode; world rank 0, the frontend, is the first of them). Each
  // request's prompt (and first token) is computed there, and its KV moved to the decode replica
  // (DP replica or attention group) with the fewest tokens reserved that can hold the whole
  // request, which decodes it (check_disaggregation: the DCP sizes a transfer takes). Each group
  // steps at its own pace.
  int prefill_dcp_size = 0;
  // Tests: called on every prefill rank before each of its steps, so that a test can hold the
  // prefill group and see the decode side go on without it.
  std::function<void()> prefill_step_hook;
};

// A latency histogram with fixed bucket bounds in seconds (Prometheus-style, cumulative on output).
struct LatencyHistogram {
  static constexpr double kBounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                       0.5,   1.0,  2.5,   5.0,  10.0, 30.0};
  std::vector<std::int64_t> counts = std::vector<std::int64_t>(std::size(kBounds) + 1, 0);
  double sum_s = 0;
  std::int64_t count = 0;
  void observe(double seconds);
};

// A prefix cache's state in tokens (whole virtual pages: page size x DCP size each).
struct PrefixCacheTokens {
  std::int64_t lookup = 0, hit = 0;         // prompt tokens looked up, and of those found cached
  std::int64_t on_device = 0, on_host = 0;  // cached now, per tier
  std::int64_t offloaded = 0, reloaded = 0, dropped = 0;  // evicted to host, back, for good
  PrefixCacheTokens& operator+=(const PrefixCacheTokens& o);
};

struct ServeMetrics {
  std::int64_t running = 0, queued = 0;  // over all DP replicas
  std::int64_t prompt_tokens = 0, generation_tokens = 0;
  std::int64_t requests_finished = 0, requests_cancelled = 0, requests_rejected = 0;
  std::vector<std::int64_t> kv_rows_used;      // per world rank, per layer
  std::vector<std::int64_t> kv_rows_capacity;  // per world rank, per layer
  PrefixCacheTokens prefix_cache;              // over every DP group's cache
  // Disaggregated: requests whose KV moved to the decode side, the bytes the decode ranks
  // received, and computed prompts waiting for the decode side's KV (also in `queued`).
  std::int64_t kv_transfers = 0, kv_transfer_bytes = 0, awaiting_transfer = 0;
  // Speculative decoding, over every replica: request steps that verified drafts, draft tokens
  // proposed, and those the target kept.
  std::int64_t spec_verifications = 0, spec_proposed = 0, spec_accepted = 0;
  std::int64_t steps = 0;
  LatencyHistogram time_to_first_token, inter_token_latency;
  LatencyHistogram request_latency;  // arrival to last token, of the requests that finished
};

class ServingDeployment {
 public:
  // spec.requests must be empty (requests come through submit). Throws on a configuration that
  // cannot be served.
  ServingDeployment(DeploymentSpec spec, ServeOptions options = {});
  ~ServingDeployment();
  ServingDeployment(const ServingDeployment&) = delete;
  ServingDeployment& operator=(const ServingDeployment&) = delete;

  // Runs this process's ranks in the calling thread until shutdown() (threads: all of them; MPI:
  // this process's). `on_ready` is called on the frontend (world rank 0's process) once every
  // rank has loaded: start the HTTP server there. Rethrows a rank's error.
  void run(const std::function<void()>& on_ready = {});

  // Frontend only, any thread. Throws RefusedError; the deployment is unchanged then.
  std::shared_ptr<RequestStream> submit(const ServeRequest& request);
  ServeMetrics metrics() const;
  // Frontend only, any thread: every DP group's prefix cache forgets its pages before the next
  // step, ahead of the requests submitted by then (running requests keep the pages they use).
  // Throws dcp::Error (invalid_argument) naming enable_prefix_cache when the cache is off.
  void reset_prefix_cache();
  bool prefix_cache_enabled() const noexcept { return spec_.engine.enable_prefix_cache; }
  bool disaggregated() const noexcept { return options_.prefill_dcp_size > 0; }
  // The deployment served (its parallel layout, KV and engine options) and how.
  const DeploymentSpec& spec() const noexcept { return spec_; }
  const ServeOptions& options() const noexcept { return options_; }
  // Stops accepting; `drain`: in-flight requests finish, else they are cancelled. run() returns
  // once nothing is left.
  void shutdown(bool drain);
  bool ready() const;

  const ModelConfig& config() const noexcept { return spec_.model.config; }
  // The engine options every rank runs: the spec's, but with neither logit rows nor step
  // records kept (a server runs for days; they would grow with every step).
  const EngineOptions& engine_options() const noexcept { return spec_.engine; }
  // The vocabulary bytes guided requests are masked with (null: regexes are refused).
  const std::shared_ptr<const GuideVocabulary>& guide_vocabulary() const noexcept {
    return spec_.engine.guide_vocabulary;
  }
  // The logical KV capacity in tokens (every DP replica's is the same), known once ready.
  std::int64_t kv_capacity_tokens() const;
  std::int64_t max_model_len() const noexcept { return options_.max_model_len; }
  int max_queued_requests() const noexcept { return options_.max_queued_requests; }
  // The longest request (prompt and new tokens) served: the lesser of the two above.
  std::int64_t context_tokens() const;

 private:
  void rank_loop(Communicator& world);
  // ServeOptions::prefill_dcp_size > 0: the decode and prefill groups' loops (src/disagg), each
  // stepping at its own pace.
  struct DisaggregatedSide;
  void disaggregated_rank_loop(Communicator& world);
  void disaggregated_decode_loop(Communicator& world, DisaggregatedSide& side);
  void disaggregated_prefill_loop(Communicator& world, DisaggregatedSide& side);
  // Frontend: the deployment has loaded; requests of up to `capacity_tokens` may come.
  void become_ready(std::int64_t capacity_tokens);
  // What the ranks apply before the next step; waits up to `idle_wait` unless `engine_busy` or
  // something came.
  std::vector<std::uint8_t> take_control(bool engine_busy, std::chrono::milliseconds idle_wait);
  // Every world rank's report of a step: a RankLoad, then its news (-1: a rank that reports
  // none). `counts_step`: the reports are of an engine step (the decode side's, disaggregated).
  void publish(const std::vector<std::vector<std::uint8_t>>& reports, bool counts_step = true);

  DeploymentSpec spec_;
  ServeOptions options_;
  Topology topology_;   // the decoding ranks' (all of them without disaggregation)
  int world_size_ = 0;  // with the prefill group, when disaggregated
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::function<void()> on_ready_;
  bool ready_ = false, stopping_ = false, drain_ = true;
  bool reset_cache_ = false;  // asked by reset_prefix_cache, not yet sent to the ranks
  std::int64_t capacity_tokens_ = 0;
  RequestId next_id_ = 0;
  std::vector<std::pair<ServeRequest, std::shared_ptr<RequestStream>>> incoming_;
  std::vector<RequestId> cancels_;
  std::vector<std::shared_ptr<RequestStream>> live_;  // submitted, not finished
  ServeMetrics metrics_;
};

}  // namespace dcp
