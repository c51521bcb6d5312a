// How a chat template reads a message's content: as one string, or as a list of parts it loops
// over. OpenAI's messages may carry either; an OpenAI-compatible front hands the template the form
// it reads.
#pragma once

#include "syntax.h"

namespace dcp::jinja {

// vLLM's detection of a template's content format: true when some loop iterates over a message's
// content (`{% for part in message['content'] %}`, or `.content`, through filters and slices),
// `message` being the variable of a loop over `messages` or over a variable set from it; or over
// a variable named `content`. Such a template takes the parts as they are (Kimi K2's does); any
// other takes a string.
bool loops_over_message_content(const Body& body);

}  // namespace dcp::jinja
