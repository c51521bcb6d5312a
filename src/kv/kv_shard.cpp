#include <algorithm>
#include <cstring>

#include "dcp/error.h"
#include "dcp/kv_cache.h"

namespace dcp {

KvShard::KvShard(const KvAllocator& allocator, LatentPool& pool, int dcp_rank)
    : allocator_(allocator),
      pool_(pool),
      layout_(allocator.dcp_size(), dcp_rank, allocator.interleave()) {
  DCP_ARG_CHECK(
      allocator.num_pages() == pool.num_pages() && allocator.page_size() == pool.page_size(),
      "allocator (", allocator.num_pages(), " pages of ", allocator.page_size(), ") and pool (",
      pool.num_pages(), " pages of ", pool.page_size(), ") disagree");
}

std::int64_t KvShard::physical_row(RequestId request, std::int64_t p) const {
  return allocator_.widened().physical(allocator_.slot(request, p));
}

std::int64_t KvShard::local_length(RequestId request) const {
  return layout_.local_length(allocator_.length(request));
}

namespace {

// Physical row of local row j of a request with these pages (one virtual page = physical page).
inline std::int64_t physical_of_local(const std::vector<std::int32_t>& pages, int page_size,
                                      std::int64_t j) {
  return static_cast<std::int64_t>(pages[static_cast<std::size_t>(j / page_size)]) * page_size +
         j % page_size;
}

}  // namespace

std::int64_t KvShard::write(RequestId request, std::int64_t start, std::int64_t length,
                            const float* rows) {
  const std::int64_t len = allocator_.length(request);
  DCP_ARG_CHECK(start >= 0 && length >= 0 && start + length <= len, "write: tokens [", start, ", ",
                start + length, ") are outside request ", request, " of length ", len);
  const int w = pool_.geometry().width();
  const int n = layout_.size();
  const std::vector<std::int32_t>& pages = allocator_.pages(request);
  if (layout_.interleave() > 1) {  // runs of I positions every I x N
    std::int64_t stored = 0;
    for (std::int64_t p = start; p < start + length; ++p) {
      if (!layout_.owns(p)) continue;
      pool_.write_row(physical_of_local(pages, pool_.page_size(), layout_.local_row(p)),
                      rows + (p - start) * w);
      ++stored;
    }
    return stored;
  }
  // The first owned position at or after start, then every N-th; position p is local row p / N.
  std::int64_t first = start + ((layout_.rank() - start) % n + n) % n;
  std::int64_t stored = 0;
  for (std::int64_t p = first; p < start + length; p += n, ++stored) {
    // The source rows this rank owns are N rows apart, too far for the hardware prefetcher to
    // follow: fetch the next one while this one is converted.
    if (p + n < start + length) {
      const char* next = reinterpret_cast<const char*>(rows + (p + n - start) * w);
      for (std::size_t b = 0; b < w * sizeof(float); b += 64) __builtin_prefetch(next + b);
    }
    pool_.write_row(physical_of_local(pages, pool_.page_size(), layout_.local_row(p)),
                    rows + (p - start) * w);
  }
  return stored;
}

void KvShard::write_destinations(RequestId request, std::int64_t start, std::int64_t length,
                                 std::int64_t* dst_rows) const {
  const std::int64_t len = allocator_.length(request);
  DCP_ARG_CHECK(start >= 0 && length >= 0 && start + length <= len, "write_destinations: tokens [",
                start, ", ", start + length, ") are outside request ", request, " of length ", len);
  for (std::int64_t i = 0; i < length; ++i) {
    const std::int64_t p = start + i;
    dst_rows[i] = layout_.owns(p) ? physical_row(request, p) : pool_.dummy_row();
  }
}

void KvShard::scatter(const std::int64_t* dst_rows, std::int64_t length, const float* rows) {
  const int w = pool_.geometry().width();
  for (std::int64_t i = 0; i < length; ++i) pool_.write_row(dst_rows[i], rows + i * w);
}

void KvShard::apply(const std::vector<PageCopy>& copies) {
  for (const PageCopy& c : copies) pool_.copy_page(c.from, c.to);
}

std::vector<float> KvShard::local_rows(RequestId request) const {
  const std::int64_t len = allocator_.length(request);
  const int w = pool_.geometry().width();
  const int n = layout_.size();
  (void)n;
  std::vector<float> out(static_cast<std::size_t>(layout_.local_length(len)) * w);
  local_rows(request, out.data());
  return out;
}

void KvShard::read_local_raw(RequestId request, std::int64_t local_row, std::uint8_t* dst) const {
  const std::int64_t rows = local_length(request);
  DCP_ARG_CHECK(local_row >= 0 && local_row < rows, "local row ", local_row, " of request ",
                request, " is outside [0, ", rows, ")");
  const std::uint8_t* src = pool_.raw_row(physical_row(request, layout_.position(local_row)));
  std::memcpy(dst, src, pool_.geometry().row_bytes());
}

void KvShard::write_local_raw(RequestId request, std::int64_t local_row, const std::uint8_t* src) {
  const std::int64_t rows = local_length(request);
  DCP_ARG_CHECK(local_row >= 0 && local_row < rows, "local row ", local_row, " of request ",
                request, " is outside [0, ", rows, ")");
  std::memcpy(pool_.raw_row(physical_row(request, layout_.position(local_row))), src,
              pool_.geometry().row_bytes());
}

void KvShard::local_rows(RequestId request, float* out) const {
  const std::int64_t rows = layout_.local_length(allocator_.length(request));
  const int w = pool_.geometry().width();
  const std::vector<std::int32_t>& pages = allocator_.pages(request);
  for (std::int64_t j = 0; j < rows; ++j)
    pool_.read_row(physical_of_local(pages, pool_.page_size(), j), out + j * w);
}

std::vector<float> gather_sequence(Communicator& group, const KvShard& shard, RequestId request) {
  const int n = group.size();
  DCP_ARG_CHECK(n == shard.layout().size() && group.rank() == shard.dcp_rank(),
                "gather_sequence: group (rank ", group.rank(), " of ", n,
                ") does not match the shard (rank ", shard.dcp_rank(), " of ",
                shard.layout().size(), ")");
  const std::int64_t len = shard.allocator().length(request);
  const int w = shard.pool().geometry().width();
  const int il = shard.layout().interleave();
  const std::int64_t max_rows = layout::count(len, 0, n, il);  // rank 0 holds the most rows
  std::vector<float> mine = shard.local_rows(request);
  mine.resize(static_cast<std::size_t>(max_rows) * w, 0.0f);  // pad to an equal count
  std::vector<float> all(mine.size() * n);
  group.all_gather(mine.data(), all.data(), mine.size() * sizeof(float));
  std::vector<float> seq(static_cast<std::size_t>(len) * w);
  for (std::int64_t p = 0; p < len; ++p) {
    const float* src =
        all.data() + (layout::owner(p, n, il) * max_rows + layout::row(p, n, il)) * w;
    std::copy(src, src + w, seq.data() + p * w);
  }
  return seq;
}

ForwardPlan plan_forward(const KvAllocator& allocator, const std::vector<BatchEntry>& batch,
                         int dcp_rank) {
  const int n = allocator.dcp_size();
  const ShardLayout layout(n, dcp_rank, allocator.interleave());
  ForwardPlan plan;
  plan.dcp_size = n;
  plan.dcp_rank = dcp_rank;
  plan.interleave = allocator.interleave();
  plan.page_size = allocator.page_size();
  plan.q_start.push_back(0);
  std::size_t stride = 1;
  for (const BatchEntry& e : batch) stride = std::max(stride, allocator.pages(e.request).size());
  plan.page_table_stride = static_cast<int>(stride);
  plan.page_table.assign(batch.size() * stride, 0);
  for (std::size_t b = 0; b < batch.size(); ++b) {
    const BatchEntry& e = batch[b];
    const std::int64_t len = allocator.length(e.request);
    DCP_ARG_CHECK(e.q_len >= 1 && e.q_len <= len, "plan_forward: request ", e.request,
                  " has q_len ", e.q_len, "; legal: [1, its length ", len, "]");
    plan.requests.push_back(e.request);
    plan.global_len.push_back(len);
    plan.local_len.push_back(layout.local_length(len));  // local counts, never global lengths
    for (std::int64_t p = len - e.q_len; p < len; ++p) plan.q_pos.push_back(p);
    plan.q_start.push_back(plan.q_start.back() + e.q_len);
    plan.write_share.push_back(layout.chunk_share(len - e.q_len, e.q_len));
    const auto& pages = allocator.pages(e.request);
    std::copy(pages.begin(), pages.end(),
              plan.page_table.begin() + static_cast<std::ptrdiff_t>(b * stride));
  }
  return plan;
}

MlaAttentionParams ForwardPlan::kernel_params(const LatentPool& pool) const {
  MlaAttentionParams p;
  p.kv_lora_rank = pool.geometry().kv_lora_rank;
  p.rope_dim = pool.geometry().rope_dim;
  p.num_requests = num_requests();
  p.q_start = q_start.data();
  p.q_pos = q_pos.data();
  p.kv = pool.data();
  p.kv_dtype = pool.geometry().dtype;
  p.num_pages = pool.num_pages();
  p.page_size = page_size;
  p.page_table = page_table.data();
  p.page_table_stride = page_table_stride;
  p.local_len = local_len.data();
  p.dcp_size = dcp_size;
  p.dcp_rank = dcp_rank;
  p.interleave = interleave;
  return p;
}

}  // namespace dcp
