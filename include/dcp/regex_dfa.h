// A regular expression compiled to a deterministic automaton over bytes, for guided generation
// (vLLM's guided_regex): the whole output must match the pattern (a search group, below, asks
// for a match inside it instead), and there are no capture groups.
//
// Syntax: literal characters (UTF-8; a non-ASCII character is its bytes in sequence); `.` (any
// character but a newline); classes `[abc]`, `[a-z]`, `[^...]` over code points; escapes \d \D
// \w \W \s \S (ASCII meanings), \n \r \t \f \v \0, \xHH, \x{H...}, \uHHHH, and an escaped
// punctuation character; groups `(...)`, `(?:...)` and `(?P<name>...)`/`(?<name>...)` (names
// ignored); alternation `|`; quantifiers `*`, `+`, `?`, `{n}`, `{n,}`, `{,m}`, `{n,m}` (a
// trailing `?` or `+`, lazy or possessive, changes nothing for a whole match); `^` opening and
// `$` ending an alternative of the pattern or of a length, JSON or search group (the match is
// whole anyway, but in a search group). A `{` that does not open a quantifier is a literal.
//
// Four extensions, which JSON Schemas need: a length group `(?{n,m}:X)` (or `{n}`, `{n,}`,
// `{,m}`) matches the texts X matches that are n to m characters long; a JSON group `(?json:X)`
// matches X's texts as a JSON string's body writes them (json.dumps' escapes for a quote, a
// backslash and control characters, every other character as itself); a multiple group
// `(?multiple{k}:X)` (k from 1 to kMaxMultiple) matches the texts of X that are a whole number,
// `-?[0-9]+`, divisible by k; a search group `(?search:X)` matches the texts in which Python's
// re.search (and ECMA-262's) finds X: an alternative of X that does not open with `^` may have
// any text before it, one that does not end with `$` any text after it (which its look-aheads
// see, as they are read where the match starts; a positive look-ahead opening with `^` makes its
// alternative start at the text's start, and a negative one's `^` is read where the match starts,
// leaving out the matches found after it).
//
// Look-aheads `(?=X)` and `(?!X)` may open an alternative of the pattern or of a length, JSON or
// search group (after its `^`), each looking at the whole text that pattern or group matches: that
// text must (or must not) begin with a match of X, and an alternative of X ending in `$` must match
// to its end. Pydantic's Decimal pattern `^(?!^[-+.]*$)[+-]?0*\d*\.?\d*$` and a password's
// `^(?=.*\d)(?=.*[A-Z]).{8,}$` are such. `$` is the end of the text, as in ECMA-262 (JSON
// Schema's dialect), not also before a final newline as in Python.
//
// Refused, naming the byte offset: back-references, look-aheads elsewhere, look-behinds, word
// boundaries, inline flags, POSIX classes, `^`/`$` elsewhere; and patterns whose automaton would
// be too large.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/byte_grammar.h"
#include "dcp/error.h"

namespace dcp {

// A pattern that parses but has no usable automaton, thrown apart from syntax errors (plain
// dcp::Errors) so that callers who composed the pattern from their own input (a JSON Schema's
// lengths around a pattern) can say what in that input asked for it.
class RegexError final : public Error {
 public:
  enum class Kind { too_large, no_text };
  RegexError(Kind kind, const std::string& message)
      : Error(ErrorCategory::invalid_argument, message), kind_(kind) {}
  Kind kind() const noexcept { return kind_; }

 private:
  Kind kind_;
};

class RegexDfa final : public ByteGrammar {
 public:
  static constexpr int kMaxRepeat = 1000;       // largest n or m of {n,m}
  static constexpr int kMaxCountedLength = 100000;  // largest n or m of a length group (?{n,m}:
  static constexpr int kMaxMultiple = 10000;        // largest k of a multiple group (?multiple{k}:
  // What look-aheads and multiple groups may build in all (NFA states, sets of the subset
  // construction, transitions of the product), so that many of them cannot take unbounded time.
  static constexpr std::size_t kMaxGuardWork = std::size_t{1} << 19;
  static constexpr std::size_t kMaxGroupNesting = 256;
  static constexpr int kMaxNfaStates = 200000;  // before determinization
  static constexpr int kMaxSubsetStates = 100000;  // of the subset construction
  static constexpr std::size_t kMaxSubsetEntries = std::size_t{1} << 23;  // NFA states in its sets
  static constexpr int kMaxStates = 20000;         // of the automaton itself, minimized

  // Throws dcp::Error(invalid_argument) naming `field` and the byte offset at fault, or a
  // RegexError saying the pattern is too large or matches no text.
  explicit RegexDfa(std::string_view pattern, std::string_view field = "regex");

  std::int32_t start() const noexcept override { return 0; }
  std::int32_t states() const noexcept { return static_cast<std::int32_t>(accepting_.size()); }
  // The state after byte b from `state`; kDead when no match can follow. Every live state can
  // still reach a match.
  std::int32_t next(std::int32_t state, std::uint8_t b) const noexcept override {
    return next_[static_cast<std::size_t>(state) * classes_ + class_of_[b]];
  }
  // Whether the bytes read so far are a whole match.
  bool accepting(std::int32_t state) const noexcept override { return accepting_[state] != 0; }
  // Whether some byte continues from `state` (false: a match that nothing may extend).
  bool extendable(std::int32_t state) const noexcept override { return extendable_[state] != 0; }
  // Whether the whole of `text` matches.
  bool matches(std::string_view text) const noexcept;
  // Memory the automaton holds.
  std::size_t bytes() const noexcept {
    return sizeof(*this) + next_.size() * sizeof(std::int32_t) + 2 * accepting_.size();
  }

 private:
  std::array<std::uint8_t, 256> class_of_{};  // bytes no pattern edge tells apart share a class
  std::size_t classes_ = 1;
  std::vector<std::int32_t> next_;  // [state][class]
  std::vector<char> accepting_, extendable_;
};

// The automaton of `pattern`, compiled once and shared by the requests that ask for it (a server
// sees the same tool-call and schema patterns request after request, and every rank of a process
// compiles each): kept while in use, and among the most recently asked while the kept ones hold
// at most kSharedRegexBytes. A RegexDfa is immutable, so any thread may walk a shared one. A
// pattern that does not compile throws as the constructor does, naming `field`, every time.
std::shared_ptr<const RegexDfa> shared_regex(std::string_view pattern,
                                             std::string_view field = "regex");
inline constexpr std::size_t kSharedRegexBytes = std::size_t{64} << 20;
inline constexpr std::size_t kSharedRegexCount = 256;

}  // namespace dcp
