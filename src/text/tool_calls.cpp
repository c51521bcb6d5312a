// Reading tool calls back out of a reply's text (see dcp/tool_calls.h).
#include "dcp/tool_calls.h"

#include <cctype>
#include <nlohmann/json.hpp>

#include "python_calls.h"

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

// MiniCPM3 writes all its calls as Python between one pair of markers (python_calls.cpp).
constexpr Markers kMiniCpm3{"<|tool_call_start|>", "", "", "", "<|tool_call_end|>"};

const Markers& markers(ToolCallFormat f) {
  return f == ToolCallFormat::kimi_k2    ? kKimi
         : f == ToolCallFormat::minicpm3 ? kMiniCpm3
                                         : kDeepSeek;
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

// The index past the JSON string that opens at text[i] (a quote), or npos when it is not one:
// an unescaped control character, an unknown escape, or bytes that are not UTF-8.
std::size_t string_end(std::string_view text, std::size_t i) {
  const std::size_t begin = i++;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20) return std::string_view::npos;
    if (c == '"') {
      const std::string_view s = text.substr(begin, i + 1 - begin);
      return utf8_lossy(s) == s ? i + 1 : std::string_view::npos;
    }
    if (c != '\\') {
      ++i;
      continue;
    }
    if (++i == text.size()) return std::string_view::npos;
    if (text[i] == 'u') {
      for (int k = 1; k <= 4; ++k)
        if (i + k >= text.size() || !std::isxdigit(static_cast<unsigned char>(text[i + k])))
          return std::string_view::npos;
      i += 5;
    } else if (std::string_view("\"\\/bfnrt").find(text[i]) != std::string_view::npos) {
      ++i;
    } else {
      return std::string_view::npos;
    }
  }
  return std::string_view::npos;
}

// The index past the JSON number at text[i], or npos: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
std::size_t number_end(std::string_view text, std::size_t i) {
  const auto digit = [&](std::size_t k) {
    return k < text.size() && text[k] >= '0' && text[k] <= '9';
  };
  const auto digits = [&](std::size_t k) {  // past one or more digits, or npos
    if (!digit(k)) return std::string_view::npos;
    while (digit(k)) ++k;
    return k;
  };
  if (i < text.size() && text[i] == '-') ++i;
  if (!digit(i)) return std::string_view::npos;
  i = text[i] == '0' ? i + 1 : digits(i);
  if (i < text.size() && text[i] == '.') {
    i = digits(i + 1);
    if (i == std::string_view::npos) return i;
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    return digits(i);
  }
  return i;
}

// A JSON string's text (quotes included) decoded, or nullopt where an escape names a lone
// surrogate.
std::optional<std::string> decoded_string(std::string_view quoted) {
  const nlohmann::json v = nlohmann::json::parse(quoted, nullptr, false);
  if (!v.is_string()) return std::nullopt;
  return v.get<std::string>();
}

std::size_t skip_space(std::string_view text, std::size_t i) {
  while (i < text.size() && is_space(text[i])) ++i;
  return i;
}

}  // namespace

