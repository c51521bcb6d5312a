// The HTTP API's request bodies (outside input from the network): the first byte picks the
// endpoint (completions, chat, /generate, /tokenize, /detokenize), the rest is the body. Every body
// gets a reply, an error or a refusal, never a crash. The deployment is built but not running, so a
// body that parses is refused at submission ("still loading").
#include <cstddef>
#include <cstdint>
#include <string>

#include "api_fixture.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static ApiFixture f;
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  dcp::serve::Handled h;
  switch (data[0] % 5) {
    case 0: h = f.api->completions(body); break;
    case 1: h = f.api->chat_completions(body); break;
    case 2: h = f.api->generate(body); break;
    case 3: h.reply = f.api->tokenize(body); break;
    default: h.reply = f.api->detokenize(body); break;
  }
  // Nothing runs, so nothing may come back as a stream.
  if (!h.reply) __builtin_trap();
  return 0;
}
