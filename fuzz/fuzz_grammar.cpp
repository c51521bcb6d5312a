// Guided-grammar texts (outside input from the network): the input up to its first NUL byte is a
// GBNF grammar, the rest a text. A grammar compiles or is refused with dcp::Error, never a crash
// or a hang; a compiled one walks the text, and every live state it reaches can still end in a
// text of the grammar (a live state that is not accepting has a next byte).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dcp/error.h"
#include "dcp/gbnf_grammar.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::size_t cut = std::min(in.find('\0'), in.size());
  try {
    const dcp::GbnfGrammar g(in.substr(0, cut), "guided_grammar");
    std::int32_t s = g.start();
    if (!g.accepting(s) && !g.extendable(s)) __builtin_trap();
    for (const char c : in.substr(std::min(cut + 1, in.size()))) {
      s = g.walk(s, std::string_view(&c, 1));
      if (s == dcp::ByteGrammar::kDead) break;
      if (!g.accepting(s) && !g.extendable(s)) __builtin_trap();
    }
  } catch (const dcp::Error&) {
  }
  return 0;
}
