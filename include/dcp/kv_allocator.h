// The widened KV allocator the scheduler sees.
//
// Each rank of a DCP group of N ranks has `num_pages` physical pages of `page_size` (P) latent
// rows. The scheduler sees virtual pages of P*N token slots: virtual page k is physical page k
// on every rank, and token position p of a request lives in virtual slot
//     v = pages[p / (P*N)] * P*N + p mod (P*N),   owner(v) = v mod N,  physical(v) = v / N.
// The allocator works in tokens and virtual pages only; ranks never appear in its API. Every
// rank of the group runs an identical replica in lockstep (same calls, same results).
//
// Whole pages of a prefix can be shared between requests (reference counted). A request that
// later writes into a shared, partly used page gets a private copy first: extend() reports the
// page copies the caller must apply to each rank's pool (copy on write).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "dcp/layout.h"

namespace dcp {

using RequestId = std::int64_t;

// Copy the first `rows` physical rows of page `from` to page `to` on every rank.
struct PageCopy {
  std::int32_t from = 0;
  std::int32_t to = 0;
  friend bool operator==(const PageCopy&, const PageCopy&) = default;
};

class KvAllocator {
 public:
  // Throws unless dcp_size >= 1, page_size >= 1, num_pages >= 0 and fits an int32 page id, and
  // interleave >= 1 divides page_size. interleave: the stripe of consecutive tokens per rank
  // (owner(p) = (p / I) mod N; vLLM's dcp_kv_cache_interleave_size).
  KvAllocator(int dcp_size, int page_size, std::int64_t num_pages, int interleave = 1);

  // The slot mapping (owner(v), physical(v), page sizes): the layout's widened page math.
  const WidenedPages& widened() const noexcept { return widened_; }
  int dcp_size() const noexcept { return widened_.dcp_size(); }
  int page_size() const noexcept { return widened_.page_size(); }  // P, physical
  int interleave() const noexcept { return widened_.interleave(); }
  std::int64_t virtual_page_size() const noexcept { return widened_.virtual_page_size(); }
  std::int64_t num_pages() const noexcept { return widened_.physical_pages(); }
  // Logical capacity in tokens: physical rows x N.
  std::int64_t capacity_tokens() const noexcept { return widened_.virtual_capacity(); }
  std::int64_t free_pages() const noexcept { return static_cast<std::int64_t>(free_.size()); }
  // Tokens that could still be placed in free pages.
  std::int64_t free_tokens() const noexcept { return free_pages() * virtual_page_size(); }
  // Free pages needed to grow `request` to `new_length` tokens (incl. a copy-on-write page).
  std::int64_t pages_needed(RequestId request, std::int64_t new_length) const;

  // Registers a request holding its first n >= 0 tokens. Throws (capacity) if the pages are
  // not free, (invalid_argument) if the id exists; either way nothing changes.
  void allocate(RequestId request, std::int64_t n);
  // Grows a request by n >= 0 tokens. Returns the page copies every rank must apply to its pools
  // (copy on write) before the new tokens are written: MlaModel::extend does.
  [[nodiscard]] std::vector<PageCopy> extend(RequestId request, std::int64_t n);
  // Shrinks a request to new_length <= length (speculative rollback); frees whole pages.
  void truncate(RequestId request, std::int64_t new_length);
  // Releases a request's pages (shared pages when their last user goes).
  void free(RequestId request);
  // Moves a request's pages and length to a new id (a multi-turn continuation takes over the
  // KV of the turn before it).
  void rename(RequestId from, RequestId to);
  // Creates `dst` holding the first `tokens` tokens of `src` by sharing its pages. `tokens`
  // must be a whole number of virtual pages and <= src's length.
  void share_prefix(RequestId src, RequestId dst, std::int64_t tokens);

  // ---- pages held outside requests (the prefix cache) ----
  // A fresh page held by the caller (refcount 1). Throws (capacity) when none is free.
  std::int32_t acquire_page();
  // Another holder of a page in use, and the release of one hold.
  void retain(std::int32_t page);
  void release(std::int32_t page);
  // Registers a request whose first pages.size() virtual pages are `pages` (already held; each
  // gains a reference) and whose length is those whole pages.
  void allocate_shared(RequestId request, const std::vector<std::int32_t>& pages);

  bool contains(RequestId request) const noexcept { return requests_.count(request) != 0; }
  std::int64_t length(RequestId request) const;
  // The request's virtual pages (= physical page ids on every rank), in token order.
  const std::vector<std::int32_t>& pages(RequestId request) const;
  // Virtual slot of token position p (0 <= p < length).
  std::int64_t slot(RequestId request, std::int64_t p) const;
  std::int32_t ref_count(std::int32_t page) const {
    return refs_.at(static_cast<std::size_t>(page));
  }
  std::vector<RequestId> requests() const;

  // Checks every invariant (refcounts match references, free list disjoint from used pages,
  // page counts match lengths); throws dcp::Error(internal) on a violation. For tests.
  void check_invariants() const;

 private:
  struct Entry {
    std::int64_t length = 0;
    std::vector<std::int32_t> pages;
  };
  const Entry& entry(RequestId request, const char* what) const;
  std::int64_t pages_for(std::int64_t tokens) const noexcept {
    return (tokens + virtual_page_size() - 1) / virtual_page_size();
  }
  std::int32_t take_page();
  void release_page(std::int32_t page);

  WidenedPages widened_;
  std::vector<std::int32_t> free_;  // LIFO; deterministic so every replica agrees
  std::vector<std::int32_t> refs_;  // [num_pages]
  std::vector<std::int32_t> held_;  // [num_pages] holds from outside requests (retain/acquire)
  std::unordered_map<RequestId, Entry> requests_;
};

}  // namespace dcp
