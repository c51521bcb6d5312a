// One chat choice's reply as the client reads it: with --reasoning-parser its thinking apart
// (reasoning_content), then its content and the tool calls read from it (tool_fields.h), as one
// message or streamed as deltas.
#pragma once

#include <optional>
#include <string>

#include "dcp/reasoning.h"
#include "serve/request_fields.h"
#include "serve/tool_fields.h"

namespace dcp::serve {

class ChatReply {
 public:
  // `call_id` names the calls (numbered after it) where the model's format gives them no id;
  // `reasoning`: the reply starts with the model's thinking, opened and closed by `markers`
  // (ReasoningSplit).
  ChatReply(ToolUse use, std::string call_id, bool reasoning, bool include_reasoning,
            ReasoningMarkers markers = {});
  // Streaming: the delta for newly generated `text`: content, "auto" and "required" calls each as
  // it is read whole, a named call's arguments as they come; with `finished`, what was held back.
  // Null when nothing is to be sent yet (a finished reply always sends one). The deltas join to
  // the whole reply's message.
  json delta(const std::string& text, bool finished);
  // A whole reply's message for its `text`.
  json message(const std::string& text);
  // finish_reason "tool_calls" (unless cut by max_tokens, "length"): the reply called a tool (a
  // forced named call ends with "stop", as OpenAI's does).
  bool ends_in_tool_calls() const noexcept { return called_ && use_.mode != ToolUse::Mode::named; }

 private:
  struct Read {
    std::string content;
    json calls = json::array();
  };
  Read read(const std::string& text) const;
  json call_json(std::size_t index, const std::string& id, const std::string& name,
                 const std::string& arguments) const;
  // The content's and calls' part of a delta.
  json content_delta(const std::string& text, bool finished);
  json auto_delta(bool finished);    // "auto": the content and calls read so far, not yet sent
  json listed_delta(bool finished);  // "required": likewise
  // The calls of `read` not sent yet (all but the first where parallel_tool_calls is false).
  json new_calls(const std::vector<ToolCall>& read);

  ToolUse use_;
  std::string call_id_;
  bool reasoning_, include_reasoning_;
  ReasoningMarkers markers_;
  ReasoningSplit split_;  // streaming: the thinking told from the content
  std::string text_;      // the content so far
  std::size_t sent_ = 0;  // content bytes sent (a prefix of the content read at the end)
  std::optional<ToolCallReader> calls_;  // "auto": the calls read so far
  ListedCallReader listed_;              // "required": likewise
  std::size_t calls_sent_ = 0;
  bool opened_ = false;  // named: the call's head was sent
  bool called_ = false;
};

}  // namespace dcp::serve
