// The byte-level BPE tokenizer: tokenizer.json read, text encoded and decoded (see
// dcp/tokenizer.h for the pipeline; tiktoken.cpp reads tiktoken.model into the same state).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "dcp/tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "dcp/error.h"
#include "sentencepiece_model.h"
#include "tokenizer_impl.h"

namespace dcp {
namespace {

// The UTF-8 length of the character starting with byte b (the text is valid UTF-8 here).
std::size_t char_len(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

}  // namespace

namespace text_internal {

ByteLevelMap::ByteLevelMap() {
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const int cp = printable ? b : next++;
    std::string u;
    if (cp < 0x80) {
      u += static_cast<char>(cp);
    } else {  // U+0080..U+07FF: two bytes
      u += static_cast<char>(0xC0 | (cp >> 6));
      u += static_cast<char>(0x80 | (cp & 0x3F));
    }
    to_char[static_cast<std::size_t>(b)] = u;
    to_byte[u] = static_cast<unsigned char>(b);
  }
}

const ByteLevelMap& byte_level_map() {
  static const ByteLevelMap map;
  return map;
}

// A compiled PCRE2 pattern (UTF, Unicode properties), shareable across threads.
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    const std::uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0u);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                          &err, &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(err, message, sizeof message);
      throw Error(ErrorCategory::io, str(where, ": PCRE2 cannot compile the pattern at offset ",
                                         offset, ": ", reinterpret_cast<const char*>(message)));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // faster when available; fine without
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }

  // Every match of the pattern in s, as [begin, end) byte ranges, left to right.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    std::size_t at = 0;
    while (at <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        throw Error(ErrorCategory::internal, str("PCRE2 match failed with code ", rc));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const std::size_t b = ov[0], e = ov[1];
      if (e > b) out.emplace_back(b, e);
      // An empty match moves on by one character.
      at = e > b ? e : (e < s.size() ? e + char_len(static_cast<unsigned char>(s[e])) : e + 1);
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
};

}  // namespace text_internal

namespace {

using json = nlohmann::json;
using text_internal::byte_level_map;
using text_internal::ByteLevelMap;
using text_internal::PreStep;
using text_internal::Regex;

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  DCP_CHECK(in, io, "cannot read ", p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string type_of(const json& j, const std::string& where) {
  DCP_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), io, where,
            " must be an object with a string 'type'");
  return j["type"].get<std::string>();
}

bool flag(const json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  DCP_CHECK(j[key].is_boolean(), io, "tokenizer.json: '", key, "' must be true or false");
  return j[key].get<bool>();
}

}  // namespace

