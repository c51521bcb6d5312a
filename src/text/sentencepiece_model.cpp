#include "sentencepiece_model.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dcp/error.h"
#include "dcp/tokenizer.h"

namespace dcp {
namespace {

using OrderedJson = nlohmann::ordered_json;

// Protocol buffers' wire format, read field by field (no generated code: the model holds three
// messages and a dozen fields dcp reads).
class ProtoReader {
 public:
  ProtoReader(std::string_view data, std::string what) : d_(data), what_(std::move(what)) {}
  bool done() const { return pos_ >= d_.size(); }
  // The next field's number and wire type.
  std::pair<std::uint32_t, int> key() {
    const std::uint64_t k = varint();
    const std::uint64_t field = k >> 3;
    DCP_CHECK(field >= 1 && field <= 0x1fffffff, io, "tokenizer.model: ", what_,
              " holds field number ", field);
    return {static_cast<std::uint32_t>(field), static_cast<int>(k & 7)};
  }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const auto b = static_cast<std::uint8_t>(d_[pos_++]);
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    fail("a varint longer than 10 bytes");
  }
  std::string_view bytes() {
    const std::uint64_t n = varint();
    need(n);
    const std::string_view s = d_.substr(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  float fixed32_float() {
    need(4);
    std::uint32_t bits = 0;
    for (int i = 3; i >= 0; --i)
      bits = (bits << 8) | static_cast<std::uint8_t>(d_[pos_ + static_cast<std::size_t>(i)]);
    pos_ += 4;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  void skip(int wire) {
    switch (wire) {
      case 0: varint(); return;
      case 1:
        need(8);
        pos_ += 8;
        return;
      case 2: bytes(); return;
      case 5:
        need(4);
        pos_ += 4;
        return;
      default: fail("wire type " + std::to_string(wire) + " (groups are not read)");
    }
  }
  void expect(int wire, int want, const char* field) {
    if (wire != want) fail(std::string("field ") + field + " has the wrong wire type");
  }

 private:
  void need(std::uint64_t n) const {
    if (n > d_.size() - pos_) fail("a truncated field");
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ErrorCategory::io, str("tokenizer.model: ", what_, ": ", why, " (at byte ", pos_,
                                       "; not a SentencePiece model?)"));
  }
  std::string_view d_;
  std::size_t pos_ = 0;
  std::string what_;
};

struct Piece {
  std::string text;
  float score = 0;
  int type = 1;  // NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6
};

struct Model {
  std::vector<Piece> pieces;
  int model_type = 1;  // UNIGRAM 1, BPE 2, WORD 3, CHAR 4
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  std::int64_t bos_id = 1;
  std::string charsmap;                // normalizer_spec.precompiled_charsmap
  bool denormalizer_charsmap = false;  // denormalizer_spec's: rules applied when decoding
  bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
};

Piece read_piece(std::string_view data) {
  ProtoReader r(data, "a piece");
  Piece p;
  while (!r.done()) {
    const auto [field, wire] = r.key();
    if (field == 1) {
      r.expect(wire, 2, "piece");
      p.text = std::string(r.bytes());
    } else if (field == 2) {
      r.expect(wire, 5, "score");
      p.score = r.fixed32_float();
    } else if (field == 3) {
      r.expect(wire, 0, "type");
      p.type = static_cast<int>(r.varint());
    } else {
      r.skip(wire);
    }
  }
  return p;
}

Model read_model(std::string_view data) {
  Model m;
  ProtoReader r(data, "the model");
  while (!r.done()) {
    const auto [field, wire] = r.key();
    if (field == 1) {  // pieces
      r.expect(wire, 2, "pieces");
      m.pieces.push_back(read_piece(r.bytes()));
    } else if (field == 2) {  // trainer_spec
      r.expect(wire, 2, "trainer_spec");
      ProtoReader t(r.bytes(), "trainer_spec");
      while (!t.done()) {
        const auto [f, w] = t.key();
        // A field dcp reads, written with another wire type, is refused rather than skipped.
        if (f == 3 || f == 24 || f == 35 || f == 41) t.expect(w, 0, "a trainer_spec field");
        if (f == 3 && w == 0) {
          m.model_type = static_cast<int>(t.varint());
        } else if (f == 24 && w == 0) {
          m.treat_whitespace_as_suffix = t.varint() != 0;
        } else if (f == 35 && w == 0) {
          m.byte_fallback = t.varint() != 0;
        } else if (f == 41 && w == 0) {
          m.bos_id = static_cast<std::int32_t>(t.varint());  // int32: -1 is ten bytes
        } else {
          t.skip(w);
        }
      }
    } else if (field == 3) {  // normalizer_spec
      r.expect(wire, 2, "normalizer_spec");
      ProtoReader n(r.bytes(), "normalizer_spec");
      while (!n.done()) {
        const auto [f, w] = n.key();
        if (f == 2) n.expect(w, 2, "a normalizer_spec field");
        if (f >= 3 && f <= 5) n.expect(w, 0, "a normalizer_spec field");
        if (f == 2 && w == 2) {
          m.charsmap = std::string(n.bytes());
        } else if (f == 3 && w == 0) {
          m.add_dummy_prefix = n.varint() != 0;
        } else if (f == 4 && w == 0) {
          m.remove_extra_whitespaces = n.varint() != 0;
        } else if (f == 5 && w == 0) {
          m.escape_whitespaces = n.varint() != 0;
        } else {
          n.skip(w);
        }
      }
    } else if (field == 5) {  // denormalizer_spec: only whether it has rules
      r.expect(wire, 2, "denormalizer_spec");
      ProtoReader n(r.bytes(), "denormalizer_spec");
      while (!n.done()) {
        const auto [f, w] = n.key();
        if (f == 2) n.expect(w, 2, "denormalizer_spec.precompiled_charsmap");
        if (f == 2 && w == 2)
          m.denormalizer_charsmap = !n.bytes().empty();
        else
          n.skip(w);
      }
    } else {
      r.skip(wire);
    }
  }
  return m;
}

// The code points of a UTF-8 string, as Python slices it (each an index into the bytes).
std::vector<std::size_t> char_starts(const std::string& s) {
  std::vector<std::size_t> starts;
  for (std::size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) starts.push_back(i);
  return starts;
}

}  // namespace

SentencePieceConversion convert_sentencepiece_model(std::string_view data,
                                                    const std::string& config_json) {
  const Model m = read_model(data);
  static const char* const kTypes[] = {"", "UNIGRAM", "BPE", "WORD", "CHAR"};
  const auto refuse = [](const std::string& field, const std::string& why) {
    throw Error(ErrorCategory::io, str("tokenizer.model: ", field, ": ", why));
  };
  if (m.model_type != 2)
    refuse("trainer_spec.model_type = " +
               std::string(m.model_type >= 1 && m.model_type <= 4 ? kTypes[m.model_type] : "?"),
           "dcp reads BPE SentencePiece models (legal: BPE)");
  if (!m.byte_fallback) refuse("trainer_spec.byte_fallback = false", "dcp reads models with it");
  if (m.treat_whitespace_as_suffix)
    refuse("trainer_spec.treat_whitespace_as_suffix = true", "not supported (legal: false)");
  if (m.denormalizer_charsmap)
    refuse("denormalizer_spec.precompiled_charsmap",
           "dcp applies no rule when decoding (legal: none, as spm_train writes it by default)");
  if (!m.escape_whitespaces || !m.add_dummy_prefix)
    refuse(std::string("normalizer_spec.") +
               (m.escape_whitespaces ? "add_dummy_prefix" : "escape_whitespaces") + " = false",
           "dcp reads models that mark spaces with U+2581 and prefix one (legal: true)");
  DCP_CHECK(!m.pieces.empty(), io, "tokenizer.model: the model has no pieces");

  std::unordered_map<std::string, std::int64_t> vocab;
  OrderedJson vocab_json = OrderedJson::object();
  std::string unk;
  OrderedJson added = OrderedJson::array();
  for (std::size_t id = 0; id < m.pieces.size(); ++id) {
    const Piece& p = m.pieces[id];
    DCP_CHECK(!p.text.empty(), io, "tokenizer.model: piece ", id, " is empty");
    DCP_CHECK(utf8_lossy(p.text) == p.text, io, "tokenizer.model: piece ", id,
              " is not valid UTF-8");
    DCP_CHECK(vocab.emplace(p.text, static_cast<std::int64_t>(id)).second, io,
              "tokenizer.model: piece '", p.text, "' appears twice");
    vocab_json[p.text] = id;
    if (p.type == 2 && unk.empty()) unk = p.text;
    // Unknown, control (<s>, </s>) and user-defined pieces are matched whole in the text, as
    // Transformers' converted tokenizer adds them.
    if (p.type == 2 || p.type == 3 || p.type == 4) {
      added.push_back({{"id", id},
                       {"content", p.text},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", p.type != 4}});
    }
  }
  // tokenizer_config.json's added_tokens_decoder: tokens Transformers' slow tokenizer adds to
  // the model's pieces (MiniCPM3's chat tokens follow its pieces so), or marks among them.
  if (!config_json.empty()) {
    OrderedJson c;
    try {
      c = OrderedJson::parse(config_json);
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCategory::io, str("tokenizer_config.json: malformed JSON: ", e.what()));
    }
    const OrderedJson* decoder =
        c.is_object() && c.contains("added_tokens_decoder") ? &c["added_tokens_decoder"] : nullptr;
    if (decoder && !decoder->is_null()) {
      DCP_CHECK(decoder->is_object(), io,
                "tokenizer_config.json: added_tokens_decoder must map ids to tokens");
      for (const auto& [key, a] : decoder->items()) {
        std::size_t used = 0;
        long long id = -1;
        try {
          id = std::stoll(key, &used);
        } catch (const std::exception&) {
        }
        DCP_CHECK(used == key.size() && id >= 0 && id < (1LL << 30), io,
                  "tokenizer_config.json: added_tokens_decoder key '", key,
                  "' is not an id in [0, 2^30)");
        DCP_CHECK(a.is_object() && a.contains("content") && a["content"].is_string(), io,
                  "tokenizer_config.json: added_tokens_decoder['", key, "'] needs a 'content'");
        const std::string content = a["content"].get<std::string>();
        if (static_cast<std::size_t>(id) < m.pieces.size()) {
          DCP_CHECK(m.pieces[static_cast<std::size_t>(id)].text == content, io,
                    "tokenizer_config.json: added_tokens_decoder['", key, "'] is '", content,
                    "', but piece ", id, " of tokenizer.model is '",
                    m.pieces[static_cast<std::size_t>(id)].text, "'");
        }
        OrderedJson entry = a;
        entry["id"] = id;
        bool replaced = false;
        for (OrderedJson& e : added) {
          if (e["id"] == id) {
            e = entry;
            replaced = true;
          }
        }
        if (!replaced) added.push_back(entry);
      }
    }
  }
  // Merges: every split of a piece into two pieces, ordered by the piece's score, highest first
  // (a stable order: then by the piece's id, then by the two halves' ids).
  struct MergeCandidate {
    float score;
    std::size_t piece;
    std::int64_t left, right;
    std::size_t cut;
  };
  std::vector<MergeCandidate> merges;
  for (std::size_t id = 0; id < m.pieces.size(); ++id) {
    const std::string& s = m.pieces[id].text;
    const std::vector<std::size_t> starts = char_starts(s);
    for (std::size_t k = 1; k < starts.size(); ++k) {
      const auto l = vocab.find(s.substr(0, starts[k])), r = vocab.find(s.substr(starts[k]));
      if (l != vocab.end() && r != vocab.end())
        merges.push_back({m.pieces[id].score, id, l->second, r->second, starts[k]});
    }
  }
  std::stable_sort(merges.begin(), merges.end(),
                   [](const MergeCandidate& a, const MergeCandidate& b) {
                     if (a.score != b.score) return a.score > b.score;
                     if (a.piece != b.piece) return a.piece < b.piece;
                     return std::make_pair(a.left, a.right) < std::make_pair(b.left, b.right);
                   });
  OrderedJson merges_json = OrderedJson::array();
  for (const MergeCandidate& c : merges) {
    const std::string& s = m.pieces[c.piece].text;
    merges_json.push_back(OrderedJson::array({s.substr(0, c.cut), s.substr(c.cut)}));
  }

  const std::string bos = m.bos_id >= 0 && static_cast<std::size_t>(m.bos_id) < m.pieces.size()
                              ? m.pieces[static_cast<std::size_t>(m.bos_id)].text
                              : std::string();
  SentencePieceConversion out;
  out.tokenizer_json = sentencepiece_tokenizer_json(std::move(added), std::move(vocab_json),
                                                    std::move(merges_json), unk, bos, m.bos_id)
                           .dump();
  // The normalizer's name only says which rules training compiled into the map: the map decides.
  if (!m.charsmap.empty() || m.remove_extra_whitespaces)
    out.normalizer = std::make_shared<const text_internal::SentencePieceNormalizer>(
        m.charsmap, m.remove_extra_whitespaces);
  return out;
}

OrderedJson sentencepiece_tokenizer_json(OrderedJson added, OrderedJson vocab, OrderedJson merges,
                                         const std::string& unk, const std::string& bos,
                                         std::int64_t bos_id) {
  const std::string mark = "\u2581";
  OrderedJson post = nullptr;
  if (!bos.empty()) {
    post = {{"type", "TemplateProcessing"},
            {"single", OrderedJson::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"pair", OrderedJson::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                         {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                         {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
                                         {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
            {"special_tokens",
             {{bos, {{"id", bos}, {"ids", {bos_id}}, {"tokens", OrderedJson::array({bos})}}}}}};
  }
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", std::move(added)},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         OrderedJson::array(
             {{{"type", "Prepend"}, {"prepend", mark}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", mark}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", post},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", OrderedJson::array(
                         {{{"type", "Replace"}, {"pattern", {{"String", mark}}}, {"content", " "}},
                          {{"type", "ByteFallback"}},
                          {{"type", "Fuse"}},
                          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", unk.empty() ? OrderedJson(nullptr) : OrderedJson(unk)},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", std::move(vocab)},
        {"merges", std::move(merges)}}}};
}

}  // namespace dcp
