#include "dcp/token_guide.h"

#include <algorithm>
#include <atomic>

#include "dcp/error.h"
#include "dcp/regex_dfa.h"

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
  for (std::int32_t t = 0; t < size(); ++t) {
    if (!writable(t)) continue;
    by_bytes_.push_back(t);
    longest_ = std::max(longest_, bytes(t).size());
  }
  // std::string_view compares as unsigned bytes, the order a walk over bytes shares prefixes in.
  std::stable_sort(by_bytes_.begin(), by_bytes_.end(),
                   [this](std::int32_t a, std::int32_t b) { return bytes(a) < bytes(b); });
  shared_prefix_.assign(by_bytes_.size(), 0);
  sorted_begin_.reserve(by_bytes_.size() + 1);
  for (const std::int32_t t : by_bytes_) {
    sorted_begin_.push_back(static_cast<std::uint32_t>(sorted_all_.size()));
    sorted_all_ += bytes(t);
  }
  sorted_begin_.push_back(static_cast<std::uint32_t>(sorted_all_.size()));
  for (std::size_t k = 1; k < by_bytes_.size(); ++k) {
    const std::string_view a = bytes(by_bytes_[k - 1]), b = bytes(by_bytes_[k]);
    const auto n = std::min(a.size(), b.size());
    std::uint32_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    shared_prefix_[k] = i;
  }
}

TokenGuide::TokenGuide(std::shared_ptr<const ByteGrammar> grammar,
                       std::shared_ptr<const GuideVocabulary> vocab, bool share_sets)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  DCP_CHECK(grammar_ && vocab_, internal, "a token guide needs a grammar and a vocabulary");
  if (share_sets) shared_ = SharedAllowedSets::of(grammar_, vocab_);
}

std::optional<std::int32_t> TokenGuide::state_after(std::span<const std::int32_t> output) {
  const std::size_t same = static_cast<std::size_t>(
      std::mismatch(walked_.begin(), walked_.end(), output.begin(), output.end()).first -
      walked_.begin());
  walked_.resize(same);
  walked_states_.resize(same + 1);
  walked_states_[0] = grammar_->start();
  for (std::size_t i = same; i < output.size(); ++i) {
    const std::int32_t t = output[i];
    if (!vocab_->writable(t)) return std::nullopt;
    const std::int32_t s = grammar_->walk(walked_states_.back(), vocab_->bytes(t));
    if (s == ByteGrammar::kDead) return std::nullopt;
    walked_.push_back(t);
    walked_states_.push_back(s);
  }
  return walked_states_[output.size()];
}

namespace token_trie {  // named: a unity build shares one file's anonymous namespace

// Marks in `keep` (zeroed, one flag per id) the tokens whose bytes stay live from `state`, and
// returns how many. The tokens go in byte order: each shares a prefix with the one before, whose
// states along it are in `path`, so only the rest of its bytes is walked; a dead prefix skips
// every token that begins with it without walking at all. A template so that an automaton whose
// step is inline (a regex's table) is not called through the virtual table at every byte.
template <class Grammar>
std::size_t mark_live(const Grammar& grammar, const GuideVocabulary& vocab, std::int32_t state,
                      std::int32_t* path, char* keep) {
  const std::int32_t* order = vocab.by_bytes().data();
  const std::uint32_t* shared = vocab.shared_prefix().data();
  const std::size_t tokens = vocab.by_bytes().size();
  path[0] = state;
  std::size_t dead_at = vocab.longest() + 1;  // the last walk's prefix of this length is dead
  std::size_t kept = 0;
  for (std::size_t k = 0; k < tokens; ++k) {
    if (shared[k] >= dead_at) continue;  // begins with that dead prefix
    const std::string_view b = vocab.sorted_bytes(k);
    dead_at = vocab.longest() + 1;
    std::int32_t s = path[shared[k]];
    for (std::size_t i = shared[k]; i < b.size(); ++i) {
      s = grammar.next(s, static_cast<std::uint8_t>(b[i]));
      path[i + 1] = s;
      if (s == ByteGrammar::kDead) {
        dead_at = i + 1;
        break;
      }
    }
    if (s != ByteGrammar::kDead) {
      keep[static_cast<std::size_t>(order[k])] = 1;
      ++kept;
    }
  }
  return kept;
}

}  // namespace token_trie

