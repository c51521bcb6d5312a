// --prompt-tokens as text: token ids or a dcp::Error naming the prompt, nothing else.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cli/prompt_tokens.h"
#include "dcp/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto prompts =
        dcp::cli::parse_prompt_list(std::string(reinterpret_cast<const char*>(data), size));
    for (const auto& p : prompts) {
      if (p.empty()) __builtin_trap();  // an empty prompt must have been refused
      for (std::int32_t id : p)
        if (id < 0) __builtin_trap();
    }
  } catch (const dcp::Error&) {
  }
  return 0;
}
