#include "dcp/kv_allocator.h"

#include <algorithm>
#include <limits>

#include "dcp/error.h"

namespace dcp {

KvAllocator::KvAllocator(int dcp_size, int page_size, std::int64_t num_pages, int interleave)
    // widened_ validates dcp_size, page_size and num_pages >= 0
    : widened_(dcp_size, num_pages, page_size, interleave) {
  DCP_ARG_CHECK(num_pages <= std::numeric_limits<std::int32_t>::max(), "num_pages = ", num_pages,
                " must be in [0, 2^31)");
  refs_.assign(static_cast<std::size_t>(num_pages), 0);
  held_.assign(static_cast<std::size_t>(num_pages), 0);
  free_.resize(static_cast<std::size_t>(num_pages));
  // Pop from the back: page 0 first.
  for (std::int64_t i = 0; i < num_pages; ++i)
    free_[i] = static_cast<std::int32_t>(num_pages - 1 - i);
}

const KvAllocator::Entry& KvAllocator::entry(RequestId request, const char* what) const {
  const auto it = requests_.find(request);
  DCP_ARG_CHECK(it != requests_.end(), what, ": unknown request ", request);
  return it->second;
}

std::int64_t KvAllocator::length(RequestId request) const {
  return entry(request, "length").length;
}

const std::vector<std::int32_t>& KvAllocator::pages(RequestId request) const {
  return entry(request, "pages").pages;
}

std::int64_t KvAllocator::slot(RequestId request, std::int64_t p) const {
  const Entry& e = entry(request, "slot");
  DCP_ARG_CHECK(p >= 0 && p < e.length, "slot: position ", p, " is outside request ", request,
                " of length ", e.length);
  const std::int64_t vp = virtual_page_size();
  return e.pages[static_cast<std::size_t>(p / vp)] * vp + p % vp;
}

std::vector<RequestId> KvAllocator::requests() const {
  std::vector<RequestId> ids;
  for (const auto& [id, e] : requests_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::int32_t KvAllocator::take_page() {
  const std::int32_t page = free_.back();
  free_.pop_back();
  refs_[page] = 1;
  return page;
}

void KvAllocator::release_page(std::int32_t page) {
  if (--refs_[page] == 0) free_.push_back(page);
}

std::int64_t KvAllocator::pages_needed(RequestId request, std::int64_t new_length) const {
  const auto it = requests_.find(request);
  if (it == requests_.end()) return pages_for(new_length);
  const Entry& e = it->second;
  if (new_length <= e.length) return 0;
  std::int64_t need = pages_for(new_length) - static_cast<std::int64_t>(e.pages.size());
  // Writing into a shared, partly used last page needs a private copy of it.
  const bool partial = e.length % virtual_page_size() != 0;
  if (partial && refs_[e.pages.back()] > 1) ++need;
  return need;
}

void KvAllocator::allocate(RequestId request, std::int64_t n) {
  DCP_ARG_CHECK(!contains(request), "allocate: request ", request, " already exists");
  DCP_ARG_CHECK(n >= 0, "allocate: token count ", n, " must be >= 0");
  const std::int64_t need = pages_for(n);
  DCP_CHECK(need <= free_pages(), capacity, "KV cache full: request ", request, " needs ", n,
            " tokens (", need, " pages of ", virtual_page_size(), " slots), ", free_pages(),
            " pages free of ", num_pages());
  Entry e;
  e.length = n;
  for (std::int64_t i = 0; i < need; ++i) e.pages.push_back(take_page());
  requests_.emplace(request, std::move(e));
}

std::vector<PageCopy> KvAllocator::extend(RequestId request, std::int64_t n) {
  const Entry& current = entry(request, "extend");
  DCP_ARG_CHECK(n >= 0, "extend: token count ", n, " must be >= 0");
  const std::int64_t need = pages_needed(request, current.length + n);
  DCP_CHECK(need <= free_pages(), capacity, "KV cache full: request ", request, " cannot grow by ",
            n, " tokens (needs ", need, " pages, ", free_pages(), " free of ", num_pages(), ")");
  Entry& e = requests_[request];
  std::vector<PageCopy> copies;
  if (n > 0 && e.length % virtual_page_size() != 0 && refs_[e.pages.back()] > 1) {
    const std::int32_t shared = e.pages.back();
    const std::int32_t mine = take_page();
    release_page(shared);
    e.pages.back() = mine;
    copies.push_back({shared, mine});
  }
  e.length += n;
  while (static_cast<std::int64_t>(e.pages.size()) < pages_for(e.length))
    e.pages.push_back(take_page());
  return copies;
}

void KvAllocator::truncate(RequestId request, std::int64_t new_length) {
  const Entry& current = entry(request, "truncate");
  DCP_ARG_CHECK(new_length >= 0 && new_length <= current.length, "truncate: new length ",
                new_length, " must be in [0, current length ", current.length, "] of request ",
                request);
  Entry& e = requests_[request];
  e.length = new_length;
  while (static_cast<std::int64_t>(e.pages.size()) > pages_for(new_length)) {
    release_page(e.pages.back());
    e.pages.pop_back();
  }
}

void KvAllocator::free(RequestId request) {
  const Entry& e = entry(request, "free");
  for (std::int32_t page : e.pages) release_page(page);
  requests_.erase(request);
}

void KvAllocator::rename(RequestId from, RequestId to) {
  entry(from, "rename");
  DCP_ARG_CHECK(!contains(to), "rename: request ", to, " already exists");
  auto node = requests_.extract(from);
  node.key() = to;
  requests_.insert(std::move(node));
}

void KvAllocator::share_prefix(RequestId src, RequestId dst, std::int64_t tokens) {
  const Entry& s = entry(src, "share_prefix");
  DCP_ARG_CHECK(!contains(dst), "share_prefix: request ", dst, " already exists");
  DCP_ARG_CHECK(tokens >= 0 && tokens <= s.length && tokens % virtual_page_size() == 0,
                "share_prefix: ", tokens, " tokens must be a multiple of the virtual page size ",
                virtual_page_size(), " and at most request ", src, "'s length ", s.length);
  Entry d;
  d.length = tokens;
  d.pages.assign(s.pages.begin(), s.pages.begin() + tokens / virtual_page_size());
  for (std::int32_t page : d.pages) ++refs_[page];
  requests_.emplace(dst, std::move(d));
}

std::int32_t KvAllocator::acquire_page() {
  DCP_CHECK(!free_.empty(), capacity, "KV cache full: no free page of ", num_pages());
  const std::int32_t page = take_page();
  held_[page] = 1;
  return page;
}

void KvAllocator::retain(std::int32_t page) {
  DCP_ARG_CHECK(page >= 0 && page < num_pages() && refs_[page] > 0, "retain: page ", page,
                " is not in use");
  ++refs_[page];
  ++held_[page];
}

void KvAllocator::release(std::int32_t page) {
  DCP_ARG_CHECK(page >= 0 && page < num_pages() && held_[page] > 0, "release: page ", page,
                " is not held");
  --held_[page];
  release_page(page);
}

void KvAllocator::allocate_shared(RequestId request, const std::vector<std::int32_t>& pages) {
  DCP_ARG_CHECK(!contains(request), "allocate_shared: request ", request, " already exists");
  for (std::int32_t page : pages) {
    DCP_ARG_CHECK(page >= 0 && page < num_pages() && refs_[page] > 0, "allocate_shared: page ",
                  page, " is not held");
  }
  Entry e;
  e.length = static_cast<std::int64_t>(pages.size()) * virtual_page_size();
  e.pages = pages;
  for (std::int32_t page : pages) ++refs_[page];
  requests_.emplace(request, std::move(e));
}

void KvAllocator::check_invariants() const {
  std::vector<std::int32_t> counted(held_.begin(), held_.end());
  for (const auto& [id, e] : requests_) {
    DCP_CHECK_EQ(static_cast<std::int64_t>(e.pages.size()), pages_for(e.length), "request ", id);
    for (std::int32_t page : e.pages) {
      DCP_CHECK(page >= 0 && page < num_pages(), internal, "request ", id, " holds page ", page);
      ++counted[page];
    }
  }
  std::vector<char> is_free(refs_.size(), 0);
  for (std::int32_t page : free_) {
    DCP_CHECK(!is_free[page], internal, "page ", page, " is on the free list twice");
    is_free[page] = 1;
  }
  for (std::size_t page = 0; page < refs_.size(); ++page) {
    DCP_CHECK_EQ(refs_[page], counted[page], "refcount of page ", page);
    DCP_CHECK(is_free[page] == (refs_[page] == 0), internal, "page ", page, " is ",
              is_free[page] ? "free" : "not free", " with refcount ", refs_[page]);
  }
}

}  // namespace dcp
