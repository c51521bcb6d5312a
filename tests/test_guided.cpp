// Guided regex: the pattern compiler against Python's `re` on random patterns and texts, the token
// masks against the prefixes of a finite language written out by hand, and the engine's tokens
// chosen step by step among those masks (DCP 2 and speculative decoding alike).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dcp/engine.h"
#include "dcp/error.h"
#include "dcp/gbnf_grammar.h"
#include "dcp/json_grammar.h"
#include "dcp/json_schema.h"
#include "dcp/regex_dfa.h"
#include "dcp/token_guide.h"
#include "engine_util.h"
#include "guide/dfa_minimize.h"
#include "test_util.h"

namespace dcp {
namespace {

using test::EngineSetup;
using test::random_tokens;
using test::request;
using test::run_engine;

std::string refusal(std::string_view pattern) {
  try {
    RegexDfa dfa(pattern, "guided_regex");
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::invalid_argument);
    return e.what();
  }
  return "";
}

// Which RegexError a pattern throws; nullopt for a syntax error (a plain dcp::Error) or none.
std::optional<RegexError::Kind> refusal_kind(std::string_view pattern) {
  try {
    RegexDfa dfa(pattern);
  } catch (const RegexError& e) {
    return e.kind();
  } catch (const Error&) {
  }
  return std::nullopt;
}

TEST(RegexDfa, MatchesWholeTextsOnly) {
  const RegexDfa date(R"(\d{4}-\d{2}-\d{2})");
  EXPECT_TRUE(date.matches("2026-12-04"));
  EXPECT_FALSE(date.matches("2026-12-4"));
  EXPECT_FALSE(date.matches("x2026-12-04"));
  EXPECT_FALSE(date.matches("2026-12-045"));
  const RegexDfa words("^(?:yes|no)(?P<tail>!+)?$");
  EXPECT_TRUE(words.matches("yes"));
  EXPECT_TRUE(words.matches("no!!!"));
  EXPECT_FALSE(words.matches("yes!no"));
  EXPECT_FALSE(words.matches(""));
  // Classes over code points: a two-byte and a three-byte character are one item each.
  const RegexDfa accents("[à-é]{2}[^a-z]");
  EXPECT_TRUE(accents.matches("àé€"));
  EXPECT_TRUE(accents.matches("éé\n"));
  EXPECT_FALSE(accents.matches("àéz"));
  EXPECT_FALSE(accents.matches("à\xC3\xA9"));  // the third item is missing
  const RegexDfa dot("a.c");
  EXPECT_TRUE(dot.matches("a€c"));
  EXPECT_FALSE(dot.matches("a\nc"));
  EXPECT_FALSE(
      dot.matches("a\xE2\x82"
                  "c"));             // half a character is not one
  const RegexDfa brace("a{,2}b{x");  // `{x` opens no quantifier: a literal
  EXPECT_TRUE(brace.matches("aab{x"));
  EXPECT_TRUE(brace.matches("b{x"));
  EXPECT_FALSE(brace.matches("aaab{x"));
  const RegexDfa escapes(R"(\x41\x{20AC}\u00e9\.\[\t)");
  EXPECT_TRUE(escapes.matches("A€é.[\t"));
  // The state after a match that nothing may extend, and one that may be extended.
  const RegexDfa three("ab?");
  const std::int32_t a = three.walk(three.start(), "a");
  EXPECT_TRUE(three.accepting(a) && three.extendable(a));
  const std::int32_t ab = three.walk(a, "b");
  EXPECT_TRUE(three.accepting(ab) && !three.extendable(ab));
  EXPECT_EQ(three.walk(ab, "b"), RegexDfa::kDead);
}

TEST(RegexDfa, RefusesWhatItDoesNotImplementNamingTheField) {
  EXPECT_EQ(refusal("(a"), "'guided_regex': missing ')' at byte 2 of the pattern");
  // Groups nest up to a bound, past which they are refused rather than overflow the stack.
  const std::size_t deep = RegexDfa::kMaxGroupNesting;
  EXPECT_TRUE(RegexDfa(std::string(deep, '(') + "a" + std::string(deep, ')')).matches("a"));
  EXPECT_EQ(refusal(std::string(100000, '(')),
            "'guided_regex': groups nest more than 256 deep at byte 257 of the pattern");
  EXPECT_EQ(refusal("a)"), "'guided_regex': unbalanced ')' at byte 1 of the pattern");
  EXPECT_EQ(refusal("*a"), "'guided_regex': nothing to repeat at byte 0 of the pattern");
  EXPECT_EQ(refusal("a|{2}"), "'guided_regex': nothing to repeat at byte 2 of the pattern");
  EXPECT_EQ(refusal("(a)\\1"),
            "'guided_regex': back-references are not supported at byte 4 of the pattern");
  EXPECT_EQ(refusal("a(?=b)"),
            "'guided_regex': a look-ahead only opens an alternative of the pattern or of a "
            "length, JSON or search group at byte 2 of the pattern");
  EXPECT_EQ(refusal("(?:(?!a)b)"),
            "'guided_regex': a look-ahead only opens an alternative of the pattern or of a "
            "length, JSON or search group at byte 4 of the pattern");
  EXPECT_EQ(refusal("(?=(?=a)a)a"),
            "'guided_regex': a look-ahead only opens an alternative of the pattern or of a "
            "length, JSON or search group at byte 4 of the pattern");
  EXPECT_EQ(refusal("(?<!a)b"),
            "'guided_regex': look-behinds, inline flags and atomic groups are not supported at "
            "byte 1 of the pattern");
  EXPECT_EQ(refusal("(?i)a"),
            "'guided_regex': look-behinds, inline flags and atomic groups are not supported at "
            "byte 1 of the pattern");
  EXPECT_EQ(refusal("(?=a$b)a"),
            "'guided_regex': '$' other than at the end of an alternative of the pattern, of a "
            "length, JSON or search group or of a look-ahead at byte 4 of the pattern");
  EXPECT_EQ(refusal("(?=(?:a$))a"),
            "'guided_regex': '$' other than at the end of an alternative of the pattern, of a "
            "length, JSON or search group or of a look-ahead at byte 7 of the pattern");
  EXPECT_EQ(refusal("(?=a)^a"),
            "'guided_regex': '^' other than at the start of an alternative of the pattern, of a "
            "length, JSON or search group or of a look-ahead at byte 5 of the pattern");
  EXPECT_EQ(refusal("\\bword"),
            "'guided_regex': '\\b' is not a supported escape at byte 1 of the pattern");
  EXPECT_EQ(refusal("[[:alpha:]]"),
            "'guided_regex': POSIX classes ([:name:]) are not supported at byte 1 of the pattern");
  EXPECT_EQ(refusal("a^b"),
            "'guided_regex': '^' other than at the start of an alternative of the pattern, of a "
            "length, JSON or search group or of a look-ahead at byte 1 of the pattern");
  EXPECT_EQ(refusal("[z-a]"),
            "'guided_regex': a class range whose end comes before its start at "
            "byte 4 of the pattern");
  EXPECT_EQ(refusal("[ab"), "'guided_regex': an unterminated '[' at byte 3 of the pattern");
  EXPECT_EQ(refusal("a{3,2}"),
            "'guided_regex': {3,2}: the larger count comes second at byte 1 of "
            "the pattern");
  EXPECT_EQ(refusal("a{1001}"),
            "'guided_regex': a repeat count above 1000 at byte 6 of the pattern");
  EXPECT_EQ(refusal("\xC3"), "'guided_regex': invalid UTF-8 at byte 0 of the pattern");
  EXPECT_EQ(refusal("(?{3,2}:a)"),
            "'guided_regex': {3,2}: the larger count comes second at byte 2 of the pattern");
  EXPECT_EQ(refusal("(?{x}:a)"),
            "'guided_regex': a length group opens with (?{n}:, (?{n,}:, (?{,m}: or (?{n,m}: at "
            "byte 2 of the pattern");
  EXPECT_EQ(refusal("(?{2}a)"),
            "'guided_regex': a length group opens with (?{n}:, (?{n,}:, (?{,m}: or (?{n,m}: at "
            "byte 2 of the pattern");
  EXPECT_EQ(refusal("(?{100001}:a*)"),
            "'guided_regex': a length above 100000 at byte 9 of the pattern");
  EXPECT_EQ(refusal("(?{2,3}:a{4})"), "'guided_regex': the pattern matches no text");
  EXPECT_EQ(refusal("[^\\x00-\\x{10FFFF}]"), "'guided_regex': the pattern matches no text");
  // Too large before determinization, before minimization (2^21 states), and after (2^15).
  EXPECT_NE(refusal("((a{1000}){1000}){1000}").find("the pattern is too large (more than 200000"),
            std::string::npos);
  EXPECT_NE(refusal("[ab]*a[ab]{20}")
                .find("the pattern is too large (more than 100000 automaton states before "
                      "minimization)"),
            std::string::npos);
  EXPECT_NE(refusal("[ab]*a[ab]{14}").find("its automaton needs more than 20000 states"),
            std::string::npos);
  // Sets of a thousand NFA states each: bounded in all, not only in count (this one held 3 GB).
  EXPECT_NE(refusal("(?:[ab]?){1000}a[ab]{16}")
                .find("the pattern is too large (its automaton's states before minimization hold "
                      "more than 8388608 NFA states in all)"),
            std::string::npos);
  // Look-aheads and multiple groups build automata apart: bounded in all, not only each.
  std::string groups;
  for (int i = 0; i < 100; ++i) groups += "(?multiple{10000}:[0-9]+)x";
  EXPECT_EQ(refusal(groups),
            "'guided_regex': the pattern is too large (its look-aheads and multiple groups build "
            "more than 524288 states in all)");
  EXPECT_NO_THROW(RegexDfa(groups.substr(0, groups.size() / 100)));  // one of them
  // Those two refusals are told apart by kind, not by text; syntax errors are neither.
  using Kind = RegexError::Kind;
  EXPECT_EQ(refusal_kind("(?{2,3}:a{4})"), Kind::no_text);
  EXPECT_EQ(refusal_kind("[^\\x00-\\x{10FFFF}]"), Kind::no_text);
  EXPECT_EQ(refusal_kind("((a{1000}){1000}){1000}"), Kind::too_large);
  EXPECT_EQ(refusal_kind("[ab]*a[ab]{20}"), Kind::too_large);
  EXPECT_EQ(refusal_kind("[ab]*a[ab]{14}"), Kind::too_large);
  EXPECT_EQ(refusal_kind("(?:[ab]?){1000}a[ab]{16}"), Kind::too_large);
  EXPECT_EQ(refusal_kind("(a"), std::nullopt);
  EXPECT_EQ(refusal_kind("a{1001}"), std::nullopt);
  EXPECT_EQ(refusal_kind("a"), std::nullopt);
}

// Minimization against oracles written apart: the product of the two automata (same language:
// every pair of states reached by one text agrees on accepting, a missing transition being a dead
// state), and the table-filling algorithm (no two states of the result tell no text apart; every
// state reached from the start and able to reach a match), over random tables with dead
// transitions, unreachable states and copies of states.
TEST(DfaMinimize, KeepsTheLanguageWithTheFewestStates) {
  test::Rng rng = test::make_rng();
  constexpr std::int32_t kDead = ByteGrammar::kDead;
  int merged = 0, emptied = 0;
  for (int round = 0; round < 400; ++round) {
    DfaTable dfa;
    dfa.classes = static_cast<std::size_t>(rng.range(1, 4));
    const auto n = static_cast<std::int32_t>(rng.range(1, 30));
    const double dead = rng.uniform(0.0f, 0.8f);
    for (std::int32_t s = 0; s < n; ++s) {
      dfa.accepting.push_back(rng.coin(0.3) ? 1 : 0);
      for (std::size_t c = 0; c < dfa.classes; ++c)
        dfa.next.push_back(rng.coin(dead) ? kDead : static_cast<std::int32_t>(rng.range(0, n - 1)));
    }
    // Copies of states: equivalent by construction, so a minimizer must merge them.
    for (int copies = static_cast<int>(rng.range(0, 5)); copies > 0; --copies) {
      const auto of = static_cast<std::size_t>(rng.range(0, n - 1));
      dfa.accepting.push_back(dfa.accepting[of]);
      for (std::size_t c = 0; c < dfa.classes; ++c)
        dfa.next.push_back(dfa.next[of * dfa.classes + c]);
      const std::size_t from = static_cast<std::size_t>(rng.range(0, n - 1)) * dfa.classes +
                               static_cast<std::size_t>(rng.range(0, dfa.classes - 1));
      dfa.next[from] = static_cast<std::int32_t>(dfa.states() - 1);
    }
    const DfaTable min = minimized(dfa);
    ASSERT_EQ(min.classes, dfa.classes);
    ASSERT_EQ(min.next.size(), min.states() * min.classes);
    const std::size_t k = dfa.classes;
    const auto step = [k](const DfaTable& t, std::int32_t s, std::size_t c) {
      return s == kDead ? kDead : t.next[static_cast<std::size_t>(s) * k + c];
    };
    const auto accepts = [](const DfaTable& t, std::int32_t s) {
      return s != kDead && t.accepting[static_cast<std::size_t>(s)] != 0;
    };
    // Same language: the product from (0, 0).
    std::set<std::pair<std::int32_t, std::int32_t>> seen{{0, min.states() ? 0 : kDead}};
    std::vector<std::pair<std::int32_t, std::int32_t>> todo(seen.begin(), seen.end());
    bool any_match = false;
    while (!todo.empty()) {
      const auto [a, b] = todo.back();
      todo.pop_back();
      ASSERT_EQ(accepts(dfa, a), accepts(min, b)) << "round " << round;
      any_match |= accepts(dfa, a);
      for (std::size_t c = 0; c < k; ++c) {
        const std::pair<std::int32_t, std::int32_t> p{step(dfa, a, c), step(min, b, c)};
        if (seen.insert(p).second) todo.push_back(p);
      }
    }
    if (!any_match) {
      EXPECT_EQ(min.states(), 0u) << "round " << round;
      ++emptied;
      continue;
    }
    // Breadth-first numbering from the start, every state useful.
    const auto m = static_cast<std::int32_t>(min.states());
    std::vector<std::int32_t> order{0};
    std::vector<char> reached(min.states(), 0);
    reached[0] = 1;
    for (std::size_t i = 0; i < order.size(); ++i) {
      for (std::size_t c = 0; c < k; ++c) {
        const std::int32_t t = step(min, order[i], c);
        if (t != kDead && !reached[static_cast<std::size_t>(t)]) {
          EXPECT_EQ(t, static_cast<std::int32_t>(order.size())) << "round " << round;
          reached[static_cast<std::size_t>(t)] = 1;
          order.push_back(t);
        }
      }
    }
    EXPECT_EQ(order.size(), min.states()) << "round " << round;
    // Table filling: pairs told apart by accepting, then by a class leading to a told-apart pair
    // (a dead transition is the dead state, apart from every state that can reach a match).
    std::vector<char> can_match(min.states(), 0);
    for (bool grew = true; grew;) {
      grew = false;
      for (std::int32_t s = 0; s < m; ++s) {
        bool v = accepts(min, s);
        for (std::size_t c = 0; c < k && !v; ++c) {
          const std::int32_t t = step(min, s, c);
          v = t != kDead && can_match[static_cast<std::size_t>(t)];
        }
        if (v && !can_match[static_cast<std::size_t>(s)])
          can_match[static_cast<std::size_t>(s)] = grew = 1;
      }
    }
    for (std::int32_t s = 0; s < m; ++s) EXPECT_TRUE(can_match[static_cast<std::size_t>(s)]);
    std::vector<std::vector<char>> apart(min.states(), std::vector<char>(min.states(), 0));
    const auto differ = [&](std::int32_t a, std::int32_t b) {
      if (a == b) return false;
      if (a == kDead || b == kDead) return true;  // the other can reach a match
      return apart[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)] != 0;
    };
    for (std::int32_t a = 0; a < m; ++a)
      for (std::int32_t b = 0; b < m; ++b)
        apart[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)] =
            accepts(min, a) != accepts(min, b);
    for (bool grew = true; grew;) {
      grew = false;
      for (std::int32_t a = 0; a < m; ++a) {
        for (std::int32_t b = 0; b < m; ++b) {
          if (apart[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)]) continue;
          for (std::size_t c = 0; c < k; ++c) {
            if (differ(step(min, a, c), step(min, b, c))) {
              apart[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)] = grew = 1;
              break;
            }
          }
        }
      }
    }
    for (std::int32_t a = 0; a < m; ++a)
      for (std::int32_t b = a + 1; b < m; ++b)
        EXPECT_TRUE(apart[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)])
            << "round " << round << ": states " << a << " and " << b << " are equivalent";
    merged += static_cast<int>(dfa.states()) - m;
  }
  EXPECT_GT(emptied, 0);  // both kinds of table were drawn
  EXPECT_GT(merged, 400);
}

// A regex's automaton is the minimal one of its language: the copies a list spells out merge.
TEST(RegexDfa, CopiesOfASubpatternMerge) {
  // x(,x)* and (x,)*x: two spellings of one language, one automaton.
  const RegexDfa twice("(?:ab|cd)(?:,(?:ab|cd))*"), once("(?:(?:ab|cd),)*(?:ab|cd)");
  EXPECT_EQ(twice.states(), once.states());
  EXPECT_EQ(twice.states(), 4);  // start (again after a comma), after a, after c, after a pair
}

// Python's re backtracks, exponentially on some random patterns and texts. The oracles below run
// each text under `decided`: from the first text of a pattern that Python has not decided in a
// second of its CPU time (CPU time, so that a loaded machine leaves out no more), the pattern's
// texts are left out (null), and `undecided` counts such patterns.
constexpr const char* kDecided = R"(import signal
def expired(*_):
    raise TimeoutError
signal.signal(signal.SIGVTALRM, expired)
def decided(texts, one):
    out = []
    for t in texts:
        if out and out[-1] is None:
            out.append(None)
            continue
        signal.setitimer(signal.ITIMER_VIRTUAL, 1)
        try:
            out.append(one(t))
        except TimeoutError:
            out.append(None)
        finally:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    return out
)";

int undecided(const nlohmann::json& verdicts) {
  return static_cast<int>(std::count_if(verdicts.begin(), verdicts.end(), [](const auto& row) {
    return std::any_of(row.begin(), row.end(), [](const auto& v) { return v.is_null(); });
  }));
}

// Random patterns and texts over a small alphabet (ASCII, two- and three-byte characters),
// each pattern with a text built to match it where the generator can: Python's re.fullmatch
// (re.ASCII: \d \w \s as here) decides every case.
class PatternMaker {
 public:
  explicit PatternMaker(std::mt19937_64& rng) : rng_(rng) {}
  std::pair<std::string, std::string> make(int depth) {  // (pattern, a text it likely matches)
    std::string pattern, sample;
    const int items = pick(1, 3);
    for (int i = 0; i < items; ++i) {
      auto [p, s] = quantified(depth);
      pattern += p;
      sample += s;
    }
    if (depth > 0 && pick(0, 3) == 0) {  // an alternative
      auto [p, s] = make(depth - 1);
      pattern += "|" + p;
      if (pick(0, 1)) sample = s;
    }
    return {pattern, sample};
  }
  std::string text() {
    std::string t;
    for (int n = pick(0, 6); n > 0; --n) t += any_char();
    return t;
  }

 private:
  static constexpr const char* kChars[] = {"a",  "b",  "c", "é", "0", "-", " ",
                                           "\n", "\r", "_", "Z", "9", "€", "\t"};
  std::string any_char() { return kChars[pick(0, static_cast<int>(std::size(kChars)) - 1)]; }
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  std::pair<std::string, std::string> quantified(int depth) {
    auto [p, s] = atom(depth);
    switch (pick(0, 7)) {
      case 0: return {p + "*", pick(0, 1) ? s + s : ""};
      case 1: return {p + "+", s};
      case 2: return {p + "?", pick(0, 1) ? s : ""};
      case 3: return {p + "{2}", s + s};
      case 4: return {p + "{1,3}", s};
      case 5: return {p + "{2,}", s + s + s};
      default: return {p, s};
    }
  }

  std::pair<std::string, std::string> atom(int depth) {
    switch (pick(0, 9)) {
      case 0: return {".", any_char()};
      case 1: return {"\\d", "7"};
      case 2: return {"\\w", "_"};
      case 3: return {"\\s", " "};
      case 4: return {"\\W", "€"};
      case 5: return {"[a-c0é]", "b"};
      case 6: return {"[^b\\d]", any_char()};
      case 7:
        if (depth > 0) {
          auto [p, s] = make(depth - 1);
          return {(pick(0, 1) ? "(?:" : "(") + p + ")", s};
        }
        [[fallthrough]];
      default: {
        const std::string c = any_char();
        const std::string p = c == "\n"   ? "\\n"
                              : c == "\r" ? "\\r"
                              : c == "\t" ? "\\t"
                              : c == "-"  ? "\\-"
                                          : c;
        return {p, c};
      }
    }
  }

  std::mt19937_64& rng_;
};

