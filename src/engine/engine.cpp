#include "dcp/engine.h"

#include <algorithm>
#include <limits>

#include "dcp/error.h"
#include "dcp/gbnf_grammar.h"
#include "dcp/json_grammar.h"
#include "dcp/regex_dfa.h"
#include "dcp/timing.h"

namespace dcp {
namespace {
// The first prompt position a request's prompt logprobs cover (the first token has none).
std::int64_t first_scored(const RequestSpec& spec) {
  return std::max<std::int64_t>(spec.prompt_logprobs_start, 1);
}
}  // namespace

std::string_view to_string(FinishReason r) noexcept {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::length: return "length";
    case FinishReason::stop: return "stop";
    case FinishReason::cancelled: return "cancelled";
  }
  return "?";
}

Engine::Engine(MlaModel& model, const EngineOptions& options, MlaModel* draft)
    : model_(model), draft_(draft), options_(options) {
  DCP_ARG_CHECK(options.chunked_prefill_size >= 1,
                "chunked_prefill_size = ", options.chunked_prefill_size, " must be >= 1");
  DCP_ARG_CHECK(options.max_running_requests >= 1,
                "max_running_requests = ", options.max_running_requests, " must be >= 1");
  DCP_ARG_CHECK(options.extend_mode != ForwardMode::decode,
                "extend_mode must be extend or extend_native");
  DCP_ARG_CHECK(options.num_draft_tokens >= 0, "num_draft_tokens = ", options.num_draft_tokens,
                " must be >= 0");
  DCP_ARG_CHECK(options.ngram_draft >= 0, "ngram_draft = ", options.ngram_draft,
                " must be >= 0 (0: a draft model proposes)");
  DCP_ARG_CHECK(
      options.ngram_draft == 0 || draft == nullptr,
      "speculative decoding takes a draft model or n-gram lookup (ngram_draft), not both");
  DCP_ARG_CHECK(options.ngram_draft == 0 || options.num_draft_tokens > 0,
                "ngram_draft = ", options.ngram_draft, " needs num_draft_tokens >= 1");
  DCP_ARG_CHECK(options.num_draft_tokens == 0 || draft != nullptr || options.ngram_draft > 0,
                "num_draft_tokens > 0 needs a draft model or ngram_draft >= 1");
  if (draft) {
    DCP_ARG_CHECK(draft->config().vocab_size == model.config().vocab_size,
                  "the draft model's vocabulary (", draft->config().vocab_size,
                  ") differs from the target's (", model.config().vocab_size, ")");
    DCP_ARG_CHECK(draft->dcp_group().size() == 1 && draft->tp_group().size() == 1,
                  "the draft model must be replicated on every rank (TP 1, DCP 1)");
  }
  if (options.enable_prefix_cache) {
    std::vector<LatentPool*> pools;
    for (int l = 0; l < model.config().num_hidden_layers; ++l)
      pools.push_back(&model.kv_shard(l).pool());
    cache_ = std::make_unique<PrefixCache>(model.allocator(), pools, model.dcp_group().rank(),
                                           options.host_kv_capacity_tokens);
  } else {
    DCP_ARG_CHECK(options.host_kv_capacity_tokens == 0,
                  "host_kv_capacity_tokens > 0 needs enable_prefix_cache");
  }
}

void check_request_choice(const RequestSpec& spec, int vocab, std::string_view budget_name) {
  for (std::int32_t t : spec.stop_token_ids) {
    DCP_ARG_CHECK(t >= 0 && t < vocab, "stop token id ", t, " is outside the vocabulary [0, ",
                  vocab, ")");
  }
  DCP_ARG_CHECK(spec.min_tokens >= 0 && spec.min_tokens <= spec.max_new_tokens,
                "min_tokens = ", spec.min_tokens, " must be in [0, ", budget_name, " = ",
                spec.max_new_tokens, "]");
  // min_tokens masks the stop tokens too.
  validate(spec.sampling, vocab,
           spec.min_tokens > 0 ? std::span<const std::int32_t>(spec.stop_token_ids)
                               : std::span<const std::int32_t>());
  DCP_ARG_CHECK(spec.logprobs >= -1 && spec.logprobs <= 20, "logprobs = ", spec.logprobs,
                " must be in [0, 20] (-1: none)");
  DCP_ARG_CHECK(spec.prompt_logprobs >= -1 && spec.prompt_logprobs <= 20,
                "prompt_logprobs = ", spec.prompt_logprobs, " must be in [0, 20] (-1: none)");
  DCP_ARG_CHECK(spec.prompt_logprobs_start >= 0 &&
                    spec.prompt_logprobs_start <= static_cast<std::int64_t>(spec.prompt.size()),
                "prompt_logprobs_start = ", spec.prompt_logprobs_start, " must be in [0, ",
                spec.prompt.size(), "] (the prompt's positions)");
}

