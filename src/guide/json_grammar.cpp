#include "dcp/json_grammar.h"

namespace dcp {
namespace {

// Parsing modes. Structural modes keep the run of whitespace bytes so far in `aux`.
enum Mode : std::uint8_t {
  kTop,         // before the root object: only '{'
  kObjectOpen,  // after '{': a key or '}'
  kKey,         // after ',' in an object: a key
  kColon,       // after a key: ':'
  kValue,       // after ':', or after ',' in an array: a value
  kArrayOpen,   // after '[': a value or ']'
  kAfterValue,  // after a value inside a container: ',' or the container's close
  kString,      // inside a string; aux: kKeyBit when it is a key
  kEscape,      // after a backslash in a string; aux: kKeyBit
  kHex,         // in \uXXXX; aux: digits still needed | surrogate flags | kKeyBit
  kLowSlash,    // after a high surrogate's \uXXXX: the backslash of its low one; aux: kKeyBit
  kLowU,        // then its 'u'; aux: kKeyBit
  kUtf8,        // inside a multi-byte character; aux: bytes still needed | range << 3 | kKeyBit
  kNumMinus,    // '-'
  kNumZero,     // a leading 0
  kNumInt,      // [1-9][0-9]*
  kNumDot,      // the '.' of a fraction
  kNumFrac,     // the fraction's digits
  kNumE,        // 'e' or 'E'
  kNumESign,    // the exponent's sign
  kNumExp,      // the exponent's digits
  kLiteral,     // true, false or null; aux: literal * 8 + bytes matched
  kDone,        // the root object closed: nothing may follow
};
constexpr std::uint8_t kKeyBit = 0x80;
// A surrogate escape stands only in a pair (a high one, D800-DBFF, then a low one, DC00-DFFF):
// strict parsers refuse one alone. kHex's flags: the first digit was D; this escape is a high
// surrogate; this escape must be the low one.
constexpr std::uint8_t kFirstD = 0x08, kHigh = 0x10, kLowNeeded = 0x20;
constexpr std::int32_t kUnknown = -2;
constexpr std::string_view kLiterals[] = {"true", "false", "null"};
// The first continuation byte's range after a lead byte (UTF-8's table: no overlong forms, no
// surrogates, nothing above U+10FFFF); later continuation bytes are 80-BF.
constexpr std::uint8_t kRangeLo[] = {0x80, 0xA0, 0x80, 0x90, 0x80};
constexpr std::uint8_t kRangeHi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};

bool is_space(std::uint8_t b) {
  return b == ' ' || b == '\t' || b == '\n' || b == '\r';
}
bool is_digit(std::uint8_t b) {
  return b >= '0' && b <= '9';
}
bool is_hex(std::uint8_t b) {
  return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}

using Config = JsonGrammar::Config;

// A value just ended: back to the container, or done at the root.
void value_done(Config& c) {
  c.mode = c.stack.empty() ? kDone : kAfterValue;
  c.aux = 0;
}

bool open(Config& c, char kind) {
  if (static_cast<int>(c.stack.size()) >= JsonGrammar::kMaxDepth) return false;
  c.stack.push_back(kind);
  c.mode = kind == '{' ? kObjectOpen : kArrayOpen;
  c.aux = 0;
  return true;
}

bool close(Config& c, char kind) {
  if (c.stack.empty() || c.stack.back() != kind) return false;
  c.stack.pop_back();
  value_done(c);
  return true;
}

bool begin_value(Config& c, std::uint8_t b) {
  c.aux = 0;
  switch (b) {
    case '{': return open(c, '{');
    case '[': return open(c, '[');
    case '"': c.mode = kString; return true;
    case '-': c.mode = kNumMinus; return true;
    case '0': c.mode = kNumZero; return true;
    case 't':
      c.mode = kLiteral;
      c.aux = 0 * 8 + 1;
      return true;
    case 'f':
      c.mode = kLiteral;
      c.aux = 1 * 8 + 1;
      return true;
    case 'n':
      c.mode = kLiteral;
      c.aux = 2 * 8 + 1;
      return true;
    default:
      if (b >= '1' && b <= '9') {
        c.mode = kNumInt;
        return true;
      }
      return false;
  }
}

// Moves c over byte b; false when no JSON object begins so.
bool transition(Config& c, std::uint8_t b) {
  const auto whitespace = [&] {
    if (c.aux >= JsonGrammar::kMaxWhitespace) return false;
    ++c.aux;
    return true;
  };
  const auto end_number = [&] {  // a byte after a number's last digit: the container's turn
    value_done(c);
    return transition(c, b);
  };
  switch (c.mode) {
    case kTop: return b == '{' && open(c, '{');
    case kObjectOpen:
    case kKey:  // a key, or (right after '{' only) the close
      if (is_space(b)) return whitespace();
      if (b == '}' && c.mode == kObjectOpen) return close(c, '{');
      if (b != '"') return false;
      c.mode = kString;
      c.aux = kKeyBit;
      return true;
    case kColon:
      if (is_space(b)) return whitespace();
      if (b != ':') return false;
      c.mode = kValue;
      c.aux = 0;
      return true;
    case kValue:
      if (is_space(b)) return whitespace();
      return begin_value(c, b);
    case kArrayOpen:
      if (is_space(b)) return whitespace();
      if (b == ']') return close(c, '[');
      return begin_value(c, b);
    case kAfterValue:
      if (is_space(b)) return whitespace();
      if (b == '}') return close(c, '{');
      if (b == ']') return close(c, '[');
      if (b != ',') return false;
      c.mode = c.stack.back() == '{' ? kKey : kValue;
      c.aux = 0;
      return true;
    case kString: {
      const std::uint8_t key = c.aux & kKeyBit;
      if (b == '"') {
        if (key) {
          c.mode = kColon;
          c.aux = 0;
        } else {
          value_done(c);
        }
        return true;
      }
      if (b == '\\') {
        c.mode = kEscape;
        return true;
      }
      if (b < 0x20) return false;
      if (b < 0x80) return true;
      int need = 0, range = 0;
      if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
      } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        range = b == 0xE0 ? 1 : b == 0xED ? 2 : 0;
      } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        range = b == 0xF0 ? 3 : b == 0xF4 ? 4 : 0;
      } else {
        return false;
      }
      c.mode = kUtf8;
      c.aux = static_cast<std::uint8_t>(need | range << 3 | key);
      return true;
    }
    case kUtf8: {
      const std::uint8_t key = c.aux & kKeyBit;
      const int need = c.aux & 7, range = (c.aux >> 3) & 7;
      if (b < kRangeLo[range] || b > kRangeHi[range]) return false;
      if (need == 1) {
        c.mode = kString;
        c.aux = key;
      } else {
        c.aux = static_cast<std::uint8_t>((need - 1) | key);  // later bytes: 80-BF
      }
      return true;
    }
    case kEscape:
      if (b == 'u') {
        c.mode = kHex;
        c.aux = static_cast<std::uint8_t>(4 | (c.aux & kKeyBit));
        return true;
      }
      if (b != '"' && b != '\\' && b != '/' && b != 'b' && b != 'f' && b != 'n' && b != 'r' &&
          b != 't')
        return false;
      c.mode = kString;
      return true;
    case kHex: {
      if (!is_hex(b)) return false;
      const int need = (c.aux & 7) - 1;
      std::uint8_t flags = c.aux & (kHigh | kLowNeeded | kKeyBit);
      const bool d = b == 'd' || b == 'D';
      if (need == 3) {  // the first digit
        if (c.aux & kLowNeeded && !d) return false;
        if (d) flags |= kFirstD;
      } else if (need == 2 && c.aux & kFirstD) {  // the second digit of DXXX
        const bool high =
            (b >= '8' && b <= '9') || (b >= 'a' && b <= 'b') || (b >= 'A' && b <= 'B');
        const bool low = is_hex(b) && !is_digit(b) && !high;  // c-f
        if (c.aux & kLowNeeded ? !low : low) return false;
        if (high) flags |= kHigh;
      }
      if (need > 0) {
        c.mode = kHex;
        c.aux = static_cast<std::uint8_t>(need | flags);
      } else {
        c.mode = flags & kHigh ? kLowSlash : kString;
        c.aux = flags & kKeyBit;
      }
      return true;
    }
    case kLowSlash:
      if (b != '\\') return false;
      c.mode = kLowU;
      return true;
    case kLowU:
      if (b != 'u') return false;
      c.mode = kHex;
      c.aux = static_cast<std::uint8_t>(4 | kLowNeeded | (c.aux & kKeyBit));
      return true;
    case kNumMinus:
      if (b == '0') {
        c.mode = kNumZero;
        return true;
      }
      if (b >= '1' && b <= '9') {
        c.mode = kNumInt;
        return true;
      }
      return false;
    case kNumZero:
    case kNumInt:
      if (is_digit(b) && c.mode == kNumInt) return true;
      if (b == '.') {
        c.mode = kNumDot;
        return true;
      }
      if (b == 'e' || b == 'E') {
        c.mode = kNumE;
        return true;
      }
      return end_number();
    case kNumDot:
      if (!is_digit(b)) return false;
      c.mode = kNumFrac;
      return true;
    case kNumFrac:
      if (is_digit(b)) return true;
      if (b == 'e' || b == 'E') {
        c.mode = kNumE;
        return true;
      }
      return end_number();
    case kNumE:
      if (b == '+' || b == '-') {
        c.mode = kNumESign;
        return true;
      }
      [[fallthrough]];
    case kNumESign:
      if (!is_digit(b)) return false;
      c.mode = kNumExp;
      return true;
    case kNumExp:
      if (is_digit(b)) return true;
      return end_number();
    case kLiteral: {
      const std::string_view lit = kLiterals[c.aux / 8];
      const std::size_t at = c.aux % 8;
      if (static_cast<char>(b) != lit[at]) return false;
      if (at + 1 == lit.size())
        value_done(c);
      else
        ++c.aux;
      return true;
    }
    default:  // kDone
      return false;
  }
}

