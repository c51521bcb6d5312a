// How a chat template reads a message's content (one string, or a list of parts it loops over)
// and a tool call's arguments (a JSON string, or a mapping). OpenAI's messages may carry either
// form of content and always carry arguments as a string; an OpenAI-compatible front hands the
// template the form it reads.
#pragma once

#include "syntax.h"

namespace dcp::jinja {

// vLLM's detection of a template's content format: true when some loop iterates over a message's
// content (`{% for part in message['content'] %}`, or `.content`, through filters and slices),
// `message` being the variable of a loop over `messages` or over a variable set from it; or over
// a variable named `content`. Such a template takes the parts as they are (Kimi K2's does); any
// other takes a string.
bool loops_over_message_content(const Body& body);

// True when the template reads a tool call's arguments (`x.arguments`, `x['arguments']`, a
// variable set from one, or a macro parameter given one) only as a mapping: it applies `items`,
// `dictsort` or `tojson` to them, calls their `items()`, `keys()`, `values()` or `get()`, loops
// over them or subscripts them with a string, and never tests them with `is string` or `is
// mapping`. Such a template (vLLM's for MiniCPM3, Qwen2.5's) needs the arguments parsed into an
// object, as vLLM parses them; one that concatenates them (DeepSeek's), tests their type first
// (Kimi K2's, Qwen3's) or never reads them takes the string as the client sent it, the model's own
// text.
bool reads_tool_arguments_as_mapping(const Body& body);

}  // namespace dcp::jinja