// A pattern is compiled once and shared while it is held or among the most recent; one that does
// not compile throws naming the field it came from, each time; threads asking at once for the
// same patterns get one automaton each.
TEST(RegexDfa, SharedAutomataAreCompiledOncePerPatternWithinABound) {
  const auto a = shared_regex("x[0-9]+");
  EXPECT_EQ(shared_regex("x[0-9]+", "guided_regex"), a);
  EXPECT_NE(shared_regex("x[0-9]*"), a);
  EXPECT_TRUE(a->matches("x12"));
  for (const char* field : {"guided_regex", "tools"}) {
    try {
      shared_regex("(", field);
      ADD_FAILURE() << "'(' compiled";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(str("'", field, "'")), std::string::npos) << e.what();
    }
  }
  // Past kSharedRegexCount other patterns the first is dropped (asked again, it is compiled
  // again); the automaton a request still holds stays whole.
  for (std::size_t i = 0; i < kSharedRegexCount + 8; ++i) shared_regex(str("p", i, "[a-z]"));
  const auto again = shared_regex("x[0-9]+");
  EXPECT_NE(again, a);
  EXPECT_TRUE(a->matches("x7"));
  EXPECT_FALSE(a->matches("x"));
  // Four threads over the same twelve patterns: every answer is that pattern's automaton.
  std::vector<std::vector<std::shared_ptr<const RegexDfa>>> got(4);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 240; ++i) got[t].push_back(shared_regex(str("t", i % 12, "[0-9]{2}")));
    });
  }
  for (std::thread& th : threads) th.join();
  for (std::size_t t = 0; t < got.size(); ++t) {
    for (std::size_t i = 0; i < got[t].size(); ++i) {
      EXPECT_EQ(got[t][i], got[0][i % 12]) << t << " " << i;
      EXPECT_TRUE(got[t][i]->matches(str("t", i % 12, "42")));
    }
  }
}

TEST(RegexDfa, AgreesWithPythonReOnRandomPatternsAndTexts) {
  test::Rng rng = test::make_rng();
  PatternMaker maker(rng.engine());
  nlohmann::json cases = nlohmann::json::array();
  for (int i = 0; i < 400; ++i) {
    auto [pattern, sample] = maker.make(2);
    nlohmann::json texts = {sample};
    for (int k = 0; k < 15; ++k) texts.push_back(maker.text());
    cases.push_back({pattern, texts});
  }
  const auto verdicts = test::python_oracle(cases, R"(import json, re, sys
cases = json.load(open(sys.argv[1]))
out = [[bool(re.fullmatch(p, t, re.ASCII)) for t in texts] for p, texts in cases]
json.dump(out, open(sys.argv[2], 'w'))
)");
  if (!verdicts) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  const nlohmann::json& expected = *verdicts;
  int matched = 0, too_large = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string pattern = cases[i][0];
    std::optional<RegexDfa> compiled;
    try {
      compiled.emplace(pattern);
    } catch (const Error& e) {  // a determinized automaton past the bound: refused, not wrong
      ASSERT_NE(std::string(e.what()).find("the pattern is too large"), std::string::npos)
          << pattern << ": " << e.what();
      ++too_large;
      continue;
    }
    const RegexDfa& dfa = *compiled;
    for (std::size_t k = 0; k < cases[i][1].size(); ++k) {
      const std::string text = cases[i][1][k];
      const bool want = expected[i][k];
      matched += want;
      EXPECT_EQ(dfa.matches(text), want) << "pattern '" << pattern << "' text '" << text << "'";
    }
  }
  EXPECT_GT(matched, 300);  // the generator's samples make many positive cases
  EXPECT_LT(too_large, 8);
}

// The automaton of `pattern`; nullopt where it is refused, as too large (counted in `too_large`)
// or as matching no text, which Python's verdicts on its texts must then agree with.
std::optional<RegexDfa> compiled_or_refused(const std::string& pattern,
                                            const nlohmann::json& verdicts, int& too_large) {
  try {
    return RegexDfa(pattern);
  } catch (const RegexError& e) {
    if (e.kind() == RegexError::Kind::no_text) {
      for (const auto& want : verdicts) EXPECT_FALSE(want == true) << pattern;
    } else {
      ++too_large;
    }
  }
  return std::nullopt;
}

// The automaton of `pattern`, nullopt where it does not compile.
std::optional<RegexDfa> compiled_if_it_can(const std::string& pattern) {
  try {
    return RegexDfa(pattern);
  } catch (const Error&) {
  }
  return std::nullopt;
}

// A length group keeps exactly the matches of its pattern that have its number of characters
// (code points, as Python's len counts them); the characters around it do not count.
TEST(RegexDfa, LengthGroupsKeepTheMatchesOfTheirLength) {
  test::Rng rng = test::make_rng();
  PatternMaker maker(rng.engine());
  std::uniform_int_distribution<int> small(0, 4);
  nlohmann::json cases = nlohmann::json::array();
  for (int i = 0; i < 400; ++i) {
    auto [pattern, sample] = maker.make(2);
    // Bounds around the sample's length, so that some hold it and some cut it.
    const auto length = static_cast<int>(
        std::count_if(sample.begin(), sample.end(), [](char c) { return (c & 0xC0) != 0x80; }));
    const int lo = std::max(0, length - small(rng.engine()) + 1);
    const int hi = small(rng.engine()) == 0 ? -1 : lo + small(rng.engine());
    nlohmann::json texts = nlohmann::json::array();
    for (const std::string& inner : {sample, sample + sample, std::string()})
      texts.push_back("«" + inner + "»");
    for (int k = 0; k < 12; ++k) texts.push_back("«" + maker.text() + "»");
    cases.push_back({pattern, lo, hi, texts});
  }
  const auto verdicts = test::python_oracle(cases, std::string(kDecided) + R"(import json, re, sys
def verdict(p, lo, hi, t):
    return bool(re.fullmatch(p, t[1:-1], re.ASCII)) and lo <= len(t) - 2 and (hi < 0 or len(t) - 2 <= hi)
cases = json.load(open(sys.argv[1]))
json.dump([decided(texts, lambda t: verdict(p, lo, hi, t)) for p, lo, hi, texts in cases],
          open(sys.argv[2], 'w'))
)");
  if (!verdicts) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  int matched = 0, cut = 0, too_large = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string inner = cases[i][0];
    const int lo = cases[i][1], hi = cases[i][2];
    const std::string pattern =
        str("«(?{", lo, hi == lo ? "" : ",", hi > lo ? std::to_string(hi) : "", "}:", inner, ")»");
    const std::optional<RegexDfa> compiled =
        compiled_or_refused(pattern, (*verdicts)[i], too_large);
    if (!compiled) continue;
    // To count the matches cut; itself too large at times.
    const std::optional<RegexDfa> plain = compiled_if_it_can(inner);
    for (std::size_t k = 0; k < cases[i][3].size(); ++k) {
      const std::string text = cases[i][3][k];
      if ((*verdicts)[i][k].is_null()) continue;
      const bool want = (*verdicts)[i][k];
      matched += want;
      cut += !want && plain && plain->matches(text.substr(2, text.size() - 4));
      EXPECT_EQ(compiled->matches(text), want) << "pattern '" << pattern << "' text '" << text;
    }
  }
  EXPECT_GT(matched, 200);
  EXPECT_GT(cut, 100);  // matches of the pattern that the length group refuses
  EXPECT_LT(too_large, 8);
  EXPECT_LT(undecided(*verdicts), 3);

  // Inside a repeat, each copy counts its own characters; bounds on both sides and one alone.
  const RegexDfa words("(?:(?{2,3}:[a-zé]+) )*");
  EXPECT_TRUE(words.matches("ab éé abc "));
  EXPECT_FALSE(words.matches("ab a "));
  EXPECT_FALSE(words.matches("abcd "));
  const RegexDfa at_least("(?{3,}:\\w*)x(?{,1}:\\d*)");
  EXPECT_TRUE(at_least.matches("abcx"));
  EXPECT_TRUE(at_least.matches("abcdefghx7"));
  EXPECT_FALSE(at_least.matches("abx"));
  EXPECT_FALSE(at_least.matches("abcx12"));
  const RegexDfa exact("(?{4}:.*)");
  EXPECT_TRUE(exact.matches("€€€€"));
  EXPECT_FALSE(exact.matches("€€€"));
  EXPECT_FALSE(exact.matches("€€€€€"));
}

// Look-aheads opening an alternative of the pattern, or of a length group's body (their scope:
// the characters around the group are not seen), positive and negative, one or two, with `^` and
// `$` on some of their alternatives, against Python's re.fullmatch (its `$` written `\Z`, the end
// of the text, which ours is).
TEST(RegexDfa, LookAheadsKeepTheTextsTheyAdmitWithinTheirScope) {
  test::Rng rng = test::make_rng();
  PatternMaker maker(rng.engine());
  const auto pick = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng.engine());
  };
  nlohmann::json cases = nlohmann::json::array();
  for (int i = 0; i < 400; ++i) {
    auto [body, sample] = maker.make(2);
    std::string ours, python;
    std::vector<std::string> begins;  // texts a look-ahead reads
    for (int k = pick(1, 2); k > 0; --k) {
      auto [x, x_sample] = maker.make(1);
      const std::string open = pick(0, 1) ? "(?=" : "(?!", caret = pick(0, 3) ? "" : "^";
      const bool to_end = pick(0, 1);
      ours += open + caret + x + (to_end ? "$)" : ")");
      python += open + caret + x + (to_end ? "\\Z)" : ")");
      begins.push_back(x_sample);
    }
    ours += body;
    python += body;
    if (pick(0, 2) == 0) {  // the look-aheads open a later alternative, and see the whole text
      const std::string before = maker.make(1).first;
      ours = before + "|" + ours;
      python = before + "|" + python;
      body = before + "|" + body;
    }
    const bool scoped = pick(0, 1);
    if (scoped) ours = "«(?{0,}:" + ours + ")»";
    nlohmann::json texts = nlohmann::json::array();
    const auto wrap = [&](const std::string& t) { return scoped ? "«" + t + "»" : t; };
    texts.push_back(wrap(sample));
    for (const std::string& b : begins) {
      texts.push_back(wrap(b));
      texts.push_back(wrap(b + sample));
    }
    for (int k = 0; k < 10; ++k) texts.push_back(wrap(maker.text()));
    cases.push_back({ours, python, body, scoped, texts});
  }
  const auto verdicts = test::python_oracle(cases, std::string(kDecided) + R"(import json, re, sys
cases = json.load(open(sys.argv[1]))
json.dump([decided(texts, lambda t: bool(re.fullmatch(p, t[1:-1] if scoped else t, re.ASCII)))
           for _, p, _, scoped, texts in cases], open(sys.argv[2], 'w'))
)");
  if (!verdicts) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  int matched = 0, kept_out = 0, too_large = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string pattern = cases[i][0];
    const std::optional<RegexDfa> compiled =
        compiled_or_refused(pattern, (*verdicts)[i], too_large);
    if (!compiled) continue;
    // To count the matches the look-aheads keep out.
    const std::optional<RegexDfa> body = compiled_if_it_can(cases[i][2].get<std::string>());
    const bool scoped = cases[i][3];
    for (std::size_t k = 0; k < cases[i][4].size(); ++k) {
      const std::string text = cases[i][4][k];
      if ((*verdicts)[i][k].is_null()) continue;
      const bool want = (*verdicts)[i][k];
      matched += want;
      kept_out += !want && body && body->matches(scoped ? text.substr(2, text.size() - 4) : text);
      EXPECT_EQ(compiled->matches(text), want) << "pattern '" << pattern << "' text '" << text;
    }
  }
  EXPECT_GT(matched, 300);
  EXPECT_GT(kept_out, 100);  // matches of the body that a look-ahead refuses
  EXPECT_LT(too_large, 8);
  EXPECT_LT(undecided(*verdicts), 3);

  // Pydantic's Decimal: a number's text, not only signs and points.
  const RegexDfa decimal(R"(^(?!^[-+.]*$)[+-]?0*\d*\.?\d*$)");
  for (const char* yes : {"1", "-0.5", ".5", "5.", "+007", "12.340"})
    EXPECT_TRUE(decimal.matches(yes)) << yes;
  for (const char* no : {"", "+", "-", ".", "+.", "-.", "1.2.3", "1e5", " 1"})
    EXPECT_FALSE(decimal.matches(no)) << no;
  // `$` is the end of the text, not also before a final newline.
  const RegexDfa not_a("(?!a$)[a\n]*");
  EXPECT_TRUE(not_a.matches("a\n"));
  EXPECT_FALSE(not_a.matches("a"));
  // Several look-aheads, positive: each must hold.
  const RegexDfa password("^(?=.*\\d)(?=.*[A-Z]).{8,}$");
  EXPECT_TRUE(password.matches("abcdefG1"));
  EXPECT_FALSE(password.matches("abcdefgh1"));
  EXPECT_FALSE(password.matches("abcdefGh"));
  EXPECT_FALSE(password.matches("abcdG1"));
  EXPECT_EQ(refusal_kind("(?=a)b"), RegexError::Kind::no_text);
}

// A search group matches the texts in which Python's re.search finds its pattern: random
// alternatives, each opening with `^` or not and ending with `$` or not, some opening with
// look-aheads (which then read the text from where the match starts), against Python's re.search
// on random texts around a sample of the pattern; inside a length group or not.
TEST(RegexDfa, SearchGroupsMatchWherePythonsSearchFindsAMatch) {
  test::Rng rng = test::make_rng();
  PatternMaker maker(rng.engine());
  const auto pick = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng.engine());
  };
  nlohmann::json cases = nlohmann::json::array();
  for (int i = 0; i < 300; ++i) {
    std::string ours, python;
    std::vector<std::string> samples;
    for (int alternatives = pick(1, 2), a = 0; a < alternatives; ++a) {
      if (a) ours += "|", python += "|";
      const std::string caret = pick(0, 2) ? "" : "^";
      ours += caret, python += caret;
      if (pick(0, 3) == 0) {  // a look-ahead
        const std::string x = maker.make(1).first, open = pick(0, 1) ? "(?=" : "(?!";
        const bool to_end = pick(0, 3) == 0;
        ours += open + x + (to_end ? "$)" : ")");
        python += open + x + (to_end ? "\\Z)" : ")");
      }
      auto [body, sample] = maker.make(1);
      const bool to_end = pick(0, 2) == 0;
      ours += body + (to_end ? "$" : "");
      python += body + (to_end ? "\\Z" : "");
      samples.push_back(sample);
    }
    const bool scoped = pick(0, 1);
    ours = scoped ? "«(?{0,}:(?search:" + ours + "))»" : "(?search:" + ours + ")";
    nlohmann::json texts = nlohmann::json::array();
    const auto wrap = [&](const std::string& t) { return scoped ? "«" + t + "»" : t; };
    for (const std::string& sample : samples) {
      texts.push_back(wrap(sample));
      texts.push_back(wrap(maker.text() + sample));
      texts.push_back(wrap(sample + maker.text()));
      texts.push_back(wrap(maker.text() + sample + maker.text()));
    }
    for (int k = 0; k < 6; ++k) texts.push_back(wrap(maker.text()));
    cases.push_back({ours, python, scoped, texts});
  }
  const auto verdicts = test::python_oracle(cases, std::string(kDecided) + R"(import json, re, sys
cases = json.load(open(sys.argv[1]))
json.dump([decided(texts, lambda t: bool(re.search(p, t[1:-1] if scoped else t, re.ASCII)))
           for _, p, scoped, texts in cases], open(sys.argv[2], 'w'))
)");
  if (!verdicts) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  int found = 0, not_found = 0, too_large = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string pattern = cases[i][0];
    const std::optional<RegexDfa> compiled =
        compiled_or_refused(pattern, (*verdicts)[i], too_large);
    if (!compiled) continue;
    for (std::size_t k = 0; k < cases[i][3].size(); ++k) {
      const std::string text = cases[i][3][k];
      if ((*verdicts)[i][k].is_null()) continue;
      const bool want = (*verdicts)[i][k];
      (want ? found : not_found) += 1;
      EXPECT_EQ(compiled->matches(text), want) << "pattern '" << pattern << "' text '" << text;
    }
  }
  EXPECT_GT(found, 1000);
  EXPECT_GT(not_found, 300);
  EXPECT_LT(too_large, 8);
  EXPECT_LT(undecided(*verdicts), 3);

  // A positive look-ahead's `^` holds where the text starts only; a negative one's is read where
  // the match starts, which leaves out the matches after the start (fewer texts, each a match).
  const RegexDfa first_x("(?search:(?=^x)x)");
  EXPECT_TRUE(first_x.matches("xy"));
  EXPECT_FALSE(first_x.matches("yx"));
  const RegexDfa not_first("(?search:(?!^ab)a)");
  EXPECT_TRUE(not_first.matches("ac"));
  EXPECT_FALSE(not_first.matches("ab"));
  EXPECT_FALSE(not_first.matches("xab"));  // Python finds "a" here; a subset
  // Groups nested in a search group are matched whole; `^` and `$` hold at the group's ends.
  const RegexDfa nested("(?search:^a(?json:b)$|c)");
  EXPECT_TRUE(nested.matches("ab"));
  EXPECT_FALSE(nested.matches("abx"));
  EXPECT_TRUE(nested.matches("xcx"));
}

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string h;
  for (const char c : bytes) {
    h += digits[static_cast<std::uint8_t>(c) >> 4];
    h += digits[static_cast<std::uint8_t>(c) & 15];
  }
  return h;
}

// Random JSON objects: nested values, strings with escapes and one- to four-byte characters,
// every number form, whitespace between tokens.
class JsonMaker {
 public:
  explicit JsonMaker(std::mt19937_64& rng) : rng_(rng) {}
  std::string object(int depth) {
    std::string s = "{";
    s += ws();
    for (int n = pick(0, 3), i = 0; i < n; ++i) {
      if (i) s.append(",").append(ws());
      s.append(string()).append(ws()).append(":").append(ws()).append(value(depth - 1));
      s.append(ws());
    }
    return s.append("}");
  }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  std::string ws() {
    static const char* spaces[] = {"", "", "", " ", "\n  ", "\t", "\r\n"};
    return spaces[pick(0, 6)];
  }
  std::string string() {
    static const char* parts[] = {"a",    "Z",    " ",   "é",   "€",       "\xF0\x9F\x98\x80",
                                  "\\\"", "\\\\", "\\/", "\\n", "\\u00e9", "\\uD83D\\uDE00",
                                  "k"};
    std::string s = "\"";
    for (int n = pick(0, 4); n > 0; --n) s += parts[pick(0, 12)];
    return s.append("\"");
  }
  std::string number() {
    std::string s = pick(0, 2) ? "" : "-";
    if (pick(0, 3))
      s.append(std::to_string(pick(1, 9))).append(std::string(pick(0, 3), '7'));
    else
      s.append("0");
    if (!pick(0, 2)) s.append(".").append(std::to_string(pick(0, 99)));
    if (!pick(0, 3)) s.append(pick(0, 1) ? "e" : "E").append(pick(0, 1) ? "-" : "").append("12");
    return s;
  }
  std::string value(int depth) {
    switch (pick(0, depth > 0 ? 7 : 5)) {
      case 0:
      case 1: return string();
      case 2:
      case 3: return number();
      case 4: return pick(0, 1) ? "true" : pick(0, 1) ? "false" : "null";
      case 5: return std::string("[").append(ws()).append("]");
      case 6: {
        std::string s = "[";
        s.append(ws()).append(value(depth - 1));
        for (int n = pick(0, 2); n > 0; --n)
          s.append(ws()).append(",").append(ws()).append(value(depth - 1));
        return s.append(ws()).append("]");
      }
      default: return object(depth);
    }
  }
  std::mt19937_64& rng_;
};

TEST(JsonGrammar, AgreesWithPythonJsonOnRandomAndMutatedObjects) {
  test::Rng rng = test::make_rng();
  JsonMaker maker(rng.engine());
  std::vector<std::string> texts;
  static constexpr char kMutations[] = "{}[],:\"\\0-e.+ aE\x01\xC3\x80\xFF\xED\xA0\xF4\x90";
  const std::string mutations(kMutations, sizeof kMutations - 1);
  for (int i = 0; i < 300; ++i) {
    const std::string t = maker.object(3);
    texts.push_back(t);
    for (int k = 0; k < 4; ++k) {
      std::string m = t;
      const std::size_t at = rng.engine()() % (m.size() + 1);
      const char c = mutations[rng.engine()() % mutations.size()];
      switch (k) {
        case 0:
          if (at < m.size()) m.erase(at, 1);
          break;
        case 1: m.insert(at, 1, c); break;
        case 2:
          if (at < m.size()) m[at] = c;
          break;
        default: m = m.substr(0, at); break;
      }
      texts.push_back(m);
    }
  }
  for (const char* t : {"{}", "{ }", " {}", "{} ", "[]", "{\"a\":01}", "{\"a\":1.}", "{\"a\":-}",
                        "{\"a\":1e}", "{\"a\":tru}", "{\"a\":\"\t\"}", "{\"a\":\"\\x\"}",
                        "{\"a\":\"\\u12G4\"}", "{\"a\" :[1 ,2, {\"b\":null}] }", "{\"\xC0\xAF\":1}",
                        "{\"\xED\xA0\x80\":1}", "{\"\xF4\x90\x80\x80\":1}", "{\"a\":NaN}",
                        // Surrogate escapes: pairs, and each way of standing alone.
                        R"({"\ud83d\ude00":"\uDBFF\uDFFF\ud800\udc00"})", R"({"a":"\ud800"})",
                        R"({"a":"\udc00\ud800"})", R"({"a":"\ud800\u0041"})", R"({"a":"\ud800\n"})",
                        R"({"a":"\ud800\ud800"})", R"({"a":"\udfff"})", R"({"a":"\ud7ff\ue000"})",
                        R"({"\uDB00":1})"})
    texts.push_back(t);
  nlohmann::json cases = nlohmann::json::array();
  for (const std::string& t : texts) cases.push_back(hex(t));
  const auto expected = test::python_oracle(cases, R"(import json, sys
def ok(b):
    try:
        t = b.decode('utf-8')
    except UnicodeDecodeError:
        return False
    if t != t.strip(' \t\n\r'):
        return False
    def refuse(x):
        raise ValueError(x)
    # A surrogate escape alone stays a surrogate, which UTF-8 cannot encode (strict parsers
    # refuse it); a pair becomes one character. Every member is checked as its object is read,
    # before a repeated name drops one.
    def check(x):
        if isinstance(x, str):
            x.encode('utf-8')
        elif isinstance(x, list):
            for y in x:
                check(y)
    def members(pairs):
        for k, x in pairs:
            check(k)
            check(x)
        return dict(pairs)
    try:
        v = json.loads(t, parse_constant=refuse, object_pairs_hook=members)
        return isinstance(v, dict)
    except (ValueError, UnicodeEncodeError):
        return False
cases = json.load(open(sys.argv[1]))
json.dump([ok(bytes.fromhex(h)) for h in cases], open(sys.argv[2], 'w'))
)");
  if (!expected) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  const JsonGrammar json;
  int accepted = 0;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const bool want = (*expected)[i];
    accepted += want;
    EXPECT_EQ(json.matches(texts[i]), want) << "'" << texts[i] << "'";
    if (!want) continue;
    for (std::size_t n = 0; n < texts[i].size(); ++n)  // every prefix of a text can go on
      ASSERT_NE(json.walk(json.start(), texts[i].substr(0, n)), ByteGrammar::kDead)
          << "'" << texts[i].substr(0, n) << "'";
    EXPECT_FALSE(json.extendable(json.walk(json.start(), texts[i])));
  }
  EXPECT_GT(accepted, 300);
}