void Tokenizer::Impl::load(const json& t) {
  DCP_CHECK(t.is_object(), io, "tokenizer.json must hold a JSON object");
  // Model: BPE over byte-level characters.
  DCP_CHECK(t.contains("model"), io, "tokenizer.json: missing field 'model'");
  const json& m = t["model"];
  const std::string model_type = type_of(m, "tokenizer.json: 'model'");
  DCP_CHECK(model_type == "BPE", io, "tokenizer.json: model type '", model_type,
            "' is not supported (legal: BPE)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"}) {
    DCP_CHECK(!m.contains(key) || m[key].is_null(), io, "tokenizer.json: model.", key,
              " is not supported (must be null)");
  }
  ignore_merges = flag(m, "ignore_merges", false);
  DCP_CHECK(m.contains("vocab") && m["vocab"].is_object(), io,
            "tokenizer.json: model.vocab must be an object of token -> id");
  std::int32_t max_id = -1;
  for (const auto& [tok, id] : m["vocab"].items()) {
    DCP_CHECK(id.is_number_integer() && id.get<std::int64_t>() >= 0 &&
                  id.get<std::int64_t>() < (1LL << 30),
              io, "tokenizer.json: model.vocab['", tok, "'] must be an id in [0, 2^30)");
    vocab[tok] = id.get<std::int32_t>();
    max_id = std::max(max_id, id.get<std::int32_t>());
  }
  // Added tokens: matched in the text before anything else.
  if (t.contains("added_tokens") && !t["added_tokens"].is_null()) {
    DCP_CHECK(t["added_tokens"].is_array(), io, "tokenizer.json: 'added_tokens' must be a list");
    for (const json& a : t["added_tokens"]) {
      DCP_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() &&
                    a.contains("content") && a["content"].is_string(),
                io, "tokenizer.json: every added token needs an integer 'id' and a 'content'");
      const std::string content = a["content"].get<std::string>();
      const std::int64_t id = a["id"].get<std::int64_t>();
      DCP_CHECK(id >= 0 && id < (1LL << 30), io, "tokenizer.json: added token '", content,
                "' has id ", id, " outside [0, 2^30)");
      DCP_CHECK(!content.empty(), io, "tokenizer.json: an added token (id ", id, ") is empty");
      for (const char* key : {"lstrip", "rstrip", "single_word"}) {
        DCP_CHECK(!flag(a, key, false), io, "tokenizer.json: added token '", content, "': ", key,
                  " = true is not supported");
      }
      added.push_back({content, static_cast<std::int32_t>(id)});
      max_id = std::max(max_id, static_cast<std::int32_t>(id));
    }
  }
  // The id table is sized by the largest id: a sparse id would make it huge (2^30 entries for
  // one line), so ids must stay near the number of tokens, as every published vocabulary does.
  const std::int64_t entries = static_cast<std::int64_t>(vocab.size() + added.size());
  DCP_CHECK(max_id < 2 * entries + 65536, io, "tokenizer: the largest id, ", max_id,
            ", is far beyond the ", entries, " tokens (ids must be below 2 x tokens + 65536)");
  id_to_token.assign(static_cast<std::size_t>(max_id + 1), std::string());
  special.assign(id_to_token.size(), 0);
  for (const auto& [tok, id] : vocab) id_to_token[static_cast<std::size_t>(id)] = tok;
  if (t.contains("added_tokens") && t["added_tokens"].is_array()) {
    for (const json& a : t["added_tokens"]) {
      const auto id = static_cast<std::size_t>(a["id"].get<std::int64_t>());
      id_to_token[id] = a["content"].get<std::string>();
      special[id] = flag(a, "special", false) ? 1 : 0;
    }
  }
  std::sort(added.begin(), added.end(), [](const Added& x, const Added& y) {
    return x.content.size() > y.content.size();  // longest first: leftmost-longest matching
  });
  for (std::size_t i = 0; i < added.size(); ++i)
    added_by_first_byte[static_cast<unsigned char>(added[i].content[0])].push_back(i);

  // Merges: "a b" strings or [a, b] pairs, by rank.
  DCP_CHECK(m.contains("merges") && m["merges"].is_array(), io,
            "tokenizer.json: model.merges must be a list");
  std::int32_t rank = 0;
  for (const json& mg : m["merges"]) {
    std::string a, b;
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const std::size_t sp = s.find(' ');
      DCP_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size(), io,
                "tokenizer.json: merge ", rank, " '", s,
                "' is not two tokens separated by a space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      DCP_CHECK(mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string(), io,
                "tokenizer.json: merge ", rank, " must be \"a b\" or [a, b]");
      a = mg[0].get<std::string>();
      b = mg[1].get<std::string>();
    }
    const auto ia = vocab.find(a), ib = vocab.find(b), ir = vocab.find(a + b);
    DCP_CHECK(ia != vocab.end() && ib != vocab.end() && ir != vocab.end(), io,
              "tokenizer.json: merge ", rank, " ('", a, "', '", b,
              "') names a token that is not in the vocabulary");
    const std::uint64_t key = (static_cast<std::uint64_t>(ia->second) << 32) |
                              static_cast<std::uint32_t>(ib->second);
    merges.emplace(key, Merge{rank, ir->second});  // the first (lowest) rank of a pair wins
    ++rank;
  }

  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    DCP_CHECK(m["unk_token"].is_string(), io, "tokenizer.json: model.unk_token must be a string");
    const auto it = vocab.find(m["unk_token"].get<std::string>());
    DCP_CHECK(it != vocab.end(), io, "tokenizer.json: model.unk_token '",
              m["unk_token"].get<std::string>(), "' is not in the vocabulary");
    unk = it->second;
  }
  fuse_unk = flag(m, "fuse_unk", false);
  load_post_processor(t);
  if (flag(m, "byte_fallback", false)) {  // SentencePiece-style (sentencepiece_bpe.cpp)
    load_metaspace(t);
    return;
  }
  // Normalizer: none (DeepSeek ships an empty Sequence).
  if (t.contains("normalizer") && !t["normalizer"].is_null()) {
    const json& n = t["normalizer"];
    const std::string type = type_of(n, "tokenizer.json: 'normalizer'");
    DCP_CHECK(type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array() &&
                  n["normalizers"].empty(),
              io, "tokenizer.json: normalizer '", type,
              "' is not supported (legal: none, or an empty Sequence)");
  }
  // Pre-tokenizer: Split and ByteLevel steps, alone or in a Sequence.
  if (t.contains("pre_tokenizer") && !t["pre_tokenizer"].is_null()) {
    const json& p = t["pre_tokenizer"];
    std::vector<json> steps;
    if (type_of(p, "tokenizer.json: 'pre_tokenizer'") == "Sequence") {
      DCP_CHECK(p.contains("pretokenizers") && p["pretokenizers"].is_array(), io,
                "tokenizer.json: pre_tokenizer.pretokenizers must be a list");
      for (const json& s : p["pretokenizers"]) steps.push_back(s);
    } else {
      steps.push_back(p);
    }
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const json& s = steps[i];
      const std::string where = str("tokenizer.json: pre_tokenizer step ", i);
      const std::string type = type_of(s, where);
      PreStep step;
      if (type == "Split") {
        DCP_CHECK(s.contains("pattern") && s["pattern"].is_object(), io, where,
                  ": Split needs a 'pattern' object");
        const json& pat = s["pattern"];
        const bool literal = pat.contains("String");
        DCP_CHECK((literal && pat["String"].is_string()) ||
                      (pat.contains("Regex") && pat["Regex"].is_string()),
                  io, where, ": Split pattern must be {\"Regex\": ...} or {\"String\": ...}");
        step.regex = std::make_shared<Regex>(
            literal ? pat["String"].get<std::string>() : pat["Regex"].get<std::string>(), literal,
            where);
        const std::string behavior =
            s.contains("behavior") && s["behavior"].is_string() ? s["behavior"].get<std::string>()
                                                               : "";
        const bool invert = flag(s, "invert", false);
        if (behavior == "Isolated") {
          step.keep_matches = step.keep_gaps = true;
        } else if (behavior == "Removed") {
          step.keep_matches = invert;
          step.keep_gaps = !invert;
        } else {
          throw Error(ErrorCategory::io, str(where, ": Split behavior '", behavior,
                                             "' is not supported (legal: Isolated, Removed)"));
        }
      } else if (type == "ByteLevel") {
        step.kind = PreStep::byte_level;
        step.add_prefix_space = flag(s, "add_prefix_space", true);
        if (flag(s, "use_regex", true))
          step.regex = std::make_shared<Regex>(kGpt2Pattern, false, where);
      } else {
        throw Error(ErrorCategory::io, str(where, ": type '", type,
                                           "' is not supported (legal: Split, ByteLevel)"));
      }
      pre.push_back(std::move(step));
    }
  }
  DCP_CHECK(!pre.empty() && pre.back().kind == PreStep::byte_level, io,
            "tokenizer.json: the pre-tokenizer must end with ByteLevel (byte-level BPE)");
  for (std::size_t i = 0; i + 1 < pre.size(); ++i) {
    DCP_CHECK(pre[i].kind == PreStep::split, io,
              "tokenizer.json: ByteLevel must be the last pre-tokenizer step");
  }
  if (t.contains("decoder") && !t["decoder"].is_null()) {
    const std::string type = type_of(t["decoder"], "tokenizer.json: 'decoder'");
    DCP_CHECK(type == "ByteLevel", io, "tokenizer.json: decoder '", type,
              "' is not supported (legal: ByteLevel)");
  }
}

