#include "python_calls.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "dcp/tokenizer.h"

namespace dcp {
namespace {

constexpr int kMaxDepth = 100;  // nested lists, tuples and dicts in one value

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || (c >= '0' && c <= '9');
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

bool is_keyword(std::string_view w) {
  static constexpr std::string_view kKeywords[] = {
      "False", "None",     "True",  "and",    "as",   "assert", "async",  "await",    "break",
      "class", "continue", "def",   "del",    "elif", "else",   "except", "finally",  "for",
      "from",  "global",   "if",    "import", "in",   "is",     "lambda", "nonlocal", "not",
      "or",    "pass",     "raise", "return", "try",  "while",  "with",   "yield"};
  for (std::string_view k : kKeywords)
    if (w == k) return true;
  return false;
}

// A string as Python's json.dumps(..., ensure_ascii=False) writes it.
void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

// repr() of a finite double: the shortest digits that read back, in fixed notation when the
// decimal point falls within 16 digits of them (with ".0" if whole), else as d.ddde+XX.
std::string python_float_repr(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<std::size_t>(res.ptr - buf));
  std::string out;
  if (!sci.empty() && sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  const std::size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits += c;
  const int exponent = std::atoi(std::string(sci.substr(e + 1)).c_str());
  const int point = exponent + 1;  // digits are 0.DIGITS x 10^point
  const int n = static_cast<int>(digits.size());
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      out += "0." + std::string(static_cast<std::size_t>(-point), '0') + digits;
    } else if (point >= n) {
      out += digits + std::string(static_cast<std::size_t>(point - n), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(point)) + "." +
             digits.substr(static_cast<std::size_t>(point));
    }
    return out;
  }
  out += digits[0];
  if (n > 1) out += "." + digits.substr(1);
  const int x = point - 1;
  char exp[16];
  std::snprintf(exp, sizeof exp, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
  return out + exp;
}

class PythonReader {
 public:
  explicit PythonReader(std::string_view code) : s_(code) {}

  std::optional<std::vector<ToolCall>> calls() {
    std::vector<ToolCall> out;
    bool line_start = true;  // a statement after a newline may not be indented
    while (true) {
      const std::size_t before = i_;
      skip_blank();
      if (i_ >= s_.size()) break;
      if (s_[i_] == '\n' || s_[i_] == '\r') {  // a blank line
        ++i_;
        line_start = true;
        continue;
      }
      if (line_start && i_ != before) return std::nullopt;  // an indented statement
      ToolCall call;
      if (!function_name(call.name)) return std::nullopt;
      skip_blank();
      if (peek() != '(') return std::nullopt;
      ++i_;
      if (!arguments(call.arguments)) return std::nullopt;
      out.push_back(std::move(call));
      skip_blank();
      if (i_ >= s_.size()) break;
      if (s_[i_] == ';') {
        ++i_;
        line_start = false;
        skip_blank();
        if (i_ < s_.size() && s_[i_] == ';') return std::nullopt;
        continue;
      }
      if (s_[i_] != '\n' && s_[i_] != '\r') return std::nullopt;
      line_start = true;
    }
    if (out.empty()) return std::nullopt;
    return out;
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }

