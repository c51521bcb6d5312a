// A small BPE tokenizer for generated checkpoints, so that a random model takes and gives text
// like a real one: byte-level as DeepSeek's, or SentencePiece-style as MiniCPM3's.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "dcp/error.h"
#include "dcp/tokenizer.h"
#include "sentencepiece_model.h"

namespace dcp {
namespace {

using ordered_json = nlohmann::ordered_json;  // the files keep the order they are written in

// GPT-2's byte-to-unicode map, as the tokenizer reads it back.
std::string byte_char(int b) {
  const auto kept = [](int x) {
    return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
  };
  int cp = b;
  if (!kept(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x) cp += kept(x) ? 0 : 1;
  }
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  return {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
}

// Merges of frequent English pieces, each built from earlier ones ("_" stands for the space).
const char* const kMerges[][2] = {
    {"_", "t"},   {"_", "a"},   {"h", "e"},   {"i", "n"},   {"r", "e"},    {"o", "n"},
    {"_t", "he"}, {"e", "r"},   {"_", "s"},   {"a", "t"},   {"_", "w"},    {"_", "o"},
    {"e", "n"},   {"_", "c"},   {"i", "t"},   {"i", "s"},   {"a", "n"},    {"o", "r"},
    {"e", "s"},   {"_", "b"},   {"e", "d"},   {"_", "f"},   {"in", "g"},   {"_", "p"},
    {"o", "u"},   {"_a", "n"},  {"a", "l"},   {"a", "r"},   {"_t", "o"},   {"_", "m"},
    {"_o", "f"},  {"_", "in"},  {"_", "d"},   {"_", "h"},   {"_an", "d"},  {"i", "c"},
    {"a", "s"},   {"l", "e"},   {"_t", "h"},  {"i", "on"},  {"o", "m"},    {"l", "l"},
    {"en", "t"},  {"_", "n"},   {"_", "l"},   {"s", "t"},   {"_", "re"},   {"v", "e"},
    {"_", "e"},   {"r", "o"},   {"l", "y"},   {"_b", "e"},  {"_", "g"},    {"_", "T"},
    {"c", "t"},   {"_", "y"},   {"_", "S"},   {"_", "I"},   {"_", "A"},
};

// kMerges whose pieces (spelled by `piece`) are in `vocab`, each result added to it from id
// `next` while ids stay below `limit`; the merges in tokenizer.json's "a b" form.
ordered_json add_merges(ordered_json& vocab, const std::function<std::string(const char*)>& piece,
                        int& next, int limit) {
  ordered_json merges = ordered_json::array();
  for (const auto& m : kMerges) {
    if (next >= limit) break;
    const std::string a = piece(m[0]), b = piece(m[1]);
    if (!vocab.contains(a) || !vocab.contains(b) || vocab.contains(a + b)) continue;
    vocab[a + b] = next++;
    merges.push_back(a + " " + b);
  }
  return merges;
}

// tokenizer.json as given, and tokenizer_config.json with a plain chat format: system text first,
// then the turns, each assistant turn closed by EOS.
void write_files(const std::string& dir, const ordered_json& tokenizer) {
  const std::string chat_template =
      "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}\n"
      "{% elif m.role == 'user' %}<|user|>{{ m.content }}{% elif m.role == 'assistant' %}"
      "<|assistant|>{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"
      "{% if add_generation_prompt %}<|assistant|>{% endif %}";
  const ordered_json config = {{"add_bos_token", true},
                               {"add_eos_token", false},
                               {"bos_token", "<s>"},
                               {"eos_token", "</s>"},
                               {"chat_template", chat_template}};
  namespace fs = std::filesystem;
  for (const auto& [name, j] :
       {std::pair{"tokenizer.json", &tokenizer}, std::pair{"tokenizer_config.json", &config}}) {
    std::ofstream out(fs::path(dir) / name);
    out << j->dump(1) << "\n";
    DCP_CHECK(out.good(), io, "cannot write ", (fs::path(dir) / name).string());
  }
}

}  // namespace

namespace {

// SentencePiece-style: <unk> <s> </s>, the 256 byte tokens, U+2581 and the lowercase letters, the
// merges that fit; characters outside the vocabulary fall back to their bytes.
void write_sentencepiece(const std::string& dir, int vocab_size) {
  const std::string mark = "\xE2\x96\x81";
  const int n_turns = 2;  // <|user|>, <|assistant|>
  DCP_ARG_CHECK(
      vocab_size >= 3 + 256 + 1 + 26 + n_turns, "vocab_size = ", vocab_size,
      " must be >= ", 3 + 256 + 1 + 26 + n_turns,
      " for a SentencePiece-style tokenizer (3 specials, 256 bytes, U+2581, a-z, 2 turns)");
  ordered_json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  int next = 259;
  vocab[mark] = next++;
  for (char ch = 'a'; ch <= 'z'; ++ch) vocab[std::string(1, ch)] = next++;
  const auto piece = [&](const char* p) {
    std::string out;
    for (const char* c = p; *c; ++c) out += *c == '_' ? mark : std::string(1, *c);
    return out;
  };
  const ordered_json merges = add_merges(vocab, piece, next, vocab_size - n_turns);
  ordered_json added = ordered_json::array();
  const char* const specials[] = {"<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"};
  for (int k = 0; k < 5; ++k) {
    added.push_back({{"id", k < 3 ? k : next + k - 3},
                     {"content", specials[k]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const ordered_json tokenizer =
      sentencepiece_tokenizer_json(std::move(added), std::move(vocab), merges, "<unk>", "<s>", 1);
  write_files(dir, tokenizer);
}

}  // namespace

void write_small_tokenizer(const std::string& dir, int vocab_size, bool sentencepiece) {
  if (sentencepiece) {
    write_sentencepiece(dir, vocab_size);
    return;
  }
  const char* const specials[] = {"<s>", "</s>", "<|user|>", "<|assistant|>"};
  const int n_special = static_cast<int>(std::size(specials));
  DCP_ARG_CHECK(vocab_size >= 256 + n_special, "vocab_size = ", vocab_size, " must be >= ",
                256 + n_special, " for a byte-level tokenizer (256 bytes and ", n_special,
                " special tokens)");
  ordered_json vocab = ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const auto piece = [](const char* p) {
    std::string s;
    for (const char* c = p; *c; ++c)
      s += *c == '_' ? byte_char(' ') : byte_char(static_cast<unsigned char>(*c));
    return s;
  };
  int next = 256;
  const ordered_json merges = add_merges(vocab, piece, next, vocab_size - n_special);
  ordered_json added = ordered_json::array();
  for (int k = 0; k < n_special; ++k) {
    added.push_back({{"id", next + k}, {"content", specials[k]}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                     {"special", true}});
  }
  const ordered_json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  write_files(dir, tokenizer);
}

}  // namespace dcp
