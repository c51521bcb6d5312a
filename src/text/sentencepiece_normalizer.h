// SentencePiece's normalizer, run as SentencePiece runs it: the model's compiled character map
// (NFKC and its variants, or rules from a TSV, as spm_train compiled them into a double-array
// trie) applied longest match first, runs of spaces collapsed and the text trimmed
// (remove_extra_whitespaces), U+2581 prepended (add_dummy_prefix) and for every space. Internal.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dcp::text_internal {

class SentencePieceNormalizer {
 public:
  // `charsmap`: normalizer_spec.precompiled_charsmap (empty: no character rule). Throws
  // dcp::Error (io) naming the field when the map is malformed: a trie size past the blob or not
  // whole units, a rule string without its terminator, a rule pointing outside the strings.
  SentencePieceNormalizer(std::string_view charsmap, bool remove_extra_whitespaces);

  // The text the model's BPE runs over: U+2581 first, then the normalized text with U+2581 for
  // each space. Empty when nothing but spaces remains under remove_extra_whitespaces. `text` must
  // be valid UTF-8 (the tokenizer replaces invalid bytes before it gets here).
  std::string normalize(std::string_view text) const;

 private:
  // The longest rule matching the start of `text`: its replacement and the bytes it consumes, or
  // {the first character unchanged, its length} when no rule matches.
  std::pair<std::string_view, std::size_t> normalize_prefix(std::string_view text) const;

  std::vector<std::uint32_t> units_;  // the double-array trie (darts-clone's layout)
  std::string strings_;               // the replacements, each ending in a NUL
  bool remove_extra_whitespaces_;
};

}  // namespace dcp::text_internal
