#include "serve/api_job.h"

#include <algorithm>

namespace dcp::serve {

std::string pull_news(Choice& c, const std::vector<std::int32_t>& stop_ids,
                      std::chrono::milliseconds wait, bool echo_only) {
  const std::optional<StreamUpdate> u = c.stream->next(wait);
  if (!u) return {};
  c.prompt_logprobs.insert(c.prompt_logprobs.end(), u->prompt_logprobs.begin(),
                           u->prompt_logprobs.end());
  c.cached_tokens = std::max(c.cached_tokens, u->cached_prompt_tokens);
  c.spec_verify_steps = std::max(c.spec_verify_steps, u->spec_verify_steps);
  std::string out;
  for (std::size_t k = 0; k < u->tokens.size() && !echo_only; ++k) {
    if (c.text.stopped()) break;
    const bool ends = u->finished && u->finish_reason == FinishReason::stop &&
                      k + 1 == u->tokens.size() &&
                      std::find(stop_ids.begin(), stop_ids.end(), u->tokens[k]) != stop_ids.end();
    out += ends ? c.text.push_stop_token(u->tokens[k]) : c.text.push(u->tokens[k]);
    if (k < u->logprobs.size()) c.logprobs.push_back(u->logprobs[k]);
  }
  if (c.text.stopped() && !u->finished) c.stream->cancel();  // a stop string: end it now
  if (u->finished) {
    c.finished = true;
    c.reason = echo_only && u->finish_reason == FinishReason::stop ? FinishReason::length
                                                                   : u->finish_reason;
    c.error = u->error;
    out += c.text.finish();
  }
  c.shown += out;
  return out;
}

std::optional<HttpReply> wait_for_all(
    std::vector<Choice>& choices,
    const std::function<const std::vector<std::int32_t>&(std::size_t)>& stop_ids, bool echo_only,
    const ClientGone& gone) {
  for (std::size_t i = 0; i < choices.size(); ++i) {
    while (!choices[i].finished) {
      pull_news(choices[i], stop_ids(i), std::chrono::milliseconds(200), echo_only);
      if (!choices[i].finished && gone && gone()) {
        for (Choice& d : choices) d.stream->cancel();
        return OpenAiApi::error(499, "the client closed its connection before the reply");
      }
    }
  }
  for (const Choice& c : choices)
    if (!c.error.empty()) return OpenAiApi::error(500, c.error);
  return std::nullopt;
}

std::string sse(const json& j) {
  return "data: " + text_of(j) + "\n\n";
}

std::string finish_text(FinishReason r, bool stop_string) {
  if (stop_string || r == FinishReason::stop) return "stop";
  if (r == FinishReason::length) return "length";
  return "abort";  // cancelled: the server shut down
}

}  // namespace dcp::serve
