// GBNF grammars (GbnfGrammar): the syntax as llama.cpp documents it; the automaton against
// RegexDfa (itself checked against Python's re) on random regular grammars, byte by byte, and
// against an independent recognizer on random recursive ones, with every live state shown to
// end in a text of the grammar; the refusals, naming line and column; the bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <vector>

#include "dcp/error.h"
#include "dcp/gbnf_grammar.h"
#include "dcp/regex_dfa.h"
#include "test_util.h"

namespace dcp {
namespace {

std::string refusal(std::string_view grammar) {
  try {
    GbnfGrammar g(grammar, "guided_grammar");
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::invalid_argument);
    return e.what();
  }
  return "";
}

bool live(const GbnfGrammar& g, std::string_view text) {
  return g.walk(g.start(), text) != ByteGrammar::kDead;
}

TEST(GbnfGrammar, ReadsTheSyntaxAsLlamaCppWritesIt) {
  const GbnfGrammar hello(R"(root ::= greeting ", " name "!"   # a comment
greeting ::= "hello" | "hi"
name ::=
  [A-Z] [a-z]*
)");
  EXPECT_TRUE(hello.matches("hello, Bob!"));
  EXPECT_TRUE(hello.matches("hi, B!"));
  EXPECT_FALSE(hello.matches("hi, bob!"));
  EXPECT_FALSE(hello.matches("hello, Bob"));
  EXPECT_TRUE(live(hello, "hello, Bob"));
  EXPECT_FALSE(live(hello, "hey"));

  const GbnfGrammar escapes(R"(root ::= "\x41\u00e9\U0001F600\n\t\"\\\[\]" [\]\-\\^]+)");
  EXPECT_TRUE(escapes.matches("A\xC3\xA9\xF0\x9F\x98\x80\n\t\"\\[]]-\\^"));
  EXPECT_FALSE(escapes.matches("A\xC3\xA9\xF0\x9F\x98\x80\n\t\"\\[]a"));

  const GbnfGrammar any("root ::= . .");  // any character, newlines too
  EXPECT_TRUE(any.matches("\xC3\xA9\n"));
  EXPECT_FALSE(any.matches("abc"));
  EXPECT_FALSE(any.matches("a\xFF"));  // not UTF-8

  const GbnfGrammar counts(R"(root ::= "ab"{2} "c"{1,} "d"{,2} "e"? ("f" "g"){0})");
  EXPECT_TRUE(counts.matches("ababc"));
  EXPECT_TRUE(counts.matches("ababcccdde"));
  EXPECT_FALSE(counts.matches("abc"));
  EXPECT_FALSE(counts.matches("ababcddd"));
  EXPECT_FALSE(counts.matches("ababcfg"));

  const GbnfGrammar empty_alt("root ::= \"a\" ( | \"b\" )\r\n");  // CRLF ends lines too
  EXPECT_TRUE(empty_alt.matches("a"));
  EXPECT_TRUE(empty_alt.matches("ab"));

  const GbnfGrammar negated("root ::= [^a\\n] [^\\x00-\\x7F]");  // code points, not bytes
  EXPECT_TRUE(negated.matches("b\xE4\xB8\xAD"));
  EXPECT_FALSE(negated.matches("a\xE4\xB8\xAD"));
  EXPECT_FALSE(negated.matches("\n\xE4\xB8\xAD"));
  EXPECT_FALSE(negated.matches("bc"));

  // A character is read byte by byte: its first bytes are live while the class may still hold it.
  const GbnfGrammar han("root ::= [\\u4E2D-\\u4E2F]");  // E4 B8 AD .. E4 B8 AF
  EXPECT_TRUE(live(han, "\xE4"));
  EXPECT_TRUE(live(han, "\xE4\xB8"));
  EXPECT_FALSE(live(han, "\xE4\xB9"));
  EXPECT_FALSE(live(han, "\xE4\xB8\xAC"));
  EXPECT_TRUE(han.matches("\xE4\xB8\xAE"));
  EXPECT_FALSE(han.accepting(han.walk(han.start(), "\xE4\xB8")));

  // Right recursion does not grow a parse: a long list walks in constant depth.
  const GbnfGrammar list("root ::= item (\",\" item)*\nitem ::= [0-9]+");
  std::string text = "1";
  for (int i = 0; i < 5000; ++i) text += ",23";
  EXPECT_TRUE(list.matches(text));
}

// A grammar as a tree, printed as GBNF and (without recursion) as a regular expression.
struct Tree {
  enum Kind { kLit, kClass, kAny, kSeq, kAlt, kRep, kRef };
  struct Node {
    Kind kind = kLit;
    std::u32string text;                                // kLit
    std::vector<std::pair<char32_t, char32_t>> ranges;  // kClass
    bool negated = false;
    std::vector<int> kids;  // kSeq, kAlt, kRep (one)
    int lo = 0, hi = 0;     // kRep; hi < 0: unbounded
    int rule = 0;           // kRef
    bool nullable = false;
  };
  std::vector<Node> nodes;
  std::vector<int> rules;  // each rule's body; rule 0 is root
};