std::optional<RespeltJson> respelt_json(std::string_view text) {
  constexpr std::size_t npos = std::string_view::npos;
  RespeltJson out;
  std::string& w = out.text;
  std::vector<char> open;  // the containers the value is inside, innermost last
  std::size_t i = 0;
  // A member's name and its colon (inside an object, after '{' or ',').
  const auto name = [&] {
    i = skip_space(text, i);
    if (i >= text.size() || text[i] != '"') return false;
    const std::size_t end = string_end(text, i);
    if (end == npos) return false;
    w.append(text.substr(i, end - i));
    i = skip_space(text, end);
    if (i >= text.size() || text[i] != ':') return false;
    w += ": ";
    ++i;
    return true;
  };
  while (true) {
    // A value.
    i = skip_space(text, i);
    if (i >= text.size()) return std::nullopt;
    const char c = text[i];
    if (c == '{' || c == '[') {
      w += c;
      const char close = c == '{' ? '}' : ']';
      i = skip_space(text, i + 1);
      if (i < text.size() && text[i] == close) {
        w += close;
        ++i;
      } else {
        open.push_back(close);
        if (close == '}' && !name()) return std::nullopt;
        continue;
      }
    } else {
      std::size_t end = npos;
      if (c == '"') {
        end = string_end(text, i);
      } else if (c == '-' || (c >= '0' && c <= '9')) {
        end = number_end(text, i);
      } else {
        for (std::string_view word : {"true", "false", "null"})
          if (text.substr(i, word.size()) == word) end = i + word.size();
      }
      if (end == npos) return std::nullopt;
      w.append(text.substr(i, end - i));
      i = end;
    }
    // After a value: close what it ends, then the next member or item.
    while (true) {
      if (open.empty()) {
        out.end = i;
        return out;
      }
      i = skip_space(text, i);
      if (i >= text.size()) return std::nullopt;
      if (text[i] == open.back()) {
        w += text[i++];
        open.pop_back();
        continue;
      }
      if (text[i] != ',') return std::nullopt;
      w += ", ";
      ++i;
      if (open.back() == '}' && !name()) return std::nullopt;
      break;
    }
  }
}

namespace {

// One item of a listed reply, respelt (respelt_json): a call when it is an object of a "name"
// (a string) and "parameters" (an object), each once and nothing else.
std::optional<ToolCall> listed_call(std::string_view t) {
  if (t.front() != '{' || t == "{}") return std::nullopt;
  // The respelt object holds no whitespace but after its separators: read it by those.
  std::optional<std::string> name, arguments;
  std::size_t i = 1;
  while (true) {
    const std::size_t key_end = string_end(t, i);
    // A lone surrogate's escape reads as no string (nlohmann refuses it): no call.
    const auto key = decoded_string(t.substr(i, key_end - i));
    if (!key) return std::nullopt;
    i = key_end + 2;  // past ": "
    const std::optional<RespeltJson> v = respelt_json(t.substr(i));
    const std::string_view value = t.substr(i, v->end);
    if (*key == "name" && value.front() == '"' && !name) {
      name = decoded_string(value);
      if (!name) return std::nullopt;
    } else if (*key == "parameters" && value.front() == '{' && !arguments) {
      arguments = std::string(value);
    } else {
      return std::nullopt;
    }
    i += v->end;
    if (t[i] == '}') break;
    i += 2;  // past ", "
  }
  if (!name || !arguments) return std::nullopt;
  return ToolCall{"", std::move(*name), std::move(*arguments)};
}

}  // namespace

void ListedCallReader::read(std::string_view text) {
  while (state_ != State::spoiled) {
    const std::size_t at = skip_space(text, at_);
    if (at == text.size()) return;  // blank so far
    const char c = text[at];
    if (state_ == State::before) {
      if (c != '[') break;
      state_ = State::item;
      at_ = at + 1;
    } else if (state_ == State::item) {
      // An item that does not read yet may still be cut short: it waits for the end.
      const std::optional<RespeltJson> item = respelt_json(text.substr(at));
      if (!item) return;
      std::optional<ToolCall> call = listed_call(item->text);
      if (!call) break;
      calls_.push_back(std::move(*call));
      last_ = at_ = at + item->end;
      state_ = State::after_item;
    } else if (state_ == State::after_item && (c == ',' || c == ']')) {
      state_ = c == ',' ? State::item : State::closed;
      at_ = at + 1;
    } else {
      break;  // after an item, or after the list, text that does not go on with it
    }
  }
  state_ = State::spoiled;
}

std::size_t ListedCallReader::content_resumes(bool finished) const noexcept {
  if (state_ == State::closed || (state_ != State::spoiled && !finished)) return npos;
  return last_;  // 0 where no call was read: all of the text
}

