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

}  // namespace dcp::serve
