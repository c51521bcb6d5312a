#include "dcp/token_guide.h"

#include "dcp/error.h"

namespace dcp {

GuideVocabulary::GuideVocabulary(const std::vector<std::optional<std::string>>& texts) {
  begin_.reserve(texts.size() + 1);
  writable_.reserve(texts.size());
  for (const std::optional<std::string>& t : texts) {
    begin_.push_back(static_cast<std::uint32_t>(all_.size()));
    // A token of no bytes would leave the output unchanged forever: never allowed either.
    writable_.push_back(t && !t->empty() ? 1 : 0);
    if (t) all_ += *t;
  }
  begin_.push_back(static_cast<std::uint32_t>(all_.size()));
  DCP_CHECK(all_.size() < (std::size_t{1} << 32), invalid_argument,
            "a vocabulary of more than 4 GiB of token bytes");
}

TokenGuide::TokenGuide(std::shared_ptr<const ByteGrammar> grammar,
                       std::shared_ptr<const GuideVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  DCP_CHECK(grammar_ && vocab_, internal, "a token guide needs a grammar and a vocabulary");
}

std::optional<std::int32_t> TokenGuide::state_after(std::span<const std::int32_t> output) const {
  std::int32_t s = grammar_->start();
  for (const std::int32_t t : output) {
    if (!vocab_->writable(t)) return std::nullopt;
    s = grammar_->walk(s, vocab_->bytes(t));
    if (s == ByteGrammar::kDead) return std::nullopt;
  }
  return s;
}

const std::vector<std::int32_t>& TokenGuide::allowed(std::int32_t state) {
  auto it = allowed_.find(state);
  if (it != allowed_.end()) return it->second;
  std::vector<std::int32_t> ids;
  for (std::int32_t t = 0; t < vocab_->size(); ++t) {
    if (vocab_->writable(t) && grammar_->walk(state, vocab_->bytes(t)) != ByteGrammar::kDead)
      ids.push_back(t);
  }
  if (cached_ids_ + ids.size() > kMaxCachedIds) {
    allowed_.clear();
    cached_ids_ = 0;
  }
  cached_ids_ += ids.size();
  return allowed_.emplace(state, std::move(ids)).first->second;
}

}  // namespace dcp