std::shared_ptr<TokenGuide> request_guide(const RequestSpec& spec,
                                          std::shared_ptr<const GuideVocabulary> vocabulary,
                                          std::string_view field) {
  const SamplingParams& p = spec.sampling;
  if (p.regex.empty() && !p.json_object && p.grammar.empty()) return nullptr;
  DCP_ARG_CHECK(vocabulary, "'", field,
                "' needs the vocabulary's bytes (a tokenizer); this engine has none");
  std::shared_ptr<const ByteGrammar> grammar;
  if (p.json_object) {
    grammar = std::make_shared<const JsonGrammar>();  // one per request: it grows as it is walked
  } else if (!p.grammar.empty()) {
    auto gbnf = std::make_shared<const GbnfGrammar>(p.grammar, field);  // one per request too
    DCP_ARG_CHECK(gbnf->extendable(gbnf->start()), "'", field,
                  "' derives only the empty text (a reply holds at least one token)");
    grammar = std::move(gbnf);
  } else {
    auto dfa = shared_regex(p.regex, field);  // compiled once for every request and rank
    DCP_ARG_CHECK(dfa->extendable(dfa->start()), "'", field,
                  "' matches only the empty text (a reply holds at least one token)");
    grammar = std::move(dfa);
  }
  auto guide = std::make_shared<TokenGuide>(std::move(grammar), std::move(vocabulary));
  DCP_ARG_CHECK(!guide->allowed(guide->grammar().start()).empty(), "'", field,
                "': no token of the vocabulary begins a match");
  return guide;
}

void Engine::check_choice(const RequestSpec& spec, const std::string& who) const {
  try {
    check_request_choice(spec, model_.config().vocab_size);
  } catch (const Error& e) {
    throw Error(e.category(), str(who, ": ", e.what()));
  }
}

std::shared_ptr<TokenGuide> Engine::guide_of(const RequestSpec& spec,
                                             const std::string& who) const {
  try {
    return request_guide(spec, options_.guide_vocabulary);
  } catch (const Error& e) {
    throw Error(e.category(), str(who, ": ", e.what()));
  }
}

bool Engine::guide_ends(const Live& l, std::span<const std::int32_t> output) const {
  if (!l.guide) return false;
  // A match nothing may extend; or no token can continue (a match whose stop tokens were not
  // asked for, or a vocabulary that cannot spell the next bytes the pattern needs).
  const std::optional<std::size_t> start = l.spec.sampling.guide_start(output);
  if (!start) return false;  // not guided yet
  const std::optional<std::int32_t> s = l.guide->state_after(output.subspan(*start));
  return !s || !l.guide->grammar().extendable(*s) || l.guide->allowed(*s).empty();
}

void Engine::submit(const RequestSpec& spec) {
  DCP_ARG_CHECK(!spec.prompt.empty(), "request ", spec.id, ": the prompt must hold >= 1 token");
  DCP_ARG_CHECK(spec.max_new_tokens >= 1, "request ", spec.id,
                ": max_new_tokens = ", spec.max_new_tokens, " must be >= 1");
  DCP_ARG_CHECK(spec.forced_outputs.empty() || options_.num_draft_tokens == 0, "request ", spec.id,
                ": teacher forcing and speculative decoding do not combine");
  for (std::int32_t t : spec.prompt) {
    DCP_ARG_CHECK(t >= 0 && t < model_.config().vocab_size, "request ", spec.id, ": token id ", t,
                  " is outside the vocabulary [0, ", model_.config().vocab_size, ")");
  }
  check_choice(spec, str("request ", spec.id));
  // A continuation's prompt is its new turn only; the earlier turns' tokens are not kept.
  DCP_ARG_CHECK(spec.sampling.repetition_penalty == 1 || !spec.continue_from, "request ", spec.id,
                ": repetition_penalty does not combine with continue_from (the penalty covers the "
                "prompt, and a continuation's earlier turns are not kept as tokens)");
  DCP_ARG_CHECK(spec.prompt_logprobs < 0 || !spec.continue_from, "request ", spec.id,
                ": prompt_logprobs does not combine with continue_from (the earlier turns are "
                "not computed again)");
  for (const RequestResult& r : results_) {
    DCP_ARG_CHECK(r.id != spec.id, "request id ", spec.id, " was already submitted");
  }
  Live live{spec, 0, 0, {}, 0, {}, false, false, nullptr};
  live.guide = guide_of(spec, str("request ", spec.id));
  if (spec.continue_from) {
    const RequestId from = *spec.continue_from;
    const auto kept = std::find(kept_.begin(), kept_.end(), from);
    DCP_ARG_CHECK(kept != kept_.end(), "request ", spec.id, " continues request ", from,
                  ", which has not finished with keep_kv");
    const RequestResult& prev = *std::find_if(results_.begin(), results_.end(),
                                              [&](const RequestResult& r) { return r.id == from; });
    live.feed.push_back(prev.output_tokens.back());  // its last token never entered the KV
    kept_.erase(kept);
    // Take over the earlier turn's KV now, so nothing else can claim it.
    model_.allocator().rename(from, spec.id);
    if (draft_) draft_->allocator().rename(from, spec.id);
    live.context = model_.allocator().length(spec.id);
  }
  live.feed.insert(live.feed.end(), spec.prompt.begin(), spec.prompt.end());
  live.cacheable = cache_ && !spec.continue_from;
  RequestResult result;
  result.id = spec.id;
  results_.push_back(result);
  live.result = results_.size() - 1;
  prompt_total_ += static_cast<std::int64_t>(live.feed.size());
  waiting_.push_back(std::move(live));
}

void Engine::release(RequestId id) {
  const auto kept = std::find(kept_.begin(), kept_.end(), id);
  DCP_ARG_CHECK(kept != kept_.end(), "release: request ", id, " holds no kept KV");
  model_.allocator().free(id);
  if (draft_) draft_->allocator().free(id);
  kept_.erase(kept);
}