std::optional<std::vector<ToolCall>> read_listed_calls(std::string_view text) {
  ListedCallReader reader;
  reader.read(text);
  if (!reader.whole()) return std::nullopt;
  return reader.calls();
}

std::optional<ToolCallFormat> tool_call_format_named(std::string_view name) {
  if (name == "deepseek_v3") return ToolCallFormat::deepseek_v3;
  if (name == "kimi_k2") return ToolCallFormat::kimi_k2;
  if (name == "minicpm3") return ToolCallFormat::minicpm3;
  return std::nullopt;
}

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kimi_k2: return "kimi_k2";
    case ToolCallFormat::minicpm3: return "minicpm3";
    case ToolCallFormat::deepseek_v3: break;
  }
  return "deepseek_v3";
}

std::optional<ToolCallFormat> tool_call_format_of(const Tokenizer& tokenizer) {
  for (ToolCallFormat f :
       {ToolCallFormat::deepseek_v3, ToolCallFormat::kimi_k2, ToolCallFormat::minicpm3}) {
    if (tokenizer.encode(markers(f).calls_begin).size() == 1) return f;
  }
  return std::nullopt;
}

std::string_view tool_calls_begin(ToolCallFormat format) {
  return markers(format).calls_begin;
}

void ToolCallReader::read(std::string_view text) {
  const Markers& m = markers(format_);
  if (state_ == State::before) {
    begin_ = text.find(m.calls_begin, at_);
    if (begin_ == npos) {
      // The marker may yet end in a tail of the text that begins it.
      const std::size_t tail = m.calls_begin.size() - 1;
      at_ = text.size() > tail ? text.size() - tail : 0;
      return;
    }
    state_ = State::calls;
    at_ = begin_ + m.calls_begin.size();
  }
  if (format_ == ToolCallFormat::minicpm3 && state_ == State::calls) {
    // One block of Python, read once its closing marker arrives: all its calls, or none.
    const std::size_t end = text.find(m.calls_end, at_);
    if (end == npos) return;
    std::optional<std::vector<ToolCall>> calls = read_python_calls(text.substr(at_, end - at_));
    if (!calls) {
      state_ = State::spoiled;
      return;
    }
    calls_ = std::move(*calls);
    state_ = State::closed;
    at_ = end + m.calls_end.size();
    return;
  }
  while (state_ == State::calls) {
    at_ = skip_space(text, at_);
    const std::string_view rest = text.substr(at_);
    if (rest.starts_with(m.calls_end)) {
      state_ = State::closed;
      at_ += m.calls_end.size();
    } else if (rest.starts_with(m.call_begin)) {
      const std::size_t end = rest.find(m.call_end, m.call_begin.size());
      if (end == npos) return;  // the call goes on
      std::optional<ToolCall> call =
          read_call(rest.substr(m.call_begin.size(), end - m.call_begin.size()), format_);
      if (!call) {
        state_ = State::spoiled;
        return;
      }
      calls_.push_back(std::move(*call));
      at_ += end + m.call_end.size();
    } else if (!m.call_begin.starts_with(rest) && !m.calls_end.starts_with(rest)) {
      state_ = State::spoiled;  // text that no marker could begin
    } else {
      return;  // a marker may be on its way
    }
  }
}

std::size_t ToolCallReader::content_resumes(bool finished) const noexcept {
  if (state_ == State::before || (state_ == State::calls && !finished)) return npos;
  return calls_.empty() ? begin_ : at_;
}

ParsedToolCalls parse_tool_calls(std::string_view text, ToolCallFormat format) {
  ToolCallReader reader(format);
  reader.read(text);
  if (reader.calls_begin() == ToolCallReader::npos) return {std::string(text), {}};
  ParsedToolCalls out{std::string(text.substr(0, reader.calls_begin())), reader.calls()};
  out.content += text.substr(reader.content_resumes(true));
  return out;
}

}  // namespace dcp
