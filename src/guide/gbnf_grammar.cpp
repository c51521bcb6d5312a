#include "dcp/gbnf_grammar.h"

#include <algorithm>

#include "dcp/error.h"
#include "guide/gbnf_rules.h"

namespace dcp {
namespace gbnf_walk {  // named: a unity build shares one file's anonymous namespace
namespace {

constexpr std::int32_t kUnknown = -2;
using Stack = std::vector<std::int32_t>;
using Config = GbnfGrammar::Config;

// The parses `s` stands for once the rules at its top are expanded down to the next class to read
// (an empty stack: the text may end here), appended to `out`, at most `limit` of them; false when
// some were dropped (past the limit, or nested past kMaxDepth). No left recursion (parse_gbnf)
// makes this end.
bool expand(const GbnfRules& g, Stack s, std::vector<Stack>& out, std::size_t limit) {
  bool whole = true;
  std::vector<Stack> work;
  while (true) {
    while (!s.empty()) {
      const std::int32_t at = s.back();
      const GbnfRules::Element e = g.elements[static_cast<std::size_t>(at)];
      if (e.kind == GbnfRules::kClass) break;
      s.pop_back();
      if (e.kind == GbnfRules::kEnd) continue;
      // A rule: its continuation stays below (none when the rule ends its alternative, so that
      // right recursion does not grow the stack), each alternative on top.
      if (g.elements[static_cast<std::size_t>(at) + 1].kind != GbnfRules::kEnd) s.push_back(at + 1);
      if (s.size() >= GbnfGrammar::kMaxDepth) {
        s.assign(1, -1);  // dropped
        whole = false;
        break;
      }
      const auto& alts = g.alternatives[static_cast<std::size_t>(e.arg)];
      for (std::size_t i = 1; i < alts.size(); ++i) {
        work.push_back(s);
        work.back().push_back(alts[i]);
      }
      s.push_back(alts[0]);
    }
    if (s.empty() || s.back() >= 0) out.push_back(std::move(s));
    if (work.empty()) return whole;
    if (out.size() >= limit) return false;
    s = std::move(work.back());
    work.pop_back();
  }
}

// Sorted and distinct, the first kMaxParses kept; false when some were not.
bool settle(std::vector<Stack>& stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.size() <= GbnfGrammar::kMaxParses) return true;
  stacks.resize(GbnfGrammar::kMaxParses);
  return false;
}

// Expansions repeat one another (ambiguous rules reach the same parse by several ways), so the
// bound on distinct parses applies after duplicates are dropped.
bool expand_all(const GbnfRules& g, std::vector<Stack> from, std::vector<Stack>& out) {
  constexpr std::size_t kSlack = 4 * GbnfGrammar::kMaxParses;
  bool whole = true;
  for (std::size_t i = 0; i < from.size(); ++i) {
    whole = expand(g, std::move(from[i]), out, out.size() + kSlack) && whole;
    if (out.size() >= kSlack) {
      whole = settle(out) && whole;
      if (out.size() >= GbnfGrammar::kMaxParses && i + 1 < from.size()) return false;
    }
  }
  return settle(out) && whole;
}

std::size_t utf8_length(std::uint8_t lead) {
  return lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
}

// The range of the byte after `lead` in valid UTF-8 (no overlong forms, no surrogates, nothing
// past U+10FFFF); bytes after the second are 80-BF.
std::pair<std::uint8_t, std::uint8_t> second_byte(std::uint8_t lead) {
  return {lead == 0xE0   ? 0xA0
          : lead == 0xF0 ? 0x90
                         : 0x80,
          lead == 0xED   ? 0x9F
          : lead == 0xF4 ? 0x8F
                         : 0xBF};
}

// The code points a valid UTF-8 character beginning with `partial` can be (one, when whole).
std::pair<char32_t, char32_t> completions(std::string_view partial) {
  const auto lead = static_cast<std::uint8_t>(partial[0]);
  const std::size_t length = utf8_length(lead);
  if (length == 1) return {lead, lead};
  char32_t lo = lead & (0x7F >> length), hi = lo;
  for (std::size_t i = 1; i < length; ++i) {
    auto [a, b] = i == 1 ? second_byte(lead) : std::pair<std::uint8_t, std::uint8_t>{0x80, 0xBF};
    if (i < partial.size()) a = b = static_cast<std::uint8_t>(partial[i]);
    lo = lo << 6 | (a & 0x3F);
    hi = hi << 6 | (b & 0x3F);
  }
  return {lo, hi};
}

// Whether byte b may follow `partial` (empty: b begins a character) in valid UTF-8.
bool utf8_continues(std::string_view partial, std::uint8_t b) {
  if (partial.empty()) return b < 0x80 || (b >= 0xC2 && b <= 0xF4);
  if (partial.size() > 1) return b >= 0x80 && b <= 0xBF;
  const auto [lo, hi] = second_byte(static_cast<std::uint8_t>(partial[0]));
  return b >= lo && b <= hi;
}

// The configuration after byte b, or no parses when none may read it.
Config step(const GbnfRules& g, const Config& c, std::uint8_t b) {
  Config out;
  if (!utf8_continues(c.partial, b)) return out;
  const std::string partial = c.partial + static_cast<char>(b);
  if (partial.size() < utf8_length(static_cast<std::uint8_t>(partial[0]))) {
    // Keep the parses that a character beginning so can continue.
    const auto [lo, hi] = completions(partial);
    for (const Stack& s : c.stacks) {
      if (!s.empty() && g.overlaps(g.elements[static_cast<std::size_t>(s.back())].arg, lo, hi))
        out.stacks.push_back(s);
    }
    if (!out.stacks.empty()) out.partial = partial;
    out.trimmed = c.trimmed;
    return out;
  }
  const char32_t cp = completions(partial).first;  // complete: one code point
  std::vector<Stack> moved;
  for (const Stack& s : c.stacks) {
    if (s.empty() || !g.contains(g.elements[static_cast<std::size_t>(s.back())].arg, cp)) continue;
    moved.push_back(s);
    ++moved.back().back();
  }
  out.trimmed = !expand_all(g, std::move(moved), out.stacks) || c.trimmed;
  return out;
}

std::string key_of(const Config& c) {
  std::string k(1, static_cast<char>(c.partial.size() | (c.trimmed ? 0x80 : 0)));
  k += c.partial;
  for (const Stack& s : c.stacks) {
    const auto n = static_cast<std::int32_t>(s.size());
    k.append(reinterpret_cast<const char*>(&n), sizeof n);
    k.append(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(std::int32_t));
  }
  return k;
}

}  // namespace
}  // namespace gbnf_walk

