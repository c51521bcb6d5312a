// The engine: requests in, tokens out. Continuous batching over one MlaModel rank; every rank
// of the group runs the same deterministic scheduler in lockstep (same requests, same steps).
// With DP attention each attention group schedules its own requests, and the groups agree on
// every forward (an idle group joins with an empty batch) and on when all are done.
//
// Each step: admit waiting requests whose whole KV (prompt + max_new_tokens) fits beside what
// running requests have reserved; run prefill chunks (at most chunked_prefill_size prompt
// tokens per step, the upstream extend path); then one decode forward for every request that
// has finished its prefill. Finished requests free their KV. A request larger than the whole
// cache is rejected (never crashes); one that fits later waits in the queue. With the prefix
// cache, a prompt's whole pages are cached as its prefill writes them, and a request that would
// hit pages another prefill is still writing waits for them (requests behind it may pass).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/model.h"
#include "dcp/prefix_cache.h"
#include "dcp/sampling.h"
#include "dcp/timing.h"
#include "dcp/token_guide.h"

namespace dcp {

struct RequestSpec {
  RequestId id = 0;
  std::vector<std::int32_t> prompt;  // >= 1 token ids
  int max_new_tokens = 1;            // >= 1
  // Teacher forcing: when non-empty, the token fed after step k is forced_outputs[k] instead of
  // the greedy choice (what --verify uses to compare logits step by step).
  std::vector<std::int32_t> forced_outputs;
  // Multi-turn: keep this request's KV when it finishes, so a later request can continue it.
  bool keep_kv = false;
  // Continue a finished request submitted with keep_kv: its context (prompt and outputs) stays
  // in the KV cache and `prompt` holds the new turn's tokens, prefilled over that prefix.
  std::optional<RequestId> continue_from;
  // How each new token is chosen (greedy by default); a draw depends only on the logits, the
  // seed and the step, so every rank chooses the same token.
  SamplingParams sampling;
  // The request ends (finish_reason stop) right after emitting one of these (an EOS, say).
  std::vector<std::int32_t> stop_token_ids;
  // [0, max_new_tokens]: the first min_tokens tokens are never one of stop_token_ids (their
  // logits are masked), as vLLM's min_tokens.
  int min_tokens = 0;
  // -1: none; k in [0, 20]: each step's chosen-token logprob and the k most likely tokens.
  int logprobs = -1;
  // -1: none; k in [0, 20]: for every prompt token after the first, its logprob given the tokens
  // before it and the k most likely tokens there (vLLM's prompt_logprobs). The prompt is then
  // computed whole from prompt_logprobs_start on: a prefix-cache hit stops before it, and the
  // steps that reach it prefill at most kPromptLogprobsChunk tokens (each needs logits for every
  // token).
  int prompt_logprobs = -1;
  // [0, prompt size]: the first prompt position given a logprob (SGLang's logprob_start_len); the
  // first token never has one, so 0 and 1 both mean the whole prompt.
  std::int64_t prompt_logprobs_start = 0;
};
inline constexpr int kPromptLogprobsChunk = 256;

// The checks of the fields that choose and report a request's tokens (stop token ids, min_tokens,
// sampling, logprobs, prompt_logprobs), shared by the engine and the server's admission so that
// both refuse alike. `budget_name` is what the caller's users call max_new_tokens. Throws
// dcp::Error (invalid_argument) naming the field.
void check_request_choice(const RequestSpec& spec, int vocab,
                          std::string_view budget_name = "max_new_tokens");
// The guide of a request with a regex, json_object or grammar (null without one) over
// `vocabulary`.
// Throws dcp::Error (invalid_argument) naming `field` when there is no vocabulary, when the
// pattern does not compile, or when no token can begin a match. Callers of check_request_choice
// call it too (it compiles the pattern once; check_request_choice only checks the combinations).
std::shared_ptr<TokenGuide> request_guide(const RequestSpec& spec,
                                          std::shared_ptr<const GuideVocabulary> vocabulary,
                                          std::string_view field = "regex");

enum class RequestState : std::uint8_t { waiting, prefill, decode, finished, rejected };
// Why a finished request ended: its token budget, a stop token, or cancel().
enum class FinishReason : std::uint8_t { none, length, stop, cancelled };
std::string_view to_string(FinishReason r) noexcept;

struct RequestResult {
  RequestId id = 0;
  RequestState state = RequestState::waiting;
  std::string error;                        // why it was rejected
  FinishReason finish_reason = FinishReason::none;
  std::vector<std::int32_t> output_tokens;  // the chosen tokens, one per step
  std::vector<float> step_logits;           // [steps, vocab] when record_logits
  std::vector<StepLogprobs> logprobs;       // one per output token when spec.logprobs >= 0
  // When asked: one per prompt token from position max(1, prompt_logprobs_start) on.
  std::vector<StepLogprobs> prompt_logprobs;
  std::int64_t cached_prompt_tokens = 0;      // prompt tokens whose KV the prefix cache held
  // Speculative decoding: the target steps that verified its drafts (SGLang's spec_verify_ct);
  // its tokens after the first over this count is its mean tokens per step.
  std::int64_t spec_verify_steps = 0;
};

struct EngineOptions {
  int chunked_prefill_size = 2048;  // prompt tokens per step (>= 1)
  int max_running_requests = 64;
  bool record_logits = false;
  // Keep every decode forward's wall time and its split in EngineStats (decode_step_ms,
  // decode_timings), for run reports and benchmarks. A server turns it off: it runs for days,
  // and the lists would grow by a few hundred bytes a step without end.
  bool record_step_timings = true;
  // Prefill chunks over a cached prefix: ForwardMode::extend (gather, upstream) or
  // ForwardMode::extend_native (DCP-native).
  ForwardMode extend_mode = ForwardMode::extend;
  // Speculative decoding: tokens the draft proposes per step (0: off). The draft is a model
  // (Engine's `draft`), or with ngram_draft = N > 0 none (prompt lookup): the tokens that
  // followed the latest earlier occurrence of the request's last n tokens (prompt and output),
  // for the largest n <= N that has one; none when no n has.
  int num_draft_tokens = 0;
  int ngram_draft = 0;
  // Prefix cache over whole virtual pages of prompts; with a host tier of this many logical
  // tokens (0: evicted pages are dropped).
  bool enable_prefix_cache = false;
  std::int64_t host_kv_capacity_tokens = 0;
  // The bytes each token writes, for requests with a regex (SamplingParams::regex); every rank's
  // engine holds the same. Null: such requests are refused.
  std::shared_ptr<const GuideVocabulary> guide_vocabulary;
};

struct EngineStats {
  double prefill_ms = 0;
  // Wall time of each decode forward, including (DP attention) those this rank's attention
  // group took part in with no tokens of its own.
  std::vector<double> decode_step_ms;
  std::vector<ForwardTimings> decode_timings;  // their split
  std::int64_t steps = 0;
  std::int64_t decode_tokens = 0;  // tokens this rank's group decoded
  std::int64_t max_queue = 0;  // most requests ever waiting for KV
  // Most KV rows this rank held per layer (its DCP shard, summed over requests), sampled after
  // every forward, before finished requests free theirs.
  std::int64_t peak_kv_rows = 0;
  std::int64_t peak_running = 0;  // most requests in one forward, sampled likewise
  // Speculative decoding, summed over requests.
  std::int64_t spec_verifications = 0;  // (request, target step) pairs that verified drafts
  std::int64_t spec_proposed = 0;       // draft tokens proposed
  std::int64_t spec_accepted = 0;       // draft tokens accepted
  std::int64_t spec_emitted = 0;        // tokens emitted by those steps (accepted + 1 each)
  double acceptance_rate() const {
    return spec_proposed ? static_cast<double>(spec_accepted) / spec_proposed : 0.0;
  }
  double tokens_per_target_step() const {
    return spec_verifications ? static_cast<double>(spec_emitted) / spec_verifications : 0.0;
  }
};

class Engine {
 public:
  // `draft` (optional) is a small model replicated on every rank (TP 1, DCP 1) that proposes
  // options.num_draft_tokens tokens per step; DCP stripes only the target's KV.
  Engine(MlaModel& model, const EngineOptions& options, MlaModel* draft = nullptr);