void Engine::cancel_all() {
  std::vector<RequestId> open;
  for (const RequestResult& r : results_) {
    if (r.state != RequestState::finished && r.state != RequestState::rejected)
      open.push_back(r.id);
  }
  for (const RequestId id : open) cancel(id);
}

bool Engine::cancel(RequestId id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (it->spec.id != id) continue;
    if (it->context > 0) {  // a continuation already holds its earlier turn's KV
      model_.allocator().free(id);
      if (draft_) draft_->allocator().free(id);
    }
    results_[it->result].state = RequestState::finished;
    results_[it->result].finish_reason = FinishReason::cancelled;
    waiting_.erase(it);
    return true;
  }
  for (std::size_t i = 0; i < running_.size(); ++i) {
    if (running_[i].spec.id != id) continue;
    running_[i].spec.keep_kv = false;
    finish(i, FinishReason::cancelled);
    return true;
  }
  return false;
}

bool Engine::forget(RequestId id) {
  const auto it = std::find_if(results_.begin(), results_.end(),
                               [&](const RequestResult& r) { return r.id == id; });
  if (it == results_.end()) return false;
  if (it->state != RequestState::finished && it->state != RequestState::rejected) return false;
  if (std::find(kept_.begin(), kept_.end(), id) != kept_.end()) return false;
  const std::size_t index = static_cast<std::size_t>(it - results_.begin());
  results_.erase(it);
  for (std::vector<Live>* live : {&waiting_, &running_}) {
    for (Live& l : *live)
      if (l.result > index) --l.result;
  }
  return true;
}

void Engine::adopt(const RequestSpec& spec, std::int32_t first_token) {
  KvAllocator& alloc = model_.allocator();
  DCP_ARG_CHECK(alloc.contains(spec.id) &&
                    alloc.length(spec.id) == static_cast<std::int64_t>(spec.prompt.size()),
                "adopt: request ", spec.id, " must hold exactly its ", spec.prompt.size(),
                " prompt tokens of KV");
  DCP_ARG_CHECK(
      spec.max_new_tokens >= 1 && first_token >= 0 && first_token < model_.config().vocab_size,
      "adopt: request ", spec.id, " needs max_new_tokens >= 1 and a first token in the vocabulary");
  check_choice(spec, str("adopt: request ", spec.id));
  std::shared_ptr<TokenGuide> guide = guide_of(spec, str("adopt: request ", spec.id));
  DCP_ARG_CHECK(spec.prompt_logprobs < 0, "adopt: request ", spec.id,
                ": prompt_logprobs is not supported (its prompt was computed elsewhere)");
  const std::int64_t final_len =
      static_cast<std::int64_t>(spec.prompt.size()) + spec.max_new_tokens;
  const std::int64_t need =
      pages_for(final_len) - static_cast<std::int64_t>(alloc.pages(spec.id).size());
  if (need > alloc.free_pages() - reserved_pages(alloc) ||
      draft_pages_short(spec.id, final_len) > 0) {
    alloc.free(spec.id);
    throw Error(ErrorCategory::capacity, str("adopt: request ", spec.id, " needs ", need,
                                             " more KV pages than the decode side can reserve"));
  }
  if (draft_) {  // the draft's KV of the prompt is computed here, not transferred
    draft_->allocator().allocate(spec.id, 0);
    draft_prefill(spec.id, spec.prompt);
  }
  RequestResult result;
  result.id = spec.id;
  result.state = RequestState::decode;
  result.output_tokens.push_back(first_token);
  results_.push_back(result);
  Live live{spec,
            results_.size() - 1,
            static_cast<std::int64_t>(spec.prompt.size()),
            spec.prompt,
            0,
            {},
            false,
            false,
            std::move(guide)};
  live.draft_pending = {first_token};
  // The first token ends the request as emit() would have ended it there (a stop token the
  // prefill side could choose only with min_tokens 0, a choice, a guide's end).
  live.stopped = stops_after(live, results_.back().output_tokens);
  running_.push_back(std::move(live));
  if (running_.back().stopped) {
    finish(running_.size() - 1, FinishReason::stop);
  } else if (spec.max_new_tokens == 1) {
    finish(running_.size() - 1, FinishReason::length);
  }
}

std::int64_t Engine::waiting() const noexcept {
  return static_cast<std::int64_t>(waiting_.size());
}
std::int64_t Engine::running() const noexcept {
  return static_cast<std::int64_t>(running_.size());
}

namespace {
std::int64_t final_length(std::int64_t context, std::int64_t feed, std::int64_t max_new) {
  return context + feed + max_new;
}
std::int64_t pages_for(const KvAllocator& a, std::int64_t tokens) {
  const std::int64_t vp = a.virtual_page_size();
  return (tokens + vp - 1) / vp;
}
}  // namespace

std::int64_t Engine::pages_for(std::int64_t tokens) const {
  return dcp::pages_for(model_.allocator(), tokens);
}

std::int32_t Engine::fed_after(const Live& l, std::size_t k) const {
  return k < l.spec.forced_outputs.size() ? l.spec.forced_outputs[k]
                                          : results_[l.result].output_tokens[k];
}

std::int64_t Engine::reserved_pages(const KvAllocator& a) const {
  // Pages running requests will still take in `a` before they finish.
  std::int64_t r = 0;
  for (const Live& l : running_) {
    const std::int64_t final_len =
        final_length(l.context, static_cast<std::int64_t>(l.feed.size()), l.spec.max_new_tokens);
    r += dcp::pages_for(a, final_len) - static_cast<std::int64_t>(a.pages(l.spec.id).size());
  }
  return r;
}

