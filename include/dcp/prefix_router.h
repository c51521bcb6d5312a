// Which DP group (replica, or attention group) a served request goes to when each group keeps a
// prefix cache: the group that was last given a prompt sharing the longest prefix with it, whose
// cache is the one likely to hold that prefix (the earlier turns of a conversation, the other
// choices of a prompt, a common system prompt), unless that group is loaded well past the
// least loaded one; otherwise the least loaded group, as deal_request chooses.
//
// Every rank keeps its own router and sees the same arrivals in the same order, so every rank
// routes alike with no collective. Prefixes are compared in whole blocks of `block` tokens (the
// cache's virtual page, P x N: a cache hit is whole pages) by a chained hash of each block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace dcp {

class PrefixRouter {
 public:
  // block >= 1 tokens; slack >= 0 tokens: how far past the least loaded group's load the group
  // holding a prefix may be and still get the request; remember >= 1 prefixes are kept, the least
  // recently routed forgotten first (a hot system prompt stays). Throws dcp::Error
  // (invalid_argument) naming the parameter.
  PrefixRouter(std::int64_t block, std::int64_t slack, std::size_t remember = 1 << 16);

  // The group for `prompt` holding kv_tokens (prompt + new tokens): its load in `group_load`
  // grows by them. The prompt's whole blocks are then remembered as that group's.
  int route(std::vector<std::int64_t>& group_load, const std::vector<std::int32_t>& prompt,
            std::int64_t kv_tokens);

  std::size_t remembered() const noexcept { return groups_.size(); }
  // Forgets every prefix (the groups' caches were cleared).
  void clear() noexcept {
    groups_.clear();
    recency_.clear();
  }

 private:
  std::int64_t block_, slack_;
  std::size_t remember_;
  struct Remembered {
    int group;                                // the last group given the prefix
    std::list<std::uint64_t>::iterator used;  // its place in recency_
  };
  std::unordered_map<std::uint64_t, Remembered> groups_;  // chained hash of a prefix -> ...
  std::list<std::uint64_t> recency_;  // remembered prefixes, least recently routed first
};

}  // namespace dcp
