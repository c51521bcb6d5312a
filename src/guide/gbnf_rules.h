// GBNF text compiled to flat rules (parse_gbnf), which GbnfGrammar's parses walk: each rule is a
// list of alternatives, each alternative a run of elements in `elements` closed by kEnd.
// Quantifiers and groups become rules of their own, so an element is one character class or one
// rule.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dcp {

struct GbnfRules {
  enum Kind : std::uint8_t { kEnd, kClass, kRule };
  struct Element {
    Kind kind = kEnd;
    std::int32_t arg = 0;  // the class or the rule
  };
  using Range = std::pair<char32_t, char32_t>;  // code points, inclusive

  // elements[0] is the root rule and elements[1] its kEnd: a parse starts at position 0.
  std::vector<Element> elements;
  std::vector<std::vector<std::int32_t>> alternatives;  // per rule: where each begins
  std::vector<std::vector<Range>> classes;              // sorted, disjoint, not empty

  bool contains(std::int32_t cls, char32_t c) const noexcept;
  bool overlaps(std::int32_t cls, char32_t lo, char32_t hi) const noexcept;
};

// Throws dcp::Error(invalid_argument) naming `field`, the line and the column.
GbnfRules parse_gbnf(std::string_view text, std::string_view field);

}  // namespace dcp
