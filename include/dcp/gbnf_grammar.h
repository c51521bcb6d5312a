// A context-free grammar in GBNF (llama.cpp's grammar format, which xgrammar's EBNF shares) as a
// byte automaton for guided generation (vLLM's guided_grammar and structured_outputs.grammar,
// SGLang's ebnf): the whole output must be a text the rule `root` derives.
//
// Syntax: rules `name ::= body` (names of letters, digits, '_' and '-'; a body runs on to the next
// `name ::=`); in a body, string literals "..." (UTF-8), classes [abc], [a-z], [^...] over code
// points, `.` (any character), rule names, groups (...), alternatives `|` (an empty one matches
// the empty text), and the quantifiers `*`, `+`, `?`, `{n}`, `{n,}`, `{,m}`, `{n,m}`; escapes
// \n \r \t \\ \" \' \[ \] \- \^ \/ \xHH \uHHHH \UHHHHHHHH; `#` comments to the end of the line.
// Refused, naming the line and column: a syntax error, a rule used but not defined or defined
// twice, no `root`, a class that matches no character, a rule that derives no finite text, a
// left-recursive rule (one that can reach itself before reading a byte: the parse would not
// end), and grammars too large.
//
// States are the parses still open after the bytes read (each a stack of rule positions, with
// the bytes of a character not yet complete), built as they are first reached, so an instance
// belongs to one request and one thread. A parse may nest at most kMaxDepth rules deep, and a
// state keeps at most kMaxParses parses (a highly ambiguous grammar, whose parses multiply with
// each byte, keeps the first ones): each kept parse is a parse of the grammar and can still end
// in a whole text, so the output stays a text of the grammar, from fewer choices. The states of
// one instance hold at most kMaxBytes: past that no new state is built, and a byte that would
// need one is not allowed (a text so guided ends where it stands), so that no grammar can make a
// request's guide take unbounded memory or time.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dcp/byte_grammar.h"

namespace dcp {

struct GbnfRules;  // the compiled rules (src/engine/gbnf_rules.h)

class GbnfGrammar final : public ByteGrammar {
 public:
  static constexpr std::size_t kMaxTextBytes = 256 * 1024;
  static constexpr int kMaxRepeat = 1000;              // largest n or m of {n,m}
  static constexpr std::size_t kMaxGroupNesting = 256;  // (((...))) in the text
  static constexpr std::size_t kMaxElements = 200000;  // after quantifiers are expanded
  static constexpr std::size_t kMaxDepth = 512;
  static constexpr std::size_t kMaxParses = 256;
  static constexpr std::size_t kMaxBytes = std::size_t{32} << 20;  // the states of one instance

  // Throws dcp::Error(invalid_argument) naming `field` and the line and column at fault.
  explicit GbnfGrammar(std::string_view text, std::string_view field = "grammar");
  ~GbnfGrammar() override;

  std::int32_t start() const noexcept override { return 0; }
  std::int32_t next(std::int32_t state, std::uint8_t b) const override;
  bool accepting(std::int32_t state) const noexcept override;
  bool extendable(std::int32_t state) const noexcept override;
  // Whether the whole of `text` is a text of the grammar.
  bool matches(std::string_view text) const;
  // Whether `state` kept every parse on the way to it (none nested past kMaxDepth, never more
  // than kMaxParses): if not, some texts that begin with its bytes are no longer reachable.
  bool whole(std::int32_t state) const noexcept;
  // Memory the states built so far hold (at most kMaxBytes past the first state).
  std::size_t bytes() const noexcept { return bytes_; }
  // Whether the memory bound has refused a new state: since then a byte found not allowed may be
  // one the grammar allows.
  bool exhausted() const noexcept { return exhausted_; }

  // The open parses and the bytes of an incomplete character.
  struct Config {
    std::vector<std::vector<std::int32_t>> stacks;  // sorted, distinct; top: the next class
    std::string partial;
    bool trimmed = false;  // some parse was dropped on the way here
  };

 private:
  std::int32_t intern(Config c) const;

  std::unique_ptr<const GbnfRules> rules_;
  mutable std::vector<Config> configs_;
  mutable std::unordered_map<std::string, std::int32_t> ids_;
  mutable std::vector<std::array<std::int32_t, 256>> next_;  // kUnknown until first asked
  mutable std::size_t bytes_ = 0;
  mutable bool exhausted_ = false;
};

}  // namespace dcp
