// JSON Schemas (outside input from the network: response_format, guided_json, tool parameters):
// the input up to its first NUL byte is a schema, the rest choices. A schema compiles to a regex
// or is refused with dcp::Error, in bounded time and memory, never a crash; where the regex's
// automaton builds, a text walked through it by the choices (each picks among the bytes that stay
// live) that ends in a match is JSON, as a parser written apart (nlohmann's) reads it; numbers
// past a double's range, which JSON's grammar allows and nlohmann refuses, end that check.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/error.h"
#include "dcp/json_schema.h"
#include "dcp/regex_dfa.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const std::size_t cut = std::min(in.find('\0'), in.size());
  const std::string_view choices = in.substr(std::min(cut + 1, in.size()));
  try {
    const std::string regex = dcp::json_schema_regex(in.substr(0, cut), "response_format");
    if (regex.size() > dcp::kMaxSchemaRegexBytes) __builtin_trap();
    // Through the process's cache, as the server compiles it: inputs that differ in their choices
    // only (most mutations) do not build the automaton again.
    const std::shared_ptr<const dcp::RegexDfa> shared = dcp::shared_regex(regex, "response_format");
    const dcp::RegexDfa& dfa = *shared;
    std::string text;
    std::int32_t s = dfa.start();
    std::vector<std::uint8_t> live;
    for (std::size_t k = 0; k < choices.size(); ++k) {
      const auto choice = static_cast<std::uint8_t>(choices[k]);
      if (dfa.accepting(s) && (choice == 0 || !dfa.extendable(s))) break;  // 0: stop here
      live.clear();
      for (int b = 0; b < 256; ++b)
        if (dfa.next(s, static_cast<std::uint8_t>(b)) != dcp::RegexDfa::kDead)
          live.push_back(static_cast<std::uint8_t>(b));
      if (live.empty()) __builtin_trap();  // a live state that is not a match goes on
      const std::uint8_t b = live[choice % live.size()];
      text += static_cast<char>(b);
      s = dfa.next(s, b);
    }
    if (dfa.accepting(s)) {
      try {
        (void)nlohmann::json::parse(text);
      } catch (const nlohmann::json::out_of_range&) {
        // A number past a double's range (1e400): JSON's grammar allows it, nlohmann refuses it.
      } catch (const nlohmann::json::exception&) {
        __builtin_trap();
      }
    }
  } catch (const dcp::Error&) {
  }
  return 0;
}
