// UTF-8 as browsers read it (WHATWG "decode" with replacement): what the tokenizer and the
// stream decoder do with bytes that are not valid UTF-8.
#include <string>
#include <string_view>

#include "dcp/tokenizer.h"

namespace dcp {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// The sequence starting at s[i]: its length when valid (1-4), else 0 with `stop` at the first
// byte that is not part of it (the next byte to read). `truncated` when the input ended inside a
// sequence that more bytes could have completed.
std::size_t sequence(std::string_view s, std::size_t i, std::size_t& stop, bool& truncated) {
  truncated = false;
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return 1;
  int need = 0;
  unsigned char lower = 0x80, upper = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lower = 0xA0;
    if (b == 0xED) upper = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lower = 0x90;
    if (b == 0xF4) upper = 0x8F;  // nothing past U+10FFFF
  } else {
    stop = i + 1;
    return 0;
  }
  std::size_t j = i + 1;
  for (int k = 0; k < need; ++k, ++j) {
    if (j >= s.size()) {
      truncated = true;
      stop = j;
      return 0;
    }
    const auto c = static_cast<unsigned char>(s[j]);
    if (c < lower || c > upper) {
      stop = j;  // this byte starts the next read
      return 0;
    }
    lower = 0x80;
    upper = 0xBF;
  }
  return static_cast<std::size_t>(need) + 1;
}

}  // namespace

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    std::size_t stop = 0;
    bool truncated = false;
    const std::size_t n = sequence(s, i, stop, truncated);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += kReplacement;
      i = stop;
    }
  }
  return out;
}

std::size_t utf8_complete_prefix(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    std::size_t stop = 0;
    bool truncated = false;
    const std::size_t n = sequence(s, i, stop, truncated);
    if (n > 0) {
      i += n;
    } else if (truncated) {
      return i;  // more bytes may complete it
    } else {
      i = stop;
    }
  }
  return s.size();
}

std::string StreamDecoder::push(std::int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.token_bytes(id);
  const std::size_t ready = utf8_complete_prefix(pending_);
  std::string out = utf8_lossy(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace dcp
