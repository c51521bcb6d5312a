// tokenizer.model (SentencePiece's ModelProto): every input converts, loads, and then encodes and
// decodes, or fails with a dcp::Error.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dcp/error.h"
#include "dcp/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    // Chat tokens after the pieces of the seed models, as tokenizer_config.json adds them.
    static const std::string config =
        R"({"added_tokens_decoder": {"300": {"content": "<|im_end|>", "special": true},)"
        R"( "301": {"content": "<|tool_call|>", "special": true}}})";
    const dcp::Tokenizer t = dcp::Tokenizer::from_sentencepiece(
        std::string(reinterpret_cast<const char*>(data), size), config);
    const auto ids = t.encode(
        "Hello,  world! 123 \xe4\xbd\xa0\xe5\xa5\xbd <|im_end|> \xf0\x9f\x98\x80\n"
        // Full-width A, the fi ligature, e + combining acute, an ideographic space.
        " \xef\xbc\xa1\xef\xac\x81 e\xcc\x81\xe3\x80\x80 end ");
    (void)t.decode(ids);
  } catch (const dcp::Error&) {
  }
  return 0;
}