TEST(JsonGrammar, BoundsNestingAndWhitespaceRuns) {
  const JsonGrammar json;
  std::string deep = "{\"a\":";
  for (int d = 1; d < JsonGrammar::kMaxDepth; ++d) deep += "[";
  const std::int32_t at_limit = json.walk(json.start(), deep);
  ASSERT_NE(at_limit, ByteGrammar::kDead);
  EXPECT_EQ(json.walk(at_limit, "["), ByteGrammar::kDead);
  EXPECT_EQ(json.walk(at_limit, "{"), ByteGrammar::kDead);
  EXPECT_NE(json.walk(at_limit, "1" + std::string(JsonGrammar::kMaxDepth - 1, ']') + "}"),
            ByteGrammar::kDead);
  const std::string spaces(JsonGrammar::kMaxWhitespace, ' ');
  EXPECT_TRUE(json.matches("{" + spaces + "\"a\":" + spaces + "1" + spaces + "}"));
  EXPECT_FALSE(json.matches("{" + spaces + " \"a\":1}"));
  EXPECT_TRUE(json.matches("{\"" + spaces + spaces + "\":1}"));  // inside a string: text
}

// A schema with most of what the compiler takes: $defs, optional and required properties, enums,
// formats, bounded arrays, anyOf with null, patterns and lengths.
const char* kPersonSchema = R"({
  "$defs": {"Pet": {"type": "object", "properties": {
      "kind": {"enum": ["cat", "dog", "bird"]}, "legs": {"type": "integer"}},
    "required": ["kind"]}},
  "title": "Person", "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 12},
    "age": {"type": ["integer", "null"]},
    "born": {"type": "string", "format": "date"},
    "id": {"type": "string", "format": "uuid"},
    "score": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,5}$"},
             "minItems": 1, "maxItems": 3},
    "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
    "ok": {"type": "boolean"},
    "v": {"const": "1.0"}
  },
  "required": ["name", "tags", "v"]
})";

// Random texts of the automaton's language: from the start, a random byte among those that stay
// live, stopping at a match with probability 1/4.
std::vector<std::string> random_matches(const RegexDfa& dfa, std::mt19937_64& rng, int n) {
  // Each state's fewest bytes to a match: a walk 2000 bytes long takes the shortest way to one
  // from there (a match may be rare among random bytes: \W+é{2}).
  std::vector<int> to_match;
  const auto distances = [&] {
    const auto states = static_cast<std::size_t>(dfa.states());
    to_match.assign(states, -1);
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t st = 0; st < states; ++st) {
        int best = dfa.accepting(static_cast<std::int32_t>(st)) ? 0 : -1;
        for (int b = 0; b < 256; ++b) {
          const std::int32_t t =
              dfa.next(static_cast<std::int32_t>(st), static_cast<std::uint8_t>(b));
          if (t != RegexDfa::kDead && to_match[static_cast<std::size_t>(t)] >= 0 &&
              (best < 0 || to_match[static_cast<std::size_t>(t)] + 1 < best))
            best = to_match[static_cast<std::size_t>(t)] + 1;
        }
        if (best >= 0 && best != to_match[st]) {
          to_match[st] = best;
          changed = true;
        }
      }
    }
  };
  std::vector<std::string> out;
  while (static_cast<int>(out.size()) < n) {
    std::string text;
    std::int32_t st = dfa.start();
    while (true) {
      if (dfa.accepting(st) && (!dfa.extendable(st) || rng() % 4 == 0 || text.size() >= 2000))
        break;
      std::vector<int> live;
      if (text.size() >= 2000 && to_match.empty()) distances();
      for (int b = 0; b < 256; ++b) {
        const std::int32_t t = dfa.next(st, static_cast<std::uint8_t>(b));
        if (t == RegexDfa::kDead) continue;
        if (text.size() >= 2000 &&
            to_match[static_cast<std::size_t>(t)] >= to_match[static_cast<std::size_t>(st)])
          continue;
        live.push_back(b);
      }
      const int b = live[rng() % live.size()];
      text += static_cast<char>(b);
      st = dfa.next(st, static_cast<std::uint8_t>(b));
    }
    out.push_back(text);
  }
  return out;
}

// A JSON group writes its pattern's texts as a JSON string's body: the texts it matches are
// exactly json.dumps' bodies of the strings the pattern matches (Python's json and re).
TEST(RegexDfa, JsonGroupsWriteTheirTextsAsJsonStrings) {
  test::Rng rng = test::make_rng();
  PatternMaker maker(rng.engine());
  std::vector<std::string> patterns = {
      ".*", "[^a]+", "\\W{2,4}", "[\\x00-\\x1f\"\\\\]*", "\"[a-z]+\"", "a\\\\b|\\s+", "[^@]+@[^@]+",
  };
  for (int i = 0; i < 60; ++i) patterns.push_back(maker.make(2).first);
  // Characters JSON escapes and those it writes as themselves; bodies written apart from the
  // pattern, canonical or not.
  const std::vector<std::string> pieces = {
      "a",    "b",       "@",       "\"",     "\\",      "\n",      "\t",   "\x01",
      "\x1f", " ",       "\u00e9",  "\u20ac", "\x7f",    "\\\"",    "\\\\", "\\n",
      "\\t",  "\\u0001", "\\u001f", "\\/",    "\\u0041", "\\u000A", "\\b",  "\\f"};
  nlohmann::json cases = nlohmann::json::array();
  std::vector<std::optional<RegexDfa>> dfas;
  for (const std::string& p : patterns) {
    try {
      dfas.emplace_back(RegexDfa("(?json:" + p + ")"));
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find("the pattern is too large"), std::string::npos) << p;
      dfas.emplace_back();
      continue;
    }
    nlohmann::json texts = nlohmann::json::array();
    for (const std::string& t : random_matches(*dfas.back(), rng.engine(), 20))
      texts.push_back(hex(t));
    for (int k = 0; k < 40; ++k) {
      std::string t;
      for (int n = static_cast<int>(rng.engine()() % 5); n > 0; --n)
        t += pieces[rng.engine()() % pieces.size()];
      texts.push_back(hex(t));
    }
    cases.push_back({p, texts});
  }
  const auto verdicts = test::python_oracle(cases, std::string(kDecided) + R"(import json, re, sys
def ok(p, body):
    try:
        text = '"' + bytes.fromhex(body).decode() + '"'
        v = json.loads(text)
    except ValueError:
        return False
    if json.dumps(v, ensure_ascii=False) != text:
        return False
    return bool(re.fullmatch(p, v, re.ASCII))
cases = json.load(open(sys.argv[1]))
json.dump([decided(texts, lambda t: ok(p, t)) for p, texts in cases], open(sys.argv[2], 'w'))
)");
  if (!verdicts) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  int escaped = 0, candidates_matched = 0;
  for (std::size_t i = 0, c = 0; i < patterns.size(); ++i) {
    if (!dfas[i]) continue;
    for (std::size_t k = 0; k < cases[c][1].size(); ++k) {
      const std::string h = cases[c][1][k];
      std::string text;
      for (std::size_t j = 0; j < h.size(); j += 2)
        text += static_cast<char>(std::stoi(h.substr(j, 2), nullptr, 16));
      if ((*verdicts)[c][k].is_null()) continue;
      const bool want = (*verdicts)[c][k];
      if (k < 20) {
        EXPECT_TRUE(want) << patterns[i] << " wrote " << text;
        escaped += text.find('\\') != std::string::npos;
      } else {
        candidates_matched += want;
      }
      EXPECT_EQ(dfas[i]->matches(text), want) << patterns[i] << ": " << text;
    }
    ++c;
  }
  EXPECT_GT(escaped, 100);
  EXPECT_GT(candidates_matched, 50);
  EXPECT_LT(undecided(*verdicts), 3);
  // A length group inside counts the string's characters; outside, the escapes' bytes.
  const RegexDfa inside("(?json:(?{2,3}:.*))"), outside("(?{2,3}:(?json:.*))");
  EXPECT_TRUE(inside.matches("\\\"\\\"\\\""));  // \" \" \": three characters
  EXPECT_FALSE(inside.matches("\\\""));
  EXPECT_TRUE(outside.matches("\\\""));
  EXPECT_FALSE(outside.matches("\\\"\\\""));
}

// A pattern's texts (strings it matches part of, as re.search reads it) are written as json.dumps
// writes them, and lengths that cut them keep those that have them, in characters: every random
// text of the automaton and every candidate string is checked by Python's json, re and len.
TEST(JsonSchema, PatternsWriteTheirTextsOfTheirLengthsAsJsonStrings) {
  test::Rng rng = test::make_rng();
  const std::vector<std::tuple<std::string, int, int>> schemas = {
      // pattern, minLength, maxLength
      {"a+", 0, 3},
      {"^\\d{5}(-\\d{4})?$", 0, 9},
      {"\u00e9{2}x?", 3, -1},
      {"\u00e9{2}x?", 0, 2},
      {"(ab|c)*d", 1, 200},
      {"^[a-d0-9]+(?:-[a-d0-9]+)*$", 3, 8},
      {"[\u20aca]*", 2, 4},
      {"(?:x|\u00e9\u00e9)*", 3, 3},
      // Patterns that write what JSON escapes: a quote, a backslash, a control character.
      {"^.*$", 0, 5},
      {"[^@]+@[^@]+", 3, 12},
      {"[\"\\\\a\n]+", 0, -1},
      // Look-aheads, which look at the string's characters (Pydantic's Decimal first).
      {"^(?!^[-+.]*$)[+-]?0*\\d*\\.?\\d*$", 0, -1},
      {"^(?!^[-+.]*$)[+-]?0*\\d*\\.?\\d*$", 0, 4},
      {"^(?=.*\\d)(?=.*[a-d]).+$", 3, 8},
      {"(?!.*[\"\n])(?!a$).+", 1, 6},
      {"^(?=a)a+$|^(?!x)\\d+$", 0, 4},
      // Patterns that match no text whole, and part of some: searched only.
      {"(?=.*[0-9])[a-d]", 0, 6},
      {"(?=[0-9]*\\.)[0-9]", 0, -1}};
  // Bodies of JSON strings: characters as themselves, escapes (canonical or not, which Python
  // reads and the automaton does not write).
  const std::vector<std::string> alphabet = {"a", "b",    "c",    "d",   "x",       "-",
                                             "+", "0",    ".",    "5",   "\u00e9",  "\u20ac",
                                             "@", "\\\"", "\\\\", "\\n", "\\u0001", "\\u0041"};
  nlohmann::json cases = nlohmann::json::array();
  std::vector<RegexDfa> dfas;
  for (const auto& [pattern, lo, hi] : schemas) {
    nlohmann::json schema = {{"type", "string"}, {"pattern", pattern}};
    if (lo > 0) schema["minLength"] = lo;
    if (hi >= 0) schema["maxLength"] = hi;
    dfas.emplace_back(json_schema_regex(schema.dump()));
    nlohmann::json texts = nlohmann::json::array();
    std::vector<std::string> variants;  // near the matches: longer, shorter, doubled
    for (const std::string& t : random_matches(dfas.back(), rng.engine(), 60)) {
      texts.push_back(t);
      const std::string v = nlohmann::json::parse(t).get<std::string>();
      std::string shorter = v;
      while (!shorter.empty() && (static_cast<unsigned char>(shorter.back()) & 0xC0) == 0x80)
        shorter.pop_back();
      if (!shorter.empty()) shorter.pop_back();
      for (const std::string& w : {v + v, v + "a", shorter})
        variants.push_back(nlohmann::json(w).dump());
    }
    for (const std::string& w : variants) texts.push_back(w);
    for (int k = 0; k < 200; ++k) {
      std::string v;
      for (int n = static_cast<int>(rng.engine()() % 11); n > 0; --n)
        v += alphabet[rng.engine()() % alphabet.size()];
      texts.push_back("\"" + v + "\"");
    }
    cases.push_back({pattern, lo, hi, texts});
  }
  // `$` is the end of the text, Python's \Z (its `$` also matches before a final newline); \d is
  // ASCII, as ECMA-262 has it.
  const auto verdicts = test::python_oracle(cases, R"(import json, re, sys
def verdict(p, lo, hi, t):  # [a match within the bounds, a match of the pattern]
    try:
        v = json.loads(t)  # written as json.dumps writes it, or not at all
    except ValueError:
        return [False, False]
    p = re.sub(r'\$(?=[)|]|$)', r'\\Z', p)
    plain = bool(re.search(p, v, re.ASCII)) and json.dumps(v, ensure_ascii=False) == t
    return [plain and lo <= len(v) and (hi < 0 or len(v) <= hi), plain]
cases = json.load(open(sys.argv[1]))
json.dump([[verdict(p, lo, hi, t) for t in texts] for p, lo, hi, texts in cases],
          open(sys.argv[2], 'w'))
)");
  if (!verdicts) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  int candidates_matched = 0, cut = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    for (std::size_t k = 0; k < cases[i][3].size(); ++k) {
      const std::string text = cases[i][3][k];
      const bool want = (*verdicts)[i][k][0], plain = (*verdicts)[i][k][1];
      if (k < 60) {
        EXPECT_TRUE(want) << cases[i][0] << " wrote " << text;
      } else {
        candidates_matched += want;
      }
      cut += plain && !want;
      EXPECT_EQ(dfas[i].matches(text), want) << cases[i][0] << ": " << text;
    }
  }
  EXPECT_GT(candidates_matched, 100);
  EXPECT_GT(cut, 100);  // matches of a pattern that its lengths refuse
  // The shortest and longest texts within the bounds, and one past each.
  EXPECT_TRUE(dfas[1].matches("\"12345\""));
  EXPECT_FALSE(dfas[1].matches("\"12345-6789\""));
  EXPECT_TRUE(dfas[2].matches("\"\u00e9\u00e9x\""));
  EXPECT_FALSE(dfas[2].matches("\"\u00e9\u00e9\""));
  EXPECT_TRUE(dfas[6].matches("\"\u20ac\u20ac\u20ac\u20ac\""));
  EXPECT_FALSE(dfas[6].matches("\"\u20ac\u20ac\u20ac\u20ac\u20ac\""));
  // Where a pattern searched for would pass the automaton's bounds (here: any text around it, its
  // quotes and backslashes escaped, counted to a thousand characters), it is matched whole.
  const RegexDfa whole(json_schema_regex(
      R"({"type": "string", "pattern": "(ab|c)*d", "minLength": 1, "maxLength": 1000})"));
  EXPECT_TRUE(whole.matches("\"abcd\""));
  EXPECT_FALSE(whole.matches("\"abcdx\""));
  // Pydantic's Decimal field: a number, or a string of a number's text.
  const RegexDfa decimal(json_schema_regex(
      R"({"anyOf": [{"type": "number"}, {"type": "string",
          "pattern": "^(?!^[-+.]*$)[+-]?0*\\d*\\.?\\d*$"}]})"));
  for (const char* yes : {"1.5", "-2", "\"1.50\"", "\"-.5\"", "\"007\""})
    EXPECT_TRUE(decimal.matches(yes)) << yes;
  for (const char* no : {"\"\"", "\"-\"", "\"+.\"", "\"1e5\"", "\"abc\""})
    EXPECT_FALSE(decimal.matches(no)) << no;
}

// Every text the schema's regex matches is JSON valid under the schema: random matches checked by
// a small validator written in Python for the supported keywords; instances as json.dumps writes
// them (in the schema's order, compact or spaced) match; invalid ones do not.
TEST(JsonSchema, MatchesOnlyValidInstancesAndThoseJsonDumpsWrites) {
  test::Rng rng = test::make_rng();
  const RegexDfa dfa(json_schema_regex(kPersonSchema));
  nlohmann::json cases = nlohmann::json::array();
  for (const std::string& t : random_matches(dfa, rng.engine(), 300)) cases.push_back(hex(t));
  const std::string schema_file =
      (std::filesystem::temp_directory_path() / ("dcp_schema_" + std::to_string(::getpid())))
          .string();
  std::ofstream(schema_file) << kPersonSchema;
  const auto verdicts = test::python_oracle(cases, R"(import json, re, sys, uuid
schema = json.load(open(')" + schema_file + R"('))
def valid(v, s):
    if '$ref' in s:
        return valid(v, schema['$defs'][s['$ref'].split('/')[-1]])
    if 'const' in s:
        return v == s['const']
    if 'enum' in s:
        return v in s['enum']
    if 'anyOf' in s:
        return any(valid(v, x) for x in s['anyOf'])
    types = s['type'] if isinstance(s['type'], list) else [s['type']]
    return any(typed(v, s, t) for t in types)
def typed(v, s, t):
    if t == 'null': return v is None
    if t == 'boolean': return isinstance(v, bool)
    if t == 'integer': return isinstance(v, int) and not isinstance(v, bool)
    if t == 'number': return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == 'string':
        if not isinstance(v, str): return False
        if not s.get('minLength', 0) <= len(v) <= s.get('maxLength', 1 << 30): return False
        if 'pattern' in s and not re.search(s['pattern'], v): return False
        if s.get('format') == 'uuid':
            try: uuid.UUID(v)
            except ValueError: return False
            return len(v) == 36
        if s.get('format') == 'date':
            m = re.fullmatch(r'(\d{4})-(\d\d)-(\d\d)', v, re.ASCII)
            return bool(m) and 1 <= int(m[2]) <= 12 and 1 <= int(m[3]) <= 31
        return True
    if t == 'array':
        return (isinstance(v, list) and s.get('minItems', 0) <= len(v) <= s.get('maxItems', 1 << 30)
                and all(valid(x, s['items']) for x in v))
    if t == 'object':
        return (isinstance(v, dict) and set(s.get('required', [])) <= set(v)
                and set(v) <= set(s['properties'])
                and list(v) == [k for k in s['properties'] if k in v]
                and all(valid(v[k], s['properties'][k]) for k in v))
def ok(b):
    try:
        return valid(json.loads(b.decode('utf-8')), schema)
    except ValueError:
        return False
json.dump([ok(bytes.fromhex(h)) for h in json.load(open(sys.argv[1]))], open(sys.argv[2], 'w'))
)");
  std::filesystem::remove(schema_file);
  if (!verdicts) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  for (std::size_t i = 0; i < cases.size(); ++i) {
    std::string text;
    for (std::size_t k = 0; k < cases[i].get<std::string>().size(); k += 2)
      text += static_cast<char>(std::stoi(cases[i].get<std::string>().substr(k, 2), nullptr, 16));
    EXPECT_TRUE((*verdicts)[i].get<bool>()) << "matched, but not valid: " << text;
  }
  // Instances written by hand in the schema's order, as json.dumps writes them.
  for (
      const char* valid :
      {R"({"name":"Ann","tags":["a"],"v":"1.0"})",
       R"({"name": "Bo \"B\" \u00e9", "age": null, "born": "2001-02-03", "tags": ["x", "yz"], "v": "1.0"})",
       R"({"name":"Cy","age":41,"id":"123e4567-e89b-12d3-a456-426614174000","score":-1.5e3,"tags":["abcde","b","c"],"pet":{"kind":"dog","legs":4},"ok":true,"v":"1.0"})",
       R"({ "name" : "Di" , "tags" : [ "q" ] , "pet" : null , "v" : "1.0" })"})
    EXPECT_TRUE(dfa.matches(valid)) << valid;
  for (const char* invalid :
       {R"({"tags":["a"],"v":"1.0"})",                                    // name missing
        R"({"name":"","tags":["a"],"v":"1.0"})",                          // minLength
        R"({"name":"Ann","age":1.5,"tags":["a"],"v":"1.0"})",             // not an integer
        R"({"name":"Ann","tags":[],"v":"1.0"})",                          // minItems
        R"({"name":"Ann","tags":["a","b","c","d"],"v":"1.0"})",           // maxItems
        R"({"name":"Ann","tags":["A"],"v":"1.0"})",                       // pattern
        R"({"name":"Ann","born":"2001-13-03","tags":["a"],"v":"1.0"})",   // format
        R"({"name":"Ann","tags":["a"],"pet":{"kind":"cow"},"v":"1.0"})",  // enum
        R"({"name":"Ann","tags":["a"],"v":"2.0"})",                       // const
        R"({"tags":["a"],"name":"Ann","v":"1.0"})",              // out of the schema's order
        R"( {"name":"Ann","tags":["a"],"v":"1.0"})",             // whitespace before
        R"({"name":"Ann",  "tags":["a"],"v":"1.0"})",            // two spaces
        "{\n\"name\":\"Ann\",\"tags\":[\"a\"],\"v\":\"1.0\"}"})  // a newline
    EXPECT_FALSE(dfa.matches(invalid)) << invalid;
}

