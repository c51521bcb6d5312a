// Internal to src/text: the tokenizer's state, which both loaders fill, tokenizer.json's
// (tokenizer.cpp) and tiktoken.model's (tiktoken.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dcp/tokenizer.h"

namespace dcp {
namespace text_internal {

// GPT-2's byte-to-unicode map: printable Latin-1 bytes stand for themselves, the other bytes for
// U+0100 upwards, so that every byte is a visible character.
struct ByteLevelMap {
  std::array<std::string, 256> to_char;  // byte -> UTF-8 of its character
  std::unordered_map<std::string, unsigned char> to_byte;
  ByteLevelMap();
};
const ByteLevelMap& byte_level_map();

class Regex;                    // a compiled PCRE2 pattern (tokenizer.cpp)
class SentencePieceNormalizer;  // a tokenizer.model's rules (sentencepiece_normalizer.cpp)

struct PreStep {
  enum Kind { split, byte_level } kind = split;
  std::shared_ptr<Regex> regex;  // split; byte_level with use_regex (GPT-2's pattern)
  bool keep_matches = true, keep_gaps = true;
  bool add_prefix_space = false;
};

}  // namespace text_internal

struct Tokenizer::Impl {
  std::unordered_map<std::string, std::int32_t> vocab;
  std::vector<std::string> id_to_token;  // model vocabulary and added tokens by id
  std::vector<char> special;             // per id: a special added token
  struct Merge {
    std::int32_t rank, result;
  };
  std::unordered_map<std::uint64_t, Merge> merges;  // (left id, right id) -> rank, merged id
  bool ignore_merges = false;
  struct Added {
    std::string content;
    std::int32_t id;
  };
  std::vector<Added> added;  // longest first within a first byte
  std::array<std::vector<std::size_t>, 256> added_by_first_byte;
  std::vector<text_internal::PreStep> pre;
  // SentencePiece-style BPE (Llama, MiniCPM): no pre-tokenizer, spaces become U+2581 with one
  // prepended to each stretch of text between added tokens, characters missing from the
  // vocabulary fall back to their bytes' <0xXX> tokens, and decoding undoes it (dropping the one
  // leading space of a decoded text). False: byte-level BPE.
  bool metaspace = false;
  std::array<std::int32_t, 256> byte_tokens{};  // metaspace: <0xXX> ids (-1: absent)
  std::vector<std::int16_t> byte_of_id;         // metaspace: per id, its byte (-1: not <0xXX>)
  std::optional<std::int32_t> unk;              // the model's unk_token, for what has no bytes
  bool fuse_unk = false;                        // a run of unknown characters is one unk
  bool strip_leading_space = false;             // the decoder's Strip(" ", 1, 0)
  // metaspace: writes each stretch's word (U+2581 marks, and a tokenizer.model's own rules).
  std::shared_ptr<const text_internal::SentencePieceNormalizer> sp_normalizer;
  std::optional<std::int32_t> bos, eos;
  std::string bos_text, eos_text;
  bool add_bos = false, add_eos = false;
  std::optional<std::string> chat_template;

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache;

  void load(const nlohmann::json& t);
  // metaspace: the normalizer, pre-tokenizer and decoder checked (sentencepiece_bpe.cpp).
  void load_metaspace(const nlohmann::json& t);
  // The symbols BPE starts from for one character of a word (its vocabulary id, else its bytes'
  // tokens under metaspace, else unk); false when there are none.
  bool initial_symbols(std::string_view ch, std::vector<std::int32_t>& out) const;
  // metaspace: the bytes of token `id` (a <0xXX> token's byte, else its piece with U+2581 as a
  // space).
  std::string metaspace_bytes(std::int32_t id) const;
  void load_config(const nlohmann::json& c);
  // post_processor: ByteLevel, or TemplateProcessing adding a BOS and/or an EOS token.
  void load_post_processor(const nlohmann::json& t);
  std::vector<std::string> pre_tokenize(const std::string& text) const;
  void bpe(const std::string& word, std::vector<std::int32_t>& out) const;
  void encode_plain(const std::string& text, std::vector<std::int32_t>& out) const;
};

}  // namespace dcp