void Tokenizer::Impl::load_post_processor(const json& t) {
  if (!t.contains("post_processor") || t["post_processor"].is_null()) return;
  const json& p = t["post_processor"];
  const std::string type = type_of(p, "tokenizer.json: 'post_processor'");
  if (type == "ByteLevel") return;  // it only trims offsets; it adds no token
  DCP_CHECK(type == "TemplateProcessing", io, "tokenizer.json: post_processor '", type,
            "' is not supported (legal: ByteLevel, TemplateProcessing)");
  // One sequence with at most a special token before and one after: what encoding with special
  // tokens adds (tokenizer_config.json's add_bos_token / add_eos_token, when set, decide).
  const json single = p.contains("single") ? p["single"] : json();
  DCP_CHECK(single.is_array(), io, "tokenizer.json: post_processor.single must be a list");
  std::size_t seq = single.size();
  for (std::size_t i = 0; i < single.size(); ++i)
    if (single[i].is_object() && single[i].contains("Sequence")) seq = i;
  const auto special_at = [&](std::size_t i) -> std::int32_t {
    const json& item = single[i];
    DCP_CHECK(item.is_object() && item.contains("SpecialToken") &&
                  item["SpecialToken"].contains("id") && item["SpecialToken"]["id"].is_string(),
              io, "tokenizer.json: post_processor.single[", i,
              "] must be a SpecialToken or the Sequence");
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    for (std::size_t id = 0; id < id_to_token.size(); ++id)
      if (id_to_token[id] == name) return static_cast<std::int32_t>(id);
    throw Error(ErrorCategory::io,
                str("tokenizer.json: post_processor special token '", name, "' is not a token"));
  };
  DCP_CHECK(seq < single.size() && seq <= 1 && single.size() - seq <= 2, io,
            "tokenizer.json: post_processor.single = ", single.dump(),
            " is not supported (legal: the sequence with at most one special token before and "
            "one after)");
  if (seq == 1) {
    bos = special_at(0);
    bos_text = id_to_token[static_cast<std::size_t>(*bos)];
    add_bos = true;
  }
  if (seq + 2 == single.size()) {
    eos = special_at(seq + 1);
    eos_text = id_to_token[static_cast<std::size_t>(*eos)];
    add_eos = true;
  }
}

