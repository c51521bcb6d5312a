// JSON (RFC 8259) as a byte automaton for guided generation (OpenAI's response_format
// {"type": "json_object"}): the text is one JSON object, strict UTF-8 inside its strings (a
// surrogate escape only in a pair, as strict parsers require), with no whitespace before or after
// it, nested at most kMaxDepth deep, with at most kMaxWhitespace whitespace bytes in a row (so
// that a model cannot spend its tokens on blank space). Its states (a parsing mode and the stack
// of open objects and arrays) are built as they are first reached.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dcp/byte_grammar.h"

namespace dcp {

class JsonGrammar final : public ByteGrammar {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxWhitespace = 32;

  JsonGrammar();
  std::int32_t start() const noexcept override { return 0; }
  std::int32_t next(std::int32_t state, std::uint8_t b) const override;
  bool accepting(std::int32_t state) const noexcept override;
  bool extendable(std::int32_t state) const noexcept override;
  // Whether the whole of `text` is such an object.
  bool matches(std::string_view text) const;

  // Where the parser stands: a mode, a small number whose meaning depends on it, and the open
  // containers ('{' and '[', outermost first).
  struct Config {
    std::uint8_t mode = 0;
    std::uint8_t aux = 0;
    std::string stack;
  };

 private:
  std::int32_t intern(const Config& c) const;

  mutable std::vector<Config> configs_;
  mutable std::unordered_map<std::string, std::int32_t> ids_;
  mutable std::vector<std::array<std::int32_t, 256>> next_;  // kUnknown until first asked
};

}  // namespace dcp
