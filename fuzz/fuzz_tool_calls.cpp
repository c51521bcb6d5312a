// A model's reply read for tool calls: the two formats' markers (parse_tool_calls) and the JSON
// list tool_choice "required" guides (read_listed_calls, respelt_json). The respelt JSON is
// checked against nlohmann's parser, which must accept the same texts (but for numbers past a
// double, which it refuses, and lone surrogates) and read the same values from the respelling.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "dcp/tool_calls.h"

namespace {

void check_respelt(std::string_view text) {
  const auto respelt = dcp::respelt_json(text);
  if (!respelt) return;
  if (respelt->end > text.size()) __builtin_trap();
  // A respelling respells to itself.
  const auto again = dcp::respelt_json(respelt->text);
  if (!again || again->text != respelt->text || again->end != respelt->text.size())
    __builtin_trap();
  const std::string_view value = text.substr(0, respelt->end);
  try {
    if (nlohmann::json::parse(value) != nlohmann::json::parse(respelt->text)) __builtin_trap();
  } catch (const nlohmann::json::out_of_range&) {  // a number past a double
  } catch (const nlohmann::json::parse_error& e) {
    // Read here, refused there: only a lone surrogate's escape, which JSON's grammar allows
    // (RFC 8259 section 8.2) and nlohmann refuses.
    if (std::string_view(e.what()).find("surrogate") == std::string_view::npos) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_respelt(text);
  if (nlohmann::json::accept(text) && !dcp::respelt_json(text)) __builtin_trap();
  if (const auto calls = dcp::read_listed_calls(text)) {
    if (calls->empty()) __builtin_trap();
    for (const dcp::ToolCall& c : *calls) {
      const auto args = dcp::respelt_json(c.arguments);
      if (!args || args->text != c.arguments || c.arguments.front() != '{') __builtin_trap();
    }
  }
  for (dcp::ToolCallFormat f : {dcp::ToolCallFormat::deepseek_v3, dcp::ToolCallFormat::kimi_k2}) {
    const dcp::ParsedToolCalls parsed = dcp::parse_tool_calls(text, f);
    for (const dcp::ToolCall& c : parsed.calls)
      if (c.name.empty() || c.arguments.empty()) __builtin_trap();
  }
  return 0;
}
