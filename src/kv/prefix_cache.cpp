#include "dcp/prefix_cache.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <queue>
#include <utility>

#include "dcp/error.h"

namespace dcp {

PrefixCache::PrefixCache(KvAllocator& allocator, std::vector<LatentPool*> device, int dcp_rank,
                         std::int64_t host_capacity_tokens)
    : alloc_(allocator), device_(std::move(device)) {
  DCP_ARG_CHECK(!device_.empty(), "prefix cache: no device pools");
  DCP_ARG_CHECK(host_capacity_tokens >= 0, "host_kv_capacity_tokens = ", host_capacity_tokens,
                " must be >= 0");
  const WidenedPages& w = alloc_.widened();
  // The slots of a virtual page this rank owns (owner(i) = r), as rows physical(i) of its page.
  for (std::int64_t i = 0; i < w.virtual_page_size(); ++i) {
    if (w.owner(i) == dcp_rank) owned_offsets_.push_back(w.physical(i));
  }
  host_pages_total_ = host_capacity_tokens / alloc_.virtual_page_size();
  if (host_pages_total_ > 0) {
    for (LatentPool* d : device_)
      host_.push_back(
          std::make_unique<LatentPool>(host_pages_total_, w.page_size(), d->geometry()));
    for (std::int64_t i = host_pages_total_; i-- > 0;) host_free_.push_back(i);
  }
}

PrefixCache::~PrefixCache() = default;

std::uint64_t chain_hash(std::uint64_t parent, const std::int32_t* tokens, std::int64_t n) {
  std::uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
  for (std::int64_t i = 0; i < n; ++i) {
    h ^= static_cast<std::uint32_t>(tokens[i]);
    h *= 1099511628211ull;
    h ^= h >> 29;
  }
  return h;
}

std::uint64_t PrefixCache::key(std::uint64_t parent, const std::int32_t* tokens) const {
  const std::uint64_t h = chain_hash(parent, tokens, alloc_.virtual_page_size());
  return h == 0 ? 1 : h;  // 0 is the root's key
}

void PrefixCache::copy_page(bool to_host, Node& node) {
  const int p = alloc_.page_size();
  std::int64_t bytes = 0;
  for (std::size_t l = 0; l < device_.size(); ++l) {
    const std::size_t rb = device_[l]->geometry().row_bytes();
    for (std::int64_t off : owned_offsets_) {
      std::uint8_t* dev =
          device_[l]->raw_row(static_cast<std::int64_t>(node.device_page) * p + off);
      std::uint8_t* host = host_[l]->raw_row(node.host_page * p + off);
      if (to_host) {
        std::memcpy(host, dev, rb);
      } else {
        std::memcpy(dev, host, rb);
      }
      bytes += static_cast<std::int64_t>(rb);
    }
  }
  (to_host ? stats_.bytes_to_host : stats_.bytes_to_device) += bytes;
}

void PrefixCache::drop(std::uint64_t k) {
  Node& node = nodes_.at(k);
  if (node.on_device) {
    alloc_.release(node.device_page);
    --on_device_;
  } else {
    host_free_.push_back(node.host_page);
  }
  if (node.parent != 0) {
    auto it = nodes_.find(node.parent);
    if (it != nodes_.end()) --it->second.children;
  }
  nodes_.erase(k);
  ++stats_.pages_dropped;
}

std::int64_t PrefixCache::make_room(std::int64_t pages) {
  if (alloc_.free_pages() >= pages) return alloc_.free_pages();
  // One pass over the cache finds what may go; each eviction then pops the oldest candidate, and
  // a page whose last cached successor goes becomes a candidate itself. Freeing k pages of a
  // cache of n costs O(n + k log n), not a scan per page.
  using Aged = std::pair<std::uint64_t, std::uint64_t>;  // (last used, key)
  using OldestFirst = std::priority_queue<Aged, std::vector<Aged>, std::greater<>>;
  const auto unused = [&](const Node& n) {  // a device page only the cache holds
    return n.on_device && alloc_.ref_count(n.device_page) == 1;
  };
  const auto unused_leaf = [&](const Node& n) { return unused(n) && n.children == 0; };
  const auto host_leaf = [](const Node& n) { return !n.on_device && n.children == 0; };
  OldestFirst offloadable, droppable, host_droppable;
  for (const auto& [k, n] : nodes_) {
    if (unused(n)) offloadable.emplace(n.last_used, k);
    if (unused_leaf(n)) droppable.emplace(n.last_used, k);
    if (host_leaf(n)) host_droppable.emplace(n.last_used, k);
  }
  // The oldest candidate still meeting `valid` (0 if none): entries go stale as pages move.
  const auto oldest = [&](OldestFirst& q, const auto& valid) -> std::uint64_t {
    for (; !q.empty(); q.pop()) {
      const auto it = nodes_.find(q.top().second);
      if (it != nodes_.end() && valid(it->second)) return it->first;
    }
    return 0;
  };
  const auto drop_and_offer_parent = [&](std::uint64_t k) {
    const std::uint64_t parent = nodes_.at(k).parent;
    drop(k);
    const auto it = nodes_.find(parent);
    if (it == nodes_.end() || it->second.children != 0) return;
    if (unused_leaf(it->second)) droppable.emplace(it->second.last_used, parent);
    if (host_leaf(it->second)) host_droppable.emplace(it->second.last_used, parent);
  };
  const auto host_slot = [&] {
    if (!host_free_.empty()) return true;
    const std::uint64_t k = oldest(host_droppable, host_leaf);
    if (k == 0) return false;
    drop_and_offer_parent(k);
    return !host_free_.empty();
  };
  while (alloc_.free_pages() < pages) {
    // With a host tier, the least recently used unused page moves there (a hit brings it back);
    // without one, or with the host tier full of pages that lead to device pages, the least
    // recently used unused page with no cached successor is dropped.
    const std::uint64_t victim = host_pages_total_ > 0 ? oldest(offloadable, unused) : 0;
    if (victim != 0 && host_slot()) {
      Node& node = nodes_.at(victim);
      node.host_page = host_free_.back();
      host_free_.pop_back();
      copy_page(true, node);
      alloc_.release(node.device_page);
      node.device_page = -1;
      node.on_device = false;
      --on_device_;
      ++stats_.pages_offloaded;
      if (node.children == 0) host_droppable.emplace(node.last_used, victim);
      continue;
    }
    const std::uint64_t leaf = oldest(droppable, unused_leaf);
    if (leaf == 0) break;
    drop_and_offer_parent(leaf);
  }
  return alloc_.free_pages();
}

std::int64_t PrefixCache::usable_pages(const std::vector<std::int32_t>& tokens) const {
  // Leave >= 1 token to prefill: its logits give the first new token.
  return (static_cast<std::int64_t>(tokens.size()) - 1) / alloc_.virtual_page_size();
}

bool PrefixCache::holds(const Node& node, std::uint64_t parent, const std::int32_t* tokens) const {
  return node.parent == parent &&
         std::equal(tokens, tokens + alloc_.virtual_page_size(), node.tokens.begin());
}

std::int64_t PrefixCache::cached_pages(const std::vector<std::int32_t>& tokens) const {
  const std::int64_t vp = alloc_.virtual_page_size();
  const std::int64_t usable = usable_pages(tokens);
  std::uint64_t parent = 0;
  std::int64_t k = 0;
  for (; k < usable; ++k) {
    const std::int32_t* t = tokens.data() + k * vp;
    const std::uint64_t h = key(parent, t);
    const auto it = nodes_.find(h);
    if (it == nodes_.end() || !holds(it->second, parent, t)) break;
    parent = h;
  }
  return k;
}

std::vector<std::int32_t> PrefixCache::match(const std::vector<std::int32_t>& tokens) {
  const std::int64_t vp = alloc_.virtual_page_size();
  const std::int64_t usable = usable_pages(tokens);
  stats_.lookup_tokens += static_cast<std::int64_t>(tokens.size());
  std::vector<std::int32_t> pages;
  std::uint64_t parent = 0;
  for (std::int64_t k = 0; k < usable; ++k) {
    const std::int32_t* t = tokens.data() + k * vp;
    const std::uint64_t h = key(parent, t);
    auto it = nodes_.find(h);
    if (it == nodes_.end() || !holds(it->second, parent, t)) break;
    Node& node = it->second;
    node.last_used = ++clock_;
    if (!node.on_device) {  // bring it back: a fresh device page, this rank's rows copied in
      if (alloc_.free_pages() == 0) make_room(1);
      if (alloc_.free_pages() == 0) break;
      node.device_page = alloc_.acquire_page();
      copy_page(false, node);
      host_free_.push_back(node.host_page);
      node.host_page = -1;
      node.on_device = true;
      ++on_device_;
      ++stats_.pages_reloaded;
    }
    alloc_.retain(node.device_page);  // pinned until unpin()
    pages.push_back(node.device_page);
    parent = h;
  }
  stats_.hit_tokens += static_cast<std::int64_t>(pages.size()) * vp;
  return pages;
}

void PrefixCache::unpin(const std::vector<std::int32_t>& pages) {
  for (std::int32_t page : pages) alloc_.release(page);
}

void PrefixCache::insert(const std::vector<std::int32_t>& tokens, RequestId request) {
  const std::int64_t vp = alloc_.virtual_page_size();
  const std::vector<std::int32_t>& pages = alloc_.pages(request);
  const std::int64_t whole =
      std::min<std::int64_t>(static_cast<std::int64_t>(tokens.size()), alloc_.length(request)) / vp;
  std::uint64_t parent = 0;
  for (std::int64_t k = 0; k < whole; ++k) {
    const std::int32_t* t = tokens.data() + k * vp;
    const std::uint64_t h = key(parent, t);
    auto it = nodes_.find(h);
    if (it != nodes_.end()) {
      if (!holds(it->second, parent, t)) return;  // collision: stop
      it->second.last_used = ++clock_;
    } else {
      Node node;
      node.parent = parent;
      node.tokens.assign(t, t + vp);
      node.device_page = pages[static_cast<std::size_t>(k)];
      node.last_used = ++clock_;
      alloc_.retain(node.device_page);
      if (parent != 0) ++nodes_.at(parent).children;
      nodes_.emplace(h, std::move(node));
      ++on_device_;
    }
    parent = h;
  }
}

}  // namespace dcp
