// OpenAI's tool calling on chat completions: the request's `tools`, `tool_choice` and
// `parallel_tool_calls`, and the reply's `tool_calls`. "auto" reads the calls the model writes in
// its own format (dcp/tool_calls.h); "required" and a named function guide the reply to JSON
// (a list of {"name", "parameters"}, or the function's arguments) and read that.
#pragma once

#include <optional>
#include <string>

#include "dcp/tool_calls.h"
#include "serve/request_fields.h"

namespace dcp::serve {

struct ToolUse {
  enum class Mode { none, read_auto, required, named };
  Mode mode = Mode::none;
  std::string function;  // Mode::named: its name
  bool parallel = true;  // parallel_tool_calls: false keeps a reply to one call
  ToolCallFormat format = ToolCallFormat::deepseek_v3;  // Mode::read_auto: what to read
};

// The request's `tools`, checked (each {"type": "function", "function": {"name", ...}}), for the
// chat template's `tools` variable; null when it has none. BadRequest naming the field otherwise.
const json* checked_tools(const json& body);

// One choice's reply with tools, streamed or whole. `call_id` names its calls (numbered after it)
// where the model's format gives them no id.
class ToolReply {
 public:
  ToolReply(ToolUse use, std::string call_id);
  // Streaming: the delta for newly generated `text`; null when nothing can be sent yet.
  json delta(const std::string& text);
  // Streaming: the delta that ends the choice (`complete`: it was not cut by max_tokens); null
  // when nothing is left to send.
  json last_delta(bool complete);
  // A whole reply's message for its `text`.
  json message(const std::string& text, bool complete);
  // Whether the reply called a tool (finish_reason "tool_calls").
  bool called() const noexcept { return called_; }

 private:
  struct Read {
    std::string content;
    json calls = json::array();
  };
  Read read(const std::string& text, bool complete) const;
  json call_json(std::size_t index, const std::string& id, const std::string& name,
                 const std::string& arguments) const;

  ToolUse use_;
  std::string call_id_;
  std::string text_;      // all generated so far
  std::size_t sent_ = 0;  // content bytes sent (a prefix of the content read at the end)
  bool opened_ = false;   // named: the call's head was sent
  bool called_ = false;
};

}  // namespace dcp::serve