std::string key_of(const Config& c) {
  std::string k;
  k.reserve(c.stack.size() + 2);
  k.push_back(static_cast<char>(c.mode));
  k.push_back(static_cast<char>(c.aux));
  k += c.stack;
  return k;
}

}  // namespace

JsonGrammar::JsonGrammar() {
  intern(Config{});
}

std::int32_t JsonGrammar::intern(const Config& c) const {
  const auto [it, added] = ids_.emplace(key_of(c), static_cast<std::int32_t>(configs_.size()));
  if (added) {
    configs_.push_back(c);
    std::array<std::int32_t, 256> unknown;
    unknown.fill(kUnknown);
    next_.push_back(unknown);
  }
  return it->second;
}

std::int32_t JsonGrammar::next(std::int32_t state, std::uint8_t b) const {
  std::int32_t& memo = next_[static_cast<std::size_t>(state)][b];
  if (memo != kUnknown) return memo;
  Config c = configs_[static_cast<std::size_t>(state)];
  const std::int32_t to = transition(c, b) ? intern(c) : kDead;
  next_[static_cast<std::size_t>(state)][b] = to;  // intern may have moved the table
  return to;
}

bool JsonGrammar::accepting(std::int32_t state) const noexcept {
  return configs_[static_cast<std::size_t>(state)].mode == kDone;
}

bool JsonGrammar::extendable(std::int32_t state) const noexcept {
  return !accepting(state);
}

bool JsonGrammar::matches(std::string_view text) const {
  const std::int32_t s = walk(start(), text);
  return s != kDead && accepting(s);
}

}  // namespace dcp
