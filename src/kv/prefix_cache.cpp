#include "dcp/prefix_cache.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
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

// One eviction pass: the cache is looked over once for what may go, then each page freed pops
// the oldest candidate, and a page whose last cached successor goes becomes a candidate itself.
// Freeing k pages of a cache of n costs O(n + k log n), not a scan per page. Pages used at or
// after `keep_from` (the path of a match in progress) are never taken.
class PrefixCache::Eviction {
 public:
  Eviction(PrefixCache& cache, std::uint64_t keep_from) : c_(cache), keep_from_(keep_from) {
    for (const auto& [k, n] : c_.nodes_) {
      if (unused(n)) offloadable_.emplace(n.last_used, k);
      if (unused_leaf(n)) droppable_.emplace(n.last_used, k);
      if (host_leaf(n)) host_droppable_.emplace(n.last_used, k);
    }
  }

  // Frees one device page; false if nothing more can go. With a host tier, the least recently
  // used unused page moves there (a hit brings it back); without one, or with the host tier full
  // of pages that lead to device pages, the least recently used unused page with no cached
  // successor is dropped.
  bool free_one() {
    const std::uint64_t victim =
        c_.host_pages_total_ > 0 ? oldest(offloadable_, &Eviction::unused) : 0;
    if (victim != 0 && host_slot()) {
      Node& node = c_.nodes_.at(victim);
      node.host_page = c_.host_free_.back();
      c_.host_free_.pop_back();
      c_.copy_page(true, node);
      c_.alloc_.release(node.device_page);
      node.device_page = -1;
      node.on_device = false;
      --c_.on_device_;
      ++c_.stats_.pages_offloaded;
      if (node.children == 0) host_droppable_.emplace(node.last_used, victim);
      return true;
    }
    const std::uint64_t leaf = oldest(droppable_, &Eviction::unused_leaf);
    if (leaf == 0) return false;
    drop_and_offer_parent(leaf);
    return true;
  }

 private:
  using Aged = std::pair<std::uint64_t, std::uint64_t>;  // (last used, key)
  using OldestFirst = std::priority_queue<Aged, std::vector<Aged>, std::greater<>>;

  bool unused(const Node& n) const { return c_.only_cached(n) && n.last_used < keep_from_; }
  bool unused_leaf(const Node& n) const { return unused(n) && n.children == 0; }
  bool host_leaf(const Node& n) const {
    return !n.on_device && n.children == 0 && n.last_used < keep_from_;
  }
  // The oldest candidate still meeting `valid` (0 if none): entries go stale as pages move.
  std::uint64_t oldest(OldestFirst& q, bool (Eviction::*valid)(const Node&) const) {
    for (; !q.empty(); q.pop()) {
      const auto it = c_.nodes_.find(q.top().second);
      if (it != c_.nodes_.end() && (this->*valid)(it->second)) return it->first;
    }
    return 0;
  }
  void drop_and_offer_parent(std::uint64_t k) {
    const std::uint64_t parent = c_.nodes_.at(k).parent;
    c_.drop(k);
    const auto it = c_.nodes_.find(parent);
    if (it == c_.nodes_.end() || it->second.children != 0) return;
    if (unused_leaf(it->second)) droppable_.emplace(it->second.last_used, parent);
    if (host_leaf(it->second)) host_droppable_.emplace(it->second.last_used, parent);
  }
  bool host_slot() {
    if (!c_.host_free_.empty()) return true;
    const std::uint64_t k = oldest(host_droppable_, &Eviction::host_leaf);
    if (k == 0) return false;
    drop_and_offer_parent(k);
    return !c_.host_free_.empty();
  }

  PrefixCache& c_;
  std::uint64_t keep_from_;
  OldestFirst offloadable_, droppable_, host_droppable_;
};

std::int64_t PrefixCache::make_room(std::int64_t pages) {
  if (alloc_.free_pages() >= pages) return alloc_.free_pages();
  Eviction eviction(*this, UINT64_MAX);
  while (alloc_.free_pages() < pages && eviction.free_one()) {
  }
  return alloc_.free_pages();
}

