// GBNF text -> GbnfRules: a recursive-descent reader of the text, then the checks that make every
// parse walkable (each rule defined and able to finish, no left recursion).
#include <algorithm>
#include <map>
#include <optional>

#include "dcp/error.h"
#include "dcp/gbnf_grammar.h"
#include "guide/gbnf_rules.h"

namespace dcp {
namespace gbnf_reader {  // named: a unity build shares one file's anonymous namespace
namespace {

using Element = GbnfRules::Element;
using Range = GbnfRules::Range;
constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr std::size_t kNone = std::string_view::npos;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Sorted, merged, surrogates (which UTF-8 cannot hold) left out; the complement when negated.
std::vector<Range> normalize(std::vector<Range> r, bool negated) {
  std::sort(r.begin(), r.end());
  std::vector<Range> merged;
  for (const Range& x : r) {
    if (!merged.empty() && x.first <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, x.second);
    else
      merged.push_back(x);
  }
  if (negated) {
    std::vector<Range> inverse;
    char32_t from = 0;
    for (const Range& x : merged) {
      if (x.first > from) inverse.push_back({from, x.first - 1});
      from = x.second + 1;
    }
    if (from <= kMaxCodePoint) inverse.push_back({from, kMaxCodePoint});
    merged = std::move(inverse);
  }
  std::vector<Range> out;
  for (const Range& x : merged) {  // cut D800-DFFF out
    if (x.second < 0xD800 || x.first > 0xDFFF) {
      out.push_back(x);
      continue;
    }
    if (x.first < 0xD800) out.push_back({x.first, 0xD7FF});
    if (x.second > 0xDFFF) out.push_back({0xE000, x.second});
  }
  return out;
}

class Parser {
 public:
  Parser(std::string_view text, std::string_view field) : t_(text), field_(field) {}

  GbnfRules parse() {
    if (t_.size() > GbnfGrammar::kMaxTextBytes)
      fail(0, str("the grammar is over ", GbnfGrammar::kMaxTextBytes, " bytes"));
    skip_space();
    if (at_ >= t_.size()) fail(0, "the grammar is empty (it needs a rule 'root ::= ...')");
    while (at_ < t_.size()) {
      const std::size_t where = at_;
      if (!at_rule_start()) {
        // Lark's "name: ..." (outlines' grammars) is a different language: say so.
        std::size_t i = at_;
        while (i < t_.size() && is_name_char(t_[i])) ++i;
        const bool lark = i > at_ && t_.substr(i, 1) == ":" && t_.substr(i, 3) != "::=";
        fail(at_, lark ? "expected a rule ('name ::= ...'): this reads GBNF, not Lark's 'name: ...'"
                       : "expected a rule ('name ::= ...')");
      }
      const std::string name = read_name();
      const std::int32_t r = rule_id(name, kNone);
      if (rules_[static_cast<std::size_t>(r)].defined != kNone)
        fail(where, str("rule '", name, "' is defined twice (first at ",
                        place(rules_[static_cast<std::size_t>(r)].defined), ")"));
      rules_[static_cast<std::size_t>(r)].defined = where;
      skip_space();
      at_ += 3;  // "::=", which at_rule_start saw
      alternatives(r, false);
    }
    for (const Rule& r : rules_) {
      if (r.defined == kNone && r.parent < 0)
        fail(r.first_use, str("rule '", r.name, "' is used but not defined"));
    }
    const auto root = names_.find("root");
    if (root == names_.end() || rules_[static_cast<std::size_t>(root->second)].defined == kNone)
      fail(0, "there is no rule 'root' (the text the grammar derives starts there)");
    check_productive();
    check_left_recursion();
    return flatten(root->second);
  }

 private:
  struct Rule {
    std::string name;
    std::size_t defined = kNone, first_use = kNone;  // byte offsets
    std::int32_t parent = -1;                        // a group's or quantifier's rule
    std::vector<std::vector<Element>> alts;
  };