  // Queues a request. Throws on an invalid spec (empty prompt, max_new_tokens < 1, duplicate id,
  // token id outside the vocabulary); the engine is unchanged then.
  void submit(const RequestSpec& spec);
  // One scheduling step; false once nothing is left to do.
  bool step();
  // Steps until every request finished or was rejected. `progress` (may be empty) is called
  // after each step.
  void run(const std::function<void(const Engine&)>& progress = {});
  // Drops the KV a finished keep_kv request still holds.
  void release(RequestId id);
  // Ends a waiting or running request now (finish_reason cancelled) and frees its KV, kept or
  // not; its tokens so far stay in its result. False when no such request is unfinished.
  bool cancel(RequestId id);
  // cancel() for every waiting or running request (a server's cancelling shutdown).
  void cancel_all();
  // Drops a finished or rejected request's result (a server's memory stays bounded); its id may
  // be submitted again. False when the request is unknown, unfinished or keeps its KV.
  bool forget(RequestId id);
  // Disaggregated decode: takes over a request whose prompt KV is already in this engine's
  // allocator (length = prompt size, moved in by transfer_kv) and whose first token the prefill
  // side chose; it joins the running batch in decode state. With a draft, the draft computes the
  // prompt's KV here (the target's was transferred). Throws (capacity) and frees that request's KV
  // if its remaining tokens do not fit beside the running requests' reservations (the draft's
  // included).
  void adopt(const RequestSpec& spec, std::int32_t first_token);

  const std::vector<RequestResult>& results() const noexcept { return results_; }
  const EngineStats& stats() const noexcept { return stats_; }
  std::int64_t waiting() const noexcept;
  std::int64_t running() const noexcept;
  std::int64_t prompt_tokens_done() const noexcept { return prompt_done_; }
  std::int64_t prompt_tokens_total() const noexcept { return prompt_total_; }
  // The prefix cache, when enabled (else null).
  const PrefixCache* prefix_cache() const noexcept { return cache_.get(); }
  PrefixCache* prefix_cache() noexcept { return cache_.get(); }

