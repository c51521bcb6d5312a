// tokenizer.json: every input loads, and then encodes and decodes, or fails with a dcp::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dcp/error.h"
#include "dcp/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const dcp::Tokenizer t =
        dcp::Tokenizer::from_json(std::string(reinterpret_cast<const char*>(data), size));
    const auto ids = t.encode("Hello, world! 123 \xe4\xbd\xa0\xe5\xa5\xbd <|a|>\n");
    (void)t.decode(ids);
  } catch (const dcp::Error&) {
  }
  return 0;
}
