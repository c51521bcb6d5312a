#include "dcp/prefix_router.h"

#include <algorithm>

#include "dcp/deployment.h"
#include "dcp/error.h"
#include "dcp/prefix_cache.h"

namespace dcp {

PrefixRouter::PrefixRouter(std::int64_t block, std::int64_t slack, std::size_t remember)
    : block_(block), slack_(slack), remember_(remember) {
  DCP_ARG_CHECK(block >= 1, "prefix router: block = ", block, " must be >= 1");
  DCP_ARG_CHECK(slack >= 0, "prefix router: slack = ", slack, " must be >= 0");
  DCP_ARG_CHECK(remember >= 1, "prefix router: remember = ", remember, " must be >= 1");
}

int PrefixRouter::route(std::vector<std::int64_t>& group_load,
                        const std::vector<std::int32_t>& prompt, std::int64_t kv_tokens) {
  DCP_ARG_CHECK(!group_load.empty(), "prefix router: no groups");
  const std::int64_t blocks = static_cast<std::int64_t>(prompt.size()) / block_;
  std::vector<std::uint64_t> keys;
  keys.reserve(static_cast<std::size_t>(blocks));
  std::uint64_t h = 0;
  for (std::int64_t b = 0; b < blocks; ++b) {
    h = chain_hash(h, prompt.data() + b * block_, block_);
    keys.push_back(h);
  }
  // The group of the longest remembered prefix, if it is not loaded too far past the least.
  const std::int64_t least = *std::min_element(group_load.begin(), group_load.end());
  int group = -1;
  for (std::size_t b = keys.size(); b-- > 0;) {
    const auto it = groups_.find(keys[b]);
    if (it == groups_.end()) continue;
    const int held = it->second.group;
    if (held < static_cast<int>(group_load.size()) &&
        group_load[static_cast<std::size_t>(held)] <= least + slack_)
      group = held;
    break;  // the longest prefix's group holds the most of it; no shorter one is tried
  }
  if (group < 0) {
    group = deal_request(group_load, kv_tokens);
  } else {
    group_load[static_cast<std::size_t>(group)] += kv_tokens;
  }
  for (const std::uint64_t k : keys) {  // each prefix now the most recently routed
    const auto it = groups_.find(k);
    if (it == groups_.end()) {
      groups_.emplace(k, Remembered{group, recency_.insert(recency_.end(), k)});
    } else {
      it->second.group = group;
      recency_.splice(recency_.end(), recency_, it->second.used);
    }
  }
  while (groups_.size() > remember_) {
    groups_.erase(recency_.front());
    recency_.pop_front();
  }
  return group;
}

}  // namespace dcp
