// Pattern -> syntax tree over code points -> Thompson automaton over bytes (each code point range
// becomes the UTF-8 byte-range sequences that spell it) -> subset construction over the byte
// classes the edges tell apart -> the fewest states of the language (dfa_minimize.h).
#include "dcp/regex_dfa.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>

#include "dcp/error.h"
#include "dfa_minimize.h"

namespace dcp {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;
using Ranges = std::vector<std::pair<char32_t, char32_t>>;  // inclusive code point ranges

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.emplace_back(lo, hi);
  }
  return out;
}

Ranges complement(const Ranges& sorted) {
  Ranges out;
  char32_t from = 0;
  for (const auto& [lo, hi] : sorted) {
    if (lo > from) out.emplace_back(from, lo - 1);
    from = hi + 1;
  }
  if (from <= kMaxCodePoint) out.emplace_back(from, kMaxCodePoint);
  return out;
}

struct Node {
  enum Kind {
    empty,
    set,
    concat,
    alt,
    repeat,
    counted,
    json_escaped,
    guarded,     // kids: the body, then its look-aheads
    look_ahead,  // kid: the texts it admits (followed by any text where it did not end in `$`)
    end_anchor,  // a `$` ending a look-ahead's alternative, until the look-ahead is read
    multiple,    // -?[0-9]+ whose value is a multiple of min
  } kind = empty;
  Ranges ranges;          // set
  std::vector<int> kids;  // concat, alt, guarded; repeat, counted, json_escaped, look_ahead: one
  int min = 0, max = 0;   // repeat: copies; counted: characters; max -1: unbounded; look_ahead:
                          // min 1 where negative
};

class Parser {
 public:
  Parser(std::string_view p, std::string_view field) : p_(p), field_(field) {}

  std::vector<Node> parse(int& root) {
    root = alternation();
    if (at_ < p_.size()) fail("unbalanced ')'");
    return std::move(nodes_);
  }

