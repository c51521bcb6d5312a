// Text through a small byte-level BPE tokenizer (DeepSeek-V3's pre-tokenizer patterns, a few
// merges, added tokens) and a small SentencePiece-style one (byte fallback, U+2581 spaces): any
// bytes encode, and decoding gives back the text as UTF-8 reads it (SentencePiece: with U+2581 as
// a space, and streamed, with the space its normalizer put first).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "dcp/error.h"
#include "dcp/tokenizer.h"

namespace {

const dcp::Tokenizer& tokenizer() {
  static const dcp::Tokenizer t = [] {
    using json = nlohmann::json;
    // The 256 byte characters (GPT-2's table) as ids 0..255.
    json vocab = json::object();
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool kept = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const int cp = kept ? b : next++;
      std::string u = cp < 0x80 ? std::string(1, static_cast<char>(cp))
                                : std::string{static_cast<char>(0xC0 | (cp >> 6)),
                                              static_cast<char>(0x80 | (cp & 0x3F))};
      vocab[u] = b;
    }
    const char* merges[][2] = {{"t", "h"}, {"th", "e"}, {"\xc4\xa0", "t"}, {"i", "n"}, {"in", "g"}};
    json m = json::array();
    int id = 256;
    for (const auto& mg : merges) {
      const std::string joined = std::string(mg[0]) + mg[1];
      if (!vocab.contains(joined)) vocab[joined] = id++;
      m.push_back(std::string(mg[0]) + " " + mg[1]);
    }
    const auto split = [](const char* pattern) {
      return json{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}};
    };
    const json t = {
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           json::array(
               {split("\\p{N}{1,3}"),
                split("[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-"
                      "\xe3\x83\xbf]+"),
                split("[!\"#$%&'()*+,\\-./"
                      ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
                      "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"added_tokens", json::array({{{"id", 300}, {"content", "<|a|>"}, {"special", true}},
                                      {{"id", 301}, {"content", "<|ab|>"}, {"special", true}}})}};
    return dcp::Tokenizer::from_json(t.dump());
  }();
  return t;
}

// <unk> <s> </s>, the byte tokens, U+2581, a few letters and merges; no added tokens (after one,
// the normalizer's mark would decode as a space the text did not have, as in Hugging Face).
const dcp::Tokenizer& sentencepiece_tokenizer() {
  static const dcp::Tokenizer t = [] {
    using json = nlohmann::json;
    const std::string mark = "\xE2\x96\x81";
    json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      vocab[name] = 3 + b;
    }
    int next = 259;
    for (const std::string& piece : {mark, std::string("t"), std::string("h"), std::string("e"),
                                     mark + "t", std::string("he"), mark + "the"})
      vocab[piece] = next++;
    const json merges = {mark + " t", "h e", mark + "t he"};
    const json t = {
        {"model",
         {{"type", "BPE"},
          {"vocab", vocab},
          {"merges", merges},
          {"unk_token", "<unk>"},
          {"byte_fallback", true}}},
        {"normalizer",
         {{"type", "Sequence"},
          {"normalizers",
           json::array(
               {{{"type", "Prepend"}, {"prepend", mark}},
                {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", mark}}})}}},
        {"pre_tokenizer", nullptr},
        {"decoder",
         {{"type", "Sequence"},
          {"decoders",
           json::array({{{"type", "Replace"}, {"pattern", {{"String", mark}}}, {"content", " "}},
                        {{"type", "ByteFallback"}},
                        {{"type", "Fuse"}},
                        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}}};
    return dcp::Tokenizer::from_json(t.dump());
  }();
  return t;
}

// Decoded whole and streamed, `ids` give `want` (streamed: `streamed_prefix` first).
void check_round_trip(const dcp::Tokenizer& tok, const std::vector<std::int32_t>& ids,
                      const std::string& want, const std::string& streamed_prefix) {
  if (tok.decode(ids) != want) __builtin_trap();
  dcp::StreamDecoder stream(tok);
  std::string streamed;
  for (std::int32_t id : ids) streamed += stream.push(id);
  streamed += stream.finish();
  if (streamed != streamed_prefix + want) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string want = dcp::utf8_lossy(text);
  check_round_trip(tokenizer(), tokenizer().encode(text), want, "");
  // SentencePiece cannot tell a U+2581 of the text from a space: both decode as a space.
  std::string spaced;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (want.compare(i, 3, "\xE2\x96\x81") == 0) {
      spaced += ' ';
      i += 2;
    } else {
      spaced += want[i];
    }
  }
  check_round_trip(sentencepiece_tokenizer(), sentencepiece_tokenizer().encode(text), spaced,
                   text.empty() ? "" : " ");
  return 0;
}
