#include <algorithm>
#include <cstring>

#include "dcp/disagg.h"
#include "dcp/error.h"
#include "dcp/layout.h"

namespace dcp {

TransferPlan make_transfer_plan(const KvLayoutSpec& prefill, const KvLayoutSpec& decode,
                                int decode_rank, std::int64_t tokens) {
  const int a = prefill.dcp_size, b = decode.dcp_size;
  DCP_ARG_CHECK(a >= 1 && b >= 1, "DCP sizes must be >= 1 (prefill ", a, ", decode ", b, ")");
  DCP_ARG_CHECK(
      a == b || a == 1, "prefill DCP size ", a, " -> decode DCP size ", b,
      " is not supported: the sizes must be equal, or prefill DCP 1 -> any decode DCP size");
  DCP_ARG_CHECK(prefill.page_size == decode.page_size, "page sizes differ: prefill ",
                prefill.page_size, ", decode ", decode.page_size, " (they must match)");
  DCP_ARG_CHECK(prefill.interleave == decode.interleave, "interleave sizes differ: prefill ",
                prefill.interleave, ", decode ", decode.interleave, " (they must match)");
  DCP_ARG_CHECK(prefill.dtype == decode.dtype, "KV dtypes differ: prefill ",
                to_string(prefill.dtype), ", decode ", to_string(decode.dtype),
                " (they must match)");
  DCP_ARG_CHECK(decode_rank >= 0 && decode_rank < b, "decode rank ", decode_rank,
                " must be in [0, ", b, ")");
  DCP_ARG_CHECK(tokens >= 0, "token count ", tokens, " must be >= 0");
  TransferPlan p;
  p.prefill_dcp_size = a;
  p.decode_dcp_size = b;
  p.decode_rank = decode_rank;
  p.interleave = decode.interleave;
  p.tokens = tokens;
  p.rows = layout::count(tokens, decode_rank, b, decode.interleave);
  p.page_path = a == b;  // the same striping: rank r's rows move as they are
  p.src_dcp_rank = a == b ? decode_rank : 0;
  return p;
}

namespace {

std::uint64_t fnv1a(const std::uint8_t* data, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ data[i]) * 1099511628211ull;
  return h;
}

struct Header {
  std::int64_t request = 0;
  std::int64_t tokens = 0;
  std::int64_t rows = 0;
  std::uint64_t checksum = 0;
};

constexpr int kTagHeader = 7001, kTagPayload = 7002;

}  // namespace

std::vector<TransferResult> transfer_kv(Communicator& world, Communicator* decode_group,
                                        const DisaggRoles& roles,
                                        const std::vector<TransferItem>& items,
                                        const std::vector<KvShard*>& shards,
                                        KvAllocator* decode_allocator,
                                        const TransportOptions& options) {
  const int me = world.rank();
  const auto prefill_it = std::find(roles.prefill_ranks.begin(), roles.prefill_ranks.end(), me);
  const auto decode_it = std::find(roles.decode_ranks.begin(), roles.decode_ranks.end(), me);
  const bool is_prefill = prefill_it != roles.prefill_ranks.end();
  const bool is_decode = decode_it != roles.decode_ranks.end();
  DCP_ARG_CHECK(!(is_prefill && is_decode), "world rank ", me,
                " must not be both a prefill and a decode rank");
  if (!is_prefill && !is_decode) return {};  // another decode replica's transfer
  DCP_ARG_CHECK(!is_decode || (decode_allocator && decode_group),
                "a decode rank needs its allocator and group");
  const std::size_t row_bytes =
      static_cast<std::size_t>(shards.empty() ? 0 : shards[0]->pool().geometry().row_bytes());
  std::vector<TransferResult> results;
  std::vector<std::vector<std::uint8_t>> payloads;  // decode side: held until every rank agrees

  for (const TransferItem& item : items) {
    for (std::size_t k = 0; k < roles.decode_ranks.size(); ++k) {
      const int dst = roles.decode_ranks[k];
      const TransferPlan plan =
          make_transfer_plan(roles.prefill, roles.decode, roles.decode_dcp_rank[k], item.tokens);
      const int src = roles.prefill_ranks[static_cast<std::size_t>(plan.src_dcp_rank)];
      if (me == src) {
        // Pack the planned rows of every layer in the pool's own dtype; checksum them.
        std::vector<std::uint8_t> buf(static_cast<std::size_t>(plan.rows) * row_bytes *
                                      shards.size());
        std::size_t at = 0;
        for (KvShard* shard : shards) {
          for (std::int64_t j = 0; j < plan.rows; ++j, at += row_bytes) {
            shard->read_local_raw(item.request, plan.source_row(j),
                                  buf.data() + at);
          }
        }
        Header h{item.request, item.tokens, plan.rows, fnv1a(buf.data(), buf.size())};
        if (options.corrupt_request == item.request && !buf.empty()) buf[buf.size() / 2] ^= 0x5a;
        world.send(&h, sizeof h, dst, kTagHeader);
        world.send(buf.data(), buf.size(), dst, kTagPayload);
      }
      if (me == dst) {
        Header h;
        world.recv(&h, sizeof h, src, kTagHeader);
        std::vector<std::uint8_t> buf(static_cast<std::size_t>(h.rows) * row_bytes * shards.size());
        world.recv(buf.data(), buf.size(), src, kTagPayload);
        TransferResult r;
        r.request = item.request;
        r.bytes_received = static_cast<std::int64_t>(buf.size() + sizeof h);
        r.ok = h.request == item.request && h.tokens == item.tokens && h.rows == plan.rows &&
               fnv1a(buf.data(), buf.size()) == h.checksum;
        if (!r.ok) r.error = "KV transfer checksum mismatch";
        results.push_back(r);
        payloads.push_back(std::move(buf));
      }
    }
  }
  if (!is_decode) return results;

  // Agree on each request across the decode group (replicas stay identical), then commit.
  std::vector<std::int32_t> failed(results.size());
  for (std::size_t i = 0; i < results.size(); ++i) failed[i] = results[i].ok ? 0 : 1;
  decode_group->all_reduce(failed.data(), failed.data(), failed.size(), ScalarType::i32,
                           ReduceOp::max);
  for (std::size_t i = 0; i < results.size(); ++i) {
    TransferResult& r = results[i];
    if (failed[i]) {
      r.ok = false;
      if (r.error.empty()) r.error = "KV transfer failed on another decode rank";
      continue;
    }
    try {
      decode_allocator->allocate(r.request, items[i].tokens);
    } catch (const Error& e) {  // capacity: the request fails, nothing else changes
      r.ok = false;
      r.error = e.what();
      continue;
    }
    const std::int64_t rows = shards[0]->local_length(r.request);
    std::size_t at = 0;
    for (KvShard* shard : shards) {
      for (std::int64_t j = 0; j < rows; ++j, at += row_bytes)
        shard->write_local_raw(r.request, j, payloads[i].data() + at);
    }
  }
  return results;
}

}  // namespace dcp