void Tokenizer::Impl::load_config(const json& c) {
  DCP_CHECK(c.is_object(), io, "tokenizer_config.json must hold a JSON object");
  const auto token_text = [&](const char* key) -> std::string {
    if (!c.contains(key) || c[key].is_null()) return {};
    const json& v = c[key];
    if (v.is_string()) return v.get<std::string>();
    DCP_CHECK(v.is_object() && v.contains("content") && v["content"].is_string(), io,
              "tokenizer_config.json: '", key, "' must be a string or an object with 'content'");
    return v["content"].get<std::string>();
  };
  const auto id_of = [&](const std::string& text, const char* key) -> std::optional<std::int32_t> {
    if (text.empty()) return std::nullopt;
    for (std::size_t id = 0; id < id_to_token.size(); ++id)
      if (id_to_token[id] == text) return static_cast<std::int32_t>(id);
    throw Error(ErrorCategory::io, str("tokenizer_config.json: ", key, " '", text,
                                       "' is not a token of tokenizer.json"));
  };
  if (c.contains("bos_token")) {
    bos_text = token_text("bos_token");
    bos = id_of(bos_text, "bos_token");
  }
  if (c.contains("eos_token")) {
    eos_text = token_text("eos_token");
    eos = id_of(eos_text, "eos_token");
  }
  // Hugging Face would edit decoded text ("a ." -> "a."); dcp decodes bytes exactly.
  DCP_CHECK(!flag(c, "clean_up_tokenization_spaces", false), io,
            "tokenizer_config.json: clean_up_tokenization_spaces = true is not supported "
            "(legal: false)");
  add_bos = flag(c, "add_bos_token", add_bos);
  add_eos = flag(c, "add_eos_token", add_eos);
  DCP_CHECK(!add_bos || bos, io, "tokenizer_config.json: add_bos_token without a bos_token");
  DCP_CHECK(!add_eos || eos, io, "tokenizer_config.json: add_eos_token without an eos_token");
  if (c.contains("chat_template") && !c["chat_template"].is_null()) {
    const json& ct = c["chat_template"];
    if (ct.is_string()) {
      chat_template = ct.get<std::string>();
    } else {  // a list of named templates: the default one
      DCP_CHECK(ct.is_array(), io,
                "tokenizer_config.json: chat_template must be a string or a list of named ones");
      for (const json& e : ct) {
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string())
          chat_template = e["template"].get<std::string>();
      }
      DCP_CHECK(chat_template.has_value(), io,
                "tokenizer_config.json: chat_template lists no template named 'default'");
    }
  }
}