using gbnf_walk::Stack;

GbnfGrammar::GbnfGrammar(std::string_view text, std::string_view field)
    : rules_(std::make_unique<const GbnfRules>(parse_gbnf(text, field))) {
  Config c;
  c.trimmed = !gbnf_walk::expand_all(*rules_, {Stack{0}}, c.stacks);
  DCP_ARG_CHECK(!c.stacks.empty(), "'", field, "': the grammar nests rules more than ", kMaxDepth,
                " deep before its first character");
  intern(std::move(c));
}

GbnfGrammar::~GbnfGrammar() = default;

std::int32_t GbnfGrammar::intern(Config c) const {
  std::string key = gbnf_walk::key_of(c);
  if (const auto it = ids_.find(key); it != ids_.end()) return it->second;
  // What the state holds: its transitions, its key, its parses.
  std::size_t cost = sizeof(next_[0]) + 2 * key.size() + sizeof(Config) + 64;
  cost += c.stacks.size() * (sizeof(Stack) + 16);
  if (bytes_ + cost > kMaxBytes && !configs_.empty()) {
    exhausted_ = true;
    return kDead;
  }
  bytes_ += cost;
  const auto id = static_cast<std::int32_t>(configs_.size());
  ids_.emplace(std::move(key), id);
  configs_.push_back(std::move(c));
  std::array<std::int32_t, 256> unknown;
  unknown.fill(gbnf_walk::kUnknown);
  next_.push_back(unknown);
  return id;
}

std::int32_t GbnfGrammar::next(std::int32_t state, std::uint8_t b) const {
  if (next_[static_cast<std::size_t>(state)][b] != gbnf_walk::kUnknown)
    return next_[static_cast<std::size_t>(state)][b];
  // Past the budget nothing new is worked out: a byte not walked before ends the text here.
  if (bytes_ >= kMaxBytes) {
    exhausted_ = true;
    return next_[static_cast<std::size_t>(state)][b] = kDead;
  }
  Config c = gbnf_walk::step(*rules_, configs_[static_cast<std::size_t>(state)], b);
  const std::int32_t to = c.stacks.empty() ? kDead : intern(std::move(c));
  next_[static_cast<std::size_t>(state)][b] = to;  // intern may have moved the table
  return to;
}

bool GbnfGrammar::accepting(std::int32_t state) const noexcept {
  const Config& c = configs_[static_cast<std::size_t>(state)];
  return c.partial.empty() && c.stacks.front().empty();  // sorted: an empty stack comes first
}

bool GbnfGrammar::extendable(std::int32_t state) const noexcept {
  const Config& c = configs_[static_cast<std::size_t>(state)];
  return !c.partial.empty() || !c.stacks.back().empty();
}

bool GbnfGrammar::whole(std::int32_t state) const noexcept {
  return !configs_[static_cast<std::size_t>(state)].trimmed;
}

bool GbnfGrammar::matches(std::string_view text) const {
  const std::int32_t s = walk(start(), text);
  return s != kDead && accepting(s);
}

}  // namespace dcp