std::int64_t Engine::pages_in_flight(const std::vector<std::int32_t>& prompt) const {
  const std::int64_t vp = model_.allocator().virtual_page_size();
  const auto usable = static_cast<std::ptrdiff_t>(prompt.size()) - 1;  // as a cache hit leaves
  std::int64_t best = 0;
  for (const Live& l : running_) {
    if (!l.cacheable || results_[l.result].state != RequestState::prefill) continue;
    const std::vector<std::int32_t>& p = l.spec.prompt;
    const auto n = std::min<std::ptrdiff_t>(usable, static_cast<std::ptrdiff_t>(p.size()));
    const auto common = std::mismatch(prompt.begin(), prompt.begin() + n, p.begin()).first;
    best = std::max<std::int64_t>(best, (common - prompt.begin()) / vp);
  }
  return best;
}

std::int64_t Engine::draft_pages_short(RequestId id, std::int64_t final_len) const {
  // The draft holds every token of every request itself (no prefix sharing), so with the prefix
  // cache the target may admit what the draft cannot hold yet.
  if (!draft_) return 0;
  const KvAllocator& d = draft_->allocator();
  const std::int64_t held = d.contains(id) ? static_cast<std::int64_t>(d.pages(id).size()) : 0;
  return dcp::pages_for(d, final_len) - held - (d.free_pages() - reserved_pages(d));
}

void Engine::draft_prefill(RequestId id, const std::vector<std::int32_t>& tokens) {
  const std::int64_t n = static_cast<std::int64_t>(tokens.size());
  for (std::int64_t at = 0; at < n; at += options_.chunked_prefill_size) {
    const std::int64_t chunk = std::min<std::int64_t>(options_.chunked_prefill_size, n - at);
    draft_->extend(id, chunk);
    ForwardBatch d;
    d.mode = ForwardMode::extend;
    d.entries = {{id, static_cast<std::int32_t>(chunk)}};
    d.tokens.assign(tokens.begin() + at, tokens.begin() + at + chunk);
    draft_->forward(d);
  }
}

void Engine::admit() {
  KvAllocator& alloc = model_.allocator();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const std::int64_t final_len = final_length(
        it->context, static_cast<std::int64_t>(it->feed.size()), it->spec.max_new_tokens);
    // Can never fit (in the target's cache, or the draft's): reject, keep serving the others.
    const std::int64_t capacity = draft_ ? std::min(alloc.capacity_tokens(),
                                                    draft_->allocator().capacity_tokens())
                                         : alloc.capacity_tokens();
    const int positions = model_.config().max_position_embeddings;
    if (final_len > capacity || final_len > positions) {
      RequestResult& r = results_[it->result];
      r.state = RequestState::rejected;
      r.error = final_len > positions
                    ? str("needs ", final_len, " positions; the model's context is ", positions,
                          " (max_position_embeddings)")
                    : str("needs ", final_len, " tokens of KV; the cache holds ", capacity,
                          " (raise kv_capacity_tokens)");
      if (it->context > 0) {
        alloc.free(it->spec.id);
        if (draft_) draft_->allocator().free(it->spec.id);
      }
      it = waiting_.erase(it);
      continue;
    }
    if (static_cast<int>(running_.size()) >= options_.max_running_requests) break;
    // A prompt that another request's prefill is computing pages of (the choices of one prompt, a
    // shared system prompt) waits for them to enter the cache rather than computing them again.
    // Later requests may pass it meanwhile: it waits at most until those pages are written.
    // A prompt with prompt_logprobs is computed from the token before its first scored one: the
    // cache is looked up (and waited for) over the prompt up to that token only.
    std::vector<std::int32_t> unscored;
    const std::vector<std::int32_t>* lookup = &it->feed;
    if (it->spec.prompt_logprobs >= 0) {
      unscored.assign(it->feed.begin(), it->feed.begin() + first_scored(it->spec));
      lookup = &unscored;
    }
    // (Scored from position 1: nothing before it to hit.)
    const bool may_hit =
        it->cacheable && (it->spec.prompt_logprobs < 0 || first_scored(it->spec) > 1);
    if (may_hit && pages_in_flight(*lookup) > cache_->cached_pages(*lookup)) {
      ++it;
      continue;
    }
    const std::int64_t reserved = reserved_pages(alloc);  // what running requests will take
    // A prefix-cache hit: whole pages the request shares instead of computing (pinned for now).
    std::vector<std::int32_t> hit, prefix;
    if (may_hit) hit = cache_->match(*lookup, reserved);
    const std::int64_t held = it->context > 0
                                  ? static_cast<std::int64_t>(alloc.pages(it->spec.id).size())
                                  : static_cast<std::int64_t>(hit.size());
    const std::int64_t need = pages_for(final_len) - held;
    const bool draft_short = draft_pages_short(it->spec.id, final_len) > 0;
    // Evict only what admits the request: while it waits anyway, the cache keeps its pages.
    const std::int64_t short_of = need - (alloc.free_pages() - reserved);
    if (cache_ && short_of > 0 && !draft_short && short_of <= cache_->unused_pages())
      cache_->make_room(need + reserved);
    if (need > alloc.free_pages() - reserved || draft_short) {
      if (cache_) cache_->unpin(hit);  // FIFO: wait for KV
      break;
    }
    if (may_hit)
      cache_->count_lookup(static_cast<std::int64_t>(it->feed.size()),
                           static_cast<std::int64_t>(hit.size()));
    if (it->context == 0) {
      if (hit.empty()) {
        alloc.allocate(it->spec.id, 0);
      } else {  // the cached prefix becomes this request's context; only the rest is prefilled
        alloc.allocate_shared(it->spec.id, hit);
        cache_->unpin(hit);
        it->context = alloc.length(it->spec.id);
        results_[it->result].cached_prompt_tokens = it->context;
        prefix.assign(it->feed.begin(), it->feed.begin() + it->context);
        it->feed.erase(it->feed.begin(), it->feed.begin() + it->context);
        prompt_done_ += it->context;
      }
      if (draft_) {  // the draft has no cache: it computes the cached prefix's KV itself
        draft_->allocator().allocate(it->spec.id, 0);
        if (!prefix.empty()) draft_prefill(it->spec.id, prefix);
      }
    }
    results_[it->result].state = RequestState::prefill;
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
  }
  stats_.max_queue = std::max(stats_.max_queue, static_cast<std::int64_t>(waiting_.size()));
}

