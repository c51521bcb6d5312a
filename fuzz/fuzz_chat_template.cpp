// A chat template's source, rendered on a small conversation (as given, and as an OpenAI front
// hands it over: arguments parsed for a template that reads them as a mapping): output or a
// dcp::Error naming the line, within the renderer's bounds, nothing else.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dcp/chat_template.h"
#include "dcp/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string messages =
      R"([{"role": "system", "content": "sys Stra\u00dfe \u03a3\u0391\u03a3 \u0130 \u01c5"},)"
      R"( {"role": "user", "content": "hi\u00a0there \u2028 1_000 2.5e1"},)"
      R"( {"role": "assistant", "content": null, "tool_calls": [{"type": "function",)"
      R"( "function": {"name": "f", "arguments": "{\"city\": \"Paris\", \"n\": [1, 2.5]}"}},)"
      R"( {"type": "function", "function": {"name": "g", "arguments": ""}}]},)"
      R"( {"role": "tool", "content": "1"}])";
  static const std::string variables =
      R"("bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true})";
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    const dcp::ChatTemplate t(source);
    (void)t.reads_content_parts();
    (void)t.reads_tool_arguments_as_mapping();
    (void)t.render(R"({"messages": )" + messages + ", " + variables);
    (void)t.render(R"({"messages": )" + dcp::openai_chat_messages(messages, source) + ", " +
                   variables);
  } catch (const dcp::Error&) {
  }
  return 0;
}
