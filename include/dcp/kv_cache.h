// One rank's latent KV storage and the per-forward metadata built from the allocator.
//
//   LatentPool   C = num_pages * P physical rows of (kv_lora + rope) latent values, fp32 or
//                bf16, allocated once, plus one reserved dummy row for fixed-shape writes.
//   KvShard      a rank's view: the allocator replica + its pool + its DCP rank. Stores only
//                owned rows (count_r(a+L) - count_r(a) of a chunk [a, a+L)), gathers.
//   ForwardPlan  rank-local lengths (from local counts, never global lengths), page tables,
//                query positions and write shares for one batch: what the kernel consumes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dcp/attention.h"
#include "dcp/comm.h"
#include "dcp/dtype.h"
#include "dcp/kv_allocator.h"
#include "dcp/layout.h"
#include "dcp/memory.h"

namespace dcp {

struct LatentGeometry {
  int kv_lora_rank = 512;  // D_c
  int rope_dim = 64;       // D_r
  KvDtype dtype = KvDtype::bf16;
  int width() const noexcept { return kv_lora_rank + rope_dim; }
  std::size_t row_bytes() const noexcept {
    return static_cast<std::size_t>(width()) * dtype_size(dtype);
  }
};

class LatentPool {
 public:
  // Throws unless num_pages >= 0, page_size >= 1 and the geometry is positive.
  LatentPool(std::int64_t num_pages, int page_size, LatentGeometry geometry);
  // Enough pages per rank for `logical_tokens` tokens striped over `dcp_size` ranks.
  static LatentPool for_tokens(std::int64_t logical_tokens, int dcp_size, int page_size,
                               LatentGeometry g);
  // As many whole pages (plus the dummy row) as fit in `bytes` on this rank.
  static LatentPool for_bytes(std::size_t bytes, int page_size, LatentGeometry g);

  std::int64_t num_pages() const noexcept { return num_pages_; }
  int page_size() const noexcept { return page_size_; }
  std::int64_t rows() const noexcept { return num_pages_ * page_size_; }  // excludes the dummy row
  std::int64_t dummy_row() const noexcept { return rows(); }
  const LatentGeometry& geometry() const noexcept { return geometry_; }
  std::size_t bytes() const noexcept {
    return static_cast<std::size_t>(rows() + 1) * geometry_.row_bytes();
  }
  const void* data() const noexcept { return data_.data(); }

  // Stores one fp32 row (converted to the pool dtype) at a physical row (the dummy row allowed).
  void write_row(std::int64_t physical_row, const float* src);
  // Reads one row back as fp32.
  void read_row(std::int64_t physical_row, float* dst) const;
  // Copies page `from` onto page `to` (all P rows).
  void copy_page(std::int32_t from, std::int32_t to);
  // Fills every row with NaN (tests: proves unwritten rows are never read).
  void poison();
  // Raw bytes of one row (row_bytes() of them), in the pool's dtype.
  const std::uint8_t* raw_row(std::int64_t physical_row) const;
  std::uint8_t* raw_row(std::int64_t physical_row);

 private:
  std::byte* row_ptr(std::int64_t physical_row);
  std::int64_t num_pages_;
  int page_size_;
  LatentGeometry geometry_;
  HugePageBuffer data_;
};

class KvShard {
 public:
  // The allocator replica and pool must outlive the shard; page counts must agree.
  KvShard(const KvAllocator& allocator, LatentPool& pool, int dcp_rank);

  int dcp_rank() const noexcept { return layout_.rank(); }
  const ShardLayout& layout() const noexcept { return layout_; }
  const KvAllocator& allocator() const noexcept { return allocator_; }
  LatentPool& pool() noexcept { return pool_; }
  const LatentPool& pool() const noexcept { return pool_; }

  // Physical row of a request's token p on its owner rank (the caller checks ownership).
  std::int64_t physical_row(RequestId request, std::int64_t p) const;
  // Rows this rank stores for a request of its current length.
  std::int64_t local_length(RequestId request) const;

  // Stores the owned rows of tokens [start, start + length) of `request`; `rows` holds all
  // `length` rows [length, width] fp32 (every rank computed them). Returns the rows stored.
  // The tokens must already be allocated.
  std::int64_t write(RequestId request, std::int64_t start, std::int64_t length, const float* rows);
  // Fixed-shape variant (what a graph-captured GPU path needs): a destination for every token,
  // the dummy row for those this rank does not own. dst_rows [length].
  void write_destinations(RequestId request, std::int64_t start, std::int64_t length,
                          std::int64_t* dst_rows) const;
  void scatter(const std::int64_t* dst_rows, std::int64_t length, const float* rows);

  // Applies the allocator's copy-on-write page copies to this rank's pool.
  void apply(const std::vector<PageCopy>& copies);

  // This rank's rows of a request, in local-row order: [local_length, width] fp32.
  std::vector<float> local_rows(RequestId request) const;
  // The same into a caller's buffer of local_length(request) * width floats (no allocation).
  void local_rows(RequestId request, float* out) const;
  // One local row in the pool's own dtype (geometry().row_bytes() bytes), for transfers.
  void read_local_raw(RequestId request, std::int64_t local_row, std::uint8_t* dst) const;
  void write_local_raw(RequestId request, std::int64_t local_row, const std::uint8_t* src);

 private:
  const KvAllocator& allocator_;
  LatentPool& pool_;
  ShardLayout layout_;
};

// Reassembles a request's whole latent sequence in token order from the N shards of the group
// (one padded all-gather). Returns [length, width] fp32 on every rank.
std::vector<float> gather_sequence(Communicator& dcp_group, const KvShard& shard,
                                   RequestId request);

// One request of a forward batch: its last q_len tokens (already allocated and written, or
// about to be written) are the queries; for decode q_len is 1, for verification k+1.
struct BatchEntry {
  RequestId request = 0;
  std::int32_t q_len = 1;
};

// Per-rank forward metadata. Page ids are the same on every rank; lengths are rank-local.
struct ForwardPlan {
  int dcp_size = 1;
  int dcp_rank = 0;
  int interleave = 1;
  int page_size = 0;
  std::vector<RequestId> requests;       // [B]
  std::vector<std::int32_t> q_start;     // [B + 1]
  std::vector<std::int64_t> q_pos;       // [T] global positions of the query tokens
  std::vector<std::int64_t> global_len;  // [B] sequence length including the queries
  std::vector<std::int64_t> local_len;   // [B] layout count of global_len on this rank
  std::vector<std::int32_t> page_table;  // [B, stride]
  int page_table_stride = 0;
  std::vector<ChunkShare> write_share;  // [B] this rank's rows of the query tokens' chunk

  int num_requests() const noexcept { return static_cast<int>(local_len.size()); }
  std::int64_t num_tokens() const noexcept { return q_start.empty() ? 0 : q_start.back(); }
  // Kernel params over `pool` with this plan's metadata (the plan and pool must outlive them).
  // Geometry, lengths, pages and positions are set; heads, scale, q, masks and outputs are not.
  MlaAttentionParams kernel_params(const LatentPool& pool) const;
};

// Throws if a request is unknown or q_len is outside [1, length].
ForwardPlan plan_forward(const KvAllocator& allocator, const std::vector<BatchEntry>& batch,
                         int dcp_rank);

}  // namespace dcp
