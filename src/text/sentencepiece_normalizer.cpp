#include "sentencepiece_normalizer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "dcp/error.h"
#include "dcp/tokenizer.h"

namespace dcp::text_internal {
namespace {

const std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581

// darts-clone's unit: a label (bit 31 set on value units, so that no byte matches one), a flag
// for a node that ends a key, and the offset to its children (bit 9: shifted by 8 more bits).
bool has_leaf(std::uint32_t u) {
  return ((u >> 8) & 1) == 1;
}
std::uint32_t value_of(std::uint32_t u) {
  return u & ((1U << 31) - 1);
}
std::uint32_t label_of(std::uint32_t u) {
  return u & ((1U << 31) | 0xFF);
}
std::uint32_t offset_of(std::uint32_t u) {
  return (u >> 10) << ((u & (1U << 9)) >> 6);
}

std::size_t utf8_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

[[noreturn]] void malformed(const std::string& why) {
  throw Error(ErrorCategory::io,
              str("tokenizer.model: normalizer_spec.precompiled_charsmap is malformed: ", why));
}

}  // namespace

SentencePieceNormalizer::SentencePieceNormalizer(std::string_view charsmap,
                                                 bool remove_extra_whitespaces)
    : remove_extra_whitespaces_(remove_extra_whitespaces) {
  if (charsmap.empty()) return;
  // <trie size, 4 bytes little-endian><the trie's units><the replacements, NUL-terminated>
  if (charsmap.size() <= 4) malformed("shorter than its 4-byte header");
  std::uint32_t trie_size = 0;
  for (int i = 3; i >= 0; --i)
    trie_size = (trie_size << 8) | static_cast<unsigned char>(charsmap[static_cast<unsigned>(i)]);
  charsmap.remove_prefix(4);
  if (trie_size >= charsmap.size() + 1 || trie_size % 4 != 0 || trie_size == 0)
    malformed(str("a trie of ", trie_size, " bytes in a map of ", charsmap.size(),
                  " (legal: a positive multiple of 4, within the map)"));
  units_.resize(trie_size / 4);
  for (std::size_t i = 0; i < units_.size(); ++i) {
    std::uint32_t u = 0;
    for (int b = 3; b >= 0; --b)
      u = (u << 8) | static_cast<unsigned char>(charsmap[4 * i + static_cast<unsigned>(b)]);
    units_[i] = u;
  }
  strings_ = std::string(charsmap.substr(trie_size));
  if (!strings_.empty() && strings_.back() != '\0')
    malformed("its last replacement has no terminating NUL");
  // Every node the walk can reach, once: each rule it can end on must point at a replacement
  // that is valid UTF-8, so that normalizing never reads outside the map.
  std::vector<char> seen(units_.size(), 0);
  std::vector<std::uint32_t> todo = {0};
  seen[0] = 1;
  while (!todo.empty()) {
    const std::uint32_t id = todo.back();
    todo.pop_back();
    const std::uint32_t base = id ^ offset_of(units_[id]);
    if (has_leaf(units_[id])) {
      if (base >= units_.size()) malformed(str("unit ", id, " ends a rule past the trie"));
      const std::uint32_t at = value_of(units_[base]);
      if (at >= strings_.size())
        malformed(str("a rule points at byte ", at, " of ", strings_.size(), " replacement bytes"));
      const char* s = strings_.c_str() + at;
      if (utf8_lossy(std::string_view(s, std::strlen(s))) != s)
        malformed(str("the replacement at byte ", at, " is not valid UTF-8"));
    }
    for (std::uint32_t c = 0; c < 256; ++c) {
      const std::uint32_t child = base ^ c;
      if (child < units_.size() && !seen[child] && label_of(units_[child]) == c) {
        seen[child] = 1;
        todo.push_back(child);
      }
    }
  }
}

std::pair<std::string_view, std::size_t> SentencePieceNormalizer::normalize_prefix(
    std::string_view text) const {
  std::size_t longest = 0;
  std::uint32_t at = 0;
  if (!units_.empty()) {  // darts-clone's common prefix search, keeping the longest match
    std::uint32_t id = offset_of(units_[0]);
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      id ^= c;
      if (id >= units_.size()) break;
      const std::uint32_t unit = units_[id];
      if (label_of(unit) != c) break;
      id ^= offset_of(unit);
      if (has_leaf(unit)) {  // checked at load: units_[id] names a terminated replacement
        longest = i + 1;
        at = value_of(units_[id]);
      }
    }
  }
  if (longest == 0) {
    const std::size_t n = std::min(utf8_length(static_cast<unsigned char>(text[0])), text.size());
    return {text.substr(0, n), n};
  }
  return {std::string_view(strings_.c_str() + at), longest};
}

std::string SentencePieceNormalizer::normalize(std::string_view text) const {
  std::string out;
  // Leading text that normalizes to one space is dropped; nothing else left: no text at all.
  if (remove_extra_whitespaces_) {
    while (!text.empty()) {
      const auto [piece, used] = normalize_prefix(text);
      if (piece != " ") break;
      text.remove_prefix(used);
    }
  }
  if (text.empty()) return out;
  out.reserve(text.size() + 8);
  out += kSpaceMark;  // add_dummy_prefix
  bool after_space = remove_extra_whitespaces_;
  while (!text.empty()) {
    auto [piece, used] = normalize_prefix(text);
    if (after_space)
      while (!piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
    if (!piece.empty()) {
      for (char ch : piece) {
        if (ch == ' ')
          out += kSpaceMark;
        else
          out += ch;
      }
      after_space = remove_extra_whitespaces_ && piece.back() == ' ';
    }
    text.remove_prefix(used);
  }
  if (remove_extra_whitespaces_) {
    while (out.size() >= kSpaceMark.size() &&
           std::string_view(out).substr(out.size() - kSpaceMark.size()) == kSpaceMark)
      out.resize(out.size() - kSpaceMark.size());
  }
  return out;
}

}  // namespace dcp::text_internal
