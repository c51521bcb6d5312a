// tiktoken.model, as Kimi ships its tokenizer: the ranks read into the byte-level BPE tokenizer
// (tokenizer_impl.h), the pre-tokenizer pattern's class intersections rewritten for PCRE2.
#include <charconv>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "dcp/error.h"
#include "dcp/tokenizer.h"
#include "tokenizer_impl.h"

namespace dcp {
namespace {

using json = nlohmann::json;
using text_internal::byte_level_map;
using text_internal::ByteLevelMap;

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with padding; nullopt when malformed.
std::optional<std::string> base64_decode(std::string_view in) {
  if (in.empty() || in.size() % 4 != 0) return std::nullopt;
  std::string out;
  for (std::size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char ch = in[i + static_cast<std::size_t>(k)];
      if (ch == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else if (pad > 0 || (v[k] = base64_value(ch)) < 0) {
        return std::nullopt;
      }
    }
    const std::uint32_t n =
        (static_cast<std::uint32_t>(v[0]) << 18) | (static_cast<std::uint32_t>(v[1]) << 12) |
        (static_cast<std::uint32_t>(v[2]) << 6) | static_cast<std::uint32_t>(v[3]);
    out += static_cast<char>(n >> 16);
    if (pad < 2) out += static_cast<char>((n >> 8) & 0xFF);
    if (pad < 1) out += static_cast<char>(n & 0xFF);
  }
  return out;
}

const char* const kKimiPattern =
    R"([\p{Han}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|)"
    R"(\s+(?!\S)|)"
    R"(\s+)";
}  // namespace

const std::string& Tokenizer::kimi_pattern() {
  static const std::string pattern = kKimiPattern;
  return pattern;
}

std::string rewrite_class_intersections(const std::string& pattern) {
  // Finds the ']' closing the class that opens at `open`, past escapes and nested classes.
  const auto class_end = [](const std::string& p, std::size_t open) {
    int depth = 0;
    for (std::size_t i = open; i < p.size(); ++i) {
      if (p[i] == '\\') {
        ++i;
      } else if (p[i] == '[') {
        ++depth;
      } else if (p[i] == ']' && --depth == 0) {
        return i;
      }
    }
    throw Error(ErrorCategory::invalid_argument,
                str("pattern: the class at offset ", open, " is not closed"));
  };
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\') {
      out += pattern.substr(i, 2);
      ++i;
      continue;
    }
    if (pattern[i] != '[') {
      out += pattern[i];
      continue;
    }
    const std::size_t end = class_end(pattern, i);
    const std::string body = pattern.substr(i + 1, end - i - 1);
    // A top-level "&&" (outside escapes and nested classes) splits the class.
    std::size_t amp = std::string::npos;
    for (std::size_t k = 0, depth = 0; k + 1 < body.size(); ++k) {
      if (body[k] == '\\') {
        ++k;
      } else if (body[k] == '[') {
        ++depth;
      } else if (body[k] == ']') {
        --depth;
      } else if (depth == 0 && body[k] == '&' && body[k + 1] == '&') {
        amp = k;
        break;
      }
    }
    if (amp == std::string::npos) {
      out += pattern.substr(i, end - i + 1);
    } else {
      const std::string left = body.substr(0, amp), right = body.substr(amp + 2);
      DCP_ARG_CHECK(!right.empty() && right.front() == '[' &&
                        class_end(right, 0) + 1 == right.size() &&
                        right.find("&&") == std::string::npos,
                    "pattern: the intersection at offset ", i,
                    " must be [A&&[B]] with one bracketed class after &&");
      // [A&&B]: one character that B accepts (a lookahead) and A consumes.
      out += "(?:(?=" + right + ")[" + left + "])";
    }
    i = end;
  }
  return out;
}

