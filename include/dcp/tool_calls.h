// Tool calls as MLA chat models write them: the text a reply holds between the model's own
// markers, read back into calls (a function's name and its JSON arguments) and the content around
// them. DeepSeek (V3 writes "function<sep>NAME" and fenced JSON, V3.1 "NAME<sep>JSON") and Kimi K2
// ("functions.NAME:INDEX" as the call's id) are read; the markers are special tokens, so the text
// must be decoded with special tokens kept.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/tokenizer.h"

namespace dcp {

enum class ToolCallFormat { deepseek_v3, kimi_k2 };

// "deepseek_v3" or "kimi_k2" (vLLM's --tool-call-parser names); nullopt for any other name.
std::optional<ToolCallFormat> tool_call_format_named(std::string_view name);
const char* tool_call_format_name(ToolCallFormat format);
// The format whose markers `tokenizer` holds as single tokens; nullopt when it holds neither's.
std::optional<ToolCallFormat> tool_call_format_of(const Tokenizer& tokenizer);

// The marker that opens a reply's tool calls: text from it on is not content.
std::string_view tool_calls_begin(ToolCallFormat format);

struct ToolCall {
  std::string id;         // the model's id (Kimi K2); empty where the format has none
  std::string name;       // the function
  std::string arguments;  // JSON text, as the model wrote it (surrounding whitespace dropped)
};

struct ParsedToolCalls {
  std::string content;          // the text outside the calls
  std::vector<ToolCall> calls;  // in the order written
};

// Reads `text` (a whole reply, special tokens kept). A reply without the opening marker is all
// content; one whose calls do not all parse (cut short, a marker missing) is all content too, with
// no calls, so that nothing the model wrote is lost.
ParsedToolCalls parse_tool_calls(std::string_view text, ToolCallFormat format);

}  // namespace dcp
