// Text in and out: a Hugging Face BPE tokenizer (tokenizer.json) with the special tokens of
// tokenizer_config.json: byte-level, as DeepSeek-V2/V3 ship it, or SentencePiece-style with byte
// fallback, as Llama-family vocabularies (MiniCPM3's) are converted.
//
// Encoding follows the Hugging Face pipeline: added tokens are matched first (leftmost, longest),
// the rest goes through the pre-tokenizer (Split regexes run by PCRE2 with Unicode properties,
// then the byte-to-unicode map) and BPE merges by rank. SentencePiece-style: each stretch between
// added tokens has its spaces turned into U+2581 and one U+2581 prepended (after the model's own
// normalization rules, for a tokenizer.model that has them), and is merged whole;
// a character missing from the vocabulary becomes its bytes' <0xXX> tokens. With special tokens,
// BOS/EOS as tokenizer_config.json's add_bos_token/add_eos_token say, else as tokenizer.json's
// TemplateProcessing post-processor adds them. Text that is not valid UTF-8 is first
// decoded as a browser's TextDecoder does (each maximal invalid subpart becomes U+FFFD).
// Decoding maps tokens back to bytes; StreamDecoder does it one token at a time and never emits
// half a character.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dcp {

class Tokenizer {
 public:
  // DIR/tokenizer.json (else DIR/tiktoken.model, else DIR/tokenizer.model) and, when present,
  // DIR/tokenizer_config.json and DIR/chat_template.jinja (the chat template, over
  // tokenizer_config.json's, as transformers reads it). Throws dcp::Error (io) naming the file and
  // the field on anything it cannot read exactly (an unknown model, normalizer, pre-tokenizer or
  // decoder type, a regex PCRE2 refuses, a merge of unknown tokens).
  static Tokenizer from_dir(const std::string& dir);
  // Whether DIR holds a tokenizer from_dir reads: tokenizer.json, tiktoken.model or
  // SentencePiece's tokenizer.model (a checkpoint without one serves token ids only).
  static bool found_in(const std::string& dir);
  // The same from the two files' text (config_json may be empty).
  static Tokenizer from_json(const std::string& tokenizer_json,
                             const std::string& config_json = "");
  // A tiktoken tokenizer, as Kimi ships it: tiktoken.model ("base64-token rank" per line, the rank
  // being the id), tokenizer_config.json's added_tokens_decoder as the special tokens, and the
  // pre-tokenizer `pattern` (Kimi's by default: its class intersections [A&&[B]] become
  // lookaheads, which PCRE2 runs). from_dir takes this path when DIR has tiktoken.model and no
  // tokenizer.json.
  static Tokenizer from_tiktoken(const std::string& model_text, const std::string& config_json = "",
                                 const std::string& pattern = kimi_pattern());
  // SentencePiece's own model file (tokenizer.model: BPE with byte fallback, as Llama-family
  // checkpoints without tokenizer.json ship it), converted as Transformers converts it, with
  // tokenizer_config.json's added_tokens_decoder; its normalizer (NFKC or other compiled rules,
  // collapsed spaces) runs as SentencePiece runs it, on each stretch between added tokens.
  // from_dir takes this path when DIR has tokenizer.model and neither file above.
  static Tokenizer from_sentencepiece(const std::string& model_bytes,
                                      const std::string& config_json = "");
  // Kimi's pre-tokenizer pattern (tokenization_kimi.py's pat_str).
  static const std::string& kimi_pattern();

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text` (bytes; invalid UTF-8 is replaced as described above). With
  // add_special_tokens, BOS first (and EOS last) as described above.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // UTF-8 text of `ids` (invalid byte sequences become U+FFFD). skip_special_tokens drops the
  // special added tokens (BOS, EOS, ...). Throws dcp::Error naming an id outside the vocabulary.
  std::string decode(const std::vector<std::int32_t>& ids, bool skip_special_tokens = false) const;

  // The bytes one token stands for (a special token's text, its byte-level BPE bytes, or its
  // SentencePiece piece with U+2581 as a space). decode() of a SentencePiece text drops its one
  // leading space; the concatenated token_bytes keep it.
  std::string token_bytes(std::int32_t id) const;
  // The token as its vocabulary spells it (Transformers' convert_ids_to_tokens): byte-level BPE's
  // characters ("Ġ" for a space), a SentencePiece piece with U+2581, a special token's text; a
  // tiktoken vocabulary in the byte-level characters dcp holds it in. Throws dcp::Error naming an
  // id outside the vocabulary.
  const std::string& token_piece(std::int32_t id) const;
  bool is_special(std::int32_t id) const;
  // Whether `id` names a token (ids below vocab_size() may be unused in a sparse vocabulary).
  bool contains(std::int32_t id) const noexcept;
  // One more than the largest id (the model's vocabulary and the added tokens).
  std::int32_t vocab_size() const noexcept;
  std::optional<std::int32_t> bos_id() const noexcept;
  std::optional<std::int32_t> eos_id() const noexcept;
  // The chat template: from_dir's chat_template.jinja, else tokenizer_config.json's chat_template
  // (a string, or the one named "default" of a list), or the one set below.
  const std::optional<std::string>& chat_template() const noexcept;
  // Replaces the chat template (a model's own overridden, or one given to a tokenizer without).
  void set_chat_template(std::string jinja);
  // bos_token / eos_token text ("" when absent), for chat templates.
  const std::string& bos_token() const noexcept;
  const std::string& eos_token() const noexcept;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Detokenizes a stream of ids: push() returns the text that became complete, holding back the
// bytes of a UTF-8 character still missing its continuation bytes; finish() returns the rest
// (an incomplete tail as U+FFFD). The concatenation equals Tokenizer::decode of all ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}
  std::string push(std::int32_t id);
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes not yet emitted: the start of an incomplete character
};

// Writes DIR/tokenizer.json and DIR/tokenizer_config.json of a small BPE tokenizer whose ids are
// all below `vocab_size`: byte-level (the 256 bytes) or, with `sentencepiece`, SentencePiece-style
// (<unk>, the 256 <0xXX> byte tokens, U+2581 and a-z), merges of frequent English pieces while
// ids are left, the special tokens <s> (BOS), </s> (EOS), <|user|> and <|assistant|>, and a chat
// template. For generated checkpoints, so that a random model takes and gives text. Throws naming
// vocab_size when it is under 260 (288 SentencePiece-style).
void write_small_tokenizer(const std::string& dir, int vocab_size, bool sentencepiece = false);

// Text as a WHATWG TextDecoder (and Rust's from_utf8_lossy) reads bytes: valid UTF-8 kept, each
// maximal invalid subpart replaced by U+FFFD.
std::string utf8_lossy(std::string_view bytes);
// How many leading bytes of `bytes` end on a character boundary, so that utf8_lossy of them
// equals what a stream would show: an incomplete last character (that more bytes could complete)
// is held back; invalid bytes are not.
std::size_t utf8_complete_prefix(std::string_view bytes);
// Appends the UTF-8 bytes of `code_point` (a Unicode scalar value: at most U+10FFFF, not a
// surrogate).
void append_utf8(std::string& out, char32_t code_point);

// Rewrites each character class [A&&[B]] of `pattern` as (?:(?=[B])[A]): PCRE2 reads "&&" inside
// a class as two ampersands, so an intersection would silently match the wrong characters.
// Throws (invalid_argument) on an intersection of another form.
std::string rewrite_class_intersections(const std::string& pattern);

}  // namespace dcp
