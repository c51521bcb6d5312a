// Prefix caching over virtual pages, with a host-memory tier (HiCache L2).
//
// The cache maps whole virtual pages of prompt tokens (P*N tokens each, chained by hash: a page
// is found only after the pages before it) to KV pages. It holds one reference on each device
// page it keeps, so the pages outlive the requests that wrote them; requests share them by
// reference. Under pressure, least recently used pages that no request uses move to the host
// tier (or are dropped without one); a hit on a host page copies it back to a fresh device page.
// One widened logical page space spans both tiers: each rank's host buffer holds only its own P
// rows of each page, and every copy keeps the positions i of the page with i mod N = r, mapped to
// local rows i / N. No DCP collective is involved: each rank moves its own shard.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "dcp/kv_allocator.h"
#include "dcp/kv_cache.h"

namespace dcp {

struct PrefixCacheStats {
  std::int64_t lookup_tokens = 0;    // prompt tokens looked up
  std::int64_t hit_tokens = 0;       // of which served from the cache
  std::int64_t pages_offloaded = 0;  // device -> host
  std::int64_t pages_reloaded = 0;   // host -> device
  std::int64_t pages_dropped = 0;    // evicted for good
  std::int64_t bytes_to_host = 0;    // by this rank, all layers
  std::int64_t bytes_to_device = 0;
  double hit_rate() const {
    return lookup_tokens ? static_cast<double>(hit_tokens) / lookup_tokens : 0.0;
  }
};

// The hash of a prefix of tokens, from the hash of the prefix before it (0 for none) and its last
// n tokens: pages are chained so that a page is found only after the pages before it.
std::uint64_t chain_hash(std::uint64_t parent, const std::int32_t* tokens, std::int64_t n);

class PrefixCache {
 public:
  // device: this rank's pool of every layer (sharing the allocator's page ids).
  // host_capacity_tokens is the host tier's logical capacity (0: no host tier; evicted pages are
  // dropped).
  PrefixCache(KvAllocator& allocator, std::vector<LatentPool*> device, int dcp_rank,
              std::int64_t host_capacity_tokens);
  ~PrefixCache();

  // The device pages holding the longest cached prefix of `tokens` shorter than tokens.size()
  // (whole virtual pages). Host pages on the path are copied back first, into free pages while
  // more than `keep_free` are free (the pages running requests will still take), else in place
  // of other pages evicted for them; the path stops where no room can be made. The pages returned
  // are pinned (extra reference) until unpin(): pass them to KvAllocator::allocate_shared first.
  // Counts no statistics: a request waiting for KV is matched again each step.
  std::vector<std::int32_t> match(const std::vector<std::int32_t>& tokens,
                                  std::int64_t keep_free = 0);
  // Counts a lookup of `tokens` prompt tokens that found `hit_pages` pages, once per request (when
  // it is admitted with the hit).
  void count_lookup(std::int64_t tokens, std::int64_t hit_pages);
  void unpin(const std::vector<std::int32_t>& pages);
  // How many pages match() would find for `tokens` (either tier), with no side effect: no
  // reload, no pin, no statistics.
  std::int64_t cached_pages(const std::vector<std::int32_t>& tokens) const;

  // Caches the whole pages of `request`'s KV, which holds `tokens` in order (as far as its
  // length: a prompt being prefilled, or a finished request's prompt and reply).
  void insert(const std::vector<std::int32_t>& tokens, RequestId request);

  // Forgets every cached page: pages only the cache held are free again (device pages and host
  // slots alike); pages requests still use stay theirs. Statistics are kept. Returns the device
  // pages the cache held.
  std::int64_t clear();

  // Evicts until `pages` device pages are free or nothing more can go: the least recently used
  // pages no request holds move to the host tier; where it has no room, the least recently used
  // of them with no cached page after them are dropped. Returns the free count.
  std::int64_t make_room(std::int64_t pages);

  // Device pages no request holds (nor a match's pin): what make_room can free.
  std::int64_t unused_pages() const;

  const PrefixCacheStats& stats() const noexcept { return stats_; }
  std::int64_t device_pages() const noexcept { return on_device_; }
  std::int64_t host_pages() const noexcept {
    return static_cast<std::int64_t>(nodes_.size()) - on_device_;
  }
  std::int64_t host_capacity_pages() const noexcept { return host_pages_total_; }
  // This rank's host rows of a cached page (tests: bit-exactness of offload and reload).
  const LatentPool* host_pool(int layer) const {
    return host_.empty() ? nullptr : host_[static_cast<std::size_t>(layer)].get();
  }

 private:
  struct Node {
    std::uint64_t parent = 0;
    std::vector<std::int32_t> tokens;  // the page's P*N tokens (collision check)
    bool on_device = true;
    std::int32_t device_page = -1;
    std::int64_t host_page = -1;
    std::uint64_t last_used = 0;
    int children = 0;
  };
  class Eviction;  // one pass: candidates found once, taken least recently used first
  std::uint64_t key(std::uint64_t parent, const std::int32_t* tokens) const;
  // A device page no request holds (nor a pin): eviction may take it.
  bool only_cached(const Node& node) const;
  // Whether `node` is the page of `tokens` after `parent` (not a hash collision).
  bool holds(const Node& node, std::uint64_t parent, const std::int32_t* tokens) const;
  // The keys of the cached pages (either tier) a hit on `tokens` may cover, in order.
  std::vector<std::uint64_t> path(const std::vector<std::int32_t>& tokens) const;
  // Whole pages of `tokens` a hit may cover: one token at least is left to prefill.
  std::int64_t usable_pages(const std::vector<std::int32_t>& tokens) const;
  void copy_page(bool to_host, Node& node);
  void drop(std::uint64_t key);

  KvAllocator& alloc_;
  std::vector<LatentPool*> device_;
  std::vector<std::unique_ptr<LatentPool>> host_;
  std::vector<std::int64_t> owned_offsets_;  // rows of a physical page this rank holds (0..P-1)
  std::int64_t host_pages_total_ = 0;
  std::vector<std::int64_t> host_free_;
  std::unordered_map<std::uint64_t, Node> nodes_;
  std::int64_t on_device_ = 0;  // nodes on device
  std::uint64_t clock_ = 0;
  PrefixCacheStats stats_;
};

}  // namespace dcp
