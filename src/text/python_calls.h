// Tool calls written as Python, as MiniCPM3 writes them between its markers: one call per
// statement, `name(key=value, ...)`, each value a Python literal. Internal (tool_calls.cpp).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "dcp/tool_calls.h"

namespace dcp {

// The calls in `code` (optionally fenced as ```python ... ```), their arguments as Python's
// json.dumps(..., ensure_ascii=False) writes the keyword arguments' values: strings (every quote
// form, escapes, raw, implicit concatenation), integers of any size (decimal, hex, octal,
// binary) and floats (as repr spells them), True/False/None, lists and tuples (arrays), dicts
// with string keys, a bare name as its text (as vLLM's MiniCPM3 reader takes it); a repeated
// keyword keeps its first place and its last value. nullopt where the code is anything else:
// positional arguments, sets, nested calls, bytes and f-strings, a number JSON cannot hold (inf),
// a lone surrogate, or not Python at all.
std::optional<std::vector<ToolCall>> read_python_calls(std::string_view code);

}  // namespace dcp