 private:
  [[noreturn]] void fail(std::string_view why) const {
    throw Error(ErrorCategory::invalid_argument,
                str("'", field_, "': ", why, " at byte ", at_, " of the pattern"));
  }
  bool more() const { return at_ < p_.size(); }
  char peek() const { return p_[at_]; }
  bool eat(char c) {
    if (!more() || peek() != c) return false;
    ++at_;
    return true;
  }
  bool eat(std::string_view s) {
    if (p_.substr(at_, s.size()) != s) return false;
    at_ += s.size();
    return true;
  }
  int add(Node n) {
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size()) - 1;
  }
  int set_node(Ranges r) {
    Node n;
    n.kind = Node::set;
    n.ranges = normalized(std::move(r));
    return add(std::move(n));
  }

  // (?=X) or (?!X) opening an alternative of a scope (the pattern, or a length, JSON or search
  // group's body): the text the alternative matches begins (or does not begin) with a match of X,
  // as Python's re reads one where a match starts. An alternative of X may open
  // with `^` (the scope's start, where X is read anyway) and end with `$` (the scope's end: then
  // the whole text must match it).
  int look_ahead() {
    Node n;
    n.kind = Node::look_ahead;
    n.min = p_[at_ + 2] == '!' ? 1 : 0;
    at_ += 3;
    if (++groups_open_ > RegexDfa::kMaxGroupNesting)
      fail(str("groups nest more than ", RegexDfa::kMaxGroupNesting, " deep"));
    const std::size_t outer = look_level_;
    look_level_ = groups_open_;
    const int inner = alternation();
    if (!eat(')')) fail("missing ')'");
    look_level_ = outer;
    --groups_open_;
    std::vector<int> alts{inner};
    if (nodes_[static_cast<std::size_t>(inner)].kind == Node::alt)
      alts = nodes_[static_cast<std::size_t>(inner)].kids;
    for (int& a : alts) a = open_ended(a);
    if (alts.size() == 1) {
      n.kids = {alts[0]};
    } else {
      Node either;
      either.kind = Node::alt;
      either.kids = std::move(alts);
      n.kids = {add(std::move(either))};
    }
    return add(std::move(n));
  }

  // A look-ahead's alternative as the texts it admits: itself where it ends in `$`, itself
  // followed by any text where it does not.
  int open_ended(int i) {
    Node n = nodes_[static_cast<std::size_t>(i)];  // a copy: add() may move the nodes
    if (n.kind == Node::end_anchor) return add(Node{});
    if (n.kind == Node::concat &&
        nodes_[static_cast<std::size_t>(n.kids.back())].kind == Node::end_anchor) {
      n.kids.pop_back();
      return n.kids.size() == 1 ? n.kids[0] : add(std::move(n));
    }
    return concat({i, any_text()});
  }

  int alternation() {
    std::vector<int> kids{sequence()};
    while (eat('|')) kids.push_back(sequence());
    if (kids.size() == 1) return kids[0];
    Node n;
    n.kind = Node::alt;
    n.kids = std::move(kids);
    return add(std::move(n));
  }

  int sequence() {
    // An alternative of a scope may open with `^` and look-aheads, one of a look-ahead with `^`.
    const bool in_scope = groups_open_ == scope_level_;
    const bool searched = in_scope && groups_open_ == search_level_;
    bool from_start = false;
    if (in_scope || groups_open_ == look_level_) {
      const bool caret = eat('^');
      if (in_scope) from_start = caret;
      if (!in_scope) caret_in_look_ = caret_in_look_ || caret;  // inside a look-ahead
    }
    // A positive look-ahead's `^` holds at the text's start only: the match starts there. (A
    // negative one's also holds later, which is left out: its texts are fewer, all matches.)
    std::vector<int> looks;
    while (in_scope && (p_.substr(at_, 3) == "(?=" || p_.substr(at_, 3) == "(?!")) {
      const bool positive = p_[at_ + 2] == '=';
      caret_in_look_ = false;
      looks.push_back(look_ahead());
      from_start = from_start || (positive && caret_in_look_);
    }
    int body = items();
    // In a search group, an alternative that does not end in `$` may have any text after it,
    // which its look-aheads see too, as Python's re.search reads them at the match's start.
    if (searched && dollar_end_ != at_) body = concat({body, any_text()});
    int alternative = body;
    if (!looks.empty()) {
      Node n;
      n.kind = Node::guarded;
      n.kids = {body};
      n.kids.insert(n.kids.end(), looks.begin(), looks.end());
      alternative = add(std::move(n));
    }
    // ... and one that does not open with `^` any text before it.
    return searched && !from_start ? concat({any_text(), alternative}) : alternative;
  }

  int concat(std::vector<int> kids) {
    Node n;
    n.kind = Node::concat;
    n.kids = std::move(kids);
    return add(std::move(n));
  }

  int any_text() {
    Node any;
    any.kind = Node::repeat;
    any.max = -1;
    any.kids = {set_node({{0, kMaxCodePoint}})};
    return add(std::move(any));
  }

  int items() {
    Node n;
    n.kind = Node::concat;
    while (more() && peek() != '|' && peek() != ')') {
      int item = atom();
      while (more()) {
        int lo = 0, hi = 0;
        if (!quantifier(lo, hi)) break;
        if (!eat('?')) eat('+');  // lazy or possessive: the same whole matches
        Node r;
        r.kind = Node::repeat;
        r.kids = {item};
        r.min = lo;
        r.max = hi;
        item = add(std::move(r));
      }
      n.kids.push_back(item);
    }
    if (n.kids.size() == 1) return n.kids[0];
    if (n.kids.empty()) return add(Node{});
    return add(std::move(n));
  }

  // * + ? {n} {n,} {,m} {n,m}; false (nothing read) when none starts here. Counts above `limit`
  // are refused, naming them as `what`.
  bool quantifier(int& lo, int& hi, int limit = RegexDfa::kMaxRepeat,
                  std::string_view what = "a repeat count") {
    const auto give = [&](int a, int b) {
      lo = a;
      hi = b;
      return true;
    };
    if (eat('*')) return give(0, -1);
    if (eat('+')) return give(1, -1);
    if (eat('?')) return give(0, 1);
    if (peek() != '{') return false;
    const std::size_t open = at_;
    ++at_;
    const auto number = [&](int& v) {
      const std::size_t from = at_;
      long long x = 0;
      while (more() && peek() >= '0' && peek() <= '9') {
        x = std::min<long long>(x * 10 + (peek() - '0'), 1LL << 40);
        ++at_;
      }
      if (at_ == from) return false;
      if (x > limit) fail(str(what, " above ", limit));
      v = static_cast<int>(x);
      return true;
    };
    const bool has_lo = number(lo);
    if (!has_lo) lo = 0;
    if (eat('}')) {
      if (has_lo) return give(lo, lo);
    } else if (eat(',')) {
      const bool has_hi = number(hi);
      if (!has_hi) hi = -1;
      if ((has_lo || has_hi) && eat('}')) {
        if (hi >= 0 && hi < lo) {
          at_ = open;
          fail(str("{", lo, ",", hi, "}: the larger count comes second"));
        }
        return true;
      }
    }
    at_ = open;  // not a quantifier: a literal '{'
    return false;
  }

  int atom() {
    const std::size_t here = at_;
    const char c = peek();
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat");
    int lo = 0, hi = 0;
    if (c == '{' && quantifier(lo, hi)) {
      at_ = here;
      fail("nothing to repeat");
    }
    if (eat('(')) {
      // Groups are read by recursion: bound it, so that a pattern of '(' cannot overflow the stack.
      if (++groups_open_ > RegexDfa::kMaxGroupNesting)
        fail(str("groups nest more than ", RegexDfa::kMaxGroupNesting, " deep"));
      // A plain group is its inner pattern; a length or JSON group wraps it in a node of its own.
      Node group;
      int multiple = 0;
      bool search = false;
      if (eat("?:") || named_group()) {
      } else if (eat("?multiple{")) {
        const std::size_t open = at_;
        long long k = 0;
        while (more() && peek() >= '0' && peek() <= '9')
          k = std::min<long long>(k * 10 + (p_[at_++] - '0'), 1LL << 40);
        if (open == at_ || k < 1 || k > RegexDfa::kMaxMultiple || !eat("}:")) {
          at_ = open;
          fail(str("a multiple group opens with (?multiple{k}: for a whole k of 1 to ",
                   RegexDfa::kMaxMultiple));
        }
        multiple = static_cast<int>(k);
      } else if (eat("?json:")) {
        group.kind = Node::json_escaped;
      } else if (eat("?search:")) {
        search = true;
      } else if (p_.substr(at_, 2) == "?{") {
        ++at_;
        const std::size_t open = at_;
        group.kind = Node::counted;
        if (!quantifier(group.min, group.max, RegexDfa::kMaxCountedLength, "a length") ||
            !eat(':')) {
          at_ = open;
          fail("a length group opens with (?{n}:, (?{n,}:, (?{,m}: or (?{n,m}:");
        }
      } else if (p_.substr(at_, 2) == "?=" || p_.substr(at_, 2) == "?!") {
        fail(
            "a look-ahead only opens an alternative of the pattern or of a length, JSON or "
            "search group");
      } else if (more() && peek() == '?') {
        fail("look-behinds, inline flags and atomic groups are not supported");
      }
      const std::size_t outer = scope_level_, outer_search = search_level_;
      if (group.kind != Node::empty || search) scope_level_ = groups_open_;
      if (search) search_level_ = groups_open_;
      const int inner = alternation();
      scope_level_ = outer;
      search_level_ = outer_search;
      if (!eat(')')) fail("missing ')'");
      --groups_open_;
      if (multiple) {  // the inner texts whose value is a multiple: a look-ahead of the whole text
        Node digits;
        digits.kind = Node::multiple;
        digits.min = multiple;
        Node look;
        look.kind = Node::look_ahead;
        look.kids = {add(std::move(digits))};
        Node guarded;
        guarded.kind = Node::guarded;
        guarded.kids = {inner, add(std::move(look))};
        return add(std::move(guarded));
      }
      if (group.kind == Node::empty) return inner;
      group.kids = {inner};
      return add(std::move(group));
    }
    if (eat('[')) return set_node(char_class());
    if (eat('.')) return set_node({{0, '\n' - 1}, {'\n' + 1, kMaxCodePoint}});
    if (c == '$' && (groups_open_ == scope_level_ || groups_open_ == look_level_) &&
        (at_ + 1 == p_.size() || p_[at_ + 1] == ')' || p_[at_ + 1] == '|')) {
      ++at_;  // a scope is matched whole: its `$` holds anyway, a look-ahead's until it is read
      if (groups_open_ == scope_level_) dollar_end_ = at_;
      Node end;
      if (groups_open_ == look_level_) end.kind = Node::end_anchor;
      return add(std::move(end));
    }
    if (c == '^' || c == '$')
      fail(str("'", c, "' other than at the ", c == '^' ? "start" : "end",
               " of an alternative of the pattern, of a length, JSON or search group or of a "
               "look-ahead"));
    if (eat('\\')) {
      Ranges r;
      if (class_escape(r)) return set_node(std::move(r));
      const char32_t cp = char_escape();
      return set_node({{cp, cp}});
    }
    const char32_t cp = code_point();
    return set_node({{cp, cp}});
  }

  // (?P<name> or (?<name> (not a look-behind); false (nothing read) otherwise.
  bool named_group() {
    if (!eat("?P<")) {
      if (p_.substr(at_, 2) != "?<" || at_ + 2 >= p_.size() || p_[at_ + 2] == '=' ||
          p_[at_ + 2] == '!')
        return false;
      at_ += 2;
    }
    while (more() && peek() != '>') ++at_;
    if (!eat('>')) fail("an unterminated group name");
    return true;
  }

  // One UTF-8 encoded code point of the pattern.
  char32_t code_point() {
    const auto b0 = static_cast<std::uint8_t>(p_[at_]);
    const int len = b0 < 0x80         ? 1
                    : (b0 >> 5) == 6  ? 2
                    : (b0 >> 4) == 14 ? 3
                    : (b0 >> 3) == 30 ? 4
                                      : 0;
    if (len == 0 || at_ + len > p_.size()) fail("invalid UTF-8");
    char32_t cp = len == 1 ? b0 : b0 & (0x7F >> len);
    for (int i = 1; i < len; ++i) {
      const auto b = static_cast<std::uint8_t>(p_[at_ + i]);
      if ((b & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    at_ += len;
    return cp;
  }

  // \d \D \w \W \s \S after the backslash; false (nothing read) for other escapes.
  bool class_escape(Ranges& r) {
    if (!more()) fail("a pattern ending in '\\'");
    static const Ranges digit{{'0', '9'}};
    static const Ranges word{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    static const Ranges space{{'\t', '\r'}, {' ', ' '}};
    const char c = peek();
    const Ranges* base = c == 'd' || c == 'D'   ? &digit
                         : c == 'w' || c == 'W' ? &word
                         : c == 's' || c == 'S' ? &space
                                                : nullptr;
    if (!base) return false;
    ++at_;
    r = c >= 'a' ? *base : complement(*base);
    return true;
  }

  // A one-character escape after the backslash.
  char32_t char_escape() {
    if (!more()) fail("a pattern ending in '\\'");
    const char c = peek();
    const auto hex = [&](std::size_t digits) {
      char32_t v = 0;
      for (std::size_t i = 0; i < digits; ++i) {
        if (!more() || !std::isxdigit(static_cast<unsigned char>(peek())))
          fail("a malformed hexadecimal escape");
        const char h = peek();
        v = v * 16 + static_cast<char32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        ++at_;
      }
      return v;
    };
    ++at_;
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'x': {
        if (!eat('{')) return hex(2);
        char32_t cp = 0;
        int digits = 0;
        while (more() && peek() != '}') {
          if (++digits > 6) fail("a malformed \\x{...} escape");
          cp = cp * 16 + hex(1);
        }
        if (digits == 0 || !eat('}')) fail("a malformed \\x{...} escape");
        if (cp > kMaxCodePoint) fail("a code point above U+10FFFF");
        return cp;
      }
      case 'u': return hex(4);
      default: break;
    }
    if (c >= '1' && c <= '9') {
      --at_;
      fail("back-references are not supported");
    }
    if (std::isalnum(static_cast<unsigned char>(c))) {
      --at_;
      fail(str("'\\", c, "' is not a supported escape"));
    }
    if (static_cast<unsigned char>(c) >= 0x80) {
      --at_;
      return code_point();
    }
    return static_cast<unsigned char>(c);
  }

  // After '[': the class's code point ranges, up to and past its ']'.
  Ranges char_class() {
    const bool negate = eat('^');
    Ranges r;
    bool first = true;
    while (true) {
      if (!more()) fail("an unterminated '['");
      if (peek() == ']' && !first) break;
      if (p_.substr(at_, 2) == "[:") fail("POSIX classes ([:name:]) are not supported");
      first = false;
      char32_t lo;
      if (eat('\\')) {
        Ranges set;
        if (class_escape(set)) {
          r.insert(r.end(), set.begin(), set.end());
          continue;
        }
        lo = char_escape();
      } else {
        lo = code_point();
      }
      char32_t hi = lo;
      if (p_.substr(at_, 1) == "-" && at_ + 1 < p_.size() && p_[at_ + 1] != ']') {
        ++at_;
        if (eat('\\')) {
          Ranges set;
          if (class_escape(set)) fail("a range ending in a class escape");
          hi = char_escape();
        } else {
          hi = code_point();
        }
        if (hi < lo) fail("a class range whose end comes before its start");
      }
      r.emplace_back(lo, hi);
    }
    ++at_;  // ']'
    r = normalized(std::move(r));
    return negate ? complement(r) : r;
  }

  std::string_view p_, field_;
  std::size_t at_ = 0, groups_open_ = 0;
  std::size_t scope_level_ = 0;        // groups_open_ inside the innermost scope
  std::size_t look_level_ = SIZE_MAX;  // groups_open_ inside the look-ahead being read
  std::size_t search_level_ = SIZE_MAX;  // groups_open_ inside the innermost search group
  std::size_t dollar_end_ = SIZE_MAX;    // at_ just past the last `$` ending a scope's alternative
  bool caret_in_look_ = false;  // an alternative of the look-ahead being read opened with `^`
  std::vector<Node> nodes_;
};

// Look-aheads and multiple groups build automata apart and discard them: what they build in all is
// bounded, so that no pattern of many such groups takes unbounded time.
[[noreturn]] void guards_too_large(std::string_view field) {
  throw RegexError(RegexError::Kind::too_large,
                   str("'", field, "': the pattern is too large (its look-aheads and multiple ",
                       "groups build more than ", RegexDfa::kMaxGuardWork, " states in all)"));
}

// Thompson's construction over bytes.
class Nfa {
 public:
  struct Edge {
    std::uint8_t lo, hi;
    int to;
  };
  struct State {
    std::vector<int> eps;
    std::vector<Edge> edges;
  };
  std::vector<State> states;

  explicit Nfa(std::string_view field) : field_(field) {}

  int add() {
    if (states.size() >= RegexDfa::kMaxNfaStates)
      throw RegexError(RegexError::Kind::too_large,
                       str("'", field_, "': the pattern is too large (more than ",
                           RegexDfa::kMaxNfaStates, " automaton states before determinization)"));
    states.emplace_back();
    return static_cast<int>(states.size()) - 1;
  }

  // A fragment from `start` to `end`; `end` gets its outgoing edges later.
  struct Frag {
    int start, end;
  };

  Frag build(const std::vector<Node>& nodes, int i) {
    const Node& n = nodes[static_cast<std::size_t>(i)];
    switch (n.kind) {
      case Node::empty: {
        const int s = add();
        return {s, s};
      }
      case Node::set: {
        const int s = add(), e = add();
        for (const auto& [lo, hi] : n.ranges) utf8_ranges(s, e, lo, hi);
        return {s, e};
      }
      case Node::concat: {
        Frag f = build(nodes, n.kids[0]);
        for (std::size_t k = 1; k < n.kids.size(); ++k) {
          const Frag g = build(nodes, n.kids[k]);
          link(f.end, g.start);
          f.end = g.end;
        }
        return f;
      }
      case Node::alt: {
        const int s = add(), e = add();
        for (int kid : n.kids) {
          const Frag g = build(nodes, kid);
          link(s, g.start);
          link(g.end, e);
        }
        return {s, e};
      }
      case Node::repeat: {
        const int s = add();
        int end = s;
        for (int k = 0; k < n.min; ++k) {
          const Frag g = build(nodes, n.kids[0]);
          link(end, g.start);
          end = g.end;
        }
        if (n.max < 0) {  // a loop: enter or leave at `end`
          const Frag g = build(nodes, n.kids[0]);
          const int loop = add();
          link(end, loop);
          link(loop, g.start);
          link(g.end, loop);
          return {s, loop};
        }
        const int e = add();
        for (int k = n.min; k < n.max; ++k) {  // each optional copy may skip to the end
          link(end, e);
          const Frag g = build(nodes, n.kids[0]);
          link(end, g.start);
          end = g.end;
        }
        link(end, e);
        return {s, e};
      }
      case Node::counted: return counted(nodes, n);
      case Node::guarded: return guarded(nodes, n);
      case Node::json_escaped: {
        const std::size_t first = states.size();
        const Frag g = build(nodes, n.kids[0]);
        json_escape(first, states.size());
        return g;
      }
      case Node::multiple: {
        // The remainder of the digits read so far, modulo n.min: a digit d takes r to 10r + d.
        const int s = add(), minus = add(), e = add();
        std::vector<int> remainder(static_cast<std::size_t>(n.min));
        for (int& r : remainder) r = add();
        states[static_cast<std::size_t>(s)].edges.push_back({'-', '-', minus});
        const auto digits = [&](int from, int r) {
          for (int d = 0; d < 10; ++d) {
            const int to = remainder[static_cast<std::size_t>((10 * r + d) % n.min)];
            std::vector<Edge>& edges = states[static_cast<std::size_t>(from)].edges;
            const auto b = static_cast<std::uint8_t>('0' + d);
            if (d > 0 && edges.back().to == to)
              edges.back().hi = b;
            else
              edges.push_back({b, b, to});
          }
        };
        digits(s, 0);
        digits(minus, 0);
        for (int r = 0; r < n.min; ++r) digits(remainder[static_cast<std::size_t>(r)], r);
        link(remainder[0], e);
        return {s, e};
      }
      case Node::look_ahead:  // read by `guarded`, whose kids they are
      case Node::end_anchor:  // replaced when its look-ahead is read
        break;
    }
    return {add(), add()};
  }

 private:
  Frag guarded(const std::vector<Node>& nodes, const Node& n);
  void spend(std::size_t work) {
    if (work > guard_budget_) guards_too_large(field_);
    guard_budget_ -= work;
  }

  void link(int from, int to) { states[static_cast<std::size_t>(from)].eps.push_back(to); }

  // The edges of states [first, last) that read a character a JSON string must escape read its
  // escape instead, as json.dumps writes it: \" \\ \b \f \n \r \t, other control
  // characters as \u00xx (lowercase).
  void json_escape(std::size_t first, std::size_t last) {
    const auto needs_escape = [](int b) { return b < 0x20 || b == '"' || b == '\\'; };
    for (std::size_t st = first; st < last; ++st) {
      std::vector<Edge> edges = std::move(states[st].edges), kept;
      int backslash = -1;  // after the escape's backslash, shared by this state's escapes
      std::array<int, 2> high{-1, -1};  // after \u00 and the escape's third hex digit, 0 or 1
      for (const Edge& e : edges) {
        if (e.lo > '\\') {  // nothing past the backslash needs an escape
          kept.push_back(e);
          continue;
        }
        int from = e.lo;  // the start of the run of bytes written as themselves
        for (int b = e.lo; b <= e.hi + 1; ++b) {
          if (b <= e.hi && !needs_escape(b)) continue;
          if (from < b)
            kept.push_back(
                {static_cast<std::uint8_t>(from), static_cast<std::uint8_t>(b - 1), e.to});
          from = b + 1;
          if (b > e.hi) break;
          if (backslash < 0) {
            backslash = add();
            kept.push_back({'\\', '\\', backslash});
          }
          const char letter = b == '"'    ? '"'
                              : b == '\\' ? '\\'
                              : b == '\b' ? 'b'
                              : b == '\f' ? 'f'
                              : b == '\n' ? 'n'
                              : b == '\r' ? 'r'
                              : b == '\t' ? 't'
                                          : 0;
          if (letter) {
            const auto c = static_cast<std::uint8_t>(letter);
            states[static_cast<std::size_t>(backslash)].edges.push_back({c, c, e.to});
            continue;
          }
          if (high[static_cast<std::size_t>(b >> 4)] < 0) {
            int at = backslash;
            for (const char c : {'u', '0', '0', static_cast<char>('0' + (b >> 4))}) {
              const auto byte = static_cast<std::uint8_t>(c);
              int to = -1;
              for (const Edge& x : states[static_cast<std::size_t>(at)].edges)
                if (x.lo == byte && x.hi == byte) to = x.to;
              if (to < 0) {
                to = add();
                states[static_cast<std::size_t>(at)].edges.push_back({byte, byte, to});
              }
              at = to;
            }
            high[static_cast<std::size_t>(b >> 4)] = at;
          }
          const auto digit = static_cast<std::uint8_t>("0123456789abcdef"[b & 15]);
          states[static_cast<std::size_t>(high[static_cast<std::size_t>(b >> 4)])].edges.push_back(
              {digit, digit, e.to});
        }
      }
      states[st].edges = std::move(kept);
    }
  }

  // The matches of n.kids[0] that are n.min to n.max characters long: its fragment, built apart,
  // is copied once per count of characters read so far (the product with a counter), an edge
  // whose bytes begin a character leading to the next count. Unbounded above, the last count is
  // n.min and stays there. A fragment's states lead only to each other, so the copies replace it.
  Frag counted(const std::vector<Node>& nodes, const Node& n) {
    const std::size_t first = states.size();
    const Frag g = build(nodes, n.kids[0]);
    std::vector<State> inner(std::make_move_iterator(states.begin() + static_cast<long>(first)),
                             std::make_move_iterator(states.end()));
    states.resize(first);
    const auto local = [&](int state) { return static_cast<std::size_t>(state) - first; };
    const int top = n.max < 0 ? n.min : n.max;
    const int s = add(), e = add();
    // Copies of the fragment's states at count c (`here`) and c + 1 (`ahead`), made as reached.
    std::vector<int> here(inner.size(), -1), ahead(inner.size(), -1);
    std::vector<std::size_t> todo{local(g.start)}, todo_ahead;
    here[local(g.start)] = add();
    link(s, here[local(g.start)]);
    const auto copy = [&](std::vector<int>& at, std::vector<std::size_t>& work, std::size_t q) {
      if (at[q] < 0) {
        at[q] = add();
        work.push_back(q);
      }
      return at[q];
    };
    for (int c = 0;; ++c) {
      while (!todo.empty()) {
        const std::size_t q = todo.back();
        todo.pop_back();
        const int me = here[q];
        for (const int t : inner[q].eps) link(me, copy(here, todo, local(t)));
        for (const Edge& edge : inner[q].edges) {
          const bool begins_character = (edge.lo & 0xC0) != 0x80;
          int to;
          if (!begins_character || (n.max < 0 && c == top))
            to = copy(here, todo, local(edge.to));
          else if (c < top)
            to = copy(ahead, todo_ahead, local(edge.to));
          else
            continue;  // a character past n.max
          states[static_cast<std::size_t>(me)].edges.push_back({edge.lo, edge.hi, to});
        }
        if (q == local(g.end) && c >= n.min) link(me, e);
      }
      if (c == top || todo_ahead.empty()) break;
      here.swap(ahead);
      std::fill(ahead.begin(), ahead.end(), -1);
      todo.swap(todo_ahead);
    }
    return {s, e};
  }

  void edge_chain(int s, int e, const std::uint8_t* lo, const std::uint8_t* hi, int n) {
    int at = s;
    for (int k = 0; k < n; ++k) {
      const int to = k + 1 == n ? e : add();
      states[static_cast<std::size_t>(at)].edges.push_back({lo[k], hi[k], to});
      at = to;
    }
  }

  static int encode(char32_t cp, std::uint8_t* out) {
    if (cp < 0x80) return out[0] = static_cast<std::uint8_t>(cp), 1;
    if (cp < 0x800) {
      out[0] = static_cast<std::uint8_t>(0xC0 | (cp >> 6));
      out[1] = static_cast<std::uint8_t>(0x80 | (cp & 0x3F));
      return 2;
    }
    if (cp < 0x10000) {
      out[0] = static_cast<std::uint8_t>(0xE0 | (cp >> 12));
      out[1] = static_cast<std::uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[2] = static_cast<std::uint8_t>(0x80 | (cp & 0x3F));
      return 3;
    }
    out[0] = static_cast<std::uint8_t>(0xF0 | (cp >> 18));
    out[1] = static_cast<std::uint8_t>(0x80 | ((cp >> 12) & 0x3F));
    out[2] = static_cast<std::uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[3] = static_cast<std::uint8_t>(0x80 | (cp & 0x3F));
    return 4;
  }

  // Edges from s to e spelling every code point of [lo, hi] (surrogates excluded) in UTF-8: the
  // range is split until each piece's code points share their length and vary only in whole
  // trailing bytes, so one byte range per position spells exactly that piece.
  void utf8_ranges(int s, int e, char32_t lo, char32_t hi) {
    if (lo > hi) return;
    if (lo < 0xD800 && hi > 0xDFFF) {
      utf8_ranges(s, e, lo, 0xD7FF);
      utf8_ranges(s, e, 0xE000, hi);
      return;
    }
    if (lo >= 0xD800 && hi <= 0xDFFF) return;
    if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
    if (hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;
    if (lo > hi) return;
    for (const char32_t edge : {char32_t{0x7F}, char32_t{0x7FF}, char32_t{0xFFFF}}) {
      if (lo <= edge && hi > edge) {
        utf8_ranges(s, e, lo, edge);
        utf8_ranges(s, e, edge + 1, hi);
        return;
      }
    }
    std::uint8_t a[4], b[4];
    const int n = encode(lo, a);
    encode(hi, b);
    for (int k = 1; k < n; ++k) {  // the last k bytes must span their whole continuation range
      const char32_t m = (char32_t{1} << (6 * k)) - 1;
      if ((lo & ~m) != (hi & ~m)) {
        if ((lo & m) != 0) {
          utf8_ranges(s, e, lo, lo | m);
          utf8_ranges(s, e, (lo | m) + 1, hi);
          return;
        }
        if ((hi & m) != m) {
          utf8_ranges(s, e, lo, (hi & ~m) - 1);
          utf8_ranges(s, e, hi & ~m, hi);
          return;
        }
      }
    }
    edge_chain(s, e, a, b, n);
  }

  std::string_view field_;
  std::size_t guard_budget_ = RegexDfa::kMaxGuardWork;
};

// The first byte of each class of bytes that no edge of states [first, last) tells apart.
std::vector<std::uint8_t> class_starts(const std::vector<Nfa::State>& states, std::size_t first,
                                       std::size_t last) {
  std::array<bool, 257> cut{};
  cut[0] = true;
  for (std::size_t s = first; s < last; ++s) {
    for (const Nfa::Edge& e : states[s].edges)
      cut[e.lo] = cut[static_cast<std::size_t>(e.hi) + 1] = true;
  }
  std::vector<std::uint8_t> starts;
  for (int b = 0; b < 256; ++b)
    if (cut[static_cast<std::size_t>(b)]) starts.push_back(static_cast<std::uint8_t>(b));
  return starts;
}

// Subset construction from NFA state `start` over the classes beginning at `starts`, `accept`
// the accepting NFA state; not yet minimized. The sets' sizes are bounded in all too: a pattern
// like (?:a?){1000} holds a thousand NFA states in every set; where `budget` is given, they are
// taken from it as well.
DfaTable determinized(const std::vector<Nfa::State>& states, int start, int accept,
                      const std::vector<std::uint8_t>& starts, std::string_view field,
                      std::size_t* budget = nullptr) {
  std::vector<int> mark(states.size(), -1);
  int stamp = 0;
  const auto closure = [&](std::vector<int> seeds) {
    ++stamp;
    std::vector<int> out;
    while (!seeds.empty()) {
      const int s = seeds.back();
      seeds.pop_back();
      if (mark[static_cast<std::size_t>(s)] == stamp) continue;
      mark[static_cast<std::size_t>(s)] = stamp;
      out.push_back(s);
      for (int t : states[static_cast<std::size_t>(s)].eps) seeds.push_back(t);
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  DfaTable table;
  table.classes = starts.size();
  // Each set of NFA states is kept once, as a key of `ids`; `sets` points at them in id order.
  std::map<std::vector<int>, std::int32_t> ids;
  std::vector<const std::vector<int>*> sets{&ids.emplace(closure({start}), 0).first->first};
  std::size_t entries = sets[0]->size();
  for (std::size_t d = 0; d < sets.size(); ++d) {
    const std::vector<int>& from = *sets[d];
    for (const std::uint8_t b : starts) {
      std::vector<int> moved;
      for (int s : from) {
        for (const Nfa::Edge& e : states[static_cast<std::size_t>(s)].edges)
          if (e.lo <= b && b <= e.hi) moved.push_back(e.to);
      }
      std::int32_t to = RegexDfa::kDead;
      if (!moved.empty()) {
        const auto [it, added] =
            ids.emplace(closure(std::move(moved)), static_cast<std::int32_t>(sets.size()));
        if (added) {
          entries += it->first.size();
          if (budget && it->first.size() > *budget) guards_too_large(field);
          if (budget) *budget -= it->first.size();
          if (sets.size() >= static_cast<std::size_t>(RegexDfa::kMaxSubsetStates))
            throw RegexError(
                RegexError::Kind::too_large,
                str("'", field, "': the pattern is too large (more than ",
                    RegexDfa::kMaxSubsetStates, " automaton states before minimization)"));
          if (entries > RegexDfa::kMaxSubsetEntries)
            throw RegexError(RegexError::Kind::too_large,
                             str("'", field, "': the pattern is too large (its automaton's states ",
                                 "before minimization hold more than ", RegexDfa::kMaxSubsetEntries,
                                 " NFA states in all)"));
          sets.push_back(&it->first);
        }
        to = it->second;
      }
      table.next.push_back(to);
    }
    table.accepting.push_back(std::binary_search(from.begin(), from.end(), accept) ? 1 : 0);
  }
  return table;
}

// A scope opened by look-aheads: the body's and each look-ahead's automata, built apart, run side
// by side (the product construction); a text is kept where the body and every positive look-ahead
// accept it and no negative one does. The product's fewest states are then written back as NFA
// states, so that a JSON or length group around it treats them as any other fragment's.
Nfa::Frag Nfa::guarded(const std::vector<Node>& nodes, const Node& n) {
  const std::size_t first = states.size();
  std::vector<Frag> parts;
  for (const int kid : n.kids) {
    const Node& k = nodes[static_cast<std::size_t>(kid)];
    parts.push_back(build(nodes, k.kind == Node::look_ahead ? k.kids[0] : kid));
  }
  spend(states.size() - first);
  const std::vector<std::uint8_t> starts = class_starts(states, first, states.size());
  const std::size_t classes = starts.size();
  std::vector<DfaTable> dfas;
  for (const Frag& f : parts) {
    DfaTable d = determinized(states, f.start, f.end, starts, field_, &guard_budget_);
    spend(d.next.size());  // its transitions, which minimizing reads
    dfas.push_back(minimized(d));
  }
  states.resize(first);
  const auto negative = [&](std::size_t i) {  // kids[0] is the body
    return i > 0 && nodes[static_cast<std::size_t>(n.kids[i])].min == 1;
  };

  // A product state holds each automaton's state, kDead where it has read past its language (for
  // the body or a positive look-ahead, the product is then dead too).
  DfaTable product;
  product.classes = classes;
  std::map<std::vector<std::int32_t>, std::int32_t> ids;
  std::vector<std::vector<std::int32_t>> tuples;
  const auto id = [&](std::vector<std::int32_t> t) {
    for (std::size_t i = 0; i < t.size(); ++i)
      if (t[i] == RegexDfa::kDead && !negative(i)) return RegexDfa::kDead;
    const auto [it, added] = ids.emplace(t, static_cast<std::int32_t>(tuples.size()));
    if (added) {
      spend(t.size() * classes);  // the transitions it will be given
      if (tuples.size() >= static_cast<std::size_t>(RegexDfa::kMaxSubsetStates))
        throw RegexError(RegexError::Kind::too_large,
                         str("'", field_, "': the pattern is too large (more than ",
                             RegexDfa::kMaxSubsetStates, " states in its look-aheads' product)"));
      tuples.push_back(std::move(t));
    }
    return it->second;
  };
  std::vector<std::int32_t> start;
  for (const DfaTable& d : dfas) start.push_back(d.states() ? 0 : RegexDfa::kDead);
  if (id(start) != RegexDfa::kDead) {
    for (std::size_t q = 0; q < tuples.size(); ++q) {
      bool accepting = true;
      for (std::size_t i = 0; i < dfas.size(); ++i) {
        const std::int32_t at = tuples[q][i];
        const bool accepts =
            at != RegexDfa::kDead && dfas[i].accepting[static_cast<std::size_t>(at)];
        if (accepts == negative(i)) accepting = false;
      }
      product.accepting.push_back(accepting ? 1 : 0);
      for (std::size_t c = 0; c < classes; ++c) {
        std::vector<std::int32_t> t(dfas.size());
        for (std::size_t i = 0; i < dfas.size(); ++i) {
          const std::int32_t at = tuples[q][i];
          t[i] =
              at == RegexDfa::kDead ? at : dfas[i].next[static_cast<std::size_t>(at) * classes + c];
        }
        product.next.push_back(id(std::move(t)));
      }
    }
  }
  product = minimized(product);

  // One NFA state per product state; a class's bytes as one edge, neighbouring classes with the
  // same target merged within ASCII, continuation bytes and lead bytes (a length group tells
  // those apart by an edge's first byte).
  const int s = add(), e = add();
  std::vector<int> at(product.states());
  for (int& a : at) a = add();
  if (!at.empty()) link(s, at[0]);
  for (std::size_t q = 0; q < product.states(); ++q) {
    std::vector<Edge>& edges = states[static_cast<std::size_t>(at[q])].edges;
    for (std::size_t c = 0; c < classes; ++c) {
      const std::int32_t to = product.next[q * classes + c];
      if (to == RegexDfa::kDead) continue;
      const auto lo = starts[c];
      const auto hi = static_cast<std::uint8_t>(c + 1 < classes ? starts[c + 1] - 1 : 0xFF);
      const int target = at[static_cast<std::size_t>(to)];
      if (!edges.empty() && edges.back().to == target && edges.back().hi + 1 == lo && lo != 0x80 &&
          lo != 0xC0)
        edges.back().hi = hi;
      else
        edges.push_back({lo, hi, target});
    }
    if (product.accepting[q]) link(at[q], e);
  }
  return {s, e};
}

}  // namespace

RegexDfa::RegexDfa(std::string_view pattern, std::string_view field) {
  int root = 0;
  const std::vector<Node> nodes = Parser(pattern, field).parse(root);
  Nfa nfa(field);
  const Nfa::Frag whole = nfa.build(nodes, root);

  // Bytes that no edge tells apart share a class.
  const std::vector<std::uint8_t> starts = class_starts(nfa.states, 0, nfa.states.size());
  for (std::size_t c = 0; c < starts.size(); ++c) {
    const std::size_t end = c + 1 < starts.size() ? starts[c + 1] : 256;
    for (std::size_t b = starts[c]; b < end; ++b) class_of_[b] = static_cast<std::uint8_t>(c);
  }
  classes_ = starts.size();

  // Subset construction, then the fewest states of the language (the copies a pattern spells out
  // merge), within kMaxStates.
  DfaTable table = minimized(determinized(nfa.states, whole.start, whole.end, starts, field));
  const std::size_t n = table.states();
  if (n == 0)
    throw RegexError(RegexError::Kind::no_text, str("'", field, "': the pattern matches no text"));
  if (n > static_cast<std::size_t>(kMaxStates))
    throw RegexError(RegexError::Kind::too_large,
                     str("'", field, "': the pattern is too large (its automaton needs more than ",
                         kMaxStates, " states)"));
  next_ = std::move(table.next);
  accepting_ = std::move(table.accepting);
  extendable_.assign(n, 0);
  for (std::size_t s = 0; s < n; ++s) {
    for (std::size_t c = 0; c < classes_; ++c)
      if (next_[s * classes_ + c] != kDead) extendable_[s] = 1;
  }
}

bool RegexDfa::matches(std::string_view text) const noexcept {
  const std::int32_t s = walk(start(), text);
  return s != kDead && accepting(s);
}

}  // namespace dcp
