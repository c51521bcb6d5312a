// A model's reply read for tool calls: the three formats' markers (parse_tool_calls, and a
// ToolCallReader fed the same text in pieces, as a stream reads it) and the JSON list
// tool_choice "required" guides (read_listed_calls, respelt_json, and a ListedCallReader in
// pieces); MiniCPM3's Python calls must give JSON objects. The respelt JSON is checked against
// nlohmann's parser, which must accept the same texts (but for numbers past a double, which it
// refuses, and lone surrogates) and read the same values from the respelling.
#include <algorithm>
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
  const auto calls = dcp::read_listed_calls(text);
  if (calls) {
    if (calls->empty()) __builtin_trap();
    for (const dcp::ToolCall& c : *calls) {
      const auto args = dcp::respelt_json(c.arguments);
      if (!args || args->text != c.arguments || c.arguments.front() != '{') __builtin_trap();
    }
  }
  {  // The list read in pieces: calls stay read, and the content's start, once known, stays.
    dcp::ListedCallReader reader;
    std::size_t at = 0, read = 0, from = dcp::ListedCallReader::npos;
    while (at < text.size()) {
      at = std::min(text.size(), at + 1 + static_cast<unsigned char>(text[at]) % 9);
      reader.read(text.substr(0, at));
      if (reader.calls().size() < read) __builtin_trap();
      read = reader.calls().size();
      const std::size_t now = reader.content_resumes(false);
      if (from != dcp::ListedCallReader::npos && now != from) __builtin_trap();
      from = now;
    }
    if (reader.whole() != calls.has_value()) __builtin_trap();
    if (calls &&
        (calls->size() != read || reader.content_resumes(true) != dcp::ListedCallReader::npos))
      __builtin_trap();
    for (std::size_t k = 0; calls && k < read; ++k)
      if (reader.calls()[k].arguments != (*calls)[k].arguments ||
          reader.calls()[k].name != (*calls)[k].name)
        __builtin_trap();
  }
  for (dcp::ToolCallFormat f : {dcp::ToolCallFormat::deepseek_v3, dcp::ToolCallFormat::kimi_k2,
                                dcp::ToolCallFormat::minicpm3}) {
    const dcp::ParsedToolCalls parsed = dcp::parse_tool_calls(text, f);
    for (const dcp::ToolCall& c : parsed.calls) {
      if (c.name.empty() || c.arguments.empty()) __builtin_trap();
      // MiniCPM3's arguments are written by dcp from Python values: always a JSON object.
      if (f == dcp::ToolCallFormat::minicpm3 &&
          (!nlohmann::json::accept(c.arguments) || !nlohmann::json::parse(c.arguments).is_object()))
        __builtin_trap();
    }
    if (parsed.calls.empty() && parsed.content != text) __builtin_trap();
    // Read in pieces (a stream; their lengths from the text's own bytes), the calls come in the
    // same order and stay read, and the whole reads the same.
    dcp::ToolCallReader reader(f);
    std::size_t at = 0, read = 0, resumes = dcp::ToolCallReader::npos;
    while (at < text.size()) {
      at = std::min(text.size(), at + 1 + static_cast<unsigned char>(text[at]) % 9);
      reader.read(text.substr(0, at));
      if (reader.calls().size() < read || reader.calls().size() > parsed.calls.size())
        __builtin_trap();
      read = reader.calls().size();
      const std::size_t now = reader.content_resumes(false);
      if (resumes != dcp::ToolCallReader::npos && now != resumes) __builtin_trap();
      resumes = now;
    }
    if (read != parsed.calls.size()) __builtin_trap();
    for (std::size_t k = 0; k < read; ++k)
      if (reader.calls()[k].name != parsed.calls[k].name ||
          reader.calls()[k].arguments != parsed.calls[k].arguments ||
          reader.calls()[k].id != parsed.calls[k].id)
        __builtin_trap();
    if (reader.calls_begin() != dcp::ToolCallReader::npos &&
        std::string(text.substr(0, reader.calls_begin())) +
                std::string(text.substr(reader.content_resumes(true))) !=
            parsed.content)
      __builtin_trap();
  }
  return 0;
}