  // Spaces, tabs, a comment to the end of its line, and a backslash that joins the next line.
  void skip_blank() {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\f') {
        ++i_;
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n' && s_[i_] != '\r') ++i_;
      } else if (c == '\\' && i_ + 1 < s_.size() && (s_[i_ + 1] == '\n' || s_[i_ + 1] == '\r')) {
        i_ += s_.compare(i_ + 1, 2, "\r\n") == 0 ? 3 : 2;
      } else {
        return;
      }
    }
  }
  // Inside brackets, newlines too.
  void skip_space() {
    while (true) {
      skip_blank();
      if (i_ < s_.size() && (s_[i_] == '\n' || s_[i_] == '\r'))
        ++i_;
      else
        return;
    }
  }

  bool identifier(std::string& out) {
    if (!is_name_start(peek())) return false;
    const std::size_t start = i_;
    while (i_ < s_.size() && is_name_char(s_[i_])) ++i_;
    if (i_ < s_.size() && static_cast<unsigned char>(s_[i_]) >= 0x80) return false;  // non-ASCII
    out = std::string(s_.substr(start, i_ - start));
    return true;
  }

  // NAME(.NAME)*, no part a keyword.
  bool function_name(std::string& out) {
    std::string part;
    if (!identifier(part) || is_keyword(part)) return false;
    out = part;
    while (true) {
      const std::size_t at = i_;
      skip_blank();
      if (peek() != '.') {
        i_ = at;
        return true;
      }
      ++i_;
      skip_blank();
      if (!identifier(part) || is_keyword(part)) return false;
      out += "." + part;
    }
  }

  // After '(': KEY=VALUE, ... ')' into a JSON object in the order written.
  bool arguments(std::string& json) {
    std::vector<std::pair<std::string, std::string>> args;
    skip_space();
    while (peek() != ')') {
      std::string key, value;
      if (!identifier(key)) return false;  // a positional argument, or not Python
      skip_space();
      if (peek() != '=' || s_.compare(i_, 2, "==") == 0) return false;
      ++i_;
      skip_space();
      if (!read_value(value, 0)) return false;
      // A repeated keyword (Python's compiler refuses it, its parser does not): the first place,
      // the last value, as the reader's dict keeps it.
      bool repeated = false;
      for (auto& [k, v] : args) {
        if (k == key) {
          v = value;
          repeated = true;
        }
      }
      if (!repeated) args.emplace_back(std::move(key), std::move(value));
      skip_space();
      if (peek() == ',') {
        ++i_;
        skip_space();
      } else if (peek() != ')') {
        return false;
      }
    }
    ++i_;
    json = "{";
    for (std::size_t k = 0; k < args.size(); ++k) {
      if (k) json += ", ";
      append_json_string(json, args[k].first);
      json += ": " + args[k].second;
    }
    json += "}";
    return true;
  }

  // Whether a string literal starts here: a quote, or r/u (either case) and a quote.
  bool string_starts() const {
    const char c = peek();
    if (c == '"' || c == '\'') return true;
    if (c == 'r' || c == 'R' || c == 'u' || c == 'U')
      return i_ + 1 < s_.size() && (s_[i_ + 1] == '"' || s_[i_ + 1] == '\'');
    return false;
  }

  bool read_value(std::string& json, int depth) {
    if (depth > kMaxDepth) return false;
    const char c = peek();
    if (string_starts()) {
      std::string text;
      if (!strings(text)) return false;
      append_json_string(json, text);
      return true;
    }
    if (c == '[' || c == '(') return sequence(json, depth);
    if (c == '{') return dict(json, depth);
    if (is_digit(c) || c == '.' || c == '-' || c == '+') return number(json);
    std::string word;
    if (!identifier(word)) return false;
    if (peek() == '"' || peek() == '\'') return false;  // b"", f"", ...
    if (word == "True") {
      json += "true";
    } else if (word == "False") {
      json += "false";
    } else if (word == "None") {
      json += "null";
    } else {
      if (is_keyword(word)) return false;
      const std::size_t at = i_;
      skip_space();
      if (peek() == '(' || peek() == '.' || peek() == '[') return false;  // a call, an attribute
      i_ = at;
      append_json_string(json, word);  // a bare name stands for its text
    }
    return true;
  }

  // [a, b] or (a, b): a JSON array; (a) is a.
  bool sequence(std::string& json, int depth) {
    const char close = peek() == '[' ? ']' : ')';
    ++i_;
    skip_space();
    std::vector<std::string> items;
    bool comma = false;
    while (peek() != close) {
      std::string v;
      if (!read_value(v, depth + 1)) return false;
      items.push_back(std::move(v));
      skip_space();
      comma = peek() == ',';
      if (comma) {
        ++i_;
        skip_space();
      } else if (peek() != close) {
        return false;
      }
    }
    ++i_;
    if (close == ')' && items.size() == 1 && !comma) {  // parentheses around one value
      json += items[0];
      return true;
    }
    json += "[";
    for (std::size_t k = 0; k < items.size(); ++k) json += (k ? ", " : "") + items[k];
    json += "]";
    return true;
  }

  // {"key": value, ...} with string keys; a repeated key keeps its place and takes the last value.
  bool dict(std::string& json, int depth) {
    ++i_;
    skip_space();
    std::vector<std::pair<std::string, std::string>> items;
    while (peek() != '}') {
      std::string key, value;
      if (!string_starts() || !strings(key)) return false;  // a set, or a key JSON cannot hold
      skip_space();
      if (peek() != ':') return false;
      ++i_;
      skip_space();
      if (!read_value(value, depth + 1)) return false;
      bool replaced = false;
      for (auto& [k, v] : items) {
        if (k == key) {
          v = value;
          replaced = true;
        }
      }
      if (!replaced) items.emplace_back(std::move(key), std::move(value));
      skip_space();
      if (peek() == ',') {
        ++i_;
        skip_space();
      } else if (peek() != '}') {
        return false;
      }
    }
    ++i_;
    json += "{";
    for (std::size_t k = 0; k < items.size(); ++k) {
      if (k) json += ", ";
      append_json_string(json, items[k].first);
      json += ": " + items[k].second;
    }
    json += "}";
    return true;
  }

  // Adjacent literals, concatenated.
  bool strings(std::string& out) {
    if (!one_string(out)) return false;
    while (true) {
      const std::size_t at = i_;
      skip_space();
      if (!string_starts()) {
        i_ = at;
        return true;
      }
      if (!one_string(out)) return false;
    }
  }

  bool hex(std::size_t digits, std::uint32_t& cp) {
    cp = 0;
    for (std::size_t k = 0; k < digits; ++k) {
      if (i_ >= s_.size()) return false;
      const char c = s_[i_++];
      std::uint32_t d = 0;
      if (c >= '0' && c <= '9') {
        d = static_cast<std::uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        d = static_cast<std::uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        d = static_cast<std::uint32_t>(c - 'A' + 10);
      } else {
        return false;
      }
      cp = cp * 16 + d;
    }
    return true;
  }

  bool one_string(std::string& out) {
    bool raw = false;
    if (peek() != '"' && peek() != '\'') {
      raw = peek() == 'r' || peek() == 'R';
      ++i_;
    }
    const char q = s_[i_];
    const bool triple = s_.compare(i_, 3, std::string(3, q)) == 0;
    i_ += triple ? 3 : 1;
    while (true) {
      if (i_ >= s_.size()) return false;
      const char c = s_[i_];
      if (triple ? s_.compare(i_, 3, std::string(3, q)) == 0 : c == q) {
        i_ += triple ? 3 : 1;
        return true;
      }
      if (!triple && (c == '\n' || c == '\r')) return false;
      if (c != '\\') {
        out += c;
        ++i_;
        continue;
      }
      if (i_ + 1 >= s_.size()) return false;
      const char e = s_[i_ + 1];
      if (raw) {  // the backslash stays, and keeps the next character from ending the string
        out += c;
        out += e;
        i_ += 2;
        continue;
      }
      i_ += 2;
      std::uint32_t cp = 0;
      switch (e) {
        case '\n': continue;  // a line joined
        case '\r':
          if (peek() == '\n') ++i_;
          continue;
        case '\\': out += '\\'; continue;
        case '\'': out += '\''; continue;
        case '"': out += '"'; continue;
        case 'a': out += '\a'; continue;
        case 'b': out += '\b'; continue;
        case 'f': out += '\f'; continue;
        case 'n': out += '\n'; continue;
        case 'r': out += '\r'; continue;
        case 't': out += '\t'; continue;
        case 'v': out += '\v'; continue;
        case 'x':
          if (!hex(2, cp)) return false;
          break;
        case 'u':
          if (!hex(4, cp)) return false;
          break;
        case 'U':
          if (!hex(8, cp)) return false;
          break;
        case 'N': return false;  // a character by name: not read
        default:
          if (e >= '0' && e <= '7') {  // up to three octal digits
            cp = static_cast<std::uint32_t>(e - '0');
            for (int k = 0; k < 2 && peek() >= '0' && peek() <= '7'; ++k)
              cp = cp * 8 + static_cast<std::uint32_t>(s_[i_++] - '0');
            break;
          }
          out += '\\';  // Python keeps an unknown escape as written
          --i_;
          continue;
      }
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;  // no UTF-8 for it
      append_utf8(out, static_cast<char32_t>(cp));
    }
  }

  // Digits with single underscores between them; false where there are none.
  bool digit_run(std::string& out) {
    if (!is_digit(peek())) return false;
    while (true) {
      out += s_[i_++];
      if (is_digit(peek())) continue;
      if (peek() == '_' && i_ + 1 < s_.size() && is_digit(s_[i_ + 1])) {
        ++i_;
        continue;
      }
      return true;
    }
  }

  // 0x, 0o or 0b and its digits (single underscores between them, or after the prefix) as a
  // decimal integer, however long.
  bool based_integer(std::string& json, bool negative) {
    const char kind = static_cast<char>(s_[i_ + 1] | 0x20);
    const unsigned base = kind == 'x' ? 16 : kind == 'o' ? 8 : 2;
    i_ += 2;
    std::vector<std::uint32_t> limbs;  // little-endian, base 1e9
    bool any = false;
    while (true) {
      if (peek() == '_') ++i_;
      const char c = peek();
      unsigned d = 99;
      if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
      if (c >= 'a' && c <= 'f') d = static_cast<unsigned>(c - 'a' + 10);
      if (c >= 'A' && c <= 'F') d = static_cast<unsigned>(c - 'A' + 10);
      if (d >= base) {
        if (s_[i_ - 1] == '_' || !any) return false;  // "0x", "0x_", "0x1_"
        break;
      }
      ++i_;
      any = true;
      std::uint64_t carry = d;
      for (std::uint32_t& limb : limbs) {
        const std::uint64_t v = std::uint64_t{limb} * base + carry;
        limb = static_cast<std::uint32_t>(v % 1000000000u);
        carry = v / 1000000000u;
      }
      if (carry) limbs.push_back(static_cast<std::uint32_t>(carry));
    }
    if (is_name_char(peek()) || peek() == '.') return false;
    while (!limbs.empty() && limbs.back() == 0) limbs.pop_back();
    if (limbs.empty()) {
      json += "0";
      return true;
    }
    if (negative) json += '-';
    json += std::to_string(limbs.back());
    for (std::size_t k = limbs.size() - 1; k-- > 0;) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%09u", static_cast<unsigned>(limbs[k]));
      json += buf;
    }
    return true;
  }

  // [+-]* then an integer (decimal, 0x, 0o, 0b) or a float literal.
  bool number(std::string& json) {
    bool negative = false;
    while (peek() == '-' || peek() == '+') {
      negative ^= s_[i_] == '-';
      ++i_;
      skip_space();
    }
    if (peek() == '0' && i_ + 1 < s_.size() &&
        std::string_view("xXoObB").find(s_[i_ + 1]) != std::string_view::npos)
      return based_integer(json, negative);
    std::string whole, fraction, exponent;
    const bool has_whole = digit_run(whole);
    bool is_float = false;
    if (peek() == '.') {
      ++i_;
      is_float = true;
      if (!digit_run(fraction) && !has_whole) return false;
    } else if (!has_whole) {
      return false;
    }
    if (peek() == 'e' || peek() == 'E') {
      is_float = true;
      exponent += 'e';
      ++i_;
      if (peek() == '+' || peek() == '-') exponent += s_[i_++];
      if (!digit_run(exponent)) return false;
    }
    if (is_name_char(peek()) || peek() == '.') return false;  // 5j, 1_, 1.2.3
    if (!is_float) {
      // Python refuses leading zeros but in zero itself.
      const std::size_t nonzero = whole.find_first_not_of('0');
      if (nonzero == std::string::npos) {
        json += "0";
        return true;
      }
      if (nonzero != 0) return false;
      json += (negative ? "-" : "") + whole;
      return true;
    }
    const std::string text = (whole.empty() ? "0" : whole) + "." + fraction + exponent;
    double v = 0;
    const auto res = std::from_chars(text.data(), text.data() + text.size(), v);
    if (res.ec == std::errc::result_out_of_range) {
      v = std::strtod(text.c_str(), nullptr);   // underflow reads as 0, as in Python
      if (!(std::fabs(v) < 1.0)) return false;  // overflow: inf, which JSON cannot hold
      v = 0.0;
    } else if (res.ec != std::errc() || res.ptr != text.data() + text.size()) {
      return false;
    }
    if (!std::isfinite(v)) return false;
    json += python_float_repr(negative ? -v : v);
    return true;
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

std::string_view trim_python_space(std::string_view s) {
  const auto space = [](char c) {
    return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\f' || c == '\v';
  };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

std::optional<std::vector<ToolCall>> read_python_calls(std::string_view code) {
  code = trim_python_space(code);
  if (code.starts_with("```")) {
    code = trim_python_space(code.substr(3));
    if (code.starts_with("python")) code = trim_python_space(code.substr(6));
  }
  if (code.ends_with("```")) code = trim_python_space(code.substr(0, code.size() - 3));
  // Python reads source that is UTF-8 and holds no NUL.
  if (code.find('\0') != std::string_view::npos || utf8_lossy(code) != code) return std::nullopt;
  return PythonReader(code).calls();
}

}  // namespace dcp
