// Guided generation over a vocabulary: which tokens keep the output a prefix of some text of a
// byte-level language (ByteGrammar: a regex, JSON). Every rank of a group holds the same
// vocabulary bytes and walks the same automaton, so every rank masks the same tokens with no extra
// collective.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dcp/byte_grammar.h"

namespace dcp {

// The bytes each token id writes. A token that writes no text of its own (a special token, an id
// the tokenizer lacks) is not writable, and a guide never allows it. The writable tokens are also
// kept in byte order, so that a guide walks each prefix they share once (a trie laid flat).
class GuideVocabulary {
 public:
  // texts[id]: the token's bytes, or nullopt when it is not writable.
  explicit GuideVocabulary(const std::vector<std::optional<std::string>>& texts);
  std::int32_t size() const noexcept { return static_cast<std::int32_t>(writable_.size()); }
  bool writable(std::int32_t id) const noexcept {
    return id >= 0 && id < size() && writable_[static_cast<std::size_t>(id)];
  }
  std::string_view bytes(std::int32_t id) const noexcept {
    const auto i = static_cast<std::size_t>(id);
    return std::string_view(all_).substr(begin_[i], begin_[i + 1] - begin_[i]);
  }
  // The writable ids ordered by their bytes (ties by id), and for each the length of the prefix
  // its bytes share with the previous one's (0 for the first).
  const std::vector<std::int32_t>& by_bytes() const noexcept { return by_bytes_; }
  const std::vector<std::uint32_t>& shared_prefix() const noexcept { return shared_prefix_; }
  // The bytes of by_bytes()[k], from a copy laid out in that order (a walk reads it in sequence).
  std::string_view sorted_bytes(std::size_t k) const noexcept {
    return std::string_view(sorted_all_)
        .substr(sorted_begin_[k], sorted_begin_[k + 1] - sorted_begin_[k]);
  }
  std::size_t longest() const noexcept { return longest_; }  // bytes of the longest token

 private:
  std::string all_;                   // every token's bytes, in id order
  std::vector<std::uint32_t> begin_;  // token id's bytes: all_[begin_[id], begin_[id + 1])
  std::vector<char> writable_;
  std::vector<std::int32_t> by_bytes_;
  std::vector<std::uint32_t> shared_prefix_;
  std::string sorted_all_;
  std::vector<std::uint32_t> sorted_begin_;
  std::size_t longest_ = 0;
};

// The allowed sets of one immutable automaton (a RegexDfa) over one vocabulary, shared by every
// guide that walks them, across requests and the ranks of a process: each state's set is worked
// out once. Thread-safe; every instance together keeps at most kMaxSharedIds ids (past that the
// instance that would pass it starts afresh).
class SharedAllowedSets {
 public:
  using Set = std::shared_ptr<const std::vector<std::int32_t>>;
  static constexpr std::size_t kMaxSharedIds = std::size_t{1} << 24;
  SharedAllowedSets() = default;
  SharedAllowedSets(const SharedAllowedSets&) = delete;
  SharedAllowedSets& operator=(const SharedAllowedSets&) = delete;
  ~SharedAllowedSets();
  // The set of `state`, computed by `compute` under this instance's lock when none is kept (so
  // ranks asking for the same state at once compute it once).
  Set get(std::int32_t state, const std::function<std::vector<std::int32_t>()>& compute);
  // The instance for `grammar` over `vocab`, made on first use; nullptr for an automaton that
  // builds its states as it is walked (JSON, grammars), which no two requests may share.
  static std::shared_ptr<SharedAllowedSets> of(const std::shared_ptr<const ByteGrammar>& grammar,
                                               const std::shared_ptr<const GuideVocabulary>& vocab);
  // The ids every instance keeps, together.
  static std::size_t total_ids() noexcept;

 private:
  std::mutex mutex_;
  std::unordered_map<std::int32_t, Set> sets_;
  std::size_t ids_ = 0;  // in sets_
};

// One request's guide: the automaton state its output reached and the tokens that may follow.
class TokenGuide {
 public:
  // share_sets: keep the allowed sets of an immutable automaton in its SharedAllowedSets (every
  // guide does, but a benchmark timing the walk itself).
  TokenGuide(std::shared_ptr<const ByteGrammar> grammar,
             std::shared_ptr<const GuideVocabulary> vocab, bool share_sets = true);

  // The state after `output`; nullopt once a token of it is not allowed where it stands (a stop
  // token ended the request, or a speculative proposal looks past the end). Walks only the tokens
  // after the prefix `output` shares with the output asked for last (a step adds a token or a
  // few), so a long reply is not walked again at every step.
  std::optional<std::int32_t> state_after(std::span<const std::int32_t> output);
  // The tokens allowed in `state`, ascending. Sets are kept for the states asked before, up to
  // kMaxCachedIds ids in all (past that the kept sets are dropped: a reply whose every step is a
  // new state, as a counted repetition makes, must not grow them without end); the reference is
  // valid until the next call.
  const std::vector<std::int32_t>& allowed(std::int32_t state);
  static constexpr std::size_t kMaxCachedIds = std::size_t{1} << 22;
  std::size_t cached_ids() const noexcept { return cached_ids_; }
  const ByteGrammar& grammar() const noexcept { return *grammar_; }

 private:
  std::shared_ptr<const ByteGrammar> grammar_;
  std::shared_ptr<const GuideVocabulary> vocab_;
  std::vector<std::int32_t> compute(std::int32_t state);

  std::unordered_map<std::int32_t, SharedAllowedSets::Set> allowed_;
  std::size_t cached_ids_ = 0;  // in allowed_
  std::shared_ptr<SharedAllowedSets> shared_;  // for an immutable automaton
  // The output state_after walked last, up to its first token not allowed, and the state after
  // each of its prefixes (walked_states_[i]: after i tokens).
  std::vector<std::int32_t> walked_;
  std::vector<std::int32_t> walked_states_;
  // Scratch of allowed(): the states after each prefix of the token walked last, and a flag per id.
  std::vector<std::int32_t> path_;
  std::vector<char> keep_;
};

}  // namespace dcp
