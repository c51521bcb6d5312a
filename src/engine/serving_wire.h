// What the ranks of a served deployment send each other every step: the requests that arrived,
// each rank's load, and each request's news for the frontend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/bytes.h"
#include "dcp/engine.h"
#include "dcp/model.h"
#include "dcp/serving.h"

namespace dcp {

void write_spec(ByteWriter& w, const RequestSpec& r);
RequestSpec read_spec(ByteReader& in);

// What one rank reports after a step: its load, then (the first rank of each group that reports
// news) each request's news since the last report.
struct RankLoad {
  std::int64_t kv_rows = 0, kv_capacity_rows = 0, running = 0, waiting = 0;
  PrefixCacheTokens cache;
  // KV tokens its DP group's unfinished requests will hold (prompt + max_new_tokens each): every
  // rank deals the next arrivals by these, from the same reports, so all deal alike.
  std::int64_t dealt_tokens = 0;
  // Disaggregated, so far: requests moved in (a decode replica's first rank), bytes this rank
  // received; computed prompts waiting to move (the prefill group's first rank).
  std::int64_t moved_requests = 0, moved_bytes = 0, awaiting_transfer = 0;
  // Speculative decoding, over its engine's life: request steps that verified drafts, tokens
  // proposed, tokens kept.
  std::int64_t spec_verifications = 0, spec_proposed = 0, spec_accepted = 0;
};

// This rank's load as its engine and KV cache stand: KV rows held and held at most, the requests
// running and waiting, its prefix cache's tokens (dealt_tokens is the caller's).
RankLoad current_load(MlaModel& model, const Engine& engine, int page_size);

// A request's news since `from` tokens were reported; its prompt logprobs go with the first.
void write_news(ByteWriter& w, const RequestResult& r, std::size_t from);

// The same for a request whose life is split between two engines (disaggregation): its tokens
// from `from` on with their logprobs from `logprobs_from` on (the decode engine holds no
// logprobs for the first token, which the prefill side chose), reported as `state` with
// `cached_prompt_tokens` (the prefill side's).
void write_split_news(ByteWriter& w, const RequestResult& r, std::size_t from,
                      std::size_t logprobs_from, RequestState state,
                      std::int64_t cached_prompt_tokens);

}  // namespace dcp