const std::u32string kAlphabet = U"ab(\n\"\\]-\u00e9\u4e2d\U0001F600";

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// Strict UTF-8 to code points (nullopt when not UTF-8), written apart from the grammar's.
std::optional<std::u32string> code_points(std::string_view s) {
  std::u32string out;
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int n = b < 0x80 ? 0 : (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : (b >> 3) == 30 ? 3 : -1;
    if (n < 0 || i + static_cast<std::size_t>(n) >= s.size()) return std::nullopt;
    char32_t c = n == 0 ? b : static_cast<char32_t>(b & (0x3F >> n));
    for (int k = 1; k <= n; ++k) {
      const auto t = static_cast<unsigned char>(s[i + static_cast<std::size_t>(k)]);
      if ((t >> 6) != 2) return std::nullopt;
      c = c << 6 | (t & 0x3F);
    }
    const char32_t least[] = {0, 0x80, 0x800, 0x10000};
    if (c < least[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return std::nullopt;
    out += c;
    i += static_cast<std::size_t>(n) + 1;
  }
  return out;
}

class TreeMaker {
 public:
  TreeMaker(test::Rng& rng, bool recursive) : rng_(rng), recursive_(recursive) {}

  Tree make() {
    t_ = Tree{};
    const int rules = static_cast<int>(rng_.range(1, 4));
    t_.rules.assign(static_cast<std::size_t>(rules), -1);
    for (int r = rules - 1; r >= 0; --r) {  // later rules first: forward references are known
      // One alternative without recursion, so that the rule ends.
      std::vector<int> alts{node(2, r, false)};
      for (int n = static_cast<int>(rng_.range(0, 2)); n > 0; --n) alts.push_back(node(2, r, true));
      t_.rules[static_cast<std::size_t>(r)] = alts.size() == 1 ? alts[0] : add_alt(alts);
    }
    return t_;
  }

 private:
  char32_t letter() { return kAlphabet[static_cast<std::size_t>(rng_.range(0, 9))]; }
  int push(Tree::Node n) {
    t_.nodes.push_back(std::move(n));
    return static_cast<int>(t_.nodes.size() - 1);
  }
  int add_alt(std::vector<int> kids) {
    Tree::Node n;
    n.kind = Tree::kAlt;
    for (int k : kids) n.nullable = n.nullable || t_.nodes[static_cast<std::size_t>(k)].nullable;
    n.kids = std::move(kids);
    return push(std::move(n));
  }
  int literal(std::u32string text) {
    Tree::Node n;
    n.kind = Tree::kLit;
    n.text = std::move(text);
    return push(std::move(n));
  }
  int node(int depth, int rule, bool back) {
    const int pick = static_cast<int>(rng_.range(0, depth > 0 ? 9 : 4));
    Tree::Node n;
    if (pick == 0 || pick == 1) {
      std::u32string s;
      for (int k = static_cast<int>(rng_.range(1, 3)); k > 0; --k) s += letter();
      return literal(s);
    }
    if (pick == 2) {
      n.kind = Tree::kClass;
      for (int k = static_cast<int>(rng_.range(1, 2)); k > 0; --k) {
        char32_t a = letter(), b = rng_.coin(0.6) ? a : letter();
        n.ranges.push_back({std::min(a, b), std::max(a, b)});
      }
      n.negated = rng_.coin(0.25);
      return push(std::move(n));
    }
    if (pick == 3) {
      if (rng_.coin(0.3)) {
        n.kind = Tree::kAny;
        return push(std::move(n));
      }
      if (rule + 1 < static_cast<int>(t_.rules.size())) {  // a later rule: no cycle
        n.kind = Tree::kRef;
        n.rule = static_cast<int>(rng_.range(rule + 1, static_cast<int>(t_.rules.size()) - 1));
        n.nullable =
            t_.nodes[static_cast<std::size_t>(t_.rules[static_cast<std::size_t>(n.rule)])].nullable;
        return push(std::move(n));
      }
      return literal(std::u32string(1, letter()));
    }
    if (pick == 4 && recursive_ && back) {
      // Any rule, this one too, between two characters: recursion that reads before it recurses.
      Tree::Node ref;
      ref.kind = Tree::kRef;
      ref.rule = static_cast<int>(rng_.range(0, static_cast<int>(t_.rules.size()) - 1));
      n.kind = Tree::kSeq;
      n.kids = {literal(std::u32string(1, letter())), push(ref),
                literal(std::u32string(1, letter()))};
      return push(std::move(n));
    }
    if (pick <= 6) {
      n.kind = Tree::kSeq;
      n.nullable = true;
      for (int k = static_cast<int>(rng_.range(2, 3)); k > 0; --k) {
        n.kids.push_back(node(depth - 1, rule, back));
        n.nullable = n.nullable && t_.nodes[static_cast<std::size_t>(n.kids.back())].nullable;
      }
      return push(std::move(n));
    }
    if (pick <= 8) {
      std::vector<int> kids;
      for (int k = static_cast<int>(rng_.range(2, 3)); k > 0; --k)
        kids.push_back(node(depth - 1, rule, back));
      return add_alt(kids);
    }
    n.kind = Tree::kRep;
    n.kids = {node(depth - 1, rule, back)};
    const bool empty_kid = t_.nodes[static_cast<std::size_t>(n.kids[0])].nullable;
    const int form = static_cast<int>(rng_.range(0, 6));
    n.lo = form == 1 || form == 4 ? 1 : form == 5 ? 2 : 0;
    n.hi = form == 0 || form == 1 || form == 4 ? -1 : form == 2 ? 1 : static_cast<int>(n.lo + 2);
    if (form == 6) {
      n.lo = 0;
      n.hi = static_cast<int>(rng_.range(1, 3));
    }
    if (n.hi < 0 && empty_kid) n.hi = n.lo + 2;  // x* over an x that can be empty: refused
    n.nullable = n.lo == 0 || empty_kid;
    return push(std::move(n));
  }

  test::Rng& rng_;
  bool recursive_;
  Tree t_;
};

std::string gbnf_char(char32_t c, bool in_class, test::Rng& rng) {
  if (c == '\n') return "\\n";
  if (c == '"' || c == '\\' || (in_class && (c == ']' || c == '-' || c == '^' || c == '[')))
    return std::string("\\") + static_cast<char>(c);
  if (rng.coin(0.2)) {  // escaped forms too
    char buf[16];
    if (c < 0x100)
      std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned>(c));
    else if (c < 0x10000)
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
    else
      std::snprintf(buf, sizeof buf, "\\U%08X", static_cast<unsigned>(c));
    return buf;
  }
  return utf8(c);
}

std::string regex_char(char32_t c) {
  if (c == '\n') return "\\n";
  if (c < 0x80 && !std::isalnum(static_cast<int>(c)))
    return std::string("\\") + static_cast<char>(c);
  return utf8(c);
}

std::string rule_name(int r) {
  return r == 0 ? "root" : r % 2 ? "rule_" + std::to_string(r) : "rule-" + std::to_string(r);
}

std::string gbnf_of(const Tree& t, int i, test::Rng& rng) {
  const Tree::Node& n = t.nodes[static_cast<std::size_t>(i)];
  std::string s;
  switch (n.kind) {
    case Tree::kLit:
      s = "\"";
      for (char32_t c : n.text) s += gbnf_char(c, false, rng);
      return s + "\"";
    case Tree::kClass:
      s = n.negated ? "[^" : "[";
      for (const auto& [a, b] : n.ranges)
        s += gbnf_char(a, true, rng) + (a == b ? "" : "-" + gbnf_char(b, true, rng));
      return s + "]";
    case Tree::kAny: return ".";
    case Tree::kRef: return rule_name(n.rule);
    case Tree::kSeq:
    case Tree::kAlt:
      s = "(";
      for (std::size_t k = 0; k < n.kids.size(); ++k) {
        if (k) s += n.kind == Tree::kAlt ? (rng.coin(0.3) ? "\n  | " : " | ") : " ";
        s += gbnf_of(t, n.kids[k], rng);
      }
      return s + ")";
    case Tree::kRep:
      s = gbnf_of(t, n.kids[0], rng);
      if (n.lo == 0 && n.hi < 0) return s + (rng.coin() ? "*" : "{0,}");
      if (n.lo == 1 && n.hi < 0) return s + "+";
      if (n.lo == 0 && n.hi == 1) return s + "?";
      if (n.hi < 0) return s + "{" + std::to_string(n.lo) + ",}";
      if (n.lo == 0 && rng.coin()) return s + "{," + std::to_string(n.hi) + "}";
      return s + "{" + std::to_string(n.lo) + "," + std::to_string(n.hi) + "}";
  }
  return s;
}

std::string gbnf_text(const Tree& t, test::Rng& rng) {
  std::string s;
  for (std::size_t r = 0; r < t.rules.size(); ++r) {
    s += rule_name(static_cast<int>(r)) + (rng.coin(0.3) ? " ::=\n    " : " ::= ");
    s += gbnf_of(t, t.rules[r], rng);
    s += rng.coin(0.3) ? "  # rule " + std::to_string(r) + "\n" : "\n";
  }
  return s;
}

std::string regex_of(const Tree& t, int i) {
  const Tree::Node& n = t.nodes[static_cast<std::size_t>(i)];
  std::string s;
  switch (n.kind) {
    case Tree::kLit:
      for (char32_t c : n.text) s += regex_char(c);
      return "(?:" + s + ")";
    case Tree::kClass:
      s = n.negated ? "[^" : "[";
      for (const auto& [a, b] : n.ranges) s += regex_char(a) + (a == b ? "" : "-" + regex_char(b));
      return s + "]";
    case Tree::kAny: return "(?:.|\\n)";
    case Tree::kRef: return regex_of(t, t.rules[static_cast<std::size_t>(n.rule)]);
    case Tree::kSeq:
    case Tree::kAlt:
      for (std::size_t k = 0; k < n.kids.size(); ++k) {
        if (k && n.kind == Tree::kAlt) s += "|";
        s += regex_of(t, n.kids[k]);
      }
      return "(?:" + s + ")";
    case Tree::kRep:
      s = regex_of(t, n.kids[0]);
      if (n.hi < 0) return s + "{" + std::to_string(n.lo) + ",}";
      return s + "{" + std::to_string(n.lo) + "," + std::to_string(n.hi) + "}";
  }
  return s;
}

// Which texts the tree derives, by spans: the ends j of node's derivations from position i; and
// which it may still derive, a text being a proper prefix of what a node derives from i.
class Recognizer {
 public:
  Recognizer(const Tree& t, std::u32string s) : t_(t), s_(std::move(s)) {}
  bool whole() { return ends(t_.rules[0], 0).count(s_.size()) > 0; }
  bool viable() { return whole() || runs_off(t_.rules[0], 0); }

 private:
  bool runs_off(int i, std::size_t at) {
    const auto key = std::make_pair(i, at);
    if (const auto it = off_.find(key); it != off_.end()) return it->second;
    const Tree::Node& n = t_.nodes[static_cast<std::size_t>(i)];
    bool off = false;
    // Whether a run of kids, the first from one of `from`, runs off the end: `count` of them.
    const auto run = [&](std::set<std::size_t> from, const std::vector<int>& kids) {
      for (int k : kids) {
        for (std::size_t p : from)
          if (runs_off(k, p)) return true;
        std::set<std::size_t> next;
        for (std::size_t p : from) {
          const auto& e = ends(k, p);
          next.insert(e.begin(), e.end());
        }
        from = std::move(next);
        if (from.empty()) break;
      }
      return false;
    };
    switch (n.kind) {
      case Tree::kLit:
        off = s_.size() - at < n.text.size() &&
              n.text.compare(0, s_.size() - at, s_, at, s_.size() - at) == 0;
        break;
      case Tree::kClass:
      case Tree::kAny: off = at == s_.size(); break;
      case Tree::kRef: off = runs_off(t_.rules[static_cast<std::size_t>(n.rule)], at); break;
      case Tree::kAlt:
        for (int k : n.kids) off = off || runs_off(k, at);
        break;
      case Tree::kSeq: off = run({at}, n.kids); break;
      case Tree::kRep: {
        const int most = n.hi < 0 ? static_cast<int>(s_.size() - at) + 1 : n.hi;
        off = run({at}, std::vector<int>(static_cast<std::size_t>(std::max(most, 0)), n.kids[0]));
        break;
      }
    }
    return off_.emplace(key, off).first->second;
  }

  const std::set<std::size_t>& ends(int i, std::size_t at) {
    const auto key = std::make_pair(i, at);
    if (const auto it = memo_.find(key); it != memo_.end()) return it->second;
    std::set<std::size_t> out;
    const Tree::Node& n = t_.nodes[static_cast<std::size_t>(i)];
    const auto one = [&](char32_t c) {
      if (n.kind == Tree::kAny) return true;
      bool in = false;
      for (const auto& [a, b] : n.ranges) in = in || (c >= a && c <= b);
      return in != n.negated;
    };
    switch (n.kind) {
      case Tree::kLit:
        if (s_.compare(at, n.text.size(), n.text) == 0 && at + n.text.size() <= s_.size())
          out.insert(at + n.text.size());
        break;
      case Tree::kClass:
      case Tree::kAny:
        if (at < s_.size() && one(s_[at])) out.insert(at + 1);
        break;
      case Tree::kRef: out = ends(t_.rules[static_cast<std::size_t>(n.rule)], at); break;
      case Tree::kAlt:
        for (int k : n.kids) {
          const auto& e = ends(k, at);
          out.insert(e.begin(), e.end());
        }
        break;
      case Tree::kSeq: {
        std::set<std::size_t> from{at};
        for (int k : n.kids) {
          std::set<std::size_t> next;
          for (std::size_t p : from) {
            const auto& e = ends(k, p);
            next.insert(e.begin(), e.end());
          }
          from = std::move(next);
        }
        out = std::move(from);
        break;
      }
      case Tree::kRep: {  // an unbounded kid never matches the empty text: each pass reads
        std::set<std::size_t> from{at};
        if (n.lo == 0) out.insert(at);
        const int most = n.hi < 0 ? static_cast<int>(s_.size() - at) + 1 : n.hi;
        for (int count = 1; count <= most && !from.empty(); ++count) {
          std::set<std::size_t> next;
          for (std::size_t p : from) {
            const auto& e = ends(n.kids[0], p);
            next.insert(e.begin(), e.end());
          }
          if (count >= n.lo) out.insert(next.begin(), next.end());
          from = std::move(next);
        }
        break;
      }
    }
    return memo_.emplace(key, std::move(out)).first->second;
  }

  const Tree& t_;
  std::u32string s_;
  std::map<std::pair<int, std::size_t>, std::set<std::size_t>> memo_;
  std::map<std::pair<int, std::size_t>, bool> off_;
};

bool derives(const Tree& t, std::string_view text) {
  const std::optional<std::u32string> cps = code_points(text);
  return cps && Recognizer(t, *cps).whole();
}

// Whether `text` (whole characters) begins some text the tree derives.
bool begins(const Tree& t, std::string_view text) {
  const std::optional<std::u32string> cps = code_points(text);
  return cps && Recognizer(t, *cps).viable();
}

// A text the tree derives, drawn at random (recursion cut at a depth), or one that likely is not.
std::string sample(const Tree& t, int i, test::Rng& rng, int depth) {
  const Tree::Node& n = t.nodes[static_cast<std::size_t>(i)];
  std::string s;
  switch (n.kind) {
    case Tree::kLit:
      for (char32_t c : n.text) s += utf8(c);
      return s;
    case Tree::kClass:
    case Tree::kAny: {
      for (int tries = 0; tries < 20; ++tries) {
        const char32_t c =
            n.kind == Tree::kAny || n.negated
                ? kAlphabet[static_cast<std::size_t>(rng.range(0, 9))]
                : static_cast<char32_t>(rng.range(n.ranges[0].first, n.ranges[0].second));
        if (derives(Tree{{n}, {0}}, utf8(c))) return utf8(c);
      }
      return "a";
    }
    case Tree::kRef:
      return depth > 6 ? "" : sample(t, t.rules[static_cast<std::size_t>(n.rule)], rng, depth + 1);
    case Tree::kSeq:
      for (int k : n.kids) s += sample(t, k, rng, depth);
      return s;
    case Tree::kAlt:
      return sample(
          t, n.kids[static_cast<std::size_t>(rng.range(0, static_cast<int>(n.kids.size()) - 1))],
          rng, depth + 1);
    case Tree::kRep: {
      const int count = static_cast<int>(rng.range(n.lo, n.hi < 0 ? n.lo + 3 : n.hi));
      for (int k = 0; k < count; ++k) s += sample(t, n.kids[0], rng, depth + 1);
      return s;
    }
  }
  return s;
}

std::vector<std::string> texts_for(const Tree& t, test::Rng& rng, int n) {
  std::vector<std::string> out;
  for (int k = 0; k < n; ++k) {
    std::string s = sample(t, t.rules[0], rng, 0);
    for (int m = static_cast<int>(rng.range(0, 2)); m > 0; --m) {  // mutations: some bytes
      const std::size_t at = static_cast<std::size_t>(rng.range(0, static_cast<int>(s.size())));
      const int what = static_cast<int>(rng.range(0, 2));
      const std::string piece = rng.coin(0.7)
                                    ? utf8(kAlphabet[static_cast<std::size_t>(rng.range(0, 9))])
                                    : std::string(1, static_cast<char>(rng.range(0, 255)));
      if (what == 0) s.insert(at, piece);
      if (what == 1 && at < s.size()) s.erase(at, 1);
      if (what == 2 && at < s.size()) s.replace(at, 1, piece);
    }
    out.push_back(s);
  }
  return out;
}

// Byte by byte, both automata are live, accepting and extendable alike. Past a state that dropped
// parses (GbnfGrammar::whole: an ambiguous grammar, such as a repeat of nullable repeats, can
// hold more than kMaxParses), only one direction holds: what the grammar keeps, the regex has;
// and once the memory bound refused states, a dead byte may be one the regex allows.
TEST(GbnfGrammar, AgreesWithRegexDfaByteByByteOnRandomRegularGrammars) {
  test::Rng rng = test::make_rng();
  TreeMaker maker(rng, false);
  int accepted = 0, dead = 0, too_large = 0, checked = 0, cut = 0;
  for (int g = 0; g < 300; ++g) {
    const Tree t = maker.make();
    const std::string text = gbnf_text(t, rng), pattern = regex_of(t, t.rules[0]);
    const GbnfGrammar gbnf(text);
    std::optional<RegexDfa> compiled;
    try {
      compiled.emplace(pattern);
    } catch (const Error&) {  // a pattern past RegexDfa's state bound (a few in a thousand)
      ++too_large;
      continue;
    }
    const RegexDfa& dfa = *compiled;
    bool trimmed = false;
    for (const std::string& s : texts_for(t, rng, 20)) {
      std::int32_t a = gbnf.start(), b = dfa.start();
      bool whole = true;
      for (std::size_t k = 0; k <= s.size(); ++k) {
        const auto where = [&] {
          return "grammar:\n" + text + "regex: " + pattern + "\ntext: " + s + " at byte " +
                 std::to_string(k);
        };
        if (a != ByteGrammar::kDead) whole = whole && gbnf.whole(a);
        trimmed = trimmed || !whole;
        checked += whole;
        if (whole && !gbnf.exhausted()) {
          ASSERT_EQ(a == ByteGrammar::kDead, b == ByteGrammar::kDead) << where();
        } else if (a != ByteGrammar::kDead) {
          ASSERT_NE(b, ByteGrammar::kDead) << where();
        }
        if (a == ByteGrammar::kDead) {
          ++dead;
          break;
        }
        if (whole) {
          ASSERT_EQ(gbnf.accepting(a), dfa.accepting(b)) << where();
          ASSERT_EQ(gbnf.extendable(a), dfa.extendable(b)) << where();
        } else {
          ASSERT_TRUE(!gbnf.accepting(a) || dfa.accepting(b)) << where();
          ASSERT_TRUE(!gbnf.extendable(a) || dfa.extendable(b)) << where();
        }
        if (k == s.size()) {
          accepted += gbnf.accepting(a);
          if (whole || gbnf.accepting(a)) {
            ASSERT_EQ(gbnf.accepting(a), derives(t, s)) << where();
          }
          break;
        }
        a = gbnf.walk(a, s.substr(k, 1));
        b = dfa.walk(b, s.substr(k, 1));
      }
    }
    cut += trimmed || gbnf.exhausted();
  }
  EXPECT_GT(accepted, 1000);  // both kinds of text were met often
  EXPECT_GT(dead, 600);
  EXPECT_LT(too_large, 10);
  EXPECT_GT(checked, 20000);
  EXPECT_LT(cut, 15);  // grammars whose parses multiply past a bound are rare
}

// The bytes the random grammars' texts are written in: ASCII and the alphabet's characters'.
// (Their classes' ranges end on the alphabet, and a negated one holds \x00-\x09, so these spell a
// text wherever one may follow; searching all 256 bytes would walk every partial character.)
std::vector<char> text_bytes() {
  std::set<char> bytes;
  for (int b = 0; b < 0x80; ++b) bytes.insert(static_cast<char>(b));
  for (char32_t c : kAlphabet)
    for (char b : utf8(c)) bytes.insert(b);
  return {bytes.begin(), bytes.end()};
}

// The shortest bytes from `state` to a whole text, found over the automaton's states.
std::optional<std::string> completion(const GbnfGrammar& g, std::int32_t state) {
  static const std::vector<char> bytes = text_bytes();
  std::map<std::int32_t, std::pair<std::int32_t, char>> from{{state, {-1, 0}}};
  std::queue<std::int32_t> q;
  q.push(state);
  while (!q.empty() && from.size() < 50000) {
    const std::int32_t s = q.front();
    q.pop();
    if (g.accepting(s)) {
      std::string path;
      for (std::int32_t at = s; at != state; at = from[at].first) path += from[at].second;
      return std::string(path.rbegin(), path.rend());
    }
    for (const char b : bytes) {
      const std::int32_t to = g.walk(s, std::string(1, b));
      if (to != ByteGrammar::kDead && from.emplace(to, std::make_pair(s, b)).second) q.push(to);
    }
  }
  return std::nullopt;
}

// Every prefix that ends on a whole character is live exactly when the recognizer says a text of
// the grammar begins so, and accepting exactly when it derives it (prefixes inside a character
// are RegexDfa's test above), over random and mutated texts and random walks over live bytes.
// Past a state that dropped parses (GbnfGrammar::whole), or once the memory bound has refused
// states (GbnfGrammar::exhausted: a grammar whose parses multiply fills it), only the first halves
// hold: what is live begins a text of the grammar, and what is accepted is one.
TEST(GbnfGrammar, AgreesWithASpanRecognizerOnRandomRecursiveGrammars) {
  test::Rng rng = test::make_rng();
  TreeMaker maker(rng, true);
  int accepted = 0, dead = 0, walked_bytes = 0, checked = 0, cut = 0;
  for (int g = 0; g < 150; ++g) {
    const Tree t = maker.make();
    const std::string text = gbnf_text(t, rng);
    const GbnfGrammar gbnf(text);
    bool trimmed = false;
    std::vector<std::string> texts = texts_for(t, rng, 20);
    for (int w = 0; w < 3; ++w) {  // random walks over the bytes that keep the text live
      std::string walked;
      std::int32_t state = gbnf.start();
      for (int step = 0; step < 24; ++step) {
        ASSERT_TRUE(gbnf.accepting(state) || gbnf.extendable(state));
        std::vector<char> next;
        for (const char b : text_bytes())
          if (gbnf.walk(state, std::string(1, b)) != ByteGrammar::kDead) next.push_back(b);
        if (next.empty()) break;
        walked += next[static_cast<std::size_t>(rng.range(0, static_cast<int>(next.size()) - 1))];
        state = gbnf.walk(state, walked.substr(walked.size() - 1));
        ++walked_bytes;
      }
      texts.push_back(walked);
    }
    for (const std::string& s : texts) {
      std::int32_t state = gbnf.start();
      bool whole = true;
      for (std::size_t k = 0; k <= s.size(); ++k) {
        const std::string prefix = s.substr(0, k);
        if (state == ByteGrammar::kDead) {
          // Once a state on the way dropped parses, or the memory bound refused states, a text
          // that begins so may be out of reach.
          if (whole && !gbnf.exhausted()) {
            ASSERT_FALSE(begins(t, prefix)) << "grammar:\n" << text << "prefix: " << prefix;
          }
          ++dead;
          break;
        }
        whole = whole && gbnf.whole(state);
        trimmed = trimmed || !whole;
        checked += whole;
        if (code_points(prefix)) {
          ASSERT_TRUE(begins(t, prefix)) << "grammar:\n" << text << "prefix: " << prefix;
          if (whole || gbnf.accepting(state)) {
            ASSERT_EQ(gbnf.accepting(state), derives(t, prefix)) << text << "\n" << prefix;
          }
        }
        if (k == s.size()) accepted += gbnf.accepting(state);
        if (k < s.size()) state = gbnf.walk(state, s.substr(k, 1));
      }
    }
    cut += trimmed || gbnf.exhausted();
  }
  EXPECT_GT(accepted, 300);  // each kind of text was met often
  EXPECT_GT(dead, 300);
  EXPECT_GT(walked_bytes, 1500);
  EXPECT_GT(checked, 10000);
  EXPECT_LT(cut, 15);  // grammars whose parses multiply past a bound are rare
}

TEST(GbnfGrammar, RefusesWhatItCannotWalkNamingWhere) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "the grammar is empty"},
      {"   # only a comment\n", "the grammar is empty"},
      {"root = \"a\"", "expected a rule ('name ::= ...') at line 1, column 1"},
      {"start: \"a\"", "this reads GBNF, not Lark's 'name: ...' at line 1, column 1"},
      {"root ::= foo", "rule 'foo' is used but not defined at line 1, column 10"},
      {"root ::= a\n\na ::= \"x\" b", "rule 'b' is used but not defined at line 3, column 11"},
      {"root ::= \"a\"\nroot ::= \"b\"",
       "rule 'root' is defined twice (first at line 1, column 1)"},
      {"start ::= \"a\"", "there is no rule 'root'"},
      {"root ::= \"a\" root", "rule 'root' derives no finite text"},
      {"root ::= x\nx ::= \"(\" x \")\"",
       "rule 'x' derives no finite text (each of its alternatives needs it again) at line 2, "
       "column 1"},
      {"root ::= root \"a\" | \"b\"", "rule 'root' is left-recursive"},
      {"root ::= x\nx ::= \"\"? root | \"a\"", "is left-recursive"},
      {"root ::= (\"a\"?)*", "a group or quantified item in rule 'root' is left-recursive"},
      {"root ::= [^\\x00-\\U0010FFFF]", "a class that matches no character at line 1, column 10"},
      {"root ::= [\\uD800-\\uDFFF]", "an escape names no character"},
      {"root ::= []", "a class that matches no character"},
      {"root ::= \"abc", "a string without its closing '\"'"},
      {"root ::= \"a\nb\"", "a string without its closing '\"'"},
      {"root ::= [a-", "'[' without its ']' at line 1, column 10"},
      {"root ::= [z-a]", "a range whose end comes before its start"},
      {"root ::= \"\\q\"", "unknown escape '\\q'"},
      {"root ::= \"\\xZZ\"", "an escape needs 2 hex digits"},
      {"root ::= \"\\U00110000\"", "an escape names no character"},
      {"root ::= \"a\"{3,2}", "a repetition {n,m} with m below n"},
      {"root ::= \"a\"{1001}", "a repetition count over 1000"},
      {"root ::= \"a\"{}", "'{' needs a count"},
      {"root ::= \"a\"{2", "'{' without its '}'"},
      {"root ::= (\"a\"", "'(' without its ')' at line 1, column 10"},
      {"root ::= \"a\")", "')' without its '(' at line 1, column 13"},
      {"root ::= 'a'", "strings are written in double quotes"},
      {"root ::= \"a\" @", "unexpected '@' at line 1, column 14"},
      {"root ::= \"\xC3\x28\"", "the grammar is not UTF-8"},
  };
  for (const auto& [grammar, words] : cases) {
    const std::string why = refusal(grammar);
    EXPECT_EQ(why.rfind("'guided_grammar': ", 0), 0u) << grammar << ": " << why;
    EXPECT_NE(why.find(words), std::string::npos) << grammar << ": " << why;
  }
  EXPECT_NE(refusal(std::string(GbnfGrammar::kMaxTextBytes + 1, ' ')).find("is over"),
            std::string::npos);
  const std::size_t deep = GbnfGrammar::kMaxGroupNesting;
  EXPECT_TRUE(GbnfGrammar("root ::= " + std::string(deep, '(') + "\"a\"" + std::string(deep, ')'))
                  .matches("a"));
  EXPECT_NE(refusal("root ::= " + std::string(200000, '(')).find("groups nest more than 256 deep"),
            std::string::npos);
  std::string large = "root ::=";  // quantifiers copy what they repeat
  for (int i = 0; i < 201; ++i) large += " \"a\"{1000}";
  EXPECT_NE(refusal(large).find("the grammar is too large"), std::string::npos);
  // A group repeated is one rule used again, not copied: this one is small.
  const GbnfGrammar counted("root ::= (((\"a\"){1000}){1000})");
  EXPECT_FALSE(counted.accepting(counted.walk(counted.start(), std::string(3000, 'a'))));
  EXPECT_TRUE(live(counted, std::string(3000, 'a')));
}