bool PrefixCache::only_cached(const Node& node) const {
  return node.on_device && alloc_.ref_count(node.device_page) == 1;
}

std::int64_t PrefixCache::unused_pages() const {
  // A request holding a page holds the pages before it, so every cached page after an unused one
  // is unused too: eviction can free them all (dropping leaves where the host tier is full).
  std::int64_t n = 0;
  for (const auto& [k, node] : nodes_) n += only_cached(node);
  return n;
}

std::int64_t PrefixCache::clear() {
  const std::int64_t held = on_device_;
  for (const auto& [k, node] : nodes_) {
    if (node.on_device) {
      alloc_.release(node.device_page);  // a request sharing it keeps its own reference
    } else {
      host_free_.push_back(node.host_page);
    }
  }
  nodes_.clear();
  on_device_ = 0;
  return held;
}

std::int64_t PrefixCache::usable_pages(const std::vector<std::int32_t>& tokens) const {
  // Leave >= 1 token to prefill: its logits give the first new token.
  return (static_cast<std::int64_t>(tokens.size()) - 1) / alloc_.virtual_page_size();
}

bool PrefixCache::holds(const Node& node, std::uint64_t parent, const std::int32_t* tokens) const {
  return node.parent == parent &&
         std::equal(tokens, tokens + alloc_.virtual_page_size(), node.tokens.begin());
}

std::vector<std::uint64_t> PrefixCache::path(const std::vector<std::int32_t>& tokens) const {
  const std::int64_t vp = alloc_.virtual_page_size();
  const std::int64_t usable = usable_pages(tokens);
  std::vector<std::uint64_t> keys;
  std::uint64_t parent = 0;
  for (std::int64_t k = 0; k < usable; ++k) {
    const std::int32_t* t = tokens.data() + k * vp;
    const std::uint64_t h = key(parent, t);
    const auto it = nodes_.find(h);
    if (it == nodes_.end() || !holds(it->second, parent, t)) break;
    keys.push_back(h);
    parent = h;
  }
  return keys;
}

std::int64_t PrefixCache::cached_pages(const std::vector<std::int32_t>& tokens) const {
  return static_cast<std::int64_t>(path(tokens).size());
}

std::vector<std::int32_t> PrefixCache::match(const std::vector<std::int32_t>& tokens,
                                             std::int64_t keep_free) {
  const std::vector<std::uint64_t> keys = path(tokens);
  // The path's pages are touched and its device pages pinned first: bringing its host pages
  // back, one at a time as the old copies free host slots, then evicts only other pages.
  const std::uint64_t touched_from = clock_ + 1;
  for (const std::uint64_t k : keys) {
    Node& node = nodes_.at(k);
    node.last_used = ++clock_;
    if (node.on_device) alloc_.retain(node.device_page);
  }
  std::optional<Eviction> eviction;  // looked over at the first page that needs room
  std::vector<std::int32_t> pages;
  std::size_t i = 0;
  for (; i < keys.size(); ++i) {
    Node& node = nodes_.at(keys[i]);
    if (!node.on_device) {  // bring it back: a fresh device page, this rank's rows copied in
      if (alloc_.free_pages() <= keep_free) {
        if (!eviction) eviction.emplace(*this, touched_from);
        if (!eviction->free_one()) break;
      }
      node.device_page = alloc_.acquire_page();
      copy_page(false, node);
      host_free_.push_back(node.host_page);
      node.host_page = -1;
      node.on_device = true;
      ++on_device_;
      ++stats_.pages_reloaded;
      alloc_.retain(node.device_page);
    }
    pages.push_back(node.device_page);  // pinned until unpin()
  }
  // Past a page that could not come back the rest is no prefix: unpin its device pages.
  for (; i < keys.size(); ++i) {
    const Node& node = nodes_.at(keys[i]);
    if (node.on_device) alloc_.release(node.device_page);
  }
  return pages;
}

void PrefixCache::count_lookup(std::int64_t tokens, std::int64_t hit_pages) {
  stats_.lookup_tokens += tokens;
  stats_.hit_tokens += hit_pages * alloc_.virtual_page_size();
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
