// Kimi's tiktoken format: the first byte picks what the rest feeds. 0: a pre-tokenizer pattern
// whose class intersections are rewritten (then compiled as a tokenizer's pattern); else: lines
// appended to a valid tiktoken.model of the 256 bytes, which then encodes and decodes. Every input
// works or fails with a dcp::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "dcp/error.h"
#include "dcp/tokenizer.h"

namespace {

const std::string& byte_ranks() {
  static const std::string model = [] {
    static const char* const digits =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string m;
    for (int b = 0; b < 256; ++b) {
      m += digits[b >> 2];
      m += digits[(b & 3) << 4];
      m += "== " + std::to_string(b) + "\n";
    }
    return m;
  }();
  return model;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] == 0) {
      (void)dcp::rewrite_class_intersections(rest);
      const dcp::Tokenizer t = dcp::Tokenizer::from_tiktoken(byte_ranks(), "", rest);
      (void)t.encode("Hello \xe4\xb8\x96\xe7\x95\x8c World 12345 it's\r\n");
    } else {
      const dcp::Tokenizer t = dcp::Tokenizer::from_tiktoken(byte_ranks() + rest);
      const auto ids = t.encode("Hello \xe4\xb8\x96\xe7\x95\x8cWorld ABCdef 12345 it's\r\n");
      (void)t.decode(ids);
    }
  } catch (const dcp::Error&) {
  }
  return 0;
}