// The ipv4, hostname and email formats: random texts of each automaton pass checks written
// apart in Python (ipaddress, RFC 1123 labels, RFC 5321 lengths and RFC 5322 atoms); hand-written
// texts in and out.
TEST(JsonSchema, FormatsWriteOnlyValidAddressesAndNames) {
  test::Rng rng = test::make_rng();
  nlohmann::json cases = nlohmann::json::array();
  // Each format's lengths in characters, worked out by hand from its definition (the refusals
  // of lengths that would cut them name these).
  const std::map<std::string, std::pair<std::size_t, std::size_t>> lengths = {
      {"ipv4", {7, 15}},     {"hostname", {1, 251}},  {"email", {5, 252}}, {"date", {10, 10}},
      {"time", {8, 24}},     {"date-time", {19, 35}}, {"uuid", {36, 36}},  {"uri", {5, 2001}},
      {"duration", {3, 41}}, {"ipv6", {2, 45}},       {"uuid4", {36, 36}}, {"uuid7", {36, 36}}};
  for (const auto& [format, bounds] : lengths) {
    const RegexDfa dfa(json_schema_regex(str(R"({"type":"string","format":")", format, "\"}")));
    for (const std::string& t : random_matches(dfa, rng.engine(), 200)) {
      cases.push_back({format, hex(t)});
      EXPECT_GE(t.size() - 2, bounds.first) << t;  // ASCII: a byte is a character
      EXPECT_LE(t.size() - 2, bounds.second) << t;
    }
    const std::string at = str(R"({"type":"string","format":")", format, R"(","minLength":)",
                               bounds.first, R"(,"maxLength":)", bounds.second, "}");
    EXPECT_NO_THROW(json_schema_regex(at)) << at;
    // Lengths that cut the format's texts keep those of their lengths (a fixed length cut is
    // refused; uri's automaton cut to a length would be too large).
    for (const auto& [lo, hi] :
         {std::pair{bounds.first + 1, bounds.second}, std::pair{bounds.first, bounds.second - 1},
          std::pair{bounds.first, (bounds.first + bounds.second) / 2}}) {
      const std::string cut = str(R"({"type":"string","format":")", format, R"(","minLength":)", lo,
                                  R"(,"maxLength":)", hi, "}");
      std::optional<RegexDfa> cut_dfa;
      try {
        cut_dfa.emplace(json_schema_regex(cut, "f"));
      } catch (const Error& e) {
        if (lo > hi)
          EXPECT_EQ(std::string(e.what()),
                    "'f': the schema at '#': 'maxLength' is below 'minLength'");
        else
          EXPECT_EQ(std::string(e.what()),
                    str("'f': the schema at '#': 'format' \"", format, "\" cut to ", lo, " to ", hi,
                        " characters is too large an automaton (it writes ", bounds.first, " to ",
                        bounds.second, " characters)"));
        EXPECT_TRUE(lo > hi || format == "uri") << cut << ": " << e.what();
        continue;
      }
      EXPECT_LE(lo, hi) << cut;
      for (const std::string& t : random_matches(*cut_dfa, rng.engine(), 100)) {
        cases.push_back({format, hex(t)});
        EXPECT_GE(t.size() - 2, lo) << cut << " wrote " << t;
        EXPECT_LE(t.size() - 2, hi) << cut << " wrote " << t;
      }
    }
  }
  // Pydantic's HttpUrl.
  EXPECT_NO_THROW(
      json_schema_regex(R"({"type":"string","format":"uri","minLength":1,"maxLength":2083})"));
  const auto verdicts =
      test::python_oracle(cases, R"(import datetime, ipaddress, json, re, sys, urllib.parse, uuid
def label_ok(l):
    return 1 <= len(l) <= 63 and re.fullmatch(r'[A-Za-z0-9-]+', l) and l[0] != '-' and l[-1] != '-'
def host_ok(h):
    return len(h) <= 253 and all(label_ok(l) for l in h.split('.'))
def time_ok(t):
    m = re.fullmatch(r'(\d\d):(\d\d):(\d\d)(\.\d{1,9})?(Z|[+-](\d\d):(\d\d))?', t, re.ASCII)
    return (m and int(m[1]) < 24 and int(m[2]) < 60 and int(m[3]) < 60
            and (not m[6] or (int(m[6]) < 24 and int(m[7]) < 60)))
def uri_ok(v):
    u = urllib.parse.urlsplit(v)
    chars = r"(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*"
    return (re.fullmatch(r'[A-Za-z][A-Za-z0-9+.-]*', u.scheme) and v.lower().startswith(u.scheme + '://')
            and host_ok(u.hostname or '') and (u.port is None or 0 <= u.port <= 65535)
            and re.fullmatch(chars, u.path) and '?' not in u.path
            and re.fullmatch(chars, u.query) and re.fullmatch(chars, u.fragment))
def duration_ok(v):  # RFC 3339 Appendix A, read as its grammar says; Python holds the span
    if not v.startswith('P'):
        return False
    date, t, time = v[1:].partition('T')
    def units(part):
        found = re.findall(r'([0-9]+)([A-Z])', part)
        return found if ''.join(a + b for a, b in found) == part else None
    d, tm = units(date), units(time)
    if d is None or tm is None or (t and not tm) or (not d and not tm):
        return False
    letters = ''.join(b for _, b in d)
    if letters == 'W':
        if t:
            return False
    elif letters not in ('', 'Y', 'YM', 'YMD', 'M', 'MD', 'D'):
        return False
    if ''.join(b for _, b in tm) not in ('', 'H', 'HM', 'HMS', 'M', 'MS', 'S'):
        return False
    n = {b: int(a) for a, b in d}
    m = {b: int(a) for a, b in tm}
    datetime.timedelta(weeks=n.get('W', 0), days=n.get('D', 0), hours=m.get('H', 0),
                       minutes=m.get('M', 0), seconds=m.get('S', 0))
    return True
def ok(fmt, text):
    v = json.loads(text)
    if fmt == 'duration':
        return duration_ok(v)
    if fmt == 'date':
        return datetime.date.fromisoformat(v).isoformat() == v
    if fmt == 'time':
        return time_ok(v)
    if fmt == 'date-time':
        return datetime.date.fromisoformat(v[:10]).isoformat() == v[:10] and v[10] == 'T' and time_ok(v[11:])
    if fmt == 'uuid':
        return str(uuid.UUID(v)) == v.lower()
    if fmt.startswith('uuid'):
        return str(uuid.UUID(v)) == v.lower() and uuid.UUID(v).version == int(fmt[4:])
    if fmt == 'ipv6':
        return ipaddress.IPv6Address(v) and '%' not in v
    if fmt == 'uri':
        return uri_ok(v)
    if fmt == 'ipv4':
        return str(ipaddress.IPv4Address(v)) == v
    if fmt == 'hostname':
        return host_ok(v)
    local, _, domain = v.rpartition('@')
    atext = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
    return (len(v) <= 254 and len(local) <= 64 and re.fullmatch(atext + r'(\.' + atext + ')*', local)
            and '.' in domain and host_ok(domain))
cases = json.load(open(sys.argv[1]))
json.dump([bool(ok(f, bytes.fromhex(h).decode())) for f, h in cases], open(sys.argv[2], 'w'))
)");
  if (!verdicts) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  for (std::size_t i = 0; i < cases.size(); ++i)
    EXPECT_TRUE((*verdicts)[i].get<bool>()) << cases[i];
  const auto matches = [](const char* format, const char* text) {
    return RegexDfa(json_schema_regex(str(R"({"type":"string","format":")", format, "\"}")))
        .matches(text);
  };
  for (const char* yes : {R"("192.168.0.1")", R"("0.0.0.0")", R"("255.255.255.255")"})
    EXPECT_TRUE(matches("ipv4", yes)) << yes;
  for (const char* no : {R"("256.1.1.1")", R"("01.2.3.4")", R"("1.2.3")", R"("1.2.3.4.5")"})
    EXPECT_FALSE(matches("ipv4", no)) << no;
  for (const char* yes : {R"("localhost")", R"("a-b.example.com")", R"("x1.y2.z3.w4")"})
    EXPECT_TRUE(matches("hostname", yes)) << yes;
  for (const char* no : {R"("-a.com")", R"("a-.com")", R"("a..b")", R"("a_b.com")"})
    EXPECT_FALSE(matches("hostname", no)) << no;
  for (const char* yes :
       {R"("ann@example.com")", R"("first.last+tag@mail.example.org")", R"("o'neil@x.io")"})
    EXPECT_TRUE(matches("email", yes)) << yes;
  for (const char* no : {R"("ann@localhost")", R"(".ann@x.io")", R"("ann.@x.io")", R"("a b@x.io")",
                         R"("ann@@x.io")"})
    EXPECT_FALSE(matches("email", no)) << no;
  for (const char* yes : {R"("P1D")", R"("PT0S")", R"("P3W")", R"("P1DT2H3M4S")", R"("PT5M")",
                          R"("PT1H30M")", R"("P99999999DT999999999H")", R"("P999999W")"})
    EXPECT_TRUE(matches("duration", yes)) << yes;
  // Not RFC 3339's (P, PT, an hour then a second without a minute, weeks with days, a sign, a
  // fraction); years and months, which are but are not written; more days than Python holds.
  for (const char* no : {R"("P")", R"("PT")", R"("PT1H2S")", R"("P1W1D")", R"("P1Y")", R"("P1M")",
                         R"("PT1.5S")", R"("-P1D")", R"("P999999999D")"})
    EXPECT_FALSE(matches("duration", no)) << no;
  for (const char* yes :
       {R"("2024-02-29")", R"("2000-02-29")", R"("2023-04-30")", R"("1999-12-31")",
        R"("0001-01-01")", R"("0004-02-29")", R"("0400-02-29")", R"("9999-12-31")"})
    EXPECT_TRUE(matches("date", yes)) << yes;
  // Year 0 is RFC 3339's, but Python's date type (Pydantic's) does not hold it.
  for (const char* no : {R"("2023-02-29")", R"("1900-02-29")", R"("2023-04-31")", R"("2023-02-30")",
                         R"("2023-13-01")", R"("2023-00-10")", R"("0000-01-01")", R"("0000-02-29")",
                         R"("0100-02-29")"})
    EXPECT_FALSE(matches("date", no)) << no;
  for (const char* yes :
       {R"("https://example.com/a/b?x=1&y=%20#top")", R"("http://10.0.0.1:65535")",
        R"("ftp://files.example.org/pub/")", R"("s3://bucket/key%2Fpart")"})
    EXPECT_TRUE(matches("uri", yes)) << yes;
  for (const char* no : {R"("https://exa mple.com")", R"("example.com")", R"("http://a:65536")",
                         R"("https://a/%zz")", R"("http://a/b#c#d")"})
    EXPECT_FALSE(matches("uri", no)) << no;
}

// IPv6 addresses in every text form RFC 4291 gives them (leading zeros or not, either case, `::`
// over any run of zero groups, the last two groups as an IPv4 address) and near misses: the
// formats ipv6 and ipvanyaddress (Pydantic's IPv6Address and IPvAnyAddress) match exactly those
// Python's ipaddress reads (without a zone index, which is not written).
TEST(JsonSchema, IpAddressFormatsMatchWhatPythonsIpaddressReads) {
  test::Rng rng = test::make_rng();
  const auto pick = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng.engine());
  };
  std::vector<std::string> texts;
  for (int i = 0; i < 600; ++i) {
    std::array<int, 8> groups{};
    for (int& g : groups) g = pick(0, 9) < 4 ? 0 : pick(0, 0xFFFF);
    const bool dotted = pick(0, 3) == 0, padded = pick(0, 3) == 0;
    const int hex_groups = dotted ? 6 : 8;
    // A run of zero groups written `::` (any run, not only the longest), or none.
    int from = -1, to = -1;
    if (pick(0, 3) != 0) {
      from = pick(0, hex_groups - 1);
      to = from;
      while (to < hex_groups && groups[static_cast<std::size_t>(to)] == 0) ++to;
      if (to == from) from = to = -1;
    }
    std::string t;
    for (int k = 0; k < hex_groups; ++k) {
      if (k == from) t += k == 0 ? "::" : ":";
      if (k >= from && k < to) continue;
      char buf[8];
      std::snprintf(buf, sizeof buf, padded ? "%04x" : "%x", groups[static_cast<std::size_t>(k)]);
      for (char* c = buf; *c; ++c)
        if (pick(0, 2) == 0) *c = static_cast<char>(std::toupper(*c));
      t += buf;
      if (k + 1 < hex_groups || dotted) t += ":";
    }
    if (dotted)
      t += str(groups[6] >> 8, ".", groups[6] & 255, ".", groups[7] >> 8, ".", groups[7] & 255);
    texts.push_back(t);
    std::string miss = t;  // a character more, fewer or changed
    const std::string chars = ":.0123456789abcdefABCDEFg%";
    const auto at = static_cast<std::size_t>(pick(0, static_cast<int>(miss.size()) - 1));
    const char c = chars[static_cast<std::size_t>(pick(0, static_cast<int>(chars.size()) - 1))];
    switch (pick(0, 2)) {
      case 0: miss.insert(at, 1, c); break;
      case 1: miss.erase(at, 1); break;
      default: miss[at] = c;
    }
    texts.push_back(miss);
  }
  for (int i = 0; i < 100; ++i)
    texts.push_back(
        str(pick(0, 300), ".", pick(0, 255), ".", pick(0, 9) == 0 ? "01" : "7", ".", pick(0, 255)));
  // Groups counted to the bound on each side of `::`, and one past it.
  for (const char* t : {"1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1::3:4:5:6:7:8", "1:2:3:4:5:6::8",
                        "1:2:3:4:5::1.2.3.4", "::2:3:4:5:6:1.2.3.4", "1:2:3:4::5:6:7:8",
                        "1:2:3:4:5:6:7:8::", "::1:2:3:4:5:6:7:8", "1:2:3:4:5:6::1.2.3.4",
                        "1:2:3:4:5:6:7:1.2.3.4", "1::2::3", ":::", "::", "1:::2", ":1::", "::1:"})
    texts.push_back(t);
  nlohmann::json cases = texts;
  const auto verdicts = test::python_oracle(cases, R"(import ipaddress, json, sys
def reads(kind, v):
    try:
        kind(v)
        return '%' not in v
    except ValueError:
        return False
cases = json.load(open(sys.argv[1]))
json.dump([[reads(ipaddress.IPv6Address, v), reads(ipaddress.IPv4Address, v)] for v in cases],
          open(sys.argv[2], 'w'))
)");
  if (!verdicts) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  const RegexDfa ipv6(json_schema_regex(R"({"type":"string","format":"ipv6"})"));
  const RegexDfa any(json_schema_regex(R"({"type":"string","format":"ipvanyaddress"})"));
  int valid = 0, compressed = 0, dotted = 0;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const bool v6 = (*verdicts)[i][0], v4 = (*verdicts)[i][1];
    const std::string quoted = "\"" + texts[i] + "\"";
    EXPECT_EQ(ipv6.matches(quoted), v6) << texts[i];
    EXPECT_EQ(any.matches(quoted), v6 || v4) << texts[i];
    valid += v6;
    compressed += v6 && texts[i].find("::") != std::string::npos;
    dotted += v6 && texts[i].find('.') != std::string::npos;
  }
  EXPECT_GT(valid, 500);  // the generator's forms are valid, its near misses mostly not
  EXPECT_GT(compressed, 150);
  EXPECT_GT(dotted, 100);
  EXPECT_LT(valid, 1000);
}

// Meta-data keywords (readOnly, writeOnly, deprecated) and the password format change nothing:
// Pydantic's computed fields, SecretStr and deprecated fields compile as the plain schema does.
TEST(JsonSchema, MetaDataAndThePasswordFormatChangeNothing) {
  const std::string plain = json_schema_regex(
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
          "key": {"type": "string"}, "old": {"type": "integer"}}, "required": ["name", "key"]})");
  EXPECT_EQ(json_schema_regex(
                R"({"type": "object", "properties": {
                    "name": {"type": "string", "maxLength": 8, "readOnly": true},
                    "key": {"type": "string", "format": "password", "writeOnly": true},
                    "old": {"type": "integer", "deprecated": true}}, "required": ["name", "key"]})"),
            plain);
  const RegexDfa dfa(plain);
  EXPECT_TRUE(dfa.matches(R"({"name":"ann","key":"s3cr\"et"})"));
}

// A value's text as an exact rational: numerator over 10^scale (a JSON integer or decimal, no
// exponent); nullopt for any other text.
struct Scaled {
  std::int64_t numerator = 0;  // the texts below stay far from 2^63
  int scale = 0;
};
std::optional<Scaled> decimal_value(const std::string& text) {
  std::size_t i = 0;
  const bool negative = !text.empty() && text[0] == '-';
  if (negative) ++i;
  Scaled v;
  bool digits = false, point = false;
  for (; i < text.size(); ++i) {
    if (text[i] == '.' && !point) {
      point = true;
      continue;
    }
    if (text[i] < '0' || text[i] > '9') return std::nullopt;
    v.numerator = v.numerator * 10 + (text[i] - '0');
    digits = true;
    if (point) ++v.scale;
  }
  if (!digits) return std::nullopt;
  if (negative) v.numerator = -v.numerator;
  return v;
}

// Bounded integers and numbers match exactly the canonical texts whose value lies within the
// bounds, checked by exact arithmetic over every integer of a window around them, decimals at
// and near each integer, and values near powers of ten; non-canonical texts never match.
TEST(JsonSchema, BoundsAdmitExactlyTheNumbersWithinThem) {
  test::Rng rng = test::make_rng();
  int checked = 0;
  for (int c = 0; c < 120; ++c) {
    const bool integer = c % 2 == 0;
    struct Side {
      bool present = false, exclusive = false;
      double value = 0;
    } lo, hi;
    std::string schema = str(R"({"type":")", integer ? "integer" : "number", "\"");
    const std::int64_t open = rng.range(0, 5);  // 0: no lower bound, 1: no upper one
    for (Side* side : {&lo, &hi}) {
      if ((side == &lo && open == 0) || (side == &hi && open == 1)) continue;
      side->present = true;
      side->exclusive = rng.range(0, 1) == 1;
      side->value = static_cast<double>(rng.range(-300, 300));
      if (integer && rng.range(0, 3) == 0)
        side->value += 0.25 * static_cast<double>(rng.range(1, 3));
      if (rng.range(0, 9) == 0) side->value *= 1e9;  // far from zero
      schema += str(",\"",
                    side == &lo ? (side->exclusive ? "exclusiveMinimum" : "minimum")
                                : (side->exclusive ? "exclusiveMaximum" : "maximum"),
                    "\":", nlohmann::json(side->value).dump());
    }
    schema += "}";
    // Exact membership: value * 4 * 10^scale against the bound * 4 * 10^scale (bounds are
    // multiples of 1/4).
    const auto within = [&](const Scaled& v) {
      std::int64_t ten = 1;
      for (int k = 0; k < v.scale; ++k) ten *= 10;
      const std::int64_t x = v.numerator * 4;
      const auto bound = [&](const Side& b) {
        return static_cast<std::int64_t>(b.value * 4) * ten;
      };
      if (lo.present && (lo.exclusive ? x <= bound(lo) : x < bound(lo))) return false;
      if (hi.present && (hi.exclusive ? x >= bound(hi) : x > bound(hi))) return false;
      return true;
    };
    std::string regex;
    try {
      regex = json_schema_regex(schema);
    } catch (const Error& e) {  // only a range with no value in it is refused
      ASSERT_NE(std::string(e.what()).find("lies within its bounds"), std::string::npos)
          << schema << ": " << e.what();
      for (std::int64_t n = -400; n <= 400; ++n)
        ASSERT_FALSE(within(*decimal_value(std::to_string(n)))) << schema << " holds " << n;
      continue;
    }
    const RegexDfa dfa(regex);
    std::vector<std::string> texts;
    std::vector<std::int64_t> centres = {0};
    for (const Side* side : {&lo, &hi}) {
      if (side->present) centres.push_back(static_cast<std::int64_t>(side->value));
    }
    for (const std::int64_t centre : centres) {
      for (std::int64_t n = centre - 150; n <= centre + 150; ++n) {
        texts.push_back(std::to_string(n));
        if (!integer) {
          for (const char* f : {".0", ".00", ".5", ".05", ".999", ".001"})
            texts.push_back((n == 0 && rng.range(0, 1) ? "-0" : std::to_string(n)) + f);
        }
      }
    }
    for (std::int64_t p = 10; p <= 1000000000000000; p *= 10) {
      for (const std::int64_t n : {p - 1, p, p + 1}) {
        texts.push_back(std::to_string(n));
        texts.push_back(std::to_string(-n));
      }
    }
    for (const std::string& t : texts) {
      // Zero written with a minus sign ("-0", "-0.00") is left out: JSON writes 0.
      const Scaled v = *decimal_value(t);
      const bool want = within(v) && !(t[0] == '-' && v.numerator == 0);
      ASSERT_EQ(dfa.matches(t), want) << schema << " on " << t;
      ++checked;
    }
    for (const char* odd : {"01", "-01", "+1", "1.", ".5", "1e2", "-0", "00", "1.5e1", "0x10"})
      ASSERT_FALSE(dfa.matches(odd)) << schema << " on " << odd;
  }
  EXPECT_GT(checked, 20000);
}