  [[noreturn]] void fail(std::size_t at, const std::string& why) const {
    throw Error(ErrorCategory::invalid_argument,
                str("'", field_, "': ", why, at == kNone ? "" : " at " + place(at)));
  }
  std::string place(std::size_t at) const {
    at = std::min(at, t_.size());
    const std::size_t line =
        1 + static_cast<std::size_t>(
                std::count(t_.begin(), t_.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
    const std::size_t nl = t_.rfind('\n', at == 0 ? 0 : at - 1);
    const std::size_t column = nl == kNone || at == 0 ? at + 1 : at - nl;
    return str("line ", line, ", column ", column);
  }
  // How a refusal names a rule: its own name, or the group or quantifier it stands for.
  std::string describe(std::int32_t r) const {
    const Rule& rule = rules_[static_cast<std::size_t>(r)];
    if (rule.parent < 0) return str("rule '", rule.name, "'");
    std::int32_t named = r;
    while (rules_[static_cast<std::size_t>(named)].parent >= 0)
      named = rules_[static_cast<std::size_t>(named)].parent;
    return str("a group or quantified item in rule '", rules_[static_cast<std::size_t>(named)].name,
               "'");
  }

  bool eof() const { return at_ >= t_.size(); }
  char peek() const { return eof() ? '\0' : t_[at_]; }

  void skip_space() {
    while (!eof()) {
      const char c = t_[at_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++at_;
      } else if (c == '#') {
        while (!eof() && t_[at_] != '\n') ++at_;
      } else {
        break;
      }
    }
  }
  // A name, then spaces, then "::=".
  bool at_rule_start() const {
    std::size_t i = at_;
    while (i < t_.size() && is_name_char(t_[i])) ++i;
    if (i == at_) return false;
    while (i < t_.size() && (t_[i] == ' ' || t_[i] == '\t')) ++i;
    return t_.substr(i, 3) == "::=";
  }
  std::string read_name() {
    const std::size_t from = at_;
    while (!eof() && is_name_char(t_[at_])) ++at_;
    return std::string(t_.substr(from, at_ - from));
  }
  std::int32_t rule_id(const std::string& name, std::size_t used_at) {
    const auto [it, added] = names_.emplace(name, static_cast<std::int32_t>(rules_.size()));
    if (added) rules_.push_back(Rule{name, kNone, kNone, -1, {}});
    Rule& r = rules_[static_cast<std::size_t>(it->second)];
    if (used_at != kNone && r.first_use == kNone) r.first_use = used_at;
    return it->second;
  }
  std::int32_t new_rule(std::int32_t parent, std::vector<std::vector<Element>> alts) {
    for (const auto& a : alts) count(a.size() + 1);
    rules_.push_back(Rule{"", kNone, kNone, parent, std::move(alts)});
    return static_cast<std::int32_t>(rules_.size() - 1);
  }
  void count(std::size_t n) {
    elements_ += n;
    if (elements_ > GbnfGrammar::kMaxElements)
      fail(at_, str("the grammar is too large (over ", GbnfGrammar::kMaxElements,
                    " elements once its quantifiers are expanded)"));
  }

  void alternatives(std::int32_t r, bool nested) {
    std::vector<std::vector<Element>> alts;
    while (true) {
      alts.push_back(sequence(r, nested));
      count(alts.back().size() + 1);
      skip_space();
      if (peek() != '|') break;
      ++at_;
    }
    rules_[static_cast<std::size_t>(r)].alts = std::move(alts);
  }

  std::vector<Element> sequence(std::int32_t r, bool nested) {
    std::vector<Element> seq;
    while (true) {
      skip_space();
      if (eof() || peek() == '|') break;
      if (peek() == ')') {
        if (nested) break;
        fail(at_, "')' without its '('");
      }
      if (!nested && at_rule_start()) break;
      std::vector<Element> item = read_item(r);
      while (true) {  // quantifiers, innermost first
        skip_space();
        const char q = peek();
        if (q != '*' && q != '+' && q != '?' && q != '{') break;
        if (item.size() != 1) item = {{GbnfRules::kRule, new_rule(r, {item})}};
        item = quantified(r, item[0]);
      }
      seq.insert(seq.end(), item.begin(), item.end());
    }
    return seq;
  }

  std::vector<Element> read_item(std::int32_t r) {
    const char c = peek();
    if (c == '"') {
      ++at_;
      std::vector<Element> out;
      while (true) {
        if (eof()) fail(at_, "a string without its closing '\"'");
        if (peek() == '"') break;
        const char32_t cp = read_char(true);
        out.push_back({GbnfRules::kClass, class_id({{cp, cp}}, false)});
      }
      ++at_;
      return out;
    }
    if (c == '[') return {{GbnfRules::kClass, read_class()}};
    if (c == '.') {
      ++at_;
      return {{GbnfRules::kClass, class_id({}, true)}};
    }
    if (c == '(') {
      const std::size_t open = at_++;
      // Groups are read by recursion: bound it, so that a text of '(' cannot overflow the stack.
      if (++groups_open_ > GbnfGrammar::kMaxGroupNesting)
        fail(open, str("groups nest more than ", GbnfGrammar::kMaxGroupNesting, " deep"));
      const std::int32_t g = new_rule(r, {});
      alternatives(g, true);
      if (peek() != ')') fail(open, "'(' without its ')'");
      ++at_;
      --groups_open_;
      return {{GbnfRules::kRule, g}};
    }
    if (is_name_char(c)) {
      const std::size_t where = at_;
      return {{GbnfRules::kRule, rule_id(read_name(), where)}};
    }
    if (c == '\'') fail(at_, "strings are written in double quotes");
    fail(at_, str("unexpected '", std::string(1, c), "'"));
  }

  // One character of a string or class: an escape or UTF-8.
  char32_t read_char(bool in_string) {
    const std::size_t where = at_;
    const auto b = static_cast<unsigned char>(t_[at_]);
    if (b == '\\') {
      if (at_ + 1 >= t_.size()) fail(where, "a '\\' at the end of the grammar");
      const char e = t_[at_ + 1];
      at_ += 2;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/': return static_cast<char32_t>(e);
        case 'x': return read_hex(2, where);
        case 'u': return read_hex(4, where);
        case 'U': return read_hex(8, where);
        default: fail(where, str("unknown escape '\\", std::string(1, e), "'"));
      }
    }
    if (in_string && (b == '\n' || b == '\r')) fail(where, "a string without its closing '\"'");
    ++at_;
    if (b < 0x80) return b;
    int need = b >= 0xF0 && b <= 0xF4   ? 3
               : b >= 0xE0 && b <= 0xEF ? 2
               : b >= 0xC2 && b <= 0xDF ? 1
                                        : -1;
    if (need < 0) fail(where, "the grammar is not UTF-8");
    char32_t cp = b & (0x3F >> need);
    for (; need > 0; --need) {
      const auto c = static_cast<unsigned char>(peek());
      if (eof() || (c & 0xC0) != 0x80) fail(where, "the grammar is not UTF-8");
      cp = cp << 6 | (c & 0x3F);
      ++at_;
    }
    if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > kMaxCodePoint || cp < 0x80 ||
        (b >= 0xE0 && cp < 0x800) || (b >= 0xF0 && cp < 0x10000))
      fail(where, "the grammar is not UTF-8");
    return cp;
  }
  char32_t read_hex(int digits, std::size_t where) {
    char32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const int h = hex_value(peek());
      if (eof() || h < 0) fail(where, str("an escape needs ", digits, " hex digits"));
      v = v * 16 + static_cast<char32_t>(h);
      ++at_;
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF))
      fail(where, "an escape names no character (a surrogate or above U+10FFFF)");
    return v;
  }

