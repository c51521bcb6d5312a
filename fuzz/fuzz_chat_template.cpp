// A chat template's source, rendered on a small conversation: output or a dcp::Error naming the
// line, within the renderer's bounds, nothing else.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dcp/chat_template.h"
#include "dcp/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string context =
      R"({"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},)"
      R"( {"role": "assistant", "content": null, "tool_calls": [{"type": "function",)"
      R"( "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "content": "1"}],)"
      R"( "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true})";
  try {
    const dcp::ChatTemplate t(std::string(reinterpret_cast<const char*>(data), size));
    (void)t.render(context);
  } catch (const dcp::Error&) {
  }
  return 0;
}
