// Reading tool calls back out of a reply's text (see dcp/tool_calls.h).
#include "dcp/tool_calls.h"

namespace dcp {
namespace {

struct Markers {
  std::string_view calls_begin, call_begin, call_sep, call_end, calls_end;
};

// DeepSeek's markers, spelt with its full-width bars and "▁" word marks.
constexpr Markers kDeepSeek{
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "calls\xE2\x96\x81"
    "begin\xEF\xBD\x9C>",
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "call\xE2\x96\x81"
    "begin\xEF\xBD\x9C>",
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "sep\xEF\xBD\x9C>",
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "call\xE2\x96\x81"
    "end\xEF\xBD\x9C>",
    "<\xEF\xBD\x9Ctool\xE2\x96\x81"
    "calls\xE2\x96\x81"
    "end\xEF\xBD\x9C>"};
constexpr Markers kKimi{"<|tool_calls_section_begin|>", "<|tool_call_begin|>",
                        "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                        "<|tool_calls_section_end|>"};

const Markers& markers(ToolCallFormat f) {
  return f == ToolCallFormat::kimi_k2 ? kKimi : kDeepSeek;
}

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// One call's text between its begin and end markers, or nullopt when it does not parse.
std::optional<ToolCall> read_call(std::string_view call, ToolCallFormat f) {
  const std::size_t sep = call.find(markers(f).call_sep);
  if (sep == std::string_view::npos) return std::nullopt;
  const std::string_view head = trim(call.substr(0, sep));
  std::string_view body = trim(call.substr(sep + markers(f).call_sep.size()));
  ToolCall out;
  if (f == ToolCallFormat::kimi_k2) {
    // "functions.NAME:INDEX": the id as written; the name between the first '.' and the last ':'.
    out.id = std::string(head);
    std::string_view name = head;
    if (const std::size_t colon = name.rfind(':'); colon != std::string_view::npos)
      name = name.substr(0, colon);
    if (const std::size_t dot = name.find('.'); dot != std::string_view::npos)
      name = name.substr(dot + 1);
    out.name = std::string(name);
  } else if (head == "function") {
    // V3: "function<sep>NAME\n```json\nARGUMENTS\n```".
    const std::size_t newline = body.find('\n');
    if (newline == std::string_view::npos) return std::nullopt;
    out.name = std::string(trim(body.substr(0, newline)));
    std::string_view fenced = trim(body.substr(newline + 1));
    constexpr std::string_view open = "```json", close = "```";
    if (fenced.substr(0, open.size()) != open || fenced.size() < open.size() + close.size() ||
        fenced.substr(fenced.size() - close.size()) != close)
      return std::nullopt;
    body = trim(fenced.substr(open.size(), fenced.size() - open.size() - close.size()));
  } else {
    out.name = std::string(head);  // V3.1: "NAME<sep>ARGUMENTS"
  }
  if (out.name.empty() || body.empty()) return std::nullopt;
  out.arguments = std::string(body);
  return out;
}

}  // namespace

std::optional<ToolCallFormat> tool_call_format_named(std::string_view name) {
  if (name == "deepseek_v3") return ToolCallFormat::deepseek_v3;
  if (name == "kimi_k2") return ToolCallFormat::kimi_k2;
  return std::nullopt;
}

const char* tool_call_format_name(ToolCallFormat format) {
  return format == ToolCallFormat::kimi_k2 ? "kimi_k2" : "deepseek_v3";
}

std::optional<ToolCallFormat> tool_call_format_of(const Tokenizer& tokenizer) {
  for (ToolCallFormat f : {ToolCallFormat::deepseek_v3, ToolCallFormat::kimi_k2}) {
    if (tokenizer.encode(markers(f).calls_begin).size() == 1) return f;
  }
  return std::nullopt;
}

std::string_view tool_calls_begin(ToolCallFormat format) {
  return markers(format).calls_begin;
}

ParsedToolCalls parse_tool_calls(std::string_view text, ToolCallFormat format) {
  const Markers& m = markers(format);
  ParsedToolCalls all_content{std::string(text), {}};
  const std::size_t begin = text.find(m.calls_begin);
  if (begin == std::string_view::npos) return all_content;
  ParsedToolCalls out;
  out.content = std::string(text.substr(0, begin));
  std::string_view rest = text.substr(begin + m.calls_begin.size());
  while (true) {
    rest = trim(rest);
    if (rest.empty()) break;  // the closing marker left out (DeepSeek-V3's template omits it)
    if (rest.substr(0, m.calls_end.size()) == m.calls_end) {
      out.content += std::string(rest.substr(m.calls_end.size()));  // text after the calls
      break;
    }
    if (rest.substr(0, m.call_begin.size()) != m.call_begin) return all_content;
    rest.remove_prefix(m.call_begin.size());
    const std::size_t end = rest.find(m.call_end);
    if (end == std::string_view::npos) return all_content;  // cut short
    std::optional<ToolCall> call = read_call(rest.substr(0, end), format);
    if (!call) return all_content;
    out.calls.push_back(std::move(*call));
    rest.remove_prefix(end + m.call_end.size());
  }
  if (out.calls.empty()) return all_content;
  return out;
}

}  // namespace dcp