  std::int32_t read_class() {
    const std::size_t open = at_++;
    const bool negated = peek() == '^';
    if (negated) ++at_;
    std::vector<Range> ranges;
    while (true) {
      if (eof()) fail(open, "'[' without its ']'");
      if (peek() == ']') break;
      const char32_t lo = read_char(false);
      char32_t hi = lo;
      if (peek() == '-' && at_ + 1 < t_.size() && t_[at_ + 1] != ']') {
        const std::size_t dash = at_++;
        hi = read_char(false);
        if (hi < lo) fail(dash, "a range whose end comes before its start");
      }
      ranges.push_back({lo, hi});
    }
    ++at_;
    if (normalize(ranges, negated).empty()) fail(open, "a class that matches no character");
    return class_id(std::move(ranges), negated);
  }
  std::int32_t class_id(std::vector<Range> ranges, bool negated) {
    std::vector<Range> r = normalize(std::move(ranges), negated);
    const auto [it, added] = class_ids_.emplace(r, static_cast<std::int32_t>(classes_.size()));
    if (added) classes_.push_back(std::move(r));
    return it->second;
  }

  // x*, x+, x?, x{n}, x{n,}, x{,m}, x{n,m} as rules: x* is R ::= x R | (empty).
  std::vector<Element> quantified(std::int32_t r, Element x) {
    const auto star = [&] {
      const std::int32_t s = new_rule(r, {{}, {}});
      rules_[static_cast<std::size_t>(s)].alts[0] = {x, {GbnfRules::kRule, s}};
      count(2);
      return Element{GbnfRules::kRule, s};
    };
    const char q = t_[at_++];
    if (q == '*') return {star()};
    if (q == '+') return {x, star()};
    if (q == '?') return {{GbnfRules::kRule, new_rule(r, {{x}, {}})}};
    const std::size_t open = at_ - 1;
    const auto number = [&]() -> std::optional<int> {
      skip_space();
      if (peek() < '0' || peek() > '9') return std::nullopt;
      long v = 0;
      while (peek() >= '0' && peek() <= '9') {
        v = v * 10 + (peek() - '0');
        ++at_;
        if (v > GbnfGrammar::kMaxRepeat)
          fail(open, str("a repetition count over ", GbnfGrammar::kMaxRepeat));
      }
      skip_space();
      return static_cast<int>(v);
    };
    const std::optional<int> n = number();
    std::optional<int> m = n;
    if (peek() == ',') {
      ++at_;
      m = number();
    } else if (!n) {
      fail(open, "'{' needs a count: {n}, {n,}, {,m} or {n,m}");
    }
    if (peek() != '}') fail(open, "'{' without its '}'");
    ++at_;
    const int lo = n.value_or(0);
    if (m && *m < lo) fail(open, "a repetition {n,m} with m below n");
    std::vector<Element> out(static_cast<std::size_t>(lo), x);
    count(out.size());
    if (!m) {
      out.push_back(star());
    } else if (*m > lo) {  // opt1 ::= x | (empty); optk ::= x opt(k-1) | (empty)
      Element tail = {GbnfRules::kRule, new_rule(r, {{x}, {}})};
      for (int k = 1; k < *m - lo; ++k) tail = {GbnfRules::kRule, new_rule(r, {{x, tail}, {}})};
      out.push_back(tail);
    }
    return out;
  }