// multipleOf (a whole number) with bounds of either kind, whole or not: the integers within them
// that it divides, written as JSON writes integers, and nothing else; a range with none of them in
// it is refused. Decided by a predicate on the integer's value.
TEST(JsonSchema, MultipleOfKeepsTheMultiplesWithinTheBounds) {
  test::Rng rng = test::make_rng();
  int checked = 0, kept = 0;
  for (int c = 0; c < 80; ++c) {
    const bool integer = c % 2 == 0;
    const std::int64_t k = c % 8 == 7 ? rng.range(900, 10000) : rng.range(1, 40);
    struct Side {
      bool present = false, exclusive = false;
      double value = 0;
    } lo, hi;
    const std::int64_t a = rng.range(-500, 500);
    lo = {rng.coin(0.6), rng.coin(0.5), static_cast<double>(a) + (rng.coin(0.3) ? 0.5 : 0)};
    hi = {rng.coin(0.6), rng.coin(0.5), static_cast<double>(a + rng.range(0, 3 * k))};
    std::string schema = str(R"({"type":")", integer ? "integer" : "number", R"(","multipleOf":)",
                             integer || rng.coin(0.5) ? str(k) : str(k, ".0"));
    if (lo.present)
      schema += str(lo.exclusive ? R"(,"exclusiveMinimum":)" : R"(,"minimum":)",
                    nlohmann::json(lo.value).dump());
    if (hi.present)
      schema += str(hi.exclusive ? R"(,"exclusiveMaximum":)" : R"(,"maximum":)",
                    nlohmann::json(hi.value).dump());
    schema += "}";
    const auto want = [&](std::int64_t n) {
      const auto x = static_cast<double>(n);
      if (lo.present && (lo.exclusive ? x <= lo.value : x < lo.value)) return false;
      if (hi.present && (hi.exclusive ? x >= hi.value : x > hi.value)) return false;
      return n % k == 0;
    };
    const std::int64_t from = a - 4 * k - 50, to = a + 8 * k + 50;
    std::string regex;
    try {
      regex = json_schema_regex(schema, "f");
    } catch (const Error& e) {
      // Past a thousand, the remainders times a bound's states may pass the automaton's bounds.
      const std::string why = e.what();
      if (k > 1000 && why == str("'f': the schema at '#': the multiples of ", k,
                                 " within its bounds are too large an automaton"))
        continue;
      ASSERT_TRUE(
          why == str("'f': the schema at '#': no multiple of ", k, " lies within its bounds") ||
          why == "'f': the schema at '#': no integer lies within its bounds")
          << schema << ": " << why;
      for (std::int64_t n = from; n <= to; ++n) ASSERT_FALSE(want(n)) << schema << " holds " << n;
      continue;
    }
    const RegexDfa dfa(regex);
    std::vector<std::int64_t> values;
    for (std::int64_t n = from; n <= to; n += k > 100 ? rng.range(1, k / 10) : 1) {
      values.push_back(n);
      values.push_back(n - n % k);  // a multiple near it
    }
    for (const std::int64_t n : values) {
      if (n == 0 && rng.coin(0.5)) continue;
      const bool w = want(n);
      ASSERT_EQ(dfa.matches(std::to_string(n)), w) << schema << " on " << n;
      kept += w;
      ++checked;
      if (w) {  // other spellings of the value are not written
        ASSERT_FALSE(dfa.matches(std::to_string(n) + ".0")) << schema << " on " << n << ".0";
        ASSERT_FALSE(dfa.matches((n < 0 ? "-0" : "0") + std::to_string(std::llabs(n))))
            << schema << " on " << n;
      }
    }
    for (const std::string& t : random_matches(dfa, rng.engine(), 20)) {
      ASSERT_TRUE(std::regex_match(t, std::regex("-?(0|[1-9][0-9]*)"))) << schema << " wrote " << t;
      if (t.size() <= 18) {
        ASSERT_TRUE(want(std::stoll(t))) << schema << " wrote " << t;
        continue;
      }
      // Past 64 bits (a side without a bound): divided digit by digit.
      std::int64_t remainder = 0;
      for (const char d : t) remainder = d == '-' ? 0 : (remainder * 10 + (d - '0')) % k;
      ASSERT_TRUE(remainder == 0 && !(t[0] == '-' ? lo.present : hi.present))
          << schema << " wrote " << t;
    }
  }
  EXPECT_GT(checked, 20000);
  EXPECT_GT(kept, 2000);
  // A multipleOf that is not a whole number, or is out of range, is refused by name.
  const auto refused = [](const char* schema) {
    try {
      json_schema_regex(schema, "f");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refused(R"({"type":"number","multipleOf":0.5})"),
            "'f': the schema at '#': 'multipleOf' 0.5 is not supported (a whole number from 1 to "
            "10000)");
  EXPECT_EQ(refused(R"({"type":"integer","multipleOf":10001})"),
            "'f': the schema at '#': 'multipleOf' 10001 is not supported (a whole number from 1 to "
            "10000)");
  for (const char* bad :
       {R"({"type":"integer","multipleOf":0})", R"({"type":"integer","multipleOf":-5})",
        R"({"type":"integer","multipleOf":"5"})"})
    EXPECT_EQ(refused(bad), "'f': the schema at '#': 'multipleOf' must be a number above 0") << bad;
  EXPECT_EQ(refused(R"({"type":"string","multipleOf":5})"),
            "'f': the schema at '#': 'multipleOf' does not apply to type 'string'");
}

// A multiple group keeps the texts of its pattern that are whole numbers its k divides: long
// digit strings (past 64 bits), signs and leading zeros, against Python's int.
TEST(RegexDfa, MultipleGroupsKeepTheWholeNumbersTheirDivisorDivides) {
  test::Rng rng = test::make_rng();
  nlohmann::json cases = nlohmann::json::array();
  for (int i = 0; i < 60; ++i) {
    const std::int64_t k = i % 6 == 5 ? rng.range(1000, 10000) : rng.range(1, 60);
    nlohmann::json texts = nlohmann::json::array();
    for (int j = 0; j < 200; ++j) {
      std::string t = rng.coin(0.3) ? "-" : "";
      for (std::int64_t n = rng.range(1, 30); n > 0; --n)
        t += static_cast<char>('0' + rng.range(0, 9));
      texts.push_back(t);
    }
    texts.push_back("x");
    texts.push_back("");
    texts.push_back("1.0");
    cases.push_back({k, texts});
  }
  const auto verdicts = test::python_oracle(cases, R"(import json, re, sys
cases = json.load(open(sys.argv[1]))
json.dump([[bool(re.fullmatch(r'-?[0-9]+', t)) and int(t) % k == 0 for t in texts]
           for k, texts in cases], open(sys.argv[2], 'w'))
)");
  if (!verdicts) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  int divided = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::int64_t k = cases[i][0];
    const RegexDfa dfa(str("(?multiple{", k, "}:-?[0-9]+|x)"));
    for (std::size_t j = 0; j < cases[i][1].size(); ++j) {
      const std::string t = cases[i][1][j];
      const bool want = (*verdicts)[i][j];
      divided += want;
      EXPECT_EQ(dfa.matches(t), want) << "k " << k << " on " << t;
    }
  }
  EXPECT_GT(divided, 200);
  EXPECT_EQ(
      refusal("(?multiple{0}:1)"),
      "'guided_regex': a multiple group opens with (?multiple{k}: for a whole k of 1 to 10000 "
      "at byte 11 of the pattern");
  EXPECT_EQ(
      refusal("(?multiple{5}1)"),
      "'guided_regex': a multiple group opens with (?multiple{k}: for a whole k of 1 to 10000 "
      "at byte 11 of the pattern");
  EXPECT_EQ(refusal_kind("(?multiple{7}:1|2)"), RegexError::Kind::no_text);
}

// 'enum' and 'const' with 'type': only the listed values that are of the type (an integer is a
// number with no fraction).
TEST(JsonSchema, EnumAndConstKeepToTheirType) {
  const RegexDfa units(json_schema_regex(R"({"type":"string","enum":["celsius","fahrenheit",3]})"));
  EXPECT_TRUE(units.matches(R"("celsius")"));
  EXPECT_TRUE(units.matches(R"("fahrenheit")"));
  EXPECT_FALSE(units.matches("3"));
  const RegexDfa whole(json_schema_regex(R"({"type":"integer","enum":[1,2.0,2.5,"3",null]})"));
  EXPECT_TRUE(whole.matches("1"));
  EXPECT_TRUE(whole.matches("2.0"));
  for (const char* no : {"2.5", R"("3")", "null", "3"}) EXPECT_FALSE(whole.matches(no)) << no;
  const RegexDfa either(json_schema_regex(R"({"type":["string","null"],"enum":["a",null,1]})"));
  EXPECT_TRUE(either.matches(R"("a")"));
  EXPECT_TRUE(either.matches("null"));
  EXPECT_FALSE(either.matches("1"));
  EXPECT_TRUE(RegexDfa(json_schema_regex(R"({"type":"boolean","const":true})")).matches("true"));
  // allOf of one schema is that schema (Pydantic's form of a described $ref).
  const RegexDfa wrapped(json_schema_regex(
      R"({"$defs":{"U":{"enum":["c","f"]}},"type":"object","properties":{"u":{"allOf":[{"$ref":"#/$defs/U"}],"description":"unit"}},"required":["u"]})"));
  EXPECT_TRUE(wrapped.matches(R"({"u": "c"})"));
  EXPECT_FALSE(wrapped.matches(R"({"u": "k"})"));
}

// A random JSON value: every kind of scalar (strings with escapes, control characters and
// UTF-8), and arrays and objects nesting up to `levels` deep (`deep`: containers down a first
// branch).
nlohmann::ordered_json random_json(test::Rng& rng, int levels, bool deep = false) {
  using J = nlohmann::ordered_json;
  const auto text = [&] {
    static const char* const kPieces[] = {"a",  "Zq",   " ",        "\"",   "\\",
                                          "\n", "\x01", "\xC3\xA9", "\x7F", "\xF0\x9F\x98\x80",
                                          "}",  "[",    ",",        ":"};
    std::string t;
    for (int n = static_cast<int>(rng.range(0, 4)); n > 0; --n)
      t += kPieces[rng.range(0, std::size(kPieces) - 1)];
    return t;
  };
  switch (levels == 0 ? rng.range(0, 5) : deep ? rng.range(6, 7) : rng.range(0, 7)) {
    case 0: return nullptr;
    case 1: return rng.coin();
    case 2: return rng.range(-100000, 100000);
    case 3: return static_cast<double>(rng.uniform(-1e3f, 1e3f));
    case 4:
    case 5: return text();
    case 6: {
      J a = J::array();
      for (int n = static_cast<int>(rng.range(deep, 3)); n > 0; --n)
        a.push_back(random_json(rng, levels - 1, deep && a.empty()));
      return a;
    }
    default: {
      J o = J::object();
      for (int n = static_cast<int>(rng.range(deep, 3)); n > 0; --n) {
        const bool first = o.empty();
        o[text()] = random_json(rng, levels - 1, deep && first);
      }
      return o;
    }
  }
}

// How many levels of arrays and objects a value holds (an empty one is a level).
int levels_of(const nlohmann::ordered_json& v) {
  int inner = 0;
  if (!v.is_structured()) return 0;
  for (const auto& x : v) inner = std::max(inner, levels_of(x));
  return 1 + inner;
}

// As json.dumps writes it: ", " between members, ": " after names.
std::string spaced(const nlohmann::ordered_json& v) {
  if (!v.is_structured()) return v.dump();
  std::string out = v.is_array() ? "[" : "{";
  bool first = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    out += first ? "" : ", ";
    first = false;
    if (v.is_object()) out += nlohmann::ordered_json(it.key()).dump() + ": ";
    out += spaced(*it);
  }
  return out + (v.is_array() ? "]" : "}");
}

// `text` parsed by nlohmann, a parser written apart from the schema compiler; nullopt for a
// number past a double's range, which JSON's grammar allows (1e400) and nlohmann refuses. Any
// other failure fails the test.
std::optional<nlohmann::ordered_json> parsed(const std::string& text) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::out_of_range&) {
    return std::nullopt;
  } catch (const nlohmann::json::exception& e) {
    ADD_FAILURE() << "not JSON: " << text << ": " << e.what();
    return std::nullopt;
  }
}

// A value the schema leaves free ({}, true, an object or array with nothing said of its members)
// is any JSON value nested at most kFreeFormNesting levels, itself included: random values of
// every kind and up to one level deeper match exactly when they are of the kind and within the
// bound, compact or spaced; random texts of the automaton are such values (nlohmann parses them).
TEST(JsonSchema, FreeValuesAreAnyJsonNestedWithinTheBound) {
  test::Rng rng = test::make_rng();
  using J = nlohmann::ordered_json;
  struct Case {
    const char* schema;
    bool (*admits)(const J&);
  };
  const Case cases[] = {
      {"{}", [](const J&) { return true; }},
      {"true", [](const J&) { return true; }},
      {R"({"description": "anything", "title": "Any"})", [](const J&) { return true; }},
      {R"({"type": "object"})", [](const J& v) { return v.is_object(); }},
      {R"({"type": "object", "additionalProperties": true})",
       [](const J& v) { return v.is_object(); }},
      {R"({"type": "array"})", [](const J& v) { return v.is_array(); }},
      {R"({"type": ["object", "null"]})", [](const J& v) { return v.is_object() || v.is_null(); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema);
    const RegexDfa dfa(json_schema_regex(c.schema));
    int matched = 0, too_deep = 0;
    for (int i = 0; i < 600; ++i) {
      const J v =
          random_json(rng, static_cast<int>(rng.range(0, kFreeFormNesting + 1)), rng.coin());
      const bool expected = c.admits(v) && levels_of(v) <= kFreeFormNesting;
      EXPECT_EQ(dfa.matches(v.dump()), expected) << v.dump();
      EXPECT_EQ(dfa.matches(spaced(v)), expected) << spaced(v);
      matched += expected;
      too_deep += c.admits(v) && !expected;
    }
    EXPECT_GT(matched, 20);
    EXPECT_GT(too_deep, 5);
    for (const std::string& t : random_matches(dfa, rng.engine(), 200)) {
      const std::optional<J> v = parsed(t);
      if (!v) continue;
      EXPECT_TRUE(c.admits(*v)) << t;
      EXPECT_LE(levels_of(*v), kFreeFormNesting) << t;
    }
  }
  // The bound is the free value's own: typed containers around it do not count.
  const RegexDfa inside(json_schema_regex(
      R"({"type": "object", "properties": {"meta": {}, "list": {"type": "array", "items": {"type": "array"}}}, "required": ["meta"]})"));
  EXPECT_TRUE(inside.matches(R"({"meta": {"a": [[1]]}})"));
  EXPECT_FALSE(inside.matches(R"({"meta": {"a": [[[1]]]}})"));
  EXPECT_TRUE(inside.matches(R"({"meta": 1, "list": [[[{"b": 1}]], []]})"));
  EXPECT_FALSE(inside.matches(R"({"meta": 1, "list": [[[{"b": []}]]]})"));
  // A surrogate escape only in a pair, which is one character to the length bounds.
  const RegexDfa any(json_schema_regex("{}")),
      one(json_schema_regex(R"({"type": "string", "maxLength": 1})"));
  for (const char* pair : {R"("\ud83d\ude00")", R"("\uD800\uDFFF")", R"("\uDBFF\udc00")"}) {
    EXPECT_TRUE(any.matches(pair)) << pair;
    EXPECT_TRUE(one.matches(pair)) << pair;
  }
  for (const char* alone : {R"("\ud83d")", R"("\ude00\ud83d")", R"("\udc00")", R"("\ud800x")",
                            R"("\ud800\u0041")", R"("\ud800\ud800")"})
    EXPECT_FALSE(any.matches(alone)) << alone;
  EXPECT_TRUE(any.matches(R"("\ud7ff\ue000\uffff\u0000")"));
}

// The keywords of the maps and tuples below, read as JSON Schema reads them (written apart from
// the compiler): 'type', 'minimum', 'enum', 'items', 'prefixItems', 'additionalProperties',
// 'minItems'/'maxItems', 'minProperties'/'maxProperties'.
bool schema_admits(const nlohmann::ordered_json& v, const nlohmann::ordered_json& s) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end())
    return false;
  const std::string type =
      s.value("type", s.contains("prefixItems") || s.contains("items") ? "array" : "object");
  if (type == "integer") {  // a number with no fraction: past 2^64 nlohmann holds it as a double
    if (!v.is_number()) return false;
    const double x = v.get<double>();
    return x == std::floor(x) && x >= s.value("minimum", -1e300);
  }
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "array") {
    if (!v.is_array() || v.size() < s.value("minItems", 0u) ||
        v.size() > s.value("maxItems", 1000u))
      return false;
    const std::size_t listed = s.contains("prefixItems") ? s["prefixItems"].size() : 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const nlohmann::ordered_json& under =
          i < listed ? s["prefixItems"][i] : s.value("items", nlohmann::ordered_json(true));
      if (!schema_admits(v[i], under)) return false;
    }
    return true;
  }
  if (!v.is_object() || v.size() < s.value("minProperties", 0u) ||
      v.size() > s.value("maxProperties", 1000u))
    return false;
  for (const auto& [name, x] : v.items())
    if (!schema_admits(x, s.value("additionalProperties", nlohmann::ordered_json(true))))
      return false;
  return true;
}

// 1500 random candidates match `dfa` exactly when `written` holds of them, compact and spaced
// (some do); 200 random texts of the automaton that parse are written values.
void expect_writes_exactly(const RegexDfa& dfa, test::Rng& rng,
                           const std::function<nlohmann::ordered_json()>& candidate,
                           const std::function<bool(const nlohmann::ordered_json&)>& written) {
  int matched = 0;
  for (int i = 0; i < 1500; ++i) {
    const nlohmann::ordered_json v = candidate();
    const bool expected = written(v);
    EXPECT_EQ(dfa.matches(v.dump()), expected) << v.dump();
    EXPECT_EQ(dfa.matches(spaced(v)), expected) << spaced(v);
    matched += expected;
  }
  EXPECT_GT(matched, 0);
  for (const std::string& t : random_matches(dfa, rng.engine(), 200)) {
    const std::optional<nlohmann::ordered_json> v = parsed(t);
    if (v) {
      EXPECT_TRUE(written(*v)) << t;
    }
  }
}

// What compiling `schema` as response_format's schema says when it is refused; "" when it compiles.
std::string schema_refusal(const std::string& schema) {
  try {
    json_schema_regex(schema, "response_format");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Objects without 'properties' hold any names with values under 'additionalProperties', and
// tuples their 'prefixItems' then 'items': random candidates match exactly when valid (and, for
// a tuple whose 'items' is absent, when holding no more than 'prefixItems' lists or 'minItems'
// asks: the subset written), compact or spaced; random texts of each automaton are valid.
TEST(JsonSchema, MapsAndTuplesHoldTheirMembersUnderTheirSchemas) {
  test::Rng rng = test::make_rng();
  using J = nlohmann::ordered_json;
  const char* const kSchemas[] = {
      R"({"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}})",
      R"({"type": "object", "additionalProperties": {"type": "string", "enum": ["x", "y"]}, "minProperties": 1, "maxProperties": 2})",
      R"({"type": "object", "additionalProperties": false})",
      R"({"additionalProperties": {"type": "array", "items": {"type": "boolean"}}, "maxProperties": 0})",
      R"({"additionalProperties": {"type": "array", "items": {"type": "boolean"}}})",
      R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string", "enum": ["a", "b"]}]})",
      R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string", "enum": ["a", "b"]}], "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4})",
      R"({"prefixItems": [{"type": "integer"}, {"type": "string", "enum": ["a", "b"]}], "items": false, "minItems": 2})",
      R"({"prefixItems": [{"type": "integer"}, {"type": "string", "enum": ["a", "b"]}], "minItems": 3})",
      R"({"prefixItems": [{"type": "integer"}, {"type": "boolean"}, {"type": "boolean"}], "maxItems": 1})",
      R"({"type": "array", "items": false})",
      R"({"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 3})",
  };
  const J pool =
      J::parse(R"([0, 5, -1, "x", "y", "a", "b", true, false, null, [true, false], [], [1]])");
  for (const char* text : kSchemas) {
    SCOPED_TRACE(text);
    const J schema = J::parse(text);
    const RegexDfa dfa(json_schema_regex(text));
    const bool tuple = schema.contains("prefixItems");
    const std::size_t listed = tuple ? schema["prefixItems"].size() : 0;
    const bool extra =
        schema.contains("items") ? schema["items"] != false : schema.value("minItems", 0u) > listed;
    int matched = 0;
    for (int i = 0; i < 1500; ++i) {
      J v = tuple || schema.value("type", "") == "array" ? J::array() : J::object();
      for (int n = static_cast<int>(rng.range(0, 5)); n > 0; --n) {
        // Half the time a whole number, which most of the member schemas ask for.
        const J& x = pool[rng.coin() ? rng.range(0, 2) : rng.range(0, pool.size() - 1)];
        if (v.is_array())
          v.push_back(x);
        else
          v[str("k", rng.range(0, 9))] = x;
      }
      const bool written = !tuple || v.size() <= listed || extra;
      const bool expected = schema_admits(v, schema) && written;
      EXPECT_EQ(dfa.matches(v.dump()), expected) << v.dump();
      EXPECT_EQ(dfa.matches(spaced(v)), expected) << spaced(v);
      matched += expected;
    }
    EXPECT_GT(matched, 0);
    for (const std::string& t : random_matches(dfa, rng.engine(), 200)) {
      const std::optional<J> v = parsed(t);
      if (v) {
        EXPECT_TRUE(schema_admits(*v, schema)) << t;
      }
    }
  }
}

