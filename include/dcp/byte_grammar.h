// A language over bytes as a deterministic automaton, which guided generation walks token by
// token (TokenGuide): a regular expression (RegexDfa), JSON (JsonGrammar) or a grammar
// (GbnfGrammar). States are small
// integers; an automaton may build them as they are first reached (such an instance belongs to
// one request and one thread).
#pragma once

#include <cstdint>
#include <string_view>

namespace dcp {

class ByteGrammar {
 public:
  static constexpr std::int32_t kDead = -1;  // no text of the language begins so
  virtual ~ByteGrammar() = default;
  virtual std::int32_t start() const noexcept = 0;
  // The state after byte `b` from the live `state`; kDead when no text of the language continues
  // so. Every live state can still reach a whole text of the language.
  virtual std::int32_t next(std::int32_t state, std::uint8_t b) const = 0;
  // The state after `bytes` from `state` (kDead stays kDead).
  std::int32_t walk(std::int32_t state, std::string_view bytes) const {
    for (const char c : bytes) {
      if (state == kDead) break;
      state = next(state, static_cast<std::uint8_t>(c));
    }
    return state;
  }
  // Whether the bytes read so far are a whole text of the language.
  virtual bool accepting(std::int32_t state) const noexcept = 0;
  // Whether some byte continues from `state` (false: a whole text that nothing may extend).
  virtual bool extendable(std::int32_t state) const noexcept = 0;
};

}  // namespace dcp