TokenDistribution Engine::distribution(const Live& l, const float* logits,
                                       std::span<const std::int32_t> output) const {
  const SamplingParams& p = l.spec.sampling;
  const int vocab = model_.config().vocab_size;
  const bool hold_stops = static_cast<std::int64_t>(output.size()) < l.spec.min_tokens &&
                          !l.spec.stop_token_ids.empty();
  // A guide's state; none past its end (a speculative proposal after the request would stop).
  // Not guided yet (before guide_after): as without a guide.
  std::optional<std::int32_t> state;
  if (l.guide) {
    if (const std::optional<std::size_t> start = p.guide_start(output))
      state = l.guide->state_after(output.subspan(*start));
  }
  if (!p.adjusts_logits() && !hold_stops && !state) return token_distribution(logits, vocab, p);
  std::vector<float> adjusted = p.adjusts_logits()
                                    ? adjusted_logits(logits, vocab, p, l.spec.prompt, output)
                                    : std::vector<float>(logits, logits + vocab);
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  if (hold_stops) {
    for (std::int32_t t : l.spec.stop_token_ids) adjusted[static_cast<std::size_t>(t)] = kMasked;
  }
  // Only the tokens that keep the output a prefix of a match, and the stop tokens after a match.
  // None at all only past the end (as above): then nothing is masked.
  const std::vector<std::int32_t>* allowed = state ? &l.guide->allowed(*state) : nullptr;
  const bool stops_open = state && l.guide->grammar().accepting(*state) && !hold_stops;
  if (allowed && (!allowed->empty() || (stops_open && !l.spec.stop_token_ids.empty()))) {
    const auto& stops = l.spec.stop_token_ids;
    auto next = allowed->begin();  // ascending
    for (std::int32_t t = 0; t < vocab; ++t) {
      if (next != allowed->end() && *next == t) {
        ++next;
      } else if (!stops_open || std::find(stops.begin(), stops.end(), t) == stops.end()) {
        adjusted[static_cast<std::size_t>(t)] = kMasked;
      }
    }
  }
  return token_distribution(adjusted.data(), vocab, p);
}

std::int32_t Engine::choose(const Live& l, const float* logits,
                            std::span<const std::int32_t> output) const {
  return draw_token(distribution(l, logits, output),
                    draw_uniform(l.spec.sampling.seed, output.size(), DrawPurpose::token));
}

void Engine::emit(Live& l, const float* logits) {
  emit(l, logits, choose(l, logits, results_[l.result].output_tokens));
}

void Engine::emit(Live& l, const float* logits, std::int32_t token) {
  RequestResult& r = results_[l.result];
  const int vocab = model_.config().vocab_size;
  if (options_.record_logits) r.step_logits.insert(r.step_logits.end(), logits, logits + vocab);
  if (l.spec.logprobs >= 0)
    r.logprobs.push_back(step_logprobs(logits, vocab, token, l.spec.logprobs));
  r.output_tokens.push_back(token);
  if (stops_after(l, r.output_tokens)) l.stopped = true;
}

bool Engine::stops_after(const Live& l, std::span<const std::int32_t> output) const {
  const auto& stops = l.spec.stop_token_ids;
  return std::find(stops.begin(), stops.end(), output.back()) != stops.end() ||
         l.spec.sampling.completes_choice(output) ||  // a guided choice
         guide_ends(l, output);
}

void Engine::finish(std::size_t i, FinishReason reason) {
  Live& l = running_[i];
  if (l.spec.keep_kv) {
    // A continuation extends both caches by the same tokens, so the draft must first see what
    // the target's KV holds: its pending tokens but the last (which neither has consumed).
    if (draft_ && l.draft_pending.size() > 1) {
      const std::int32_t n = static_cast<std::int32_t>(l.draft_pending.size()) - 1;
      draft_->extend(l.spec.id, n);
      ForwardBatch catch_up;
      catch_up.mode = ForwardMode::decode;
      catch_up.entries = {{l.spec.id, n}};
      catch_up.tokens.assign(l.draft_pending.begin(), l.draft_pending.end() - 1);
      draft_->forward(catch_up);
      l.draft_pending.erase(l.draft_pending.begin(), l.draft_pending.end() - 1);
    }
    if (draft_) {
      DCP_CHECK_EQ(draft_->allocator().length(l.spec.id), model_.allocator().length(l.spec.id),
                   "draft and target KV lengths of kept request ", l.spec.id);
    }
    kept_.push_back(l.spec.id);
  } else {
    if (l.cacheable) {  // the reply's whole pages too: a conversation's next turn opens with them
      std::vector<std::int32_t> written = l.spec.prompt;
      for (std::size_t k = 0; k < results_[l.result].output_tokens.size(); ++k)
        written.push_back(fed_after(l, k));
      cache_->insert(written, l.spec.id);  // as far as the KV holds them (not the last token)
    }
    model_.allocator().free(l.spec.id);
    if (draft_) draft_->allocator().free(l.spec.id);
  }
  results_[l.result].state = RequestState::finished;
  results_[l.result].finish_reason = reason;
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
}

