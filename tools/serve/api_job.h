// What the HTTP APIs share between parsing a request and answering it: the parsed request (a
// Job) and each of its choices as the engine streams it. Internal to tools/serve.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dcp/reasoning.h"
#include "dcp/serving.h"
#include "dcp/text_stream.h"
#include "serve/openai_api.h"

namespace dcp::serve {

struct OpenAiApi::Job {
  Kind kind = Kind::completion;
  std::string id;
  ServeRequest request;  // its prompt: the first of `prompts`
  // /v1/completions takes a list of prompts: each runs n choices, numbered prompt x n + choice.
  std::vector<std::vector<std::int32_t>> prompts;
  std::string prompt_field = "prompt";   // the field the prompts came in
  std::string max_field = "max_tokens";  // the field that bounds the new tokens
  std::vector<std::string> stop;
  int n = 1;
  bool stream = false, include_usage = false, skip_special = true, seeded = false;
  bool continuous_usage = false;  // stream_options.continuous_usage_stats
  bool tokens_as_ids = false;     // return_tokens_as_token_ids
  bool include_stop = false;      // the text keeps the stop string that ended it
  bool echo = false;              // completions: the prompt comes back before each choice's text
  // completions with max_tokens 0 and echo (OpenAI's): the prompt (and its logprobs) alone. One
  // token is still sampled, from the prefill's last logits, and not returned.
  bool echo_only = false;
  // Each prompt's text: as sent, or (with echo) made from its ids.
  std::vector<std::optional<std::string>> prompt_texts;
  int top_logprobs = -1;  // -1: no logprobs
  int prompt_top = -1;    // vLLM's prompt_logprobs: alternatives per prompt token (-1: none)
  // /generate's return_logprob (SGLang's): the prompt's logprobs from this position on (-1:
  // none), and whether each entry carries its token's text (return_text_in_logprobs).
  std::int64_t logprob_start = -1;
  bool logprob_texts = false;
  std::string rid;  // /generate: the id the client gave the request (SGLang's rid), else empty
  ToolUse tools;                  // chat: what the reply does with tools
  bool reasoning = false;         // chat: the reply's thinking comes first (--reasoning-parser)
  bool include_reasoning = true;  // vLLM's: the reply carries it as reasoning_content
  ReasoningMarkers reasoning_markers;  // what opens and closes the thinking (ReasoningSplit)
};

// One choice in progress: its engine stream and the text it has shown.
struct Choice {
  std::shared_ptr<RequestStream> stream;
  TextStream text;
  std::vector<StepLogprobs> logprobs;
  std::vector<StepLogprobs> prompt_logprobs;  // when the prompt is echoed with logprobs
  std::string shown;
  bool finished = false;
  FinishReason reason = FinishReason::none;
  std::string error;
  std::int64_t cached_tokens = 0;  // of its prompt, from the prefix cache
  std::int64_t spec_verify_steps = 0;  // target steps that verified its drafts
};

// Pulls what the engine produced for `c` into its text; returns the new text. `wait` bounds the
// wait for news; the stop token that ends the choice (one of `stop_ids`) writes no text. With
// `echo_only` the tokens are dropped (max_tokens 0) and a choice that ran out ends by length.
std::string pull_news(Choice& c, const std::vector<std::int32_t>& stop_ids,
                      std::chrono::milliseconds wait, bool echo_only);

// A whole reply's wait: until every choice has finished, pulling its news (choice i's stop tokens
// are stop_ids(i)). A client that hangs up (`gone`) has every choice cancelled within a fifth of a
// second, as a stream's are at its next token (no one would read the reply): its 499 is returned;
// so is the 500 of a choice the engine failed. Nothing when all finished well.
std::optional<HttpReply> wait_for_all(
    std::vector<Choice>& choices,
    const std::function<const std::vector<std::int32_t>&(std::size_t)>& stop_ids, bool echo_only,
    const ClientGone& gone);

// One server-sent event holding `j`.
std::string sse(const json& j);
// A finish reason as the APIs write it ("stop" also where a stop string ended the text).
std::string finish_text(FinishReason r, bool stop_string);

}  // namespace dcp::serve
