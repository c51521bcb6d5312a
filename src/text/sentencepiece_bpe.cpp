// SentencePiece-style BPE as Hugging Face tokenizer.json holds it for Llama-family vocabularies
// (Llama 2, MiniCPM): the normalizer turns spaces into U+2581 and prepends one, BPE runs over the
// whole normalized text with byte fallback, and the decoder maps U+2581 back to spaces, <0xXX>
// tokens to their bytes, and drops the one space the normalizer added. Only that exact pipeline
// is accepted: any other normalizer, pre-tokenizer or decoder is refused by name.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "dcp/error.h"
#include "sentencepiece_normalizer.h"
#include "tokenizer_impl.h"

namespace dcp {
namespace {

using json = nlohmann::json;

const char* const kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

std::string type_or_null(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string()
             ? j["type"].get<std::string>()
             : std::string(j.is_null() ? "null" : "(no type)");
}

// o[key] when it is a string equal to `want` (any other type or value: false).
bool is(const json& o, const char* key, const std::string& want) {
  return o.is_object() && o.contains(key) && o[key].is_string() && o[key] == want;
}

// o[key] when it is an integer equal to `want`.
bool is(const json& o, const char* key, int want) {
  return o.is_object() && o.contains(key) && o[key].is_number_integer() && o[key] == want;
}

// A {"String": s} pattern equal to `want`.
bool string_pattern_is(const json& step, const std::string& want) {
  return step.is_object() && step.contains("pattern") && is(step["pattern"], "String", want);
}

}  // namespace

void Tokenizer::Impl::load_metaspace(const json& t) {
  const auto field = [&](const char* key) { return t.contains(key) ? t[key] : json(); };
  // Normalizer: Prepend(U+2581) then Replace(" " -> U+2581), as the Llama conversion writes it.
  const json n = field("normalizer");
  const bool legacy =
      type_or_null(n) == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() &&
      n["normalizers"].size() == 2 && type_or_null(n["normalizers"][0]) == "Prepend" &&
      is(n["normalizers"][0], "prepend", kSpaceMark) &&
      type_or_null(n["normalizers"][1]) == "Replace" &&
      string_pattern_is(n["normalizers"][1], " ") && is(n["normalizers"][1], "content", kSpaceMark);
  DCP_CHECK(legacy, io,
            "tokenizer.json: with model.byte_fallback, the normalizer must be a Sequence of "
            "Prepend(\"\u2581\") and Replace(\" \", \"\u2581\") (SentencePiece's, as Llama's "
            "tokenizer.json has it); got ",
            n.dump());
  DCP_CHECK(field("pre_tokenizer").is_null(), io,
            "tokenizer.json: with model.byte_fallback, pre_tokenizer must be null (got type ",
            type_or_null(field("pre_tokenizer")), ")");
  // Decoder: Replace(U+2581 -> " "), ByteFallback, Fuse, and Strip(" ", 1, 0) or nothing.
  const json d = field("decoder");
  bool ok = type_or_null(d) == "Sequence" && d.contains("decoders") && d["decoders"].is_array() &&
            (d["decoders"].size() == 3 || d["decoders"].size() == 4);
  if (ok) {
    const json& s = d["decoders"];
    ok = type_or_null(s[0]) == "Replace" && string_pattern_is(s[0], kSpaceMark) &&
         is(s[0], "content", " ") && type_or_null(s[1]) == "ByteFallback" &&
         type_or_null(s[2]) == "Fuse";
    if (ok && s.size() == 4) {
      ok = type_or_null(s[3]) == "Strip" && is(s[3], "content", " ") && is(s[3], "start", 1) &&
           is(s[3], "stop", 0);
      strip_leading_space = ok;
    }
  }
  DCP_CHECK(ok, io,
            "tokenizer.json: with model.byte_fallback, the decoder must be a Sequence of "
            "Replace(\"\u2581\", \" \"), ByteFallback, Fuse and optionally Strip(\" \", 1, 0); "
            "got ",
            d.dump());
  // An added token is matched in the raw text; one marked normalized would be matched in the
  // U+2581-spelled text instead, which differs from the raw one where it holds a space.
  if (t.contains("added_tokens") && t["added_tokens"].is_array()) {
    for (const json& a : t["added_tokens"]) {
      const std::string content = a["content"].get<std::string>();
      DCP_CHECK(!(a.contains("normalized") && a["normalized"] == true &&
                  content.find(' ') != std::string::npos),
                io, "tokenizer.json: added token '", content,
                "': normalized = true with a space in it is not supported with "
                "model.byte_fallback");
    }
  }
  byte_tokens.fill(-1);
  byte_of_id.assign(id_to_token.size(), -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto it = vocab.find(name);
    if (it == vocab.end()) continue;
    byte_tokens[static_cast<std::size_t>(b)] = it->second;
    byte_of_id[static_cast<std::size_t>(it->second)] = static_cast<std::int16_t>(b);
  }
  // The normalizer above: U+2581 first and for each space, no other rule.
  sp_normalizer = std::make_shared<const text_internal::SentencePieceNormalizer>("", false);
  metaspace = true;
}

bool Tokenizer::Impl::initial_symbols(std::string_view ch, std::vector<std::int32_t>& out) const {
  const auto it = vocab.find(std::string(ch));
  if (it != vocab.end()) {
    out.push_back(it->second);
    return true;
  }
  if (metaspace) {  // byte fallback: every byte's token, else the whole character is unknown
    bool all = true;
    for (unsigned char b : ch) all = all && byte_tokens[b] >= 0;
    if (all) {
      for (unsigned char b : ch) out.push_back(byte_tokens[b]);
      return true;
    }
  }
  if (!unk) return false;
  if (!fuse_unk || out.empty() || out.back() != *unk) out.push_back(*unk);
  return true;
}

std::string Tokenizer::Impl::metaspace_bytes(std::int32_t id) const {
  const auto at = static_cast<std::size_t>(id);
  if (byte_of_id[at] >= 0) return std::string(1, static_cast<char>(byte_of_id[at]));
  const std::string& piece = id_to_token[at];
  std::string bytes;
  for (std::size_t i = 0; i < piece.size();) {
    if (piece.compare(i, 3, kSpaceMark) == 0) {
      bytes += ' ';
      i += 3;
    } else {
      bytes += piece[i++];
    }
  }
  return bytes;
}

}  // namespace dcp