void Engine::finish_completed() {
  std::int64_t rows = 0;
  for (RequestId id : model_.allocator().requests()) rows += model_.kv_shard(0).local_length(id);
  stats_.peak_kv_rows = std::max(stats_.peak_kv_rows, rows);
  stats_.peak_running = std::max(stats_.peak_running, static_cast<std::int64_t>(running_.size()));
  for (std::size_t i = running_.size(); i-- > 0;) {
    const Live& l = running_[i];
    if (l.stopped) {
      finish(i, FinishReason::stop);
    } else if (results_[l.result].output_tokens.size() >=
               static_cast<std::size_t>(l.spec.max_new_tokens)) {
      finish(i, FinishReason::length);
    }
  }
}

bool Engine::run_prefill() {
  ForwardBatch batch;
  batch.mode = options_.extend_mode;
  std::vector<std::size_t> members;
  std::int64_t budget = options_.chunked_prefill_size;
  // Prompt logprobs need logits for every token of the step: bound the step, and so its logits,
  // once it may reach the row before the first scored token.
  for (const Live& l : running_) {
    if (results_[l.result].state == RequestState::prefill && l.spec.prompt_logprobs >= 0 &&
        l.context + l.prefilled + options_.chunked_prefill_size >= first_scored(l.spec)) {
      budget = std::min<std::int64_t>(budget, kPromptLogprobsChunk);
      batch.all_logits = true;
    }
  }
  for (std::size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Live& l = running_[i];
    if (results_[l.result].state != RequestState::prefill) continue;
    const std::int64_t left = static_cast<std::int64_t>(l.feed.size()) - l.prefilled;
    const std::int64_t chunk = std::min(left, budget);
    model_.extend(l.spec.id, chunk);  // admission reserved these pages
    batch.entries.push_back({l.spec.id, static_cast<std::int32_t>(chunk)});
    batch.tokens.insert(batch.tokens.end(), l.feed.begin() + l.prefilled,
                        l.feed.begin() + l.prefilled + chunk);
    members.push_back(i);
    budget -= chunk;
  }
  if (!any_group(!members.empty())) return false;
  if (members.empty()) {  // another attention group prefills: take part with no tokens
    model_.forward(batch);
    return false;
  }
  const auto t0 = Clock::now();
  const std::vector<float> logits = model_.forward(batch);
  if (draft_) {  // the draft sees the same prompt (its own replicated KV)
    for (const BatchEntry& e : batch.entries) draft_->extend(e.request, e.q_len);
    ForwardBatch d = batch;
    d.mode = ForwardMode::extend;
    d.all_logits = false;
    draft_->forward(d);
  }
  stats_.prefill_ms += ms_since(t0);
  const int vocab = model_.config().vocab_size;
  std::size_t row = 0;  // with all_logits: the first row of member k
  for (std::size_t k = 0; k < members.size(); ++k) {
    Live& l = running_[members[k]];
    const std::int32_t q = batch.entries[k].q_len;
    if (l.spec.prompt_logprobs >= 0 && batch.all_logits) {
      // Row j predicts the token after feed position prefilled + j (prompt position context +
      // prefilled + j: a cache hit took the feed's first `context` tokens).
      RequestResult& r = results_[l.result];
      for (std::int32_t j = 0; j < q; ++j) {
        const auto next = static_cast<std::size_t>(l.prefilled + j + 1);
        if (next < l.feed.size() && l.context + l.prefilled + j + 1 >= first_scored(l.spec)) {
          r.prompt_logprobs.push_back(step_logprobs(logits.data() + (row + j) * vocab, vocab,
                                                    l.feed[next], l.spec.prompt_logprobs));
        }
      }
    }
    const float* last = logits.data() + (batch.all_logits ? row + q - 1 : k) * vocab;
    row += static_cast<std::size_t>(q);
    l.prefilled += q;
    prompt_done_ += q;
    // The whole prompt pages written so far, for later requests (and those waiting for them).
    if (l.cacheable) cache_->insert(l.spec.prompt, l.spec.id);
    if (l.prefilled == static_cast<std::int64_t>(l.feed.size())) {
      emit(l, last);  // the prompt's last logits give the first new token
      l.draft_pending = {results_[l.result].output_tokens.back()};
      results_[l.result].state = RequestState::decode;
    }
  }
  finish_completed();  // max_new_tokens == 1 ends here
  return true;
}