Tokenizer Tokenizer::from_tiktoken(const std::string& model_text, const std::string& config_json,
                                   const std::string& pattern) {
  // The ranks: one "base64-token rank" per line; the rank is the token id.
  std::map<std::int32_t, std::string> by_rank;
  std::unordered_map<std::string, std::int32_t> rank_of;
  std::size_t line_no = 0;
  for (std::size_t at = 0; at < model_text.size();) {
    std::size_t eol = model_text.find('\n', at);
    if (eol == std::string::npos) eol = model_text.size();
    std::string_view line(model_text.data() + at, eol - at);
    at = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::size_t sp = line.find(' ');
    const auto bytes = sp == std::string::npos ? std::nullopt : base64_decode(line.substr(0, sp));
    std::int64_t rank = -1;
    if (sp != std::string::npos) {
      const std::string_view r = line.substr(sp + 1);
      const auto [p, ec] = std::from_chars(r.data(), r.data() + r.size(), rank);
      if (ec != std::errc() || p != r.data() + r.size()) rank = -1;
    }
    DCP_CHECK(bytes && rank >= 0 && rank < (1LL << 30), io, "tiktoken.model line ", line_no,
              ": expected 'base64-token rank' with a rank in [0, 2^30)");
    DCP_CHECK(by_rank.emplace(static_cast<std::int32_t>(rank), *bytes).second &&
                  rank_of.emplace(*bytes, static_cast<std::int32_t>(rank)).second,
              io, "tiktoken.model line ", line_no, ": rank ", rank, " or its token repeats");
  }
  for (int b = 0; b < 256; ++b) {
    DCP_CHECK(rank_of.count(std::string(1, static_cast<char>(b))), io, "tiktoken.model: byte ", b,
              " has no token (byte-level BPE needs all 256)");
  }
  // As a byte-level BPE: tokens as byte-level characters, the pre-tokenizer pattern (its class
  // intersections rewritten for PCRE2), whole pieces that are tokens kept as they are.
  const ByteLevelMap& map = byte_level_map();
  const auto visible = [&](const std::string& bytes) {
    std::string v;
    for (unsigned char ch : bytes) v += map.to_char[ch];
    return v;
  };
  json t;
  json vocab = json::object();
  for (const auto& [rank, bytes] : by_rank) vocab[visible(bytes)] = rank;
  t["model"] = {
      {"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"ignore_merges", true}};
  t["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern", {{"Regex", rewrite_class_intersections(pattern)}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  t["decoder"] = {{"type", "ByteLevel"}};
  // Special tokens: tokenizer_config.json's added_tokens_decoder ({"id": {"content": ...}}).
  json config = json::object();
  if (!config_json.empty()) {
    try {
      config = json::parse(config_json);
    } catch (const json::exception& e) {
      throw Error(ErrorCategory::io, str("tokenizer_config.json is not valid JSON: ", e.what()));
    }
  }
  t["added_tokens"] = json::array();
  if (config.is_object() && config.contains("added_tokens_decoder")) {
    const json& d = config["added_tokens_decoder"];
    DCP_CHECK(d.is_object(), io, "tokenizer_config.json: added_tokens_decoder must be an object");
    for (const auto& [key, value] : d.items()) {
      std::int64_t id = -1;
      const auto [p, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      DCP_CHECK(ec == std::errc() && p == key.data() + key.size() && value.is_object() &&
                    value.contains("content") && value["content"].is_string(),
                io, "tokenizer_config.json: added_tokens_decoder entry '", key,
                "' needs an integer id and a string 'content'");
      DCP_CHECK(!by_rank.count(static_cast<std::int32_t>(id)), io,
                "tokenizer_config.json: added token id ", id, " is also a tiktoken rank");
      t["added_tokens"].push_back(
          {{"id", id}, {"content", value["content"]}, {"special", value.value("special", true)}});
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->load(t);
  // tiktoken keeps only the pattern's matches, and merges the adjacent pair whose bytes form the
  // lowest-ranked token (leftmost on ties): every split of a token into two tokens is a merge of
  // that token's rank.
  impl->pre.front().keep_gaps = false;
  for (const auto& [rank, bytes] : by_rank) {
    for (std::size_t k = 1; k < bytes.size(); ++k) {
      const auto left = rank_of.find(bytes.substr(0, k)), right = rank_of.find(bytes.substr(k));
      if (left == rank_of.end() || right == rank_of.end()) continue;
      const std::uint64_t key = (static_cast<std::uint64_t>(left->second) << 32) |
                                static_cast<std::uint32_t>(right->second);
      impl->merges.emplace(key, Impl::Merge{rank, rank});
    }
  }
  if (config.is_object() && !config.empty()) impl->load_config(config);
  return Tokenizer(std::move(impl));
}

}  // namespace dcp
