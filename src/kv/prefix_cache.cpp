#include "dcp/prefix_cache.h"

#include <algorithm>
#include <cstring>

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

std::int64_t PrefixCache::device_pages() const noexcept {
  std::int64_t n = 0;
  for (const auto& [k, node] : nodes_) n += node.on_device;
  return n;
}

std::int64_t PrefixCache::host_pages() const noexcept {
  return static_cast<std::int64_t>(nodes_.size()) - device_pages();
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

bool PrefixCache::drop_host_leaf() {
  std::uint64_t victim = 0, oldest = UINT64_MAX;
  for (const auto& [k, node] : nodes_) {
    if (!node.on_device && node.children == 0 && node.last_used < oldest) {
      oldest = node.last_used;
      victim = k;
    }
  }
  if (victim == 0) return false;
  drop(victim);
  return true;
}

bool PrefixCache::offload_or_drop_one() {
  // The least recently used device page that no request holds (only the cache's reference).
  std::uint64_t victim = 0, oldest = UINT64_MAX;
  for (const auto& [k, node] : nodes_) {
    if (node.on_device && alloc_.ref_count(node.device_page) == 1 && node.last_used < oldest) {
      oldest = node.last_used;
      victim = k;
    }
  }
  if (victim == 0) return false;
  Node& node = nodes_.at(victim);
  if (host_pages_total_ > 0 && (!host_free_.empty() || drop_host_leaf())) {
    node.host_page = host_free_.back();
    host_free_.pop_back();
    copy_page(true, node);
    alloc_.release(node.device_page);
    node.device_page = -1;
    node.on_device = false;
    ++stats_.pages_offloaded;
    return true;
  }
  if (node.children == 0) {  // no host tier: drop it (descendants first would be needed otherwise)
    drop(victim);
    return true;
  }
  // An interior page without a host tier: drop its deepest unused descendants first.
  for (const auto& [k, n2] : nodes_) {
    if (n2.on_device && n2.children == 0 && alloc_.ref_count(n2.device_page) == 1) {
      drop(k);
      return true;
    }
  }
  return false;
}

std::int64_t PrefixCache::make_room(std::int64_t pages) {
  while (alloc_.free_pages() < pages && offload_or_drop_one()) {
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
    }
    parent = h;
  }
}

}  // namespace dcp