 private:
  struct Live {
    RequestSpec spec;
    std::size_t result = 0;  // index into results_
    std::int64_t prefilled = 0;
    std::vector<std::int32_t> feed;  // tokens to prefill: [last output of the turn before] + prompt
    std::int64_t context = 0;        // tokens already in the KV when admitted (continuations)
    std::vector<std::int32_t> draft_pending;  // tokens the draft has not seen yet
    bool cacheable = false;  // its prompt (and, when it ends, reply) go into the prefix cache
    bool stopped = false;    // it emitted a stop token
    std::shared_ptr<TokenGuide> guide;  // its regex over the vocabulary, if it has one
  };
  std::int64_t pages_for(std::int64_t tokens) const;
  // The token fed after output k of `l`: its own, or the one teacher forcing gives.
  std::int32_t fed_after(const Live& l, std::size_t k) const;
  // Pages the running requests will still take in `allocator` (the target's or the draft's).
  std::int64_t reserved_pages(const KvAllocator& allocator) const;
  void admit();
  // Whole virtual pages of `prompt` (leaving its last token) that a running request's prefill is
  // writing and will put in the prefix cache: the longest prefix shared with a cacheable prompt.
  std::int64_t pages_in_flight(const std::vector<std::int32_t>& prompt) const;
  // Pages the draft lacks to hold request `id` at final length final_len beside the running
  // requests' reservations; <= 0 when it fits (always without a draft). The prefix cache lets
  // the target admit more than the draft holds.
  std::int64_t draft_pages_short(RequestId id, std::int64_t final_len) const;
  // The draft's prefill of `tokens` for `id` in chunks (a cached prefix the target shares, or an
  // adopted prompt whose target KV was transferred).
  void draft_prefill(RequestId id, const std::vector<std::int32_t>& tokens);
  bool run_prefill();
  bool run_decode();
  bool run_speculative();
  // The fields that choose and report a request's tokens; errors start with `who`.
  void check_choice(const RequestSpec& spec, const std::string& who) const;
  // request_guide with errors that start with `who`.
  std::shared_ptr<TokenGuide> guide_of(const RequestSpec& spec, const std::string& who) const;
  // Whether l's guide ends the request after `output` (false without a guide).
  bool guide_ends(const Live& l, std::span<const std::int32_t> output) const;
  // Whether `output` (not empty) ends l there: its last token a stop token, a guided choice
  // completed, the guide's end.
  bool stops_after(const Live& l, std::span<const std::int32_t> output) const;
  // What request l draws its next token from, given `logits` and the tokens it emitted so far
  // (`output`): its penalties, masks and guide applied, then temperature and truncation.
  TokenDistribution distribution(const Live& l, const float* logits,
                                 std::span<const std::int32_t> output) const;
  // The token request l chooses from `logits` after emitting `output`.
  std::int32_t choose(const Live& l, const float* logits,
                      std::span<const std::int32_t> output) const;
  // Feeds each request's pending tokens to the draft, then proposes up to k tokens each, drawn as
  // the target would choose them; `draft_distributions` gets what each was drawn from.
  std::vector<std::vector<std::int32_t>> propose(
      const std::vector<std::size_t>& members, const std::vector<int>& k,
      std::vector<std::vector<TokenDistribution>>& draft_distributions);
  // Without a draft model (ngram_draft): up to k tokens each by prompt lookup, each proposed with
  // certainty (its distribution holds it alone); k becomes how many each got.
  std::vector<std::vector<std::int32_t>> look_up(
      const std::vector<std::size_t>& members, std::vector<int>& k,
      std::vector<std::vector<TokenDistribution>>& draft_distributions) const;
  void emit(Live& r, const float* logits);  // records a step's logits, chooses the next token
  void emit(Live& r, const float* logits, std::int32_t token);  // records it, emits `token`
  void finish(std::size_t live_index, FinishReason reason);
  void finish_completed();  // every running request that has all its tokens
  // DP attention: whether any attention group's engine has `mine` true (collective over the
  // whole TP group, so that every group runs the same forwards; an idle group runs empty ones).
  // Otherwise `mine`.
  bool any_group(bool mine);
  // DP attention: this group's part in a decode forward another group runs (no tokens here).
  bool idle_decode(const ForwardBatch& empty);
  // A decode forward started at t0 with split t: into the stats (record_step_timings).
  void record_step(Clock::time_point t0, const ForwardTimings& t);

  MlaModel& model_;
  MlaModel* draft_;
  EngineOptions options_;
  std::vector<RequestId> kept_;  // finished requests whose KV is kept for a continuation
  std::unique_ptr<PrefixCache> cache_;
  std::vector<Live> waiting_;
  std::vector<Live> running_;
  std::vector<RequestResult> results_;
  EngineStats stats_;
  std::int64_t prompt_done_ = 0, prompt_total_ = 0;
};

}  // namespace dcp