// A map's names follow 'propertyNames' (Pydantic's dict keyed by an enum, msgspec's by a pattern)
// or the one pattern of 'patternProperties' (Pydantic's dict keyed by a constr), whose values
// follow its schema: random candidates match exactly when valid and written (no name outside the
// pattern is), compact or spaced; random texts of each automaton are valid. Checked with
// std::regex and predicates written here.
TEST(JsonSchema, MapNamesFollowPropertyNamesAndPatternProperties) {
  test::Rng rng = test::make_rng();
  using J = nlohmann::ordered_json;
  const auto natural = [](const J& x) {  // past 2^64 nlohmann holds a whole number as a double
    return x.is_number() && x.get<double>() == std::floor(x.get<double>()) && x.get<double>() >= 0;
  };
  const auto boolean = [](const J& x) { return x.is_boolean(); };
  const auto any = [](const J&) { return true; };
  const auto color = [](const std::string& n) { return n == "red" || n == "green"; };
  const auto k_to = [](char last) {
    return [last](const std::string& n) {
      return std::regex_match(n, std::regex(str("k[0-", last, "]")));
    };
  };
  struct Case {
    const char* schema;
    std::function<bool(const std::string&)> name;
    std::function<bool(const J&)> value;
    std::size_t lo, hi;
  };
  const std::vector<Case> cases = {
      {R"({"type": "object", "propertyNames": {"enum": ["red", "green"]}, "additionalProperties": {"type": "integer", "minimum": 0}})",
       color, natural, 0, 99},
      {R"({"$defs": {"Color": {"enum": ["red", "green"], "type": "string", "title": "Color"}}, "type": "object", "propertyNames": {"$ref": "#/$defs/Color"}, "additionalProperties": {"type": "integer", "minimum": 0}})",
       color, natural, 0, 99},
      {R"({"type": "object", "propertyNames": {"pattern": "^k[0-3]$"}, "additionalProperties": {"type": "boolean"}, "maxProperties": 2})",
       k_to('3'), boolean, 0, 2},
      {R"({"propertyNames": {"maxLength": 2}, "additionalProperties": {"type": "boolean"}})",
       [](const std::string& n) {  // characters: UTF-8 lead bytes
         return std::count_if(n.begin(), n.end(), [](char b) { return (b & 0xC0) != 0x80; }) <= 2;
       },
       boolean, 0, 99},
      {R"({"propertyNames": true})", [](const std::string&) { return true; }, any, 0, 99},
      {R"({"type": "object", "patternProperties": {"^k[0-5]$": {"type": "integer", "minimum": 0}}})",
       k_to('5'), natural, 0, 99},
      {R"({"type": "object", "patternProperties": {"^k[0-5]$": {"type": "boolean"}}, "additionalProperties": false, "minProperties": 1})",
       k_to('5'), boolean, 1, 99},
  };
  const J pool = J::parse(R"([0, 5, -1, "x", true, false, null, [true], {}])");
  const std::vector<std::string> names = {"red", "green", "blue", "k0", "k3", "k4", "k7", "x", ""};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema);
    const RegexDfa dfa(json_schema_regex(c.schema));
    const auto candidate = [&] {
      J v = J::object();
      for (int n = static_cast<int>(rng.range(0, 3)); n > 0; --n)
        v[names[rng.range(0, names.size() - 1)]] = pool[rng.range(0, pool.size() - 1)];
      return v;
    };
    expect_writes_exactly(dfa, rng, candidate, [&](const J& v) {
      if (!v.is_object() || v.size() < c.lo || v.size() > c.hi) return false;
      for (const auto& [n, x] : v.items())
        if (!c.name(n) || !c.value(x)) return false;
      return true;
    });
  }
  const auto& refusal = schema_refusal;
  EXPECT_EQ(refusal(R"({"propertyNames": {"enum": [1, "a"]}})"),
            "'response_format': the schema at '#/propertyNames': 'propertyNames' admits values "
            "other than "
            "strings, which no name is");
  EXPECT_EQ(refusal(R"({"patternProperties": {"^a$": {}, "^b$": {}}})"),
            "'response_format': the schema at '#': 'patternProperties' is supported with one "
            "pattern only");
  EXPECT_EQ(refusal(R"({"patternProperties": {"^a$": {}}, "propertyNames": {"maxLength": 1}})"),
            "'response_format': the schema at '#': 'propertyNames' and 'patternProperties' are not "
            "supported "
            "together");
  EXPECT_EQ(
      refusal(R"({"properties": {"a": {}}, "propertyNames": {"maxLength": 1}})"),
      "'response_format': the schema at '#': 'propertyNames' and 'patternProperties' are supported "
      "without 'properties' only");
  EXPECT_EQ(refusal(R"({"patternProperties": {"^a$": false}})"),
            "'response_format': the schema at '#/patternProperties/^a$': the schema false admits "
            "no value");
}

// uniqueItems over listed values (Pydantic's set[SomeEnum]): each value at most once, in the
// list's order (the subset written); false, or at most one item, constrains nothing more. Random
// candidates match exactly when valid and written, random texts of each automaton are valid.
TEST(JsonSchema, UniqueItemsAreListedValuesEachWrittenOnce) {
  test::Rng rng = test::make_rng();
  using J = nlohmann::ordered_json;
  struct Case {
    const char* schema;
    std::vector<J> values;  // the items allowed, in the order written; empty: any string
    bool unique;
    std::size_t lo, hi;
  };
  const std::vector<Case> cases = {
      {R"({"type": "array", "items": {"enum": ["red", "green", "blue"]}, "uniqueItems": true})",
       {"red", "green", "blue"},
       true,
       0,
       99},
      {R"({"$defs": {"Color": {"enum": ["red", "green"], "type": "string"}}, "type": "array", "items": {"$ref": "#/$defs/Color"}, "uniqueItems": true, "minItems": 1})",
       {"red", "green"},
       true,
       1,
       99},
      {R"({"items": {"enum": [1, 1.0, 2, "a"], "type": "integer"}, "uniqueItems": true})",
       {1, 2},
       true,
       0,
       99},
      {R"({"type": "array", "items": {"type": "string"}, "uniqueItems": false, "maxItems": 3})",
       {},
       false,
       0,
       3},
      {R"({"type": "array", "items": {"type": "string"}, "uniqueItems": true, "maxItems": 1})",
       {},
       true,
       0,
       1},
  };
  const J pool = J::parse(R"(["red", "green", "blue", "x", 1, 2, 3, true])");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.schema);
    const RegexDfa dfa(json_schema_regex(c.schema));
    // Valid, and in the order written when the values are listed.
    const auto written = [&](const J& v) {
      if (!v.is_array() || v.size() < c.lo || v.size() > c.hi) return false;
      std::ptrdiff_t last = -1;
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (c.unique)
          for (std::size_t j = 0; j < i; ++j)
            if (v[i] == v[j]) return false;
        if (c.values.empty()) {
          if (!v[i].is_string()) return false;
          continue;
        }
        const auto at = std::find(c.values.begin(), c.values.end(), v[i]);
        if (at == c.values.end() || at - c.values.begin() <= last) return false;
        last = at - c.values.begin();
      }
      return true;
    };
    const auto candidate = [&] {
      J v = J::array();
      for (int n = static_cast<int>(rng.range(0, 4)); n > 0; --n)
        v.push_back(pool[rng.range(0, pool.size() - 1)]);
      return v;
    };
    expect_writes_exactly(dfa, rng, candidate, written);
  }
  const auto& refusal = schema_refusal;
  EXPECT_EQ(refusal(R"({"type": "array", "items": {"type": "string"}, "uniqueItems": true})"),
            "'response_format': the schema at '#': 'uniqueItems' is supported for items listed by "
            "'enum' or "
            "'const', or at most one item, only (a regex cannot remember which items it wrote)");
  EXPECT_EQ(refusal(R"({"items": {"enum": ["a", "b"]}, "uniqueItems": true, "minItems": 2})"),
            "'response_format': the schema at '#': 'uniqueItems' is supported with 'minItems' of 0 "
            "or 1 and no "
            "'maxItems' below the number of values only");
  EXPECT_EQ(
      refusal(R"({"items": {"enum": ["a", "b"]}, "uniqueItems": true, "minItems": 3})"),
      "'response_format': the schema at '#': 'minItems' asks for more than the 2 distinct items");
  EXPECT_EQ(refusal(R"({"items": {"enum": [[1], [2]]}, "uniqueItems": true})"),
            "'response_format': the schema at '#': 'uniqueItems' is supported for items of scalar "
            "values only");
  EXPECT_EQ(refusal(R"({"items": {"const": "a"}, "uniqueItems": 1})"),
            "'response_format': the schema at '#': 'uniqueItems' must be true or false");
  EXPECT_EQ(refusal(R"({"prefixItems": [{"const": "a"}], "uniqueItems": true})"),
            "'response_format': the schema at '#': 'uniqueItems' is supported for items listed by "
            "'enum' or "
            "'const', or at most one item, only (a regex cannot remember which items it wrote)");
}

// A tree node of the schema below as parsed: its depth in levels of nodes, or -1 when it is not
// one (checked apart from the compiler).
int node_depth(const nlohmann::ordered_json& v) {
  if (!v.is_object() || v.size() != 2 || !v.contains("name") || !v["name"].is_string() ||
      !v.contains("children") || !v["children"].is_array() || v["children"].size() > 2)
    return -1;
  const std::string name = v["name"].get<std::string>();
  if (std::count_if(name.begin(), name.end(), [](char c) { return (c & 0xC0) != 0x80; }) > 3)
    return -1;  // more than 3 characters (UTF-8 lead bytes)
  int deepest = 0;
  for (const auto& c : v["children"]) {
    const int d = node_depth(c);
    if (d < 0) return -1;
    deepest = std::max(deepest, d);
  }
  return 1 + deepest;
}

