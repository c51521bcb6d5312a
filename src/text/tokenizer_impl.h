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

class Regex;  // a compiled PCRE2 pattern (tokenizer.cpp)

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
  std::optional<std::int32_t> bos, eos;
  std::string bos_text, eos_text;
  bool add_bos = false, add_eos = false;
  std::optional<std::string> chat_template;

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache;

  void load(const nlohmann::json& t);
  void load_config(const nlohmann::json& c);
  std::vector<std::string> pre_tokenize(const std::string& text) const;
  void bpe(const std::string& word, std::vector<std::int32_t>& out) const;
  void encode_plain(const std::string& text, std::vector<std::int32_t>& out) const;
};

}  // namespace dcp