TEST(GbnfGrammar, BoundsHowDeepAParseNestsAndHowManyAStateKeeps) {
  const GbnfGrammar nest("root ::= \"(\" root \")\" | \"x\"");
  const std::size_t deep = GbnfGrammar::kMaxDepth - 2;
  EXPECT_TRUE(nest.matches(std::string(deep, '(') + "x" + std::string(deep, ')')));
  EXPECT_FALSE(live(nest, std::string(GbnfGrammar::kMaxDepth + 1, '(')));

  // Each '(' may close with ')' or ']': 2^n parses after n of them. A state keeps kMaxParses,
  // and every one it keeps still ends in a text of the grammar.
  const GbnfGrammar twice("root ::= \"(\" root \")\" | \"(\" root \"]\" | \"x\"");
  const std::string open(14, '(');
  const std::int32_t s = twice.walk(twice.start(), open + "x");
  ASSERT_NE(s, ByteGrammar::kDead);
  const std::optional<std::string> rest = completion(twice, s);
  ASSERT_TRUE(rest);
  EXPECT_EQ(rest->size(), open.size());
  EXPECT_EQ(rest->find_first_not_of(")]"), std::string::npos);
  EXPECT_TRUE(twice.matches(open + "x" + *rest));

  // Forty counters in a row: each position a state of its own. Walking all of them fills the memory
  // bound, past which nothing new is built: the rest of the text is dead, what was walked before
  // still matches, and the rest of the grammar's texts that need new states are not reached.
  const std::string marks = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!$%&";
  std::string rules = "root ::=", text;
  for (const char m : marks) {
    rules += std::string(" \"") + m + "\"{0,1000}";
    text += std::string(1000, m);
  }
  const GbnfGrammar counters(rules);
  EXPECT_TRUE(counters.matches("AAAB"));
  EXPECT_FALSE(counters.exhausted());
  EXPECT_FALSE(live(counters, text));
  EXPECT_TRUE(counters.exhausted());
  EXPECT_GE(counters.bytes(), GbnfGrammar::kMaxBytes - (1u << 16));
  EXPECT_LE(counters.bytes(), GbnfGrammar::kMaxBytes);
  EXPECT_TRUE(counters.matches("AAAB"));
  std::size_t reached = 0;  // how far the walk went before the bound stopped it
  for (std::int32_t st = counters.start(); reached < text.size(); ++reached) {
    st = counters.walk(st, text.substr(reached, 1));
    if (st == ByteGrammar::kDead) break;
  }
  EXPECT_GT(reached, 5000u);
  EXPECT_LT(reached, text.size());
  EXPECT_TRUE(counters.matches(text.substr(0, reached)));       // walked before the bound
  EXPECT_FALSE(counters.matches(text.substr(0, reached + 1)));  // in the language, past it
}

}  // namespace
}  // namespace dcp