bool Engine::run_decode() {
  if (options_.num_draft_tokens > 0) return run_speculative();
  ForwardBatch batch;
  batch.mode = ForwardMode::decode;
  std::vector<std::size_t> members;
  for (std::size_t i = 0; i < running_.size(); ++i) {
    Live& l = running_[i];
    RequestResult& r = results_[l.result];
    if (r.state != RequestState::decode) continue;
    model_.extend(l.spec.id, 1);
    batch.entries.push_back({l.spec.id, 1});
    batch.tokens.push_back(fed_after(l, r.output_tokens.size() - 1));  // the last emitted
    members.push_back(i);
  }
  if (!any_group(!members.empty())) return false;
  if (members.empty()) return idle_decode(batch);
  ForwardTimings t;
  const auto t0 = Clock::now();
  const std::vector<float> logits = model_.forward(batch, &t);
  record_step(t0, t);
  stats_.decode_tokens += static_cast<std::int64_t>(members.size());
  const int vocab = model_.config().vocab_size;
  for (std::size_t k = 0; k < members.size(); ++k)
    emit(running_[members[k]], logits.data() + k * vocab);
  finish_completed();
  return true;
}

std::vector<std::vector<std::int32_t>> Engine::propose(
    const std::vector<std::size_t>& members, const std::vector<int>& k,
    std::vector<std::vector<TokenDistribution>>& draft_distributions) {
  std::vector<std::vector<std::int32_t>> drafts(members.size());
  draft_distributions.assign(members.size(), {});
  const int vocab = draft_->config().vocab_size;
  const int rounds = *std::max_element(k.begin(), k.end());
  for (int round = 0; round < rounds; ++round) {
    // Round 0 feeds each request's pending tokens (the draft catches up); later rounds feed the
    // previous proposal. Each round's last logits give the next proposal.
    ForwardBatch batch;
    batch.mode = ForwardMode::decode;
    std::vector<std::size_t> in_round;
    for (std::size_t m = 0; m < members.size(); ++m) {
      if (round >= k[m]) continue;
      Live& l = running_[members[m]];
      const std::vector<std::int32_t> feed =
          round == 0 ? l.draft_pending : std::vector<std::int32_t>{drafts[m].back()};
      draft_->extend(l.spec.id, static_cast<std::int64_t>(feed.size()));
      batch.entries.push_back({l.spec.id, static_cast<std::int32_t>(feed.size())});
      batch.tokens.insert(batch.tokens.end(), feed.begin(), feed.end());
      in_round.push_back(m);
    }
    const std::vector<float> logits = draft_->forward(batch);
    for (std::size_t j = 0; j < in_round.size(); ++j) {
      // The draft proposes as the target would choose from its logits (penalties, masks and
      // guide included), drawing with the step's token number; its distribution is kept for the
      // verification.
      const std::size_t m = in_round[j];
      const Live& l = running_[members[m]];
      std::vector<std::int32_t> output = results_[l.result].output_tokens;
      output.insert(output.end(), drafts[m].begin(), drafts[m].end());
      TokenDistribution q = distribution(l, logits.data() + j * vocab, output);
      drafts[m].push_back(
          draw_token(q, draw_uniform(l.spec.sampling.seed, output.size(), DrawPurpose::token)));
      draft_distributions[m].push_back(std::move(q));
    }
  }
  return drafts;
}

std::vector<std::vector<std::int32_t>> Engine::look_up(
    const std::vector<std::size_t>& members, std::vector<int>& k,
    std::vector<std::vector<TokenDistribution>>& draft_distributions) const {
  std::vector<std::vector<std::int32_t>> drafts(members.size());
  draft_distributions.assign(members.size(), {});
  for (std::size_t m = 0; m < members.size(); ++m) {
    if (k[m] == 0) continue;
    const Live& l = running_[members[m]];
    std::vector<std::int32_t> text = l.spec.prompt;
    const std::vector<std::int32_t>& output = results_[l.result].output_tokens;
    text.insert(text.end(), output.begin(), output.end());
    const auto len = static_cast<std::ptrdiff_t>(text.size());
    // The longest suffix (up to ngram_draft tokens) seen before; its latest earlier occurrence.
    for (std::ptrdiff_t n = std::min<std::ptrdiff_t>(options_.ngram_draft, len - 1);
         n >= 1 && drafts[m].empty(); --n) {
      const auto suffix = text.end() - n;
      for (std::ptrdiff_t at = len - n - 1; at >= 0; --at) {
        if (!std::equal(suffix, text.end(), text.begin() + at)) continue;
        const std::ptrdiff_t from = at + n;
        const std::ptrdiff_t to = std::min(len, from + k[m]);
        drafts[m].assign(text.begin() + from, text.begin() + to);
        break;
      }
    }
    k[m] = static_cast<int>(drafts[m].size());
    for (const std::int32_t t : drafts[m])
      draft_distributions[m].push_back(TokenDistribution{{t}, {1.0}, 1.0});
  }
  return drafts;
}

