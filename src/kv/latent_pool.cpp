#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "dcp/error.h"
#include "dcp/kv_cache.h"

namespace dcp {

LatentPool::LatentPool(std::int64_t num_pages, int page_size, LatentGeometry geometry)
    : num_pages_(num_pages), page_size_(page_size), geometry_(geometry) {
  DCP_ARG_CHECK(num_pages >= 0, "num_pages = ", num_pages, " must be >= 0");
  DCP_ARG_CHECK(page_size >= 1, "page_size = ", page_size, " must be >= 1");
  DCP_ARG_CHECK(geometry.kv_lora_rank >= 1 && geometry.rope_dim >= 0, "latent geometry ",
                geometry.kv_lora_rank, "+", geometry.rope_dim,
                " must have kv_lora_rank >= 1, rope_dim >= 0");
  data_ = HugePageBuffer(bytes(), "a KV pool");
}

LatentPool LatentPool::for_tokens(std::int64_t logical_tokens, int dcp_size, int page_size,
                                  LatentGeometry g) {
  DCP_ARG_CHECK(logical_tokens >= 0, "KV capacity ", logical_tokens, " tokens must be >= 0");
  DCP_ARG_CHECK(dcp_size >= 1 && page_size >= 1, "dcp_size and page_size must be >= 1");
  const std::int64_t per_page = static_cast<std::int64_t>(page_size) * dcp_size;
  return LatentPool((logical_tokens + per_page - 1) / per_page, page_size, g);
}

LatentPool LatentPool::for_bytes(std::size_t bytes, int page_size, LatentGeometry g) {
  DCP_ARG_CHECK(page_size >= 1, "page_size = ", page_size, " must be >= 1");
  const std::size_t row = g.row_bytes();
  const std::size_t pages = bytes > row ? (bytes - row) / (row * page_size) : 0;  // one dummy row
  return LatentPool(static_cast<std::int64_t>(pages), page_size, g);
}

std::byte* LatentPool::row_ptr(std::int64_t physical_row) {
  DCP_ARG_CHECK(physical_row >= 0 && physical_row <= rows(), "physical row ", physical_row,
                " is outside the pool [0, ", rows(), "] (", rows(), " = dummy row)");
  return data_.data() + static_cast<std::size_t>(physical_row) * geometry_.row_bytes();
}

void LatentPool::write_row(std::int64_t physical_row, const float* src) {
  std::byte* dst = row_ptr(physical_row);
  const int w = geometry_.width();
  if (geometry_.dtype == KvDtype::fp32) {
    std::memcpy(dst, src, sizeof(float) * w);
  } else {
    floats_to_bf16(src, reinterpret_cast<bf16_t*>(dst), static_cast<std::size_t>(w));
  }
}

void LatentPool::read_row(std::int64_t physical_row, float* dst) const {
  const std::byte* src = const_cast<LatentPool*>(this)->row_ptr(physical_row);
  const int w = geometry_.width();
  if (geometry_.dtype == KvDtype::fp32) {
    std::memcpy(dst, src, sizeof(float) * w);
  } else {
    const auto* s = reinterpret_cast<const bf16_t*>(src);
    for (int i = 0; i < w; ++i) dst[i] = bf16_to_float(s[i]);
  }
}

void LatentPool::copy_page(std::int32_t from, std::int32_t to) {
  DCP_ARG_CHECK(from >= 0 && from < num_pages_ && to >= 0 && to < num_pages_, "copy_page ", from,
                " -> ", to, ": pages must be in [0, ", num_pages_, ")");
  const std::size_t page_bytes = geometry_.row_bytes() * page_size_;
  std::memmove(data_.data() + to * page_bytes, data_.data() + from * page_bytes, page_bytes);
}

const std::uint8_t* LatentPool::raw_row(std::int64_t physical_row) const {
  return reinterpret_cast<const std::uint8_t*>(
      const_cast<LatentPool*>(this)->row_ptr(physical_row));
}

std::uint8_t* LatentPool::raw_row(std::int64_t physical_row) {
  return reinterpret_cast<std::uint8_t*>(row_ptr(physical_row));
}

void LatentPool::poison() {
  const std::vector<float> nan(static_cast<std::size_t>(geometry_.width()),
                               std::numeric_limits<float>::quiet_NaN());
  for (std::int64_t r = 0; r <= rows(); ++r) write_row(r, nan.data());
}

}  // namespace dcp