  // Every rule can finish: some alternative of it reads only classes and rules that can.
  void check_productive() const {
    std::vector<char> done(rules_.size(), 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t r = 0; r < rules_.size(); ++r) {
        if (done[r]) continue;
        for (const auto& alt : rules_[r].alts) {
          if (std::all_of(alt.begin(), alt.end(), [&](const Element& e) {
                return e.kind == GbnfRules::kClass || done[static_cast<std::size_t>(e.arg)];
              })) {
            done[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    // Name the cause: an unfinishable rule that needs itself (others only need it), named
    // rather than a group or quantifier.
    std::size_t cause = rules_.size();
    for (std::size_t r = 0; r < rules_.size() && cause == rules_.size(); ++r) {
      if (done[r] || rules_[r].parent >= 0) continue;
      std::vector<char> seen(rules_.size(), 0);
      std::vector<std::size_t> todo{r};
      while (!todo.empty() && cause == rules_.size()) {
        const std::size_t at = todo.back();
        todo.pop_back();
        for (const auto& alt : rules_[at].alts) {
          for (const Element& e : alt) {
            const auto to = static_cast<std::size_t>(e.arg);
            if (e.kind != GbnfRules::kRule || done[to]) continue;
            if (to == r) cause = r;
            if (!seen[to]) {
              seen[to] = 1;
              todo.push_back(to);
            }
          }
        }
      }
    }
    for (std::size_t r = 0; r < rules_.size() && cause == rules_.size(); ++r)
      if (!done[r] && rules_[r].parent < 0) cause = r;
    if (cause < rules_.size())
      fail(rules_[cause].defined,
           str("rule '", rules_[cause].name,
               "' derives no finite text (each of its alternatives needs it again)"));
  }

  // No rule reaches itself through rules that each come first in an alternative or after rules
  // that can match the empty text: expanding it would never read a byte.
  void check_left_recursion() const {
    const std::size_t n = rules_.size();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const auto& alt : rules_[r].alts) {
          if (std::all_of(alt.begin(), alt.end(), [&](const Element& e) {
                return e.kind == GbnfRules::kRule && nullable[static_cast<std::size_t>(e.arg)];
              })) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<std::int32_t>> first(n);  // rules expanded before any byte is read
    for (std::size_t r = 0; r < n; ++r) {
      for (const auto& alt : rules_[r].alts) {
        for (const Element& e : alt) {
          if (e.kind != GbnfRules::kRule) break;
          first[r].push_back(e.arg);
          if (!nullable[static_cast<std::size_t>(e.arg)]) break;
        }
      }
    }
    std::vector<char> color(n, 0);  // 0 unseen, 1 on the path, 2 done
    for (std::size_t s = 0; s < n; ++s) {
      if (color[s]) continue;
      std::vector<std::pair<std::int32_t, std::size_t>> path{{static_cast<std::int32_t>(s), 0}};
      color[s] = 1;
      while (!path.empty()) {
        auto& [r, i] = path.back();
        const auto& next = first[static_cast<std::size_t>(r)];
        if (i == next.size()) {
          color[static_cast<std::size_t>(r)] = 2;
          path.pop_back();
          continue;
        }
        const std::int32_t to = next[i++];
        if (color[static_cast<std::size_t>(to)] == 1) {
          const Rule& rule = rules_[static_cast<std::size_t>(to)];
          fail(rule.parent < 0 ? rule.defined : kNone,
               str(describe(to),
                   " is left-recursive: it can reach itself before reading a byte (a rule that "
                   "begins with itself, or a quantifier over something that can match the empty "
                   "text)"));
        }
        if (color[static_cast<std::size_t>(to)] == 0) {
          color[static_cast<std::size_t>(to)] = 1;
          path.push_back({to, 0});
        }
      }
    }
  }

  GbnfRules flatten(std::int32_t root) {
    GbnfRules g;
    g.elements = {{GbnfRules::kRule, root}, {GbnfRules::kEnd, 0}};
    g.alternatives.resize(rules_.size());
    for (std::size_t r = 0; r < rules_.size(); ++r) {
      for (const auto& alt : rules_[r].alts) {
        g.alternatives[r].push_back(static_cast<std::int32_t>(g.elements.size()));
        g.elements.insert(g.elements.end(), alt.begin(), alt.end());
        g.elements.push_back({GbnfRules::kEnd, 0});
      }
    }
    g.classes = std::move(classes_);
    return g;
  }

  std::string_view t_, field_;
  std::size_t at_ = 0, elements_ = 0, groups_open_ = 0;
  std::vector<Rule> rules_;
  std::map<std::string, std::int32_t> names_;
  std::map<std::vector<Range>, std::int32_t> class_ids_;
  std::vector<std::vector<Range>> classes_;
};

}  // namespace
}  // namespace gbnf_reader

bool GbnfRules::contains(std::int32_t cls, char32_t c) const noexcept {
  const auto& r = classes[static_cast<std::size_t>(cls)];
  const auto it = std::upper_bound(
      r.begin(), r.end(), c, [](char32_t v, const GbnfRules::Range& x) { return v < x.first; });
  return it != r.begin() && std::prev(it)->second >= c;
}

bool GbnfRules::overlaps(std::int32_t cls, char32_t lo, char32_t hi) const noexcept {
  for (const GbnfRules::Range& x : classes[static_cast<std::size_t>(cls)]) {
    if (x.first <= hi && x.second >= lo) return true;
  }
  return false;
}

GbnfRules parse_gbnf(std::string_view text, std::string_view field) {
  return gbnf_reader::Parser(text, field).parse();
}

}  // namespace dcp