bool Engine::run_speculative() {
  std::vector<std::size_t> members;
  std::vector<int> k;
  for (std::size_t i = 0; i < running_.size(); ++i) {
    const Live& l = running_[i];
    const RequestResult& r = results_[l.result];
    if (r.state != RequestState::decode) continue;
    // Never propose past the request's budget: verification then stays inside its reserved KV.
    const int remaining = l.spec.max_new_tokens - static_cast<int>(r.output_tokens.size());
    members.push_back(i);
    k.push_back(std::min(options_.num_draft_tokens, remaining - 1));
  }
  if (!any_group(!members.empty())) return false;
  if (members.empty()) {
    ForwardBatch idle;
    idle.all_logits = true;
    return idle_decode(idle);
  }
  ForwardTimings t;
  const auto t0 = Clock::now();
  std::vector<std::vector<std::int32_t>> drafts(members.size());
  std::vector<std::vector<TokenDistribution>> draft_distributions(members.size());
  if (*std::max_element(k.begin(), k.end()) > 0) {
    drafts = draft_ ? propose(members, k, draft_distributions)
                    : look_up(members, k, draft_distributions);
  }
  // Target verification: [last, d1 .. dk] per request through the DCP step, causal on global
  // positions; logits for every one of those tokens.
  ForwardBatch batch;
  batch.mode = ForwardMode::decode;
  batch.all_logits = true;
  std::vector<std::int64_t> base_len(members.size());
  for (std::size_t m = 0; m < members.size(); ++m) {
    Live& l = running_[members[m]];
    base_len[m] = model_.allocator().length(l.spec.id);
    model_.extend(l.spec.id, k[m] + 1);
    batch.entries.push_back({l.spec.id, k[m] + 1});
    batch.tokens.push_back(results_[l.result].output_tokens.back());
    batch.tokens.insert(batch.tokens.end(), drafts[m].begin(), drafts[m].end());
  }
  const std::vector<float> logits = model_.forward(batch, &t);
  record_step(t0, t);
  const int vocab = model_.config().vocab_size;
  std::size_t row = 0;
  for (std::size_t m = 0; m < members.size(); ++m) {
    Live& l = running_[members[m]];
    // Keep drafts while the target accepts them (verify_draft: greedy, a draft equal to the
    // target's choice; sampled, the speculative-sampling test, which leaves each token
    // distributed as the target's draw), given the request's penalties, masks and guide and the
    // drafts before. The first draft refused is replaced; after the last kept one the target
    // chooses one token more.
    std::vector<std::int32_t> chosen = results_[l.result].output_tokens;
    const std::size_t before = chosen.size();
    int accepted = 0;
    bool replaced = false;
    while (accepted < k[m] && !replaced) {
      const TokenDistribution p = distribution(l, logits.data() + (row + accepted) * vocab, chosen);
      const DraftVerdict v = verify_draft(p, draft_distributions[m][accepted], drafts[m][accepted],
                                          l.spec.sampling.seed, chosen.size());
      chosen.push_back(v.token);
      if (v.accepted) ++accepted;
      replaced = !v.accepted;
    }
    if (!replaced) chosen.push_back(choose(l, logits.data() + (row + accepted) * vocab, chosen));
    // A stop token ends the emission early: what follows it is rolled back as if rejected.
    int emitted = 0;
    while (emitted <= accepted && !l.stopped) {
      emit(l, logits.data() + (row + emitted) * vocab, chosen[before + emitted]);
      ++emitted;
    }
    const bool cut = emitted <= accepted;
    accepted = emitted - 1;
    row += static_cast<std::size_t>(k[m]) + 1;
    // Roll back what was rejected, on every rank (target) and in the replicated draft cache.
    model_.allocator().truncate(l.spec.id, base_len[m] + accepted + 1);
    if (k[m] > 0) {
      if (draft_ && (accepted < k[m] || cut)) {
        draft_->allocator().truncate(l.spec.id, base_len[m] + accepted + 1);
        l.draft_pending = {results_[l.result].output_tokens.back()};
      } else if (draft_) {  // every draft accepted: the draft has not yet seen its last proposal
        DCP_CHECK_EQ(draft_->allocator().length(l.spec.id), base_len[m] + accepted,
                     "draft KV length");
        l.draft_pending = {drafts[m].back(), results_[l.result].output_tokens.back()};
      }
      ++stats_.spec_verifications;
      stats_.spec_proposed += k[m];
      stats_.spec_accepted += accepted;
      stats_.spec_emitted += accepted + 1;
    } else if (draft_) {
      l.draft_pending.push_back(results_[l.result].output_tokens.back());
    }
    stats_.decode_tokens += accepted + 1;
    ++results_[l.result].spec_verify_steps;
  }
  finish_completed();
  return true;
}

void Engine::record_step(Clock::time_point t0, const ForwardTimings& t) {
  if (!options_.record_step_timings) return;
  stats_.decode_step_ms.push_back(ms_since(t0));
  stats_.decode_timings.push_back(t);
}

bool Engine::idle_decode(const ForwardBatch& empty) {
  // Timed like a decode step: the deployment's steps are the same in every attention group.
  ForwardTimings t;
  const auto t0 = Clock::now();
  model_.forward(empty, &t);
  record_step(t0, t);
  return false;
}

bool Engine::any_group(bool mine) {
  if (!model_.dp_attention()) return mine;
  std::int64_t v = mine ? 1 : 0;
  model_.mlp_group().all_reduce(&v, &v, 1, ScalarType::i64, ReduceOp::max);
  return v != 0;
}

bool Engine::step() {
  admit();
  const bool prefilled = run_prefill();
  const bool decoded = run_decode();
  ++stats_.steps;
  const bool busy = prefilled || decoded || !running_.empty();
  // Requests may wait with nothing running only while kept KV (which its owner releases: a
  // continuation, a disaggregated prompt waiting to move) holds the pages they need.
  if (!busy)
    DCP_CHECK(waiting_.empty() || !kept_.empty(), internal, waiting_.size(),
              " requests wait but nothing runs");
  return any_group(busy);
}

void Engine::run(const std::function<void(const Engine&)>& progress) {
  while (step()) {
    if (progress) progress(*this);
  }
}

}  // namespace dcp
