#include "python_str.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <vector>

#include "dcp/tokenizer.h"

namespace dcp::jinja {
namespace {

struct CaseMapping {
  char32_t from;
  char32_t to[3];  // unused places are 0
};
struct CodeRange {
  char32_t lo, hi;
};

#include "unicode_case_data.inc"

// A character of the text: a code point, or a byte that is not part of valid UTF-8 (kept as is).
struct Unit {
  char32_t cp;
  bool raw;
};

std::vector<Unit> decode_units(std::string_view s) {
  std::vector<Unit> out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    char32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    bool ok = len > 0 && i + static_cast<std::size_t>(len) <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      ok = (c & 0xC0) == 0x80;
      cp = (cp << 6) | (c & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    static constexpr char32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kLeast[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (ok) {
      out.push_back({cp, false});
      i += static_cast<std::size_t>(len);
    } else {
      out.push_back({b, true});
      ++i;
    }
  }
  return out;
}

void append_unit(std::string& out, const Unit& u) {
  if (u.raw)
    out.push_back(static_cast<char>(u.cp));
  else
    append_utf8(out, u.cp);
}

template <std::size_t N>
const CaseMapping* find_mapping(const CaseMapping (&table)[N], char32_t cp) {
  const auto at = std::lower_bound(std::begin(table), std::end(table), cp,
                                   [](const CaseMapping& m, char32_t c) { return m.from < c; });
  return at != std::end(table) && at->from == cp ? at : nullptr;
}

template <std::size_t N>
bool in_ranges(const CodeRange (&table)[N], char32_t cp) {
  const auto at = std::lower_bound(std::begin(table), std::end(table), cp,
                                   [](const CodeRange& r, char32_t c) { return r.hi < c; });
  return at != std::end(table) && at->lo <= cp;
}

bool is_space(const Unit& u) {
  return !u.raw && in_ranges(kSpace, u.cp);
}
bool is_cased(const Unit& u) {
  return !u.raw && in_ranges(kCased, u.cp);
}
bool is_case_ignorable(const Unit& u) {
  return !u.raw && in_ranges(kCaseIgnorable, u.cp);
}

// Appends the mapping of `cp` in `table` (itself when the table has none).
template <std::size_t N>
void append_mapped(std::string& out, const CaseMapping (&table)[N], char32_t cp) {
  const CaseMapping* m = find_mapping(table, cp);
  if (!m) {
    append_utf8(out, cp);
    return;
  }
  for (const char32_t c : m->to)
    if (c) append_utf8(out, c);
}

// Python's lowering of units[i] within `units`: a capital sigma after a cased letter and not
// before one (case-ignorable characters between them skipped) becomes the final sigma.
void append_lower(std::string& out, const std::vector<Unit>& units, std::size_t i) {
  const Unit& u = units[i];
  if (u.raw) return append_unit(out, u);
  if (u.cp != 0x03A3) return append_mapped(out, kLower, u.cp);
  std::size_t j = i;
  while (j > 0 && is_case_ignorable(units[j - 1])) --j;
  bool final_sigma = j > 0 && is_cased(units[j - 1]);
  if (final_sigma) {
    std::size_t k = i + 1;
    while (k < units.size() && is_case_ignorable(units[k])) ++k;
    final_sigma = k == units.size() || !is_cased(units[k]);
  }
  append_utf8(out, final_sigma ? 0x03C2 : 0x03C3);
}

void append_upper(std::string& out, const Unit& u) {
  if (u.raw) return append_unit(out, u);
  append_mapped(out, kUpper, u.cp);
}

void append_title(std::string& out, const Unit& u) {
  if (u.raw) return append_unit(out, u);
  if (find_mapping(kTitleUnlikeUpper, u.cp)) return append_mapped(out, kTitleUnlikeUpper, u.cp);
  append_mapped(out, kUpper, u.cp);
}

}  // namespace

std::string py_upper(std::string_view s) {
  std::string out;
  for (const Unit& u : decode_units(s)) append_upper(out, u);
  return out;
}

std::string py_lower(std::string_view s) {
  const std::vector<Unit> units = decode_units(s);
  std::string out;
  for (std::size_t i = 0; i < units.size(); ++i) append_lower(out, units, i);
  return out;
}

std::string py_title(std::string_view s) {
  const std::vector<Unit> units = decode_units(s);
  std::string out;
  bool previous_cased = false;
  for (std::size_t i = 0; i < units.size(); ++i) {
    if (previous_cased)
      append_lower(out, units, i);
    else
      append_title(out, units[i]);
    previous_cased = is_cased(units[i]);
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  const std::vector<Unit> units = decode_units(s);
  std::string out;
  for (std::size_t i = 0; i < units.size(); ++i) {
    if (i == 0)
      append_title(out, units[i]);
    else
      append_lower(out, units, i);
  }
  return out;
}

std::string jinja_title(std::string_view s) {
  const std::vector<Unit> units = decode_units(s);
  const auto separator = [](const Unit& u) {
    return !u.raw &&
           (u.cp == '-' || u.cp == '(' || u.cp == '{' || u.cp == '[' || u.cp == '<' || is_space(u));
  };
  // Each word is upper-cased at its first character and lowered after it, on its own (the
  // final-sigma rule sees the word, not the text).
  std::string out;
  std::size_t i = 0;
  while (i < units.size()) {
    if (separator(units[i])) {
      append_unit(out, units[i++]);
      continue;
    }
    std::size_t end = i;
    while (end < units.size() && !separator(units[end])) ++end;
    const std::vector<Unit> rest(units.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                                 units.begin() + static_cast<std::ptrdiff_t>(end));
    append_upper(out, units[i]);
    for (std::size_t k = 0; k < rest.size(); ++k) append_lower(out, rest, k);
    i = end;
  }
  return out;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right) {
  const std::vector<Unit> units = decode_units(s);
  const std::vector<Unit> set = chars ? decode_units(*chars) : std::vector<Unit>();
  const auto strips = [&](const Unit& u) {
    if (!chars) return is_space(u);
    return std::any_of(set.begin(), set.end(),
                       [&](const Unit& c) { return c.cp == u.cp && c.raw == u.raw; });
  };
  std::size_t b = 0, e = units.size();
  if (left)
    while (b < e && strips(units[b])) ++b;
  if (right)
    while (e > b && strips(units[e - 1])) --e;
  std::string out;
  for (std::size_t k = b; k < e; ++k) append_unit(out, units[k]);
  return out;
}

std::vector<std::string> py_split_whitespace(std::string_view s, std::int64_t maxsplit) {
  const std::vector<Unit> units = decode_units(s);
  std::vector<std::string> out;
  std::size_t k = 0;
  while (k < units.size()) {
    while (k < units.size() && is_space(units[k])) ++k;
    if (k == units.size()) break;
    std::string word;
    if (maxsplit-- == 0) {  // the rest, its trailing whitespace included
      for (; k < units.size(); ++k) append_unit(word, units[k]);
      out.push_back(std::move(word));
      break;
    }
    for (; k < units.size() && !is_space(units[k]); ++k) append_unit(word, units[k]);
    out.push_back(std::move(word));
  }
  return out;
}

std::vector<std::string> py_rsplit_whitespace(std::string_view s, std::int64_t maxsplit) {
  const std::vector<Unit> units = decode_units(s);
  std::vector<std::string> out;
  std::size_t end = units.size();  // the pieces lie before `end`
  const auto text = [&](std::size_t b, std::size_t e) {
    std::string t;
    for (std::size_t k = b; k < e; ++k) append_unit(t, units[k]);
    return t;
  };
  while (end > 0) {
    while (end > 0 && is_space(units[end - 1])) --end;
    if (end == 0) break;
    if (maxsplit-- == 0) {  // the rest, its leading whitespace included
      out.push_back(text(0, end));
      break;
    }
    std::size_t begin = end;
    while (begin > 0 && !is_space(units[begin - 1])) --begin;
    out.push_back(text(begin, end));
    end = begin;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
  const std::vector<Unit> units = decode_units(s);
  const auto breaks = [](const Unit& u) {
    return !u.raw && ((u.cp >= 0x0A && u.cp <= 0x0D) || (u.cp >= 0x1C && u.cp <= 0x1E) ||
                      u.cp == 0x85 || u.cp == 0x2028 || u.cp == 0x2029);
  };
  std::vector<std::string> out;
  std::string line;
  for (std::size_t k = 0; k < units.size(); ++k) {
    if (!breaks(units[k])) {
      append_unit(line, units[k]);
      continue;
    }
    std::string end;
    append_unit(end, units[k]);
    if (units[k].cp == '\r' && k + 1 < units.size() && !units[k + 1].raw && units[k + 1].cp == '\n')
      append_unit(end, units[++k]);
    out.push_back(keepends ? line + end : line);
    line.clear();
  }
  if (!line.empty()) out.push_back(line);
  return out;
}

std::string py_repr(std::string_view s) {
  const bool double_quotes =
      s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos;
  const char quote = double_quotes ? '"' : '\'';
  std::string out(1, quote);
  for (const Unit& u : decode_units(s)) {
    const char32_t c = u.cp;
    if (!u.raw && (c == static_cast<char32_t>(quote) || c == '\\')) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (!u.raw && c == '\t') {
      out += "\\t";
    } else if (!u.raw && c == '\n') {
      out += "\\n";
    } else if (!u.raw && c == '\r') {
      out += "\\r";
    } else if (u.raw || in_ranges(kNotPrintable, c)) {
      char escape[16];
      std::snprintf(escape, sizeof escape,
                    c < 0x100     ? "\\x%02x"
                    : c < 0x10000 ? "\\u%04x"
                                  : "\\U%08x",
                    static_cast<unsigned>(c));
      out += escape;
    } else {
      append_unit(out, u);
    }
  }
  return out + quote;
}

}  // namespace dcp::jinja
