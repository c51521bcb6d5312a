// Guided-regex patterns (outside input from the network): the input's first line is the pattern,
// the rest a text. A pattern compiles or is refused with dcp::Error, never a crash or an automaton
// past its bounds; a compiled one walks the text, and every live state it reaches can still end
// in a match (a live state that is not accepting has a next byte).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dcp/error.h"
#include "dcp/regex_dfa.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::size_t cut = std::min(in.find('\n'), in.size());
  try {
    const dcp::RegexDfa dfa(in.substr(0, cut), "guided_regex");
    if (dfa.states() > dcp::RegexDfa::kMaxStates) __builtin_trap();
    std::int32_t s = dfa.start();
    for (const char c : in.substr(std::min(cut + 1, in.size()))) {
      s = dfa.next(s, static_cast<std::uint8_t>(c));
      if (s == dcp::RegexDfa::kDead) break;
      if (!dfa.accepting(s) && !dfa.extendable(s)) __builtin_trap();
    }
  } catch (const dcp::Error&) {
  }
  return 0;
}