// A recursive definition is written down to kMaxRecursion levels of itself, the deepest taking
// the alternatives that end: trees and lists of every depth match exactly when within the bound
// (compact and spaced), random texts of the automaton are such trees, and a definition that
// cannot end is refused as a schema that admits no value.
TEST(JsonSchema, RecursiveDefinitionsNestToTheBound) {
  test::Rng rng = test::make_rng();
  using J = nlohmann::ordered_json;
  const RegexDfa tree(json_schema_regex(
      R"({"$defs": {"Node": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 3}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 2}}, "required": ["name", "children"]}}, "$ref": "#/$defs/Node"})"));
  std::function<J(int)> make = [&](int depth) {  // exactly `depth` levels, down a first branch
    J node = {{"name", std::string(static_cast<std::size_t>(rng.range(0, 3)), 'x')},
              {"children", J::array()}};
    if (depth > 1) {
      for (int i = 0, n = static_cast<int>(rng.range(1, 2)); i < n; ++i)
        node["children"].push_back(
            make(i == 0 ? depth - 1 : static_cast<int>(rng.range(1, depth - 1))));
    }
    return node;
  };
  for (int depth = 1; depth <= kMaxRecursion + 2; ++depth) {
    for (int i = 0; i < 20; ++i) {
      const J v = make(depth);
      ASSERT_EQ(node_depth(v), depth);
      EXPECT_EQ(tree.matches(v.dump()), depth <= kMaxRecursion) << v.dump();
      EXPECT_EQ(tree.matches(spaced(v)), depth <= kMaxRecursion) << spaced(v);
    }
  }
  std::set<int> depths;
  for (const std::string& t : random_matches(tree, rng.engine(), 300)) {
    const std::optional<J> v = parsed(t);
    ASSERT_TRUE(v) << t;
    const int d = node_depth(*v);
    EXPECT_GE(d, 1) << t;
    EXPECT_LE(d, kMaxRecursion) << t;
    depths.insert(d);
  }
  EXPECT_GE(depths.size(), 2u);
  // A list through the root: its tail another list or null.
  const RegexDfa list(json_schema_regex(
      R"({"type": "object", "properties": {"value": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["value", "next"]})"));
  for (int n = 1; n <= kMaxRecursion + 2; ++n) {
    J v = nullptr;
    for (int i = 0; i < n; ++i) v = J{{"value", i}, {"next", v}};
    EXPECT_EQ(list.matches(v.dump()), n <= kMaxRecursion) << v.dump();
  }
  // Branches that are optional properties: left out at the deepest level.
  const RegexDfa branches(json_schema_regex(
      R"({"type": "object", "properties": {"v": {"type": "integer"}, "left": {"$ref": "#"}, "right": {"$ref": "#"}}, "required": ["v"]})"));
  std::string chain = R"({"v":0})";
  for (int n = 2; n <= kMaxRecursion + 1; ++n) {
    chain = R"({"v":0,"right":)" + chain + "}";
    EXPECT_EQ(branches.matches(chain), n <= kMaxRecursion) << chain;
  }
  EXPECT_TRUE(
      branches.matches(R"({"v":1,"left":{"v":2,"left":{"v":3},"right":{"v":4}},"right":{"v":5}})"));
  // A property that requires its own definition never ends.
  try {
    json_schema_regex(R"({"type":"object","properties":{"next":{"$ref":"#"}},"required":["next"]})",
                      "response_format");
    ADD_FAILURE() << "a schema with no finite value was compiled";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              str("'response_format': the schema admits no value: a recursive '$ref' has no way "
                  "to end within ",
                  kMaxRecursion, " levels"));
  }
}

// oneOf whose schemas no value can satisfy two of is written as anyOf, so that exactly one holds:
// Pydantic's discriminated unions (a required property's 'const' or enum of one differs), schemas
// of different types, different single values. One whose schemas may overlap is refused, naming
// the two; random texts of the union satisfy exactly one of its schemas (checked apart).
TEST(JsonSchema, OneOfIsWrittenWhereItsSchemasExcludeEachOther) {
  test::Rng rng = test::make_rng();
  using J = nlohmann::ordered_json;
  const RegexDfa pets(json_schema_regex(
      R"({"$defs": {"Cat": {"properties": {"pet_type": {"const": "cat", "title": "Pet Type", "type": "string"}, "meows": {"title": "Meows", "type": "integer"}}, "required": ["pet_type", "meows"], "title": "Cat", "type": "object"}, "Dog": {"properties": {"pet_type": {"enum": ["dog"], "title": "Pet Type", "type": "string"}, "barks": {"title": "Barks", "type": "number"}}, "required": ["pet_type", "barks"], "title": "Dog", "type": "object"}}, "properties": {"pet": {"discriminator": {"mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}, "propertyName": "pet_type"}, "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "title": "Pet"}}, "required": ["pet"], "title": "Model", "type": "object"})"));
  EXPECT_TRUE(pets.matches(R"({"pet": {"pet_type": "cat", "meows": 3}})"));
  EXPECT_TRUE(pets.matches(R"({"pet":{"pet_type":"dog","barks":1.5}})"));
  EXPECT_FALSE(pets.matches(R"({"pet": {"pet_type": "dog", "meows": 3}})"));
  EXPECT_FALSE(pets.matches(R"({"pet": {"pet_type": "cat", "barks": 1.5}})"));
  for (const std::string& t : random_matches(pets, rng.engine(), 200)) {
    const std::optional<J> v = parsed(t);
    if (!v) continue;
    const J& pet = (*v)["pet"];
    const bool cat = pet.size() == 2 && pet.value("pet_type", "") == "cat" &&
                     pet.contains("meows") && pet["meows"].is_number() &&
                     pet["meows"].get<double>() == std::floor(pet["meows"].get<double>());
    const bool dog = pet.size() == 2 && pet.value("pet_type", "") == "dog" &&
                     pet.contains("barks") && pet["barks"].is_number();
    EXPECT_NE(cat, dog) << t;
  }
  const RegexDfa mixed(json_schema_regex(
      R"({"oneOf": [{"type": "string", "maxLength": 2}, {"type": "integer"}, {"type": "null"}, {"const": true}, {"enum": [[1]]}]})"));
  for (const char* t : {"\"ab\"", "12", "null", "true", "[1]"}) EXPECT_TRUE(mixed.matches(t)) << t;
  for (const char* t : {"\"abc\"", "1.5", "false", "[2]"}) EXPECT_FALSE(mixed.matches(t)) << t;

  const auto& refusal = schema_refusal;
  const auto overlap = [](int i, int j) {
    return str("'response_format': the schema at '#': 'oneOf' schemas ", i, " and ", j,
               " may both hold for one value (supported: schemas of different types, or objects "
               "whose 'const' of a common required property differs)");
  };
  EXPECT_EQ(refusal(R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})"), overlap(0, 1));
  EXPECT_EQ(
      refusal(
          R"({"oneOf": [{"type": "null"}, {"type": "string"}, {"type": "string", "maxLength": 1}]})"),
      overlap(1, 2));
  EXPECT_EQ(refusal(R"({"oneOf": [{"const": 1}, {"const": 1.0}]})"), overlap(0, 1));
  EXPECT_EQ(refusal(R"({"oneOf": [{"type": "number"}, {"const": 2}]})"), overlap(0, 1));
  // Objects: without a common required property of differing single values, any two may overlap.
  EXPECT_EQ(
      refusal(
          R"({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "object", "properties": {"b": {"type": "integer"}}}]})"),
      overlap(0, 1));
  EXPECT_EQ(
      refusal(
          R"({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]}, {"type": "object", "properties": {"k": {"const": "b"}}}]})"),
      overlap(0, 1));
  EXPECT_EQ(
      refusal(
          R"({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]}, {"type": "object", "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"]}]})"),
      overlap(0, 1));
  EXPECT_EQ(refusal(R"({"oneOf": [{"$ref": "#/$defs/Missing"}, {"type": "null"}]})"),
            overlap(0, 1));
  EXPECT_EQ(refusal(R"({"oneOf": []})"),
            "'response_format': the schema at '#': 'oneOf' must be a non-empty list");
  EXPECT_EQ(refusal(R"({"oneOf": [{"type": "null"}], "type": "null"})"),
            "'response_format': the schema at '#': 'oneOf' with 'type' is not supported");
}

TEST(JsonSchema, RefusesWhatItCannotHonourNamingWhere) {
  // Nested objects: kMaxSchemaNesting levels compile; far more are refused, not a stack overflow.
  const auto nested = [](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += R"({"type":"object","properties":{"a":)";
    s += R"({"type":"integer"})";
    for (int i = 0; i < n; ++i) s += R"(},"required":["a"]})";
    return s;
  };
  EXPECT_NO_THROW(json_schema_regex(nested(kMaxSchemaNesting - 1)));
  for (const int n : {kMaxSchemaNesting + 1, 100000}) {  // seen compiling, and before parsing
    try {
      json_schema_regex(nested(n), "response_format");
      ADD_FAILURE() << "a schema nested " << n << " deep was compiled";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the schema nests more than 64 levels"),
                std::string::npos)
          << e.what();
    }
  }
  // Copies multiply (a list writes its item twice; recursion repeats a definition): a small
  // schema asking for a regex of gigabytes is refused, not built.
  std::string wide = R"({"type":"object","properties":{)";
  for (int i = 0; i < 12; ++i)
    wide += str(i ? "," : "", "\"p", i, R"(":{"type":"array","items":{"$ref":"#"}})");
  std::string chain = R"({"$defs":{)";
  for (int i = 0; i < 30; ++i)  // 2^30 copies of the last, within the 64 levels of nesting
    chain += str(i ? "," : "", "\"D", i, R"(":{"type":"array","items":{"$ref":"#/$defs/D)", i + 1,
                 "\"}}");
  chain += R"(,"D30":{"type":"null"}},"$ref":"#/$defs/D0"})";
  for (const std::string& big : {wide + "}}", chain}) {
    try {
      json_schema_regex(big, "response_format");
      ADD_FAILURE() << "compiled: " << big;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(str("the schema is too large (its regex passes ",
                                               kMaxSchemaRegexBytes, " bytes)")),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(json_nesting(R"({"a": "[[[\"{{"}, "b": [[1], {"c": []}]})"), 3u);
  EXPECT_EQ(json_nesting("12"), 0u);
  EXPECT_EQ(json_nesting(nested(100000)), 200001u);
  const auto& refusal = schema_refusal;
  EXPECT_EQ(refusal(R"({"type":"object","properties":{"n":{"type":"integer","multipleOf":2.5}}})"),
            "'response_format': the schema at '#/properties/n': 'multipleOf' 2.5 is not supported "
            "(a whole number from 1 to 10000)");
  EXPECT_EQ(refusal(R"({"not":{"type":"null"}})"),
            "'response_format': the schema at '#': 'not' is not supported");
  EXPECT_EQ(refusal(R"({"allOf":[{"type":"null"},{"type":"null"}]})"),
            "'response_format': the schema at '#': 'allOf' is supported with one schema only");
  EXPECT_EQ(refusal(R"({"allOf":[{"type":"null"}],"type":"null"})"),
            "'response_format': the schema at '#': 'allOf' with 'type' is not supported");
  EXPECT_EQ(refusal(R"({"$defs":{"T":{"type":"null"}},"$ref":"#/$defs/U"})"),
            "'response_format': the schema at '#': '$ref' \"#/$defs/U\" names neither the root "
            "('#') nor an entry of its $defs or definitions");
  EXPECT_EQ(refusal(R"({"$ref":"#/properties/a"})"),
            "'response_format': the schema at '#': '$ref' \"#/properties/a\" names neither the "
            "root ('#') nor an entry of its $defs or definitions");
  EXPECT_EQ(refusal("false"),
            "'response_format': the schema at '#': the schema false admits no "
            "value");
  EXPECT_EQ(refusal(R"({"type":"object","properties":{"a":{"type":"null"}},"maxProperties":1})"),
            "'response_format': the schema at '#': 'minProperties' and 'maxProperties' are "
            "supported without 'properties' only");
  EXPECT_EQ(refusal(R"({"type":"object","minProperties":2})"),
            "'response_format': the schema at '#': 'minProperties' above 1 is not supported "
            "(names may repeat)");
  EXPECT_EQ(refusal(R"({"type":"object","additionalProperties":false,"minProperties":1})"),
            "'response_format': the schema at '#': 'minProperties' asks for properties, which "
            "'additionalProperties' false forbids");
  EXPECT_EQ(refusal(R"({"type":"object","required":["a"]})"),
            "'response_format': the schema at '#': 'required' needs 'properties'");
  EXPECT_EQ(refusal(R"({"type":"object","maxProperties":0,"minProperties":1})"),
            "'response_format': the schema at '#': 'maxProperties' is below 'minProperties'");
  EXPECT_EQ(refusal(R"({"type":"object","additionalProperties":{"type":"integer","maxLength":2}})"),
            "'response_format': the schema at '#/additionalProperties': 'maxLength' does not "
            "apply to type 'integer'");
  EXPECT_EQ(refusal(R"({"type":"object","properties":[]})"),
            "'response_format': the schema at '#': 'properties' must be an object");
  EXPECT_EQ(refusal(R"({"type":"array","items":false,"minItems":1})"),
            "'response_format': the schema at '#': 'minItems' asks for items, which 'items' false "
            "forbids");
  EXPECT_EQ(refusal(R"({"type":"array","prefixItems":[]})"),
            "'response_format': the schema at '#': 'prefixItems' must be a non-empty list of "
            "schemas");
  EXPECT_EQ(refusal(R"({"prefixItems":[{"type":"null"}],"items":false,"minItems":2})"),
            "'response_format': the schema at '#': 'minItems' asks for more items than "
            "'prefixItems' lists, which 'items' false forbids");
  EXPECT_EQ(refusal(R"({"prefixItems":[{"type":"null"},{"type":"nil"}]})"),
            "'response_format': the schema at '#/prefixItems/1': type 'nil' is not a JSON Schema "
            "type");
  // Keywords of one type stand for it ({"minLength": 1} is a string); bounds of two do not.
  EXPECT_EQ(refusal(R"({"minimum":1})"),
            "'response_format': the schema at '#': a schema needs 'type' (or 'enum', 'const', "
            "'anyOf', '$ref')");
  EXPECT_TRUE(RegexDfa(json_schema_regex(R"({"minLength":1})")).matches("\"a\""));
  EXPECT_FALSE(RegexDfa(json_schema_regex(R"({"minLength":1})")).matches("\"\""));
  EXPECT_TRUE(RegexDfa(json_schema_regex(R"({"maxItems":1})")).matches("[null]"));
  EXPECT_EQ(refusal(R"({"type":"string","additionalProperties":false})"),
            "'response_format': the schema at '#': 'additionalProperties' does not apply to type "
            "'string'");
  EXPECT_EQ(refusal(R"({"type":"string","format":"iri"})"),
            "'response_format': the schema at '#': 'format' \"iri\" is not supported (date, "
            "time, date-time, duration, uuid, uuid1, uuid3-uuid8, ipv4, ipv6, ipvanyaddress, "
            "hostname, email, uri, password)");
  EXPECT_NE(refusal(R"({"type":"string","format":"uuid2"})").find("'format' \"uuid2\" is not"),
            std::string::npos);
  // Lengths beside a pattern: they must leave it a text, within the automaton's bounds.
  EXPECT_EQ(refusal(R"({"type":"string","pattern":"^[a-z]{2,5}$","minLength":6})"),
            "'response_format': the schema at '#': 'pattern' writes no text of 6 or more "
            "characters (it writes 2 to 5 characters)");
  EXPECT_EQ(
      refusal(R"({"type":"string","pattern":"^\\d{5}(-\\d{4})?$","minLength":6,"maxLength":9})"),
      "'response_format': the schema at '#': 'pattern' writes no text of 6 to 9 characters "
      "(it writes 5 to 10 characters)");
  EXPECT_EQ(refusal(R"({"type":"string","pattern":"a{3}","minLength":4,"maxLength":2})"),
            "'response_format': the schema at '#': 'maxLength' is below 'minLength'");
  EXPECT_EQ(refusal(R"({"type":"string","pattern":"a+","maxLength":100001})"),
            "'response_format': the schema at '#': 'minLength' and 'maxLength' that cut the texts "
            "of 'pattern' are supported up to 100000 (it writes 1 or more characters)");
  EXPECT_EQ(refusal(R"({"type":"string","pattern":"[ab]*a[ab]{10}","maxLength":100})"),
            "'response_format': the schema at '#': 'pattern' cut to at most 100 characters is too "
            "large an automaton (it writes 11 or more characters)");
  for (const char* fits :
       {R"({"type":"string","pattern":"^[A-Z]{3}$","minLength":3,"maxLength":3})",
        R"({"type":"string","pattern":"^\\d{5}(-\\d{4})?$","maxLength":10})",
        R"({"type":"string","pattern":"\u00e9{2}x?","minLength":2,"maxLength":3})",
        R"({"type":"string","pattern":"a+","minLength":1})",
        R"({"type":"string","pattern":"(?:ab|c){0,4}","maxLength":8})"})
    EXPECT_EQ(refusal(fits), "") << fits;
  EXPECT_EQ(refusal(R"({"type":"string","pattern":"a","format":"date"})"),
            "'response_format': the schema at '#': 'pattern' does not combine with 'format'");
  EXPECT_EQ(refusal(R"({"type":"string","format":"uuid","maxLength":-1})"),
            "'response_format': the schema at '#': 'maxLength' must be a non-negative integer");
  EXPECT_EQ(refusal(R"({"type":"integer","minimum":5,"maximum":3})"),
            "'response_format': the schema at '#': no integer lies within its bounds");
  EXPECT_EQ(refusal(R"({"type":"integer","minimum":0.2,"maximum":0.8})"),
            "'response_format': the schema at '#': no integer lies within its bounds");
  EXPECT_EQ(refusal(R"({"type":"number","exclusiveMinimum":1,"maximum":1})"),
            "'response_format': the schema at '#': no number lies within its bounds");
  EXPECT_EQ(refusal(R"({"type":"number","minimum":0.5})"),
            "'response_format': the schema at '#': 'minimum' 0.5 is not a whole number, which a "
            "bound of type 'number' must be");
  EXPECT_EQ(refusal(R"({"type":"integer","minimum":0,"exclusiveMinimum":true})"),
            "'response_format': the schema at '#': 'exclusiveMinimum' must be a number (draft "
            "4's true/false form is not read)");
  EXPECT_EQ(refusal(R"({"type":"integer","maximum":1e16})"),
            "'response_format': the schema at '#': 'maximum' must be within +-2^53");
  EXPECT_EQ(refusal(R"({"type":"string","minimum":1})"),
            "'response_format': the schema at '#': 'minimum' does not apply to type 'string'");
  EXPECT_EQ(refusal(R"({"type":"string","enum":[1,2]})"),
            "'response_format': the schema at '#': no value of 'enum' is of its 'type'");
  EXPECT_EQ(refusal(R"({"type":"string","const":1})"),
            "'response_format': the schema at '#': 'const' 1 is not of its 'type'");
  EXPECT_EQ(refusal(R"({"type":"string","enum":["a"],"minLength":1})"),
            "'response_format': the schema at '#': 'enum' with 'minLength' is not supported");
  EXPECT_EQ(refusal(R"({"type":"integer","maxLength":3})"),
            "'response_format': the schema at '#': 'maxLength' does not apply to type 'integer'");
  EXPECT_NE(refusal("{").find("the schema is not JSON"), std::string::npos);
  EXPECT_EQ(refusal(R"({"type":"string","pattern":"(a"})"),
            "'response_format' pattern at '#': missing ')' at byte 2 of the pattern");
}

// A finite language written out whole, so the allowed tokens follow from its prefixes alone.
const std::vector<std::string> kYesNoMaybe = [] {
  std::vector<std::string> all;
  for (const char* word : {"yes", "no", "maybe"})
    for (const char* bang : {"!", "!!", "!!!"}) all.push_back(std::string(word) + bang);
  return all;
}();
constexpr const char* kYesNoMaybePattern = "(yes|no|maybe)!{1,3}";

bool viable(const std::string& text) {  // a prefix of some word of the language
  return std::any_of(kYesNoMaybe.begin(), kYesNoMaybe.end(),
                     [&](const std::string& w) { return w.compare(0, text.size(), text) == 0; });
}
bool complete(const std::string& text) {
  return std::find(kYesNoMaybe.begin(), kYesNoMaybe.end(), text) != kYesNoMaybe.end();
}

// Pieces of the language's words at random ids among junk (no '#' anywhere) and special tokens.
std::shared_ptr<const GuideVocabulary> test_vocabulary(int vocab, std::mt19937_64& rng,
                                                       std::vector<std::int32_t>& specials) {
  std::vector<std::optional<std::string>> texts(static_cast<std::size_t>(vocab));
  const std::string junk = "xqzYe so!ab";
  for (auto& t : texts) {
    std::string s;
    for (int n = 1 + static_cast<int>(rng() % 4); n > 0; --n) s += junk[rng() % junk.size()];
    t = s;
  }
  std::vector<std::int32_t> ids(static_cast<std::size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::size_t next = 0;
  for (const char* piece :
       {"y",  "e",   "s",  "n",     "o",  "m",  "a",   "b",  "!",   "ye",     "yes",
        "no", "may", "be", "maybe", "s!", "!!", "!!!", "o!", "e!!", "yes!!!!"})
    texts[static_cast<std::size_t>(ids[next++])] = piece;
  for (int k = 0; k < 3; ++k) {
    specials.push_back(ids[next]);
    texts[static_cast<std::size_t>(ids[next++])].reset();
  }
  return std::make_shared<const GuideVocabulary>(texts);
}

TEST(TokenGuide, AllowsExactlyTheTokensThatKeepAPrefixOfAMatch) {
  std::mt19937_64 rng(7);
  std::vector<std::int32_t> specials;
  const auto vocab = test_vocabulary(320, rng, specials);
  TokenGuide guide(std::make_shared<const RegexDfa>(kYesNoMaybePattern), vocab);
  // Every prefix of every word, and texts that are not prefixes.
  std::vector<std::string> texts{"", "x", "yes!!!", "nob"};
  for (const std::string& w : kYesNoMaybe)
    for (std::size_t n = 0; n <= w.size(); ++n) texts.push_back(w.substr(0, n));
  for (const std::string& text : texts) {
    // Spell the text with single-character tokens where it can be reached.
    std::vector<std::int32_t> output;
    bool spelled = true;
    for (char ch : text) {
      std::int32_t id = -1;
      for (std::int32_t t = 0; t < vocab->size() && id < 0; ++t)
        if (vocab->writable(t) && vocab->bytes(t) == std::string(1, ch)) id = t;
      if (id < 0) spelled = false;
      output.push_back(id);
    }
    if (!spelled) continue;
    const std::optional<std::int32_t> state = guide.state_after(output);
    ASSERT_EQ(state.has_value(), viable(text)) << "'" << text << "'";
    if (!state) continue;
    EXPECT_EQ(guide.grammar().accepting(*state), complete(text)) << "'" << text << "'";
    std::vector<std::int32_t> want;
    for (std::int32_t t = 0; t < vocab->size(); ++t)
      if (vocab->writable(t) && viable(text + std::string(vocab->bytes(t)))) want.push_back(t);
    EXPECT_EQ(guide.allowed(*state), want) << "'" << text << "'";
  }
  // A special token leaves the language; so does a token past a match nothing extends.
  EXPECT_FALSE(guide.state_after(std::vector<std::int32_t>{specials[0]}).has_value());
}

// A reply whose every step is a new state (a counted repetition) asks for a new set each step:
// the kept sets stay within their bound, and a set asked again after they were dropped is the
// same.
TEST(TokenGuide, KeepsItsAllowedSetsWithinABound) {
  std::vector<std::optional<std::string>> texts;
  for (int i = 0; i < 65536; ++i)
    texts.push_back(std::string(1 + i % 3, static_cast<char>('a' + i % 26)));
  const auto vocab = std::make_shared<const GuideVocabulary>(texts);
  TokenGuide guide(std::make_shared<const RegexDfa>("[a-z]{0,300}"), vocab);
  const std::vector<std::int32_t> first = guide.allowed(guide.grammar().start());
  EXPECT_EQ(first.size(), texts.size());
  std::size_t most = 0;
  for (int n = 0; n < 100; ++n) {
    const std::int32_t s = guide.grammar().walk(guide.grammar().start(), std::string(n, 'q'));
    EXPECT_EQ(guide.allowed(s).size(), texts.size()) << n;
    most = std::max(most, guide.cached_ids());
  }
  EXPECT_LE(most, TokenGuide::kMaxCachedIds);
  EXPECT_GT(most, TokenGuide::kMaxCachedIds / 2);
  EXPECT_EQ(guide.allowed(guide.grammar().start()), first);
  const std::int32_t late = guide.grammar().walk(guide.grammar().start(), std::string(299, 'q'));
  EXPECT_EQ(guide.allowed(late).size(), 65536u / 3 + 1);  // only one-letter tokens fit
}

// A vocabulary grown as BPE grows one: each token an earlier one plus a piece of `alphabet`, so
// tokens share prefixes at every depth; with repeated bytes under two ids, ids that write nothing,
// an empty token, and a few long tokens.
std::vector<std::optional<std::string>> grown_vocabulary(const std::vector<std::string>& alphabet,
                                                         int size, test::Rng& rng) {
  std::vector<std::optional<std::string>> texts;
  const auto piece = [&] {
    return alphabet[static_cast<std::size_t>(
        rng.range(0, static_cast<std::int64_t>(alphabet.size()) - 1))];
  };
  while (static_cast<int>(texts.size()) < size) {
    const std::int64_t kind = rng.range(0, 99);
    if (kind < 4) {
      texts.emplace_back();  // writes nothing
    } else if (kind < 5) {
      texts.emplace_back("");
    } else if (kind < 8 && !texts.empty()) {
      texts.push_back(texts[static_cast<std::size_t>(
          rng.range(0, static_cast<std::int64_t>(texts.size()) - 1))]);  // the same bytes again
    } else if (kind < 10) {
      std::string t;
      for (std::int64_t n = rng.range(10, 40); n > 0; --n) t += piece();
      texts.push_back(t);
    } else if (kind < 60 && !texts.empty()) {
      const auto& base = texts[static_cast<std::size_t>(
          rng.range(0, static_cast<std::int64_t>(texts.size()) - 1))];
      texts.push_back(base.value_or("") + piece());
    } else {
      texts.push_back(piece());
    }
  }
  return texts;
}

// The guide walks the vocabulary in byte order, sharing prefixes: at every state a random walk
// reaches, it allows exactly the tokens whose bytes, each walked alone from that state, stay live;
// for random regexes, JSON and a grammar over vocabularies of up to 3000 tokens.
TEST(TokenGuide, WalkInByteOrderAllowsWhatEachTokenWalkedAloneAllows) {
  test::Rng rng = test::make_rng();
  PatternMaker maker(rng.engine());
  const std::vector<std::string> pattern_alphabet = {"a", "b", "c",  "0", "7", " ",    "_",
                                                     "é", "€", "\n", "-", "Z", "\xc3", "\xff"};
  const std::vector<std::string> json_alphabet = {"{",  "}", "[", "]", "\"",   ":",    ",",
                                                  " ",  "a", "1", "0", "e",    ".",    "-",
                                                  "\\", "u", "é", "n", "true", "null", "\n"};
  int grammars = 0, states = 0;
  for (int i = 0; i < 90; ++i) {
    std::shared_ptr<const ByteGrammar> grammar;
    std::vector<std::string> alphabet = pattern_alphabet;
    if (i % 3 == 2) {
      alphabet = json_alphabet;
      if (i % 2) {
        grammar = std::make_shared<const JsonGrammar>();
      } else {
        grammar = std::make_shared<const GbnfGrammar>(R"(root ::= "{" ws (pair ("," ws pair)*)? "}"
pair ::= str ws ":" ws (str | num | "true" | "null" | root) ws
str ::= "\"" [^"\\]* "\""
num ::= "-"? [0-9]+ ("." [0-9]+)? ("e" [0-9]+)?
ws ::= " "*)");
      }
    } else {
      const std::string pattern = maker.make(2).first;
      try {
        grammar = std::make_shared<const RegexDfa>(pattern);
      } catch (const Error& e) {  // a pattern past the automaton's size bound
        ASSERT_NE(std::string(e.what()).find("too large"), std::string::npos) << e.what();
        continue;
      }
    }
    ++grammars;
    const auto texts = grown_vocabulary(alphabet, static_cast<int>(rng.range(1, 3000)), rng);
    const auto vocab = std::make_shared<const GuideVocabulary>(texts);
    // The byte order itself: every writable id once, ordered, each shared prefix exact.
    std::vector<std::int32_t> writable;
    for (std::int32_t t = 0; t < vocab->size(); ++t)
      if (vocab->writable(t)) writable.push_back(t);
    std::vector<std::int32_t> ordered = vocab->by_bytes();
    ASSERT_EQ(ordered.size(), writable.size());
    for (std::size_t k = 0; k < ordered.size(); ++k) {
      const std::string_view b = vocab->bytes(ordered[k]);
      ASSERT_EQ(vocab->sorted_bytes(k), b);
      if (k == 0) continue;
      const std::string_view a = vocab->bytes(ordered[k - 1]);
      ASSERT_LE(a, b);
      std::size_t same = 0;
      while (same < a.size() && same < b.size() && a[same] == b[same]) ++same;
      ASSERT_EQ(vocab->shared_prefix()[k], same) << k;
    }
    std::sort(ordered.begin(), ordered.end());
    ASSERT_EQ(ordered, writable);

    TokenGuide guide(grammar, vocab);
    std::int32_t s = grammar->start();
    for (int step = 0; step < 30; ++step, ++states) {
      std::vector<std::int32_t> want;
      for (std::int32_t t = 0; t < vocab->size(); ++t) {
        if (vocab->writable(t) && grammar->walk(s, vocab->bytes(t)) != ByteGrammar::kDead)
          want.push_back(t);
      }
      const std::vector<std::int32_t>& got = guide.allowed(s);
      ASSERT_EQ(got, want) << "grammar " << i << ", step " << step << ", vocabulary of "
                           << texts.size();
      if (want.empty()) break;
      const std::int32_t t =
          want[static_cast<std::size_t>(rng.range(0, static_cast<std::int64_t>(want.size()) - 1))];
      s = grammar->walk(s, vocab->bytes(t));
    }
  }
  EXPECT_GE(grammars, 60);
  EXPECT_GE(states, 600);
  // A state past the language's end allows nothing.
  TokenGuide guide(std::make_shared<const JsonGrammar>(),
                   std::make_shared<const GuideVocabulary>(
                       std::vector<std::optional<std::string>>{"{", "}", "x"}));
  EXPECT_TRUE(guide.allowed(ByteGrammar::kDead).empty());
}

// Guides of one regex over one vocabulary share their allowed sets (across requests and rank
// threads): four threads walking at once get the sets an unshared guide works out alone; JSON and
// grammars, built as they are walked, share nothing; the sets kept together stay within their
// bound.
TEST(TokenGuide, GuidesOfOneRegexShareTheirSetsWithinABound) {
  test::Rng rng = test::make_rng();
  const auto texts = grown_vocabulary({"a", "b", "c", "0", "7", " ", "é"}, 2000, rng);
  const auto vocab = std::make_shared<const GuideVocabulary>(texts);
  const auto dfa = shared_regex("(?:[ab]+ ?|[0-9]{1,3})+c?");
  EXPECT_EQ(SharedAllowedSets::of(dfa, vocab), SharedAllowedSets::of(dfa, vocab));
  EXPECT_NE(SharedAllowedSets::of(dfa, vocab),
            SharedAllowedSets::of(dfa, std::make_shared<const GuideVocabulary>(texts)));
  EXPECT_EQ(SharedAllowedSets::of(std::make_shared<const JsonGrammar>(), vocab), nullptr);
  // The states of random walks, and each one's set from a guide that shares nothing.
  std::vector<std::int32_t> states;
  std::vector<std::vector<std::int32_t>> want;
  TokenGuide alone(dfa, vocab, false);
  for (int walk = 0; walk < 20; ++walk) {
    std::int32_t s = dfa->start();
    for (int step = 0; step < 12; ++step) {
      states.push_back(s);
      want.push_back(alone.allowed(s));
      if (want.back().empty()) break;
      s = dfa->walk(s, vocab->bytes(want.back()[static_cast<std::size_t>(
                           rng.range(0, static_cast<std::int64_t>(want.back().size()) - 1))]));
    }
  }
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      TokenGuide guide(dfa, vocab);
      for (std::size_t k = 0; k < states.size(); ++k) {
        const std::size_t i = (k * 7 + static_cast<std::size_t>(t) * 13) % states.size();
        if (guide.allowed(states[i]) != want[i]) ++wrong[static_cast<std::size_t>(t)];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
  // 300 states of 65536 allowed ids each pass the 2^24 ids kept together: still within it, and a
  // set asked after a fresh start is the same.
  std::vector<std::optional<std::string>> letters;
  for (int i = 0; i < 65536; ++i)
    letters.push_back(std::string(1 + i % 3, static_cast<char>('a' + i % 26)));
  const auto big = std::make_shared<const GuideVocabulary>(letters);
  const auto counted = std::make_shared<const RegexDfa>("[a-z]{0,600}");
  std::size_t most = 0;
  for (int n = 0; n < 300; ++n) {
    TokenGuide guide(counted, big);  // a request each
    const std::int32_t s = counted->walk(counted->start(), std::string(n, 'q'));
    ASSERT_EQ(guide.allowed(s).size(), letters.size()) << n;
    most = std::max(most, SharedAllowedSets::total_ids());
  }
  EXPECT_LE(most, SharedAllowedSets::kMaxSharedIds);
  EXPECT_GT(most, SharedAllowedSets::kMaxSharedIds / 2);
  TokenGuide late(counted, big);
  EXPECT_EQ(late.allowed(counted->start()).size(), letters.size());
}

// state_after walks only past the prefix shared with the output it was asked last: through
// outputs that grow, shrink, change their tail (as speculative proposals do) and hold tokens that
// are not allowed, it gives the state of the whole text walked from the start, or none.
TEST(TokenGuide, StateAfterAnOutputIsThatOfItsWholeTextWhateverWasAskedBefore) {
  test::Rng rng = test::make_rng();
  const auto texts = grown_vocabulary({"a", "b", "{", "}", "\"", ":", " ", "1", "é"}, 400, rng);
  const auto vocab = std::make_shared<const GuideVocabulary>(texts);
  const auto grammar = std::make_shared<const JsonGrammar>();
  TokenGuide guide(grammar, vocab);
  TokenGuide chooser(grammar, vocab);  // picks the tokens, so `guide` sees only the outputs
  const auto pick = [&](const std::vector<std::int32_t>& from) {
    return from[static_cast<std::size_t>(rng.range(0, static_cast<std::int64_t>(from.size()) - 1))];
  };
  // Mostly a token that keeps the text live, now and then any id.
  const auto add_token = [&](std::vector<std::int32_t>& out) {
    const std::optional<std::int32_t> s = chooser.state_after(out);
    const std::vector<std::int32_t>* allowed = s ? &chooser.allowed(*s) : nullptr;
    if (allowed && !allowed->empty() && rng.range(0, 4) > 0)
      out.push_back(pick(*allowed));
    else
      out.push_back(static_cast<std::int32_t>(rng.range(0, vocab->size() - 1)));
  };
  std::vector<std::int32_t> output;
  int live = 0, dead = 0;
  for (int step = 0; step < 3000; ++step) {
    const std::int64_t move = rng.range(0, 9);
    const std::size_t back = static_cast<std::size_t>(
        std::min<std::int64_t>(rng.range(1, 3), static_cast<std::int64_t>(output.size())));
    if (move < 5 || output.empty()) {  // a step's token
      add_token(output);
    } else if (move < 7) {  // back a few tokens
      output.resize(output.size() - back);
    } else if (move < 9) {  // a few tokens in place of the last ones, as new proposals
      output.resize(output.size() - back);
      for (std::int64_t n = rng.range(1, 3); n > 0; --n) add_token(output);
    } else {
      output.clear();
    }
    std::string text;
    bool writable = true;
    for (const std::int32_t t : output) {
      writable = writable && vocab->writable(t);
      if (vocab->writable(t)) text += vocab->bytes(t);
    }
    std::int32_t want = writable ? grammar->walk(grammar->start(), text) : ByteGrammar::kDead;
    const std::optional<std::int32_t> got = guide.state_after(output);
    if (want == ByteGrammar::kDead) {
      ASSERT_FALSE(got.has_value()) << step;
      ++dead;
    } else {
      ASSERT_TRUE(got.has_value()) << step;
      ASSERT_EQ(*got, want) << step;
      ++live;
    }
  }
  EXPECT_GT(live, 300);
  EXPECT_GT(dead, 300);
}

std::string text_of(const GuideVocabulary& v, const std::vector<std::int32_t>& tokens) {
  std::string s;
  for (std::int32_t t : tokens)
    if (v.writable(t)) s += v.bytes(t);
  return s;
}

// Each step's token is the greedy choice of that step's recorded logits among the tokens whose
// bytes keep the text a prefix of a word (and the stop tokens once it is a word); the request
// ends at a word nothing extends, at a stop token, or at a text no token can continue; the same
// under DCP 2 and with a draft.
TEST(Engine, RegexChoosesAmongTheTokensThatKeepAPrefixOfAMatch) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(11);
  std::vector<std::int32_t> specials;
  const auto vocab = test_vocabulary(c.vocab_size, rng.engine(), specials);
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 6; ++i) {
    RequestSpec r = request(i, random_tokens(rng, 9 + 13 * i, c.vocab_size), 10);
    r.sampling.regex = kYesNoMaybePattern;
    if (i % 2 == 0) r.stop_token_ids = {specials[0], specials[1]};
    if (i == 2) r.min_tokens = 4;
    if (i == 3) r.max_new_tokens = 2;
    // A stop token the model favours: chosen as soon as the text is a word.
    if (i == 4) r.sampling.logit_bias[specials[1]] = 30;
    reqs.push_back(r);
  }
  // The vocabulary cannot spell '#': the request ends where the pattern needs it.
  RequestSpec stuck = request(6, random_tokens(rng, 11, c.vocab_size), 10);
  stuck.sampling.regex = "no#|m";
  reqs.push_back(stuck);
  EngineSetup s;
  s.tp = 2;
  s.page_size = 4;
  s.guide_vocabulary = vocab;
  const test::EngineRun one = run_engine(c, *w, s, reqs);
  const int v = c.vocab_size;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const RequestResult& r = one.results[i];
    const RequestSpec& q = reqs[i];
    std::vector<std::int32_t> sofar;
    for (std::size_t k = 0; k < r.output_tokens.size(); ++k) {
      const std::string text = text_of(*vocab, sofar);
      const bool stops_open =
          static_cast<int>(k) >= q.min_tokens && (i == 6 ? text == "m" : complete(text));
      std::int32_t best = -1;
      for (std::int32_t t = 0; t < v; ++t) {
        const bool is_stop = std::find(q.stop_token_ids.begin(), q.stop_token_ids.end(), t) !=
                             q.stop_token_ids.end();
        const std::string next = text + std::string(vocab->writable(t) ? vocab->bytes(t) : "");
        const bool ok = is_stop ? stops_open
                                : vocab->writable(t) &&
                                      (i == 6 ? std::string("no#").starts_with(next) || next == "m"
                                              : viable(next));
        if (!ok) continue;
        const float x = r.step_logits[k * v + static_cast<std::size_t>(t)] +
                        (q.sampling.logit_bias.count(t) ? 30.0f : 0.0f);
        const float b = best < 0 ? 0
                                 : r.step_logits[k * v + static_cast<std::size_t>(best)] +
                                       (q.sampling.logit_bias.count(best) ? 30.0f : 0.0f);
        if (best < 0 || x > b) best = t;
      }
      ASSERT_EQ(r.output_tokens[k], best) << "request " << i << " step " << k;
      sofar.push_back(r.output_tokens[k]);
    }
    const std::string text = text_of(*vocab, r.output_tokens);
    const bool stopped_by_token =
        !r.output_tokens.empty() && std::find(q.stop_token_ids.begin(), q.stop_token_ids.end(),
                                              r.output_tokens.back()) != q.stop_token_ids.end();
    if (i == 3) {
      EXPECT_EQ(r.output_tokens.size(), 2u);
      EXPECT_TRUE(viable(text)) << text;
    } else if (i == 6) {
      EXPECT_TRUE(text == "no" || text == "m") << text;
      EXPECT_EQ(r.finish_reason, FinishReason::stop);
    } else {
      EXPECT_TRUE(complete(text)) << "request " << i << ": '" << text << "'";
      EXPECT_EQ(r.finish_reason, FinishReason::stop) << "request " << i;
      // Without stop tokens only "!!!" ends a word; with them a stop token may end it earlier.
      if (q.stop_token_ids.empty()) {
        EXPECT_TRUE(text.ends_with("!!!")) << text;
      }
      if (i == 4) {  // its stop token wins wherever it is open (the steps above check where)
        EXPECT_TRUE(stopped_by_token || text.ends_with("!!!")) << text;
      }
    }
  }
  test::expect_same_under_dcp2_and_a_draft(c, *w, s, reqs, one);
}

// JSON mode: each step's token is the greedy choice among the tokens whose bytes keep the text
// a prefix of a JSON object (JsonGrammar, checked against Python above); a request ends when its
// object closes; the same under DCP 2 and with a draft.
TEST(Engine, JsonObjectChoosesAmongTheTokensThatKeepAPrefixOfAnObject) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(12);
  std::vector<std::optional<std::string>> texts(static_cast<std::size_t>(c.vocab_size));
  const std::string junk = "xyz(!)=?";
  for (auto& t : texts) t = std::string(1, junk[rng.engine()() % junk.size()]);
  std::vector<std::int32_t> ids(texts.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng.engine());
  std::size_t next = 0;
  for (const char* piece : {"{",  "}", "\"",   "a",    "b",    ":",    ",",   "1",   "0",   "-",
                            ".",  "[", "]",    " ",    "true", "null", "{\"", "\":", "\"}", "\",\"",
                            "12", "é", "\xC3", "\xA9", "\\",   "n",    "e",   "}}",  "\n"})
    texts[static_cast<std::size_t>(ids[next++])] = piece;
  const std::int32_t special = ids[next++];
  texts[static_cast<std::size_t>(special)].reset();
  const auto vocab = std::make_shared<const GuideVocabulary>(texts);
  std::vector<RequestSpec> reqs;
  for (int i = 0; i < 6; ++i) {
    RequestSpec r = request(i, random_tokens(rng, 8 + 11 * i, c.vocab_size), 16 + 4 * i);
    r.sampling.json_object = true;
    if (i % 2) r.stop_token_ids = {special};
    // Biases towards the structure, so that some objects close within the budget.
    if (i >= 3) r.sampling.logit_bias = {{ids[1], 4.0}, {ids[18], 3.0}, {ids[7], 2.0}};
    if (i == 5) {  // "{" then "}": the smallest object
      r.sampling.logit_bias[ids[0]] = 30;
      r.sampling.logit_bias[ids[1]] = 30;
    }
    reqs.push_back(r);
  }
  EngineSetup s;
  s.tp = 2;
  s.page_size = 4;
  s.guide_vocabulary = vocab;
  const test::EngineRun one = run_engine(c, *w, s, reqs);
  const int v = c.vocab_size;
  int closed = 0;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const RequestResult& r = one.results[i];
    const JsonGrammar json;
    std::string text;
    for (std::size_t k = 0; k < r.output_tokens.size(); ++k) {
      std::int32_t best = -1;
      float best_x = 0;
      for (std::int32_t t = 0; t < v; ++t) {
        if (!texts[static_cast<std::size_t>(t)] ||
            json.walk(json.start(), text + *texts[static_cast<std::size_t>(t)]) ==
                ByteGrammar::kDead)
          continue;
        const auto bias = reqs[i].sampling.logit_bias.find(t);
        const float x =
            r.step_logits[k * v + static_cast<std::size_t>(t)] +
            (bias == reqs[i].sampling.logit_bias.end() ? 0.0f : static_cast<float>(bias->second));
        if (best < 0 || x > best_x) {
          best = t;
          best_x = x;
        }
      }
      ASSERT_EQ(r.output_tokens[k], best) << "request " << i << " step " << k;
      text += *texts[static_cast<std::size_t>(best)];
    }
    if (r.finish_reason == FinishReason::stop) {
      // A whole object, or a text no token continues (the vocabulary spells "n" and "null" but
      // not "ull": a lone "n" ends the request there).
      bool stuck = true;
      for (const auto& t : texts)
        stuck = stuck && !(t && json.walk(json.start(), text + *t) != ByteGrammar::kDead);
      if (json.matches(text))
        ++closed;
      else
        EXPECT_TRUE(stuck) << text;
    } else {
      EXPECT_EQ(r.output_tokens.size(), static_cast<std::size_t>(reqs[i].max_new_tokens)) << text;
    }
  }
  EXPECT_GT(closed, 0);
  test::expect_same_under_dcp2_and_a_draft(c, *w, s, reqs, one);
}

// guide_after (a reasoning model's "</think>"): the output is the unguided one up to and through
// the first occurrence of the marker, then guided: each later step the greedy choice of its
// recorded logits among the tokens that keep the text after the marker a prefix of a word (or
// continue a choice), ending at a word (a choice); the same under DCP 2 and with a draft. A
// marker that never comes leaves the whole output free.
TEST(Engine, GuideAfterHoldsOnlyTheOutputAfterItsMarker) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(13);
  std::vector<std::int32_t> specials;
  const auto vocab = test_vocabulary(c.vocab_size, rng.engine(), specials);
  EngineSetup s;
  s.tp = 2;
  s.page_size = 4;
  s.guide_vocabulary = vocab;
  // The unguided outputs, whose tokens 2 and 3 become each request's marker.
  std::vector<RequestSpec> free;
  for (int i = 0; i < 4; ++i)
    free.push_back(request(i, random_tokens(rng, 7 + 11 * i, c.vocab_size), 8));
  const test::EngineRun unguided = run_engine(c, *w, s, free);
  std::vector<RequestSpec> reqs;
  std::vector<std::size_t> starts;
  for (int i = 0; i < 4; ++i) {
    const std::vector<std::int32_t>& u =
        unguided.results[static_cast<std::size_t>(i)].output_tokens;
    ASSERT_EQ(u.size(), 8u);
    RequestSpec r = free[static_cast<std::size_t>(i)];
    r.max_new_tokens = 24;
    r.sampling.guide_after = {u[2], u[3]};
    if (i % 2 == 0) {
      r.sampling.regex = kYesNoMaybePattern;
    } else {
      r.sampling.choices = {{u[0]}, {u[1], u[1]}, {u[5], u[6], u[7]}};
      if (prefix_pair(r.sampling.choices)) r.sampling.choices = {{u[5], u[6], u[7]}};
    }
    const auto at = std::search(u.begin(), u.end(), u.begin() + 2, u.begin() + 4);
    starts.push_back(static_cast<std::size_t>(at - u.begin()) + 2);
    reqs.push_back(r);
  }
  // A marker the model does not write: nothing is guided.
  RequestSpec never = free[0];
  never.id = 4;
  never.sampling.regex = kYesNoMaybePattern;
  never.sampling.guide_after = {specials[0], specials[0], specials[0]};
  reqs.push_back(never);
  const test::EngineRun one = run_engine(c, *w, s, reqs);
  const int v = c.vocab_size;
  for (std::size_t i = 0; i < 4; ++i) {
    const std::vector<std::int32_t>& out = one.results[i].output_tokens;
    const std::vector<std::int32_t>& u = unguided.results[i].output_tokens;
    const std::size_t start = starts[i];
    ASSERT_GT(out.size(), start) << i;
    EXPECT_TRUE(std::equal(u.begin(), u.begin() + static_cast<std::ptrdiff_t>(start), out.begin()))
        << "request " << i << ": free up to its marker";
    const std::vector<std::vector<std::int32_t>>& choices = reqs[i].sampling.choices;
    std::vector<std::int32_t> after;
    for (std::size_t k = start; k < out.size(); ++k) {
      std::int32_t best = -1;
      for (std::int32_t t = 0; t < v; ++t) {
        bool ok;
        if (choices.empty()) {
          ok = vocab->writable(t) && viable(text_of(*vocab, after).append(vocab->bytes(t)));
        } else {
          ok = std::any_of(choices.begin(), choices.end(), [&](const auto& ch) {
            return ch.size() > after.size() && std::equal(after.begin(), after.end(), ch.begin()) &&
                   ch[after.size()] == t;
          });
        }
        const float x = one.results[i].step_logits[k * v + static_cast<std::size_t>(t)];
        if (ok &&
            (best < 0 || x > one.results[i].step_logits[k * v + static_cast<std::size_t>(best)]))
          best = t;
      }
      ASSERT_EQ(out[k], best) << "request " << i << " step " << k;
      after.push_back(out[k]);
    }
    EXPECT_EQ(one.results[i].finish_reason, FinishReason::stop) << i;
    if (choices.empty()) {
      EXPECT_TRUE(complete(text_of(*vocab, after))) << text_of(*vocab, after);
    } else {
      EXPECT_TRUE(std::find(choices.begin(), choices.end(), after) != choices.end()) << i;
    }
  }
  EXPECT_EQ(one.results[4].output_tokens, unguided.results[0].output_tokens);
  test::expect_same_under_dcp2_and_a_draft(c, *w, s, reqs, one);
  // Refused without a guide to hold back, or with a token outside the vocabulary.
  SamplingParams p;
  p.guide_after = {1};
  EXPECT_THROW(validate(p, c.vocab_size), Error);
  p.regex = "a";
  EXPECT_NO_THROW(validate(p, c.vocab_size));
  p.guide_after = {c.vocab_size};
  EXPECT_THROW(validate(p, c.vocab_size), Error);
}

TEST(Engine, RegexRequestsAreRefusedWithoutAVocabularyOrAWayToBegin) {
  const ModelConfig c = preset_config("tiny", 1);
  std::mt19937_64 rng(3);
  std::vector<std::int32_t> specials;
  const auto vocab = test_vocabulary(c.vocab_size, rng, specials);
  RequestSpec r = request(0, {1, 2, 3}, 4);
  r.sampling.regex = "yes";
  EXPECT_THROW(request_guide(r, nullptr), Error);
  try {
    request_guide(r, nullptr);
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "'regex' needs the vocabulary's bytes (a tokenizer); this engine has none");
  }
  EXPECT_NE(request_guide(r, vocab), nullptr);
  r.sampling.regex = "#";
  try {
    request_guide(r, vocab);
    ADD_FAILURE() << "a pattern no token begins was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "'regex': no token of the vocabulary begins a match");
  }
  r.sampling.regex = "a{0}|";
  try {
    request_guide(r, vocab);
    ADD_FAILURE() << "a pattern of the empty text only was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "'regex' matches only the empty text (a reply holds at least one token)");
  }
  r.sampling.regex = "(a";
  try {
    request_guide(r, vocab);
    ADD_FAILURE() << "a pattern that does not parse was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "'regex': missing ')' at byte 2 of the pattern");
  }
  // Checked with the other sampling fields: the masks beside it.
  SamplingParams p;
  p.regex = "a";
  p.allowed_token_ids = {1};
  EXPECT_THROW(validate(p, c.vocab_size), Error);
  p.allowed_token_ids.clear();
  EXPECT_NO_THROW(validate(p, c.vocab_size));
}

// A GBNF grammar of the same language as the regex test's pattern (a rule, a group, a bounded
// repetition) masks the same tokens at every step, so the engine writes the same tokens and ends
// the same way; the same under DCP 2 and with a draft. Its refusals name the field.
TEST(Engine, GrammarGuidesAsTheRegexOfTheSameLanguage) {
  auto rng = test::make_rng();
  const ModelConfig c = preset_config("tiny", 2);
  const auto w = make_synthetic_weights(13);
  std::vector<std::int32_t> specials;
  const auto vocab = test_vocabulary(c.vocab_size, rng.engine(), specials);
  const char* grammar =
      "root ::= word bang{1,3}\nword ::= \"yes\" | \"no\" | \"may\" \"be\"\n"
      "bang ::= [!]";
  std::vector<RequestSpec> by_regex, by_grammar;
  for (int i = 0; i < 5; ++i) {
    RequestSpec r = request(i, random_tokens(rng, 9 + 13 * i, c.vocab_size), 10);
    r.sampling.regex = kYesNoMaybePattern;
    if (i % 2 == 0) r.stop_token_ids = {specials[0], specials[1]};
    if (i == 3) r.max_new_tokens = 2;
    if (i == 4) r.sampling.logit_bias[specials[1]] = 30;  // a stop token, once a word is whole
    by_regex.push_back(r);
    r.sampling.regex.clear();
    r.sampling.grammar = grammar;
    by_grammar.push_back(r);
  }
  TokenGuide a(std::make_shared<const RegexDfa>(kYesNoMaybePattern), vocab);
  TokenGuide b(std::make_shared<const GbnfGrammar>(grammar), vocab);
  for (const std::string& word : kYesNoMaybe) {
    for (std::size_t n = 0; n <= word.size(); ++n) {
      const std::int32_t sa = a.grammar().walk(a.grammar().start(), word.substr(0, n));
      const std::int32_t sb = b.grammar().walk(b.grammar().start(), word.substr(0, n));
      EXPECT_EQ(a.allowed(sa), b.allowed(sb)) << word.substr(0, n);
      EXPECT_EQ(a.grammar().accepting(sa), b.grammar().accepting(sb)) << word.substr(0, n);
    }
  }
  EngineSetup s;
  s.tp = 2;
  s.page_size = 4;
  s.guide_vocabulary = vocab;
  const test::EngineRun want = run_engine(c, *w, s, by_regex);
  const test::EngineRun got = run_engine(c, *w, s, by_grammar);
  for (std::size_t i = 0; i < by_regex.size(); ++i) {
    EXPECT_EQ(got.results[i].output_tokens, want.results[i].output_tokens) << "request " << i;
    EXPECT_EQ(got.results[i].finish_reason, want.results[i].finish_reason) << "request " << i;
    if (i != 3) {
      EXPECT_TRUE(complete(text_of(*vocab, got.results[i].output_tokens))) << "request " << i;
    }
  }
  test::expect_same_under_dcp2_and_a_draft(c, *w, s, by_grammar, got);

  RequestSpec r = request(0, {1, 2, 3}, 4);
  r.sampling.grammar = "root ::= \"yes\" | oops";
  try {
    request_guide(r, vocab, "guided_grammar");
    ADD_FAILURE() << "a grammar with an undefined rule was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "'guided_grammar': rule 'oops' is used but not defined at line 1, column 18");
  }
  r.sampling.grammar = "root ::= \"#\"";
  EXPECT_THROW(request_guide(r, vocab, "guided_grammar"), Error);  // no token begins it
  r.sampling.grammar = "root ::= \"\"";
  try {
    request_guide(r, vocab, "guided_grammar");
    ADD_FAILURE() << "a grammar of the empty text only was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "'guided_grammar' derives only the empty text (a reply holds at least "
                 "one token)");
  }
  SamplingParams p;
  p.grammar = "root ::= \"a\"";
  EXPECT_NO_THROW(validate(p, c.vocab_size));
  p.json_object = true;
  EXPECT_THROW(validate(p, c.vocab_size), Error);
  p.json_object = false;
  p.bad_words = {{1}};
  EXPECT_THROW(validate(p, c.vocab_size), Error);
}

}  // namespace
}  // namespace dcp