std::vector<std::int32_t> TokenGuide::compute(std::int32_t state) {
  keep_.assign(static_cast<std::size_t>(vocab_->size()), 0);
  path_.resize(vocab_->longest() + 1);
  std::size_t kept = 0;
  if (state == ByteGrammar::kDead)
    kept = 0;  // nothing continues a text that left the language
  else if (const auto* regex = dynamic_cast<const RegexDfa*>(grammar_.get()))
    kept = token_trie::mark_live(*regex, *vocab_, state, path_.data(), keep_.data());
  else
    kept = token_trie::mark_live(*grammar_, *vocab_, state, path_.data(), keep_.data());
  // Ascending ids without a branch per id (which half the vocabulary would mispredict).
  std::vector<std::int32_t> ids(kept + 1);
  std::size_t n = 0;
  for (std::int32_t t = 0; t < vocab_->size(); ++t) {
    ids[n] = t;
    n += static_cast<std::size_t>(keep_[static_cast<std::size_t>(t)]);
    if (n == kept) break;
  }
  ids.resize(kept);
  return ids;
}

const std::vector<std::int32_t>& TokenGuide::allowed(std::int32_t state) {
  auto it = allowed_.find(state);
  if (it != allowed_.end()) return *it->second;
  SharedAllowedSets::Set set =
      shared_ ? shared_->get(state, [&] { return compute(state); })
              : std::make_shared<const std::vector<std::int32_t>>(compute(state));
  if (cached_ids_ + set->size() > kMaxCachedIds) {
    allowed_.clear();
    cached_ids_ = 0;
  }
  cached_ids_ += set->size();
  return *allowed_.emplace(state, std::move(set)).first->second;
}

namespace token_trie {

std::atomic<std::size_t> shared_ids{0};  // ids kept by every SharedAllowedSets

// The instances of the automata alive, each for its automaton and vocabulary.
struct Registry {
  struct Entry {
    std::weak_ptr<const ByteGrammar> grammar;
    std::weak_ptr<const GuideVocabulary> vocab;
    std::shared_ptr<SharedAllowedSets> sets;  // kept while the automaton lives (shared_regex)
  };
  std::mutex mutex;
  std::vector<Entry> entries;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace token_trie

SharedAllowedSets::~SharedAllowedSets() {
  token_trie::shared_ids -= ids_;
}

std::size_t SharedAllowedSets::total_ids() noexcept {
  return token_trie::shared_ids;
}

SharedAllowedSets::Set SharedAllowedSets::get(
    std::int32_t state, const std::function<std::vector<std::int32_t>()>& compute) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto it = sets_.find(state);
  if (it != sets_.end()) return it->second;
  auto set = std::make_shared<const std::vector<std::int32_t>>(compute());
  // Room for the set under the bound every instance shares, taken in one step (another
  // instance may be taking room at the same time).
  const auto reserve = [n = set->size()] {
    std::size_t now = token_trie::shared_ids.load();
    do {
      if (now + n > kMaxSharedIds) return false;
    } while (!token_trie::shared_ids.compare_exchange_weak(now, now + n));
    return true;
  };
  if (!reserve()) {  // start afresh
    token_trie::shared_ids -= ids_;
    ids_ = 0;
    sets_.clear();
    if (!reserve()) return set;  // others hold the rest: not kept
  }
  ids_ += set->size();
  sets_.emplace(state, set);
  return set;
}

std::shared_ptr<SharedAllowedSets> SharedAllowedSets::of(
    const std::shared_ptr<const ByteGrammar>& grammar,
    const std::shared_ptr<const GuideVocabulary>& vocab) {
  if (!dynamic_cast<const RegexDfa*>(grammar.get())) return nullptr;
  token_trie::Registry& r = token_trie::registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  std::shared_ptr<SharedAllowedSets> found;
  // Drop the entries of automata or vocabularies gone (an address may be reused).
  std::erase_if(r.entries, [&](const token_trie::Registry::Entry& e) {
    const auto g = e.grammar.lock();
    const auto v = e.vocab.lock();
    if (!g || !v) return true;
    if (g == grammar && v == vocab) found = e.sets;
    return false;
  });
  if (found) return found;
  found = std::make_shared<SharedAllowedSets>();
  r.entries.push_back({grammar, vocab, found});
  return found;
}

}  // namespace dcp