std::vector<std::string> Tokenizer::Impl::pre_tokenize(const std::string& text) const {
  std::vector<std::string> pieces{text};
  for (const PreStep& step : pre) {
    std::vector<std::string> next;
    for (std::string& piece : pieces) {
      if (step.kind == PreStep::byte_level && step.add_prefix_space && piece[0] != ' ')
        piece.insert(piece.begin(), ' ');
      if (!step.regex) {
        next.push_back(std::move(piece));
        continue;
      }
      std::size_t at = 0;
      for (const auto& [b, e] : step.regex->find_all(piece)) {
        if (b > at && step.keep_gaps) next.push_back(piece.substr(at, b - at));
        if (step.keep_matches) next.push_back(piece.substr(b, e - b));
        at = e;
      }
      if (at < piece.size() && step.keep_gaps) next.push_back(piece.substr(at));
    }
    pieces = std::move(next);
  }
  // The last step is ByteLevel: every byte becomes its visible character.
  const ByteLevelMap& map = byte_level_map();
  for (std::string& piece : pieces) {
    std::string mapped;
    mapped.reserve(piece.size() * 2);
    for (unsigned char b : piece) mapped += map.to_char[b];
    piece = std::move(mapped);
  }
  return pieces;
}

void Tokenizer::Impl::bpe(const std::string& word, std::vector<std::int32_t>& out) const {
  if (ignore_merges) {
    const auto it = vocab.find(word);
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mutex);
    const auto it = cache.find(word);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // Symbols as a linked list; candidate merges in a heap by (rank, position).
  struct Symbol {
    std::int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<std::int32_t> initial;
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t n = char_len(static_cast<unsigned char>(word[i]));
    DCP_CHECK(initial_symbols(std::string_view(word).substr(i, n), initial), io,
              "tokenizer: the character '", word.substr(i, n),
              "' is not in the vocabulary and has no fallback");
    i += n;
  }
  std::vector<Symbol> sym;
  for (std::int32_t id : initial) {
    const int k = static_cast<int>(sym.size());
    sym.push_back({id, k - 1, k + 1, true});
  }
  if (!sym.empty()) sym.back().next = -1;
  struct Candidate {
    std::int32_t rank;
    int left;
    std::int32_t left_id, right_id, result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto consider = [&](int left) {
    if (left < 0 || sym[left].next < 0) return;
    const int right = sym[left].next;
    const std::uint64_t key = (static_cast<std::uint64_t>(sym[left].id) << 32) |
                              static_cast<std::uint32_t>(sym[right].id);
    const auto it = merges.find(key);
    if (it != merges.end())
      heap.push({it->second.rank, left, sym[left].id, sym[right].id, it->second.result});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = sym[c.left];
    if (!l.alive || l.id != c.left_id || l.next < 0) continue;
    Symbol& r = sym[l.next];
    if (r.id != c.right_id) continue;  // stale: a neighbour merged since
    l.id = c.result;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    consider(l.prev);
    consider(c.left);
  }
  std::vector<std::int32_t> ids;
  for (const Symbol& s : sym)
    if (s.alive) ids.push_back(s.id);
  out.insert(out.end(), ids.begin(), ids.end());
  if (word.size() > 256) return;  // a whole SentencePiece text: not worth keeping
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (cache.size() > 200000) cache.clear();  // bounded: long texts of unique words
  cache.emplace(word, std::move(ids));
}

void Tokenizer::Impl::encode_plain(const std::string& text, std::vector<std::int32_t>& out) const {
  if (text.empty()) return;
  if (metaspace) {
    const std::string word = sp_normalizer->normalize(text);
    if (!word.empty()) bpe(word, out);  // collapsed spaces may leave nothing
    return;
  }
  for (const std::string& word : pre_tokenize(text)) bpe(word, out);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(const std::string& tokenizer_json, const std::string& config_json) {
  auto impl = std::make_unique<Impl>();
  try {
    impl->load(json::parse(tokenizer_json));
  } catch (const json::exception& e) {
    throw Error(ErrorCategory::io, str("tokenizer.json is not valid JSON: ", e.what()));
  }
  if (!config_json.empty()) {
    json c;
    try {
      c = json::parse(config_json);
    } catch (const json::exception& e) {
      throw Error(ErrorCategory::io, str("tokenizer_config.json is not valid JSON: ", e.what()));
    }
    impl->load_config(c);
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_sentencepiece(const std::string& model_bytes,
                                        const std::string& config_json) {
  SentencePieceConversion c = convert_sentencepiece_model(model_bytes, config_json);
  Tokenizer tok = from_json(c.tokenizer_json, config_json);
  if (c.normalizer) tok.impl_->sp_normalizer = std::move(c.normalizer);
  return tok;
}

bool Tokenizer::found_in(const std::string& dir) {
  namespace fs = std::filesystem;
  for (const char* name : {"tokenizer.json", "tiktoken.model", "tokenizer.model"})
    if (std::error_code ec; fs::is_regular_file(fs::path(dir) / name, ec)) return true;
  return false;
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path t = fs::path(dir) / "tokenizer.json", c = fs::path(dir) / "tokenizer_config.json";
  const fs::path tiktoken = fs::path(dir) / "tiktoken.model";
  const fs::path sentencepiece = fs::path(dir) / "tokenizer.model";
  DCP_CHECK(found_in(dir), io, "tokenizer directory ", dir,
            " has none of tokenizer.json, tiktoken.model and tokenizer.model");
  try {
    const std::string config = fs::is_regular_file(c) ? read_file(c) : std::string();
    // tokenizer.json first, as Transformers prefers it; a SentencePiece model is converted the
    // way Transformers converts it when there is none.
    Tokenizer tok = fs::is_regular_file(t) ? from_json(read_file(t), config)
                    : fs::is_regular_file(tiktoken)
                        ? from_tiktoken(read_file(tiktoken), config)
                        : from_sentencepiece(read_file(sentencepiece), config);
    // As transformers (4.47 on) reads a checkpoint: a chat_template.jinja beside the tokenizer
    // files is the chat template, over tokenizer_config.json's (Kimi K2 ships its template so).
    const fs::path jinja = fs::path(dir) / "chat_template.jinja";
    if (fs::is_regular_file(jinja)) tok.set_chat_template(read_file(jinja));
    return tok;
  } catch (const Error& e) {
    throw Error(e.category(), str(dir, ": ", e.what()));
  }
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view raw, bool add_special_tokens) const {
  const Impl& m = *impl_;
  const std::string text = utf8_lossy(raw);
  std::vector<std::int32_t> out;
  if (add_special_tokens && m.add_bos) out.push_back(*m.bos);
  // Added tokens first, leftmost then longest; the text between them goes through BPE.
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t* hit = nullptr;
    for (const std::size_t& k : m.added_by_first_byte[static_cast<unsigned char>(text[i])]) {
      const std::string& c = m.added[k].content;
      if (text.compare(i, c.size(), c) == 0) {
        hit = &k;
        break;  // longest first
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    m.encode_plain(text.substr(start, i - start), out);
    out.push_back(m.added[*hit].id);
    i += m.added[*hit].content.size();
    start = i;
  }
  m.encode_plain(text.substr(start), out);
  if (add_special_tokens && m.add_eos) out.push_back(*m.eos);
  return out;
}

bool Tokenizer::contains(std::int32_t id) const noexcept {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->id_to_token.size() &&
         !impl_->id_to_token[static_cast<std::size_t>(id)].empty();
}

const std::string& Tokenizer::token_piece(std::int32_t id) const {
  DCP_ARG_CHECK(contains(id), "token id ", id, " is not in the vocabulary (",
                impl_->id_to_token.size(), " ids)");
  return impl_->id_to_token[static_cast<std::size_t>(id)];
}

std::string Tokenizer::token_bytes(std::int32_t id) const {
  const Impl& m = *impl_;
  DCP_ARG_CHECK(id >= 0 && static_cast<std::size_t>(id) < m.id_to_token.size() &&
                    (!m.id_to_token[static_cast<std::size_t>(id)].empty()),
                "token id ", id, " is not in the vocabulary (", m.id_to_token.size(), " ids)");
  const std::string& tok = m.id_to_token[static_cast<std::size_t>(id)];
  if (m.metaspace) return m.metaspace_bytes(id);
  // As the ByteLevel decoder: a token whose characters all map to bytes becomes those bytes;
  // one that does not (an added token's text) stays as it is.
  const ByteLevelMap& map = byte_level_map();
  std::string bytes;
  for (std::size_t i = 0; i < tok.size();) {
    const std::size_t n = char_len(static_cast<unsigned char>(tok[i]));
    const auto it = map.to_byte.find(tok.substr(i, n));
    if (it == map.to_byte.end()) return tok;
    bytes += static_cast<char>(it->second);
    i += n;
  }
  return bytes;
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (std::int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  // SentencePiece's decoder drops the space its normalizer put before the text.
  if (impl_->strip_leading_space && !bytes.empty() && bytes[0] == ' ') bytes.erase(0, 1);
  return utf8_lossy(bytes);
}

bool Tokenizer::is_special(std::int32_t id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->special.size() &&
         impl_->special[static_cast<std::size_t>(id)] != 0;
}

std::int32_t Tokenizer::vocab_size() const noexcept {
  return static_cast<std::int32_t>(impl_->id_to_token.size());
}
std::optional<std::int32_t> Tokenizer::bos_id() const noexcept { return impl_->bos; }
std::optional<std::int32_t> Tokenizer::eos_id() const noexcept { return impl_->eos; }
const std::optional<std::string>& Tokenizer::chat_template() const noexcept {
  return impl_->chat_template;
}
void Tokenizer::set_chat_template(std::string jinja) {
  impl_->chat_template = std::move(jinja);
}
const std::string& Tokenizer::bos_token() const noexcept { return impl_->bos_text; }
const std::string& Tokenizer::eos_token() const noexcept { return impl_->eos_text; }

}  // namespace dcp
