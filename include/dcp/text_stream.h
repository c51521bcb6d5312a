// One generated choice as text: token ids detokenized as they come (never half a UTF-8
// character), with the client's stop strings matched across token boundaries and never emitted.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dcp/token_guide.h"
#include "dcp/tokenizer.h"

namespace dcp {

class TextStream {
 public:
  // `tokenizer` may be null (a server without one produces no text, only ids). A stop string
  // counts only where it ends in the text of a token after the first `min_tokens` (vLLM's
  // min_tokens). The text ends before the stop string, or after it with `include_stop` (vLLM's
  // include_stop_str_in_output). Throws dcp::Error (invalid_argument) on an empty stop string,
  // which would match before any text.
  TextStream(const Tokenizer* tokenizer, std::vector<std::string> stops, bool skip_special_tokens,
             int min_tokens = 0, bool include_stop = false);

  // Feeds one generated token; returns the text that is now safe to show. Once a stop string
  // matched, stopped() is true and later tokens add nothing.
  std::string push(std::int32_t token);
  // Feeds the stop token that ended the generation (EOS, a stop_token_ids entry): it counts among
  // the tokens but writes no text (vLLM's; include_stop writes it as push does).
  std::string push_stop_token(std::int32_t token);
  // The end of the generation: what was held back (a possible start of a stop string, an
  // incomplete character as U+FFFD).
  std::string finish();
  bool stopped() const noexcept { return stopped_; }
  // The tokens that belong to the text (those after the one that completed a stop string are
  // dropped; that one stays, as OpenAI servers report it).
  const std::vector<std::int32_t>& tokens() const noexcept { return tokens_; }

 private:
  std::string release(bool at_end);

  const Tokenizer* tokenizer_;
  std::optional<StreamDecoder> decoder_;
  std::vector<std::string> stops_;
  std::size_t min_tokens_;
  bool include_stop_;
  std::string held_;               // decoded text not yet shown
  std::size_t protected_end_ = 0;  // held_[0, this) is the first min_tokens tokens' text
  std::vector<std::int32_t> tokens_;
  bool stopped_ = false;
};

// A client's bad words as the token sequences SamplingParams::bad_words masks: each word (its
// leading whitespace dropped) as it is tokenized at the start of a text and, where that differs,
// after a space (inside a text, a word usually takes a leading-space token). Throws dcp::Error
// (invalid_argument) naming bad_words[i] when a word holds no token.
std::vector<std::vector<std::int32_t>> bad_word_token_ids(const Tokenizer& tokenizer,
                                                          const std::vector<std::string>& words);

// The bytes each of the model's `model_vocab` token ids writes, for guided requests: special tokens
// and ids the tokenizer lacks write none of their own (a guide never allows them).
std::shared_ptr<const GuideVocabulary> guide_vocabulary(const Tokenizer& tokenizer,
                                                        int model_vocab);

}  // namespace dcp
