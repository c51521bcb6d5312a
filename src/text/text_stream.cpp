#include "dcp/text_stream.h"

#include <algorithm>

#include "dcp/error.h"

namespace dcp {

TextStream::TextStream(const Tokenizer* tokenizer, std::vector<std::string> stops,
                       bool skip_special_tokens, int min_tokens, bool include_stop)
    : tokenizer_(tokenizer), stops_(std::move(stops)), include_stop_(include_stop) {
  for (const std::string& s : stops_) {
    DCP_ARG_CHECK(!s.empty(), "a stop string must not be empty");
  }
  DCP_ARG_CHECK(min_tokens >= 0, "min_tokens = ", min_tokens, " must be >= 0");
  min_tokens_ = static_cast<std::size_t>(min_tokens);
  if (tokenizer_) decoder_.emplace(*tokenizer_, skip_special_tokens);
}

std::string TextStream::push(std::int32_t token) {
  if (stopped_) return {};
  tokens_.push_back(token);
  // A model whose vocabulary is larger than its tokenizer's may emit ids with no text.
  if (decoder_ && tokenizer_->contains(token)) held_ += decoder_->push(token);
  if (tokens_.size() <= min_tokens_) protected_end_ = held_.size();
  return release(false);
}

std::string TextStream::push_stop_token(std::int32_t token) {
  if (include_stop_) return push(token);
  if (stopped_) return {};
  tokens_.push_back(token);
  return release(false);
}

std::string TextStream::finish() {
  if (stopped_) return {};
  if (decoder_) held_ += decoder_->finish();
  return release(true);
}

std::string TextStream::release(bool at_end) {
  // The earliest stop string (the first listed of those starting there) ends the text before it,
  // or after it; one within the first min_tokens tokens' text does not count (it must end after
  // protected_end_).
  std::size_t cut = std::string::npos, cut_size = 0;
  for (const std::string& s : stops_) {
    const std::size_t from = protected_end_ >= s.size() ? protected_end_ - s.size() + 1 : 0;
    const std::size_t at = held_.find(s, from);
    if (at < cut) {
      cut = at;
      cut_size = s.size();
    }
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, include_stop_ ? cut + cut_size : cut);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that could still grow into a stop string.
  std::size_t keep = 0;
  if (!at_end) {
    for (const std::string& s : stops_) {
      for (std::size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
        if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
          keep = n;
          break;
        }
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  protected_end_ -= std::min(protected_end_, out.size());
  return out;
}

std::vector<std::vector<std::int32_t>> bad_word_token_ids(const Tokenizer& tokenizer,
                                                          const std::vector<std::string>& words) {
  std::vector<std::vector<std::int32_t>> out;
  for (std::size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    const std::string word = w.substr(std::min(w.size(), w.find_first_not_of(" \t\r\n")));
    std::vector<std::int32_t> start = tokenizer.encode(word, false);
    DCP_ARG_CHECK(!start.empty(), "bad_words[", i, "] = '", w, "' holds no token");
    std::vector<std::int32_t> inside = tokenizer.encode(" " + word, false);
    out.push_back(std::move(start));
    if (inside != out.back()) out.push_back(std::move(inside));
  }
  return out;
}

std::shared_ptr<const GuideVocabulary> guide_vocabulary(const Tokenizer& tokenizer,
                                                        int model_vocab) {
  std::vector<std::optional<std::string>> texts(static_cast<std::size_t>(model_vocab));
  for (std::int32_t id = 0; id < model_vocab; ++id) {
    if (tokenizer.contains(id) && !tokenizer.is_special(id))
      texts[static_cast<std::size_t>(id)] = tokenizer.token_bytes(id);
  }
  return std::make_shared<const GuideVocabulary>(texts);
}

}  // namespace dcp
