// The KV cache: widened allocator, per-rank pools, owner-only writes, gather, planner.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "dcp/comm_threads.h"
#include "dcp/error.h"
#include "dcp/kv_cache.h"
#include "dcp/memory.h"
#include "dcp/merge.h"
#include "dcp/reference.h"
#include "test_util.h"

namespace dcp {
namespace {

constexpr LatentGeometry kSmall{4, 2, KvDtype::fp32};  // width 6: cheap, exact

// A group of N ranks in one thread: one allocator replica per rank, one pool each.
struct Group {
  Group(int n, int page, std::int64_t pages, LatentGeometry g = kSmall) {
    for (int r = 0; r < n; ++r) {
      allocators.push_back(std::make_unique<KvAllocator>(n, page, pages));
      pools.push_back(std::make_unique<LatentPool>(pages, page, g));
      pools.back()->poison();
      shards.push_back(std::make_unique<KvShard>(*allocators[r], *pools[r], r));
    }
  }
  int size() const { return static_cast<int>(shards.size()); }
  // The same call on every replica (lockstep); returns rank 0's result.
  template <typename F>
  auto all(F&& f) {
    for (int r = 1; r < size(); ++r) f(*allocators[r], *shards[r]);
    return f(*allocators[0], *shards[0]);
  }
  // Reassembles a request from the shards without a communicator.
  std::vector<float> gather(RequestId id) const {
    const int n = size(), w = pools[0]->geometry().width();
    const std::int64_t len = allocators[0]->length(id);
    std::vector<std::vector<float>> local;
    for (const auto& s : shards) local.push_back(s->local_rows(id));
    std::vector<float> seq(static_cast<std::size_t>(len) * w);
    for (std::int64_t p = 0; p < len; ++p) {
      std::copy_n(local[p % n].begin() + (p / n) * w, w, seq.begin() + p * w);
    }
    return seq;
  }
  std::vector<std::unique_ptr<KvAllocator>> allocators;
  std::vector<std::unique_ptr<LatentPool>> pools;
  std::vector<std::unique_ptr<KvShard>> shards;
};

std::vector<float> random_rows(test::Rng& rng, std::int64_t n, int width) {
  std::vector<float> rows(static_cast<std::size_t>(n) * width);
  for (float& v : rows) v = rng.normal();
  return rows;
}

// A snapshot of allocator state for "refusals change nothing".
struct Snapshot {
  std::map<RequestId, std::pair<std::int64_t, std::vector<std::int32_t>>> requests;
  std::int64_t free_pages;
  std::vector<std::int32_t> refs;
  explicit Snapshot(const KvAllocator& a) : free_pages(a.free_pages()) {
    for (RequestId id : a.requests()) requests[id] = {a.length(id), a.pages(id)};
    for (std::int64_t p = 0; p < a.num_pages(); ++p)
      refs.push_back(a.ref_count(static_cast<std::int32_t>(p)));
  }
  bool operator==(const Snapshot&) const = default;
};

TEST(HugePageBuffer, IsZeroedAlignedAndSizedAsAsked) {
  // Large: 2 MiB-aligned so the kernel can back it with huge pages; small: a cache line.
  for (const std::size_t bytes : {std::size_t{5} << 20, std::size_t{100}, std::size_t{0}}) {
    HugePageBuffer buf(bytes);
    ASSERT_NE(buf.data(), nullptr);
    EXPECT_EQ(buf.size(), bytes);
    const std::size_t align = bytes >= (std::size_t{2} << 20) ? std::size_t{2} << 20 : 64;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buf.data()) % align, 0u) << bytes << " bytes";
    EXPECT_TRUE(
        std::all_of(buf.data(), buf.data() + bytes, [](std::byte b) { return b == std::byte{0}; }));
    if (bytes < (std::size_t{2} << 20)) {
      EXPECT_FALSE(buf.huge_pages());
    }
  }
  HugePageBuffer moved = HugePageBuffer(std::size_t{3} << 20);
  moved.data()[(std::size_t{3} << 20) - 1] = std::byte{7};  // writable to its last byte
  EXPECT_EQ(moved.data()[(std::size_t{3} << 20) - 1], std::byte{7});
}

// The process's mapped size in KiB (VmSize), to see that allocate_pages returns all it maps.
long mapped_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmSize:", 0) == 0) return std::stol(line.substr(7));
  return -1;
}

TEST(PageMemory, IsZeroedAlignedAndWritable) {
  const std::size_t huge = std::size_t{2} << 20;
  for (const std::size_t bytes :
       {std::size_t{0}, std::size_t{100}, huge - 1, huge, (std::size_t{5} << 20) + 123}) {
    const PageMemory m = allocate_pages(bytes);
    ASSERT_NE(m.data, nullptr) << bytes;
    auto* p = static_cast<unsigned char*>(m.data);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u) << bytes;
    if (m.huge_pages) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % huge, 0u) << bytes;
    }
    if (bytes < huge) {
      EXPECT_FALSE(m.huge_pages) << bytes;
    }
    EXPECT_TRUE(std::all_of(p, p + bytes, [](unsigned char b) { return b == 0; })) << bytes;
    if (bytes > 0) {
      p[0] = 1;
      p[bytes - 1] = 2;
      EXPECT_EQ(p[bytes - 1], 2);
    }
    free_pages(m.data, bytes);
  }
}

TEST(PageMemory, GivesBackAllItMaps) {
  if (!allocate_pages_maps_memory()) {
    GTEST_SKIP() << "under AddressSanitizer the buffers come from its heap, whose quarantine keeps "
                    "freed memory mapped (and LeakSanitizer checks for leaks)";
  }
  // The slack mapped to reach a 2 MiB boundary is unmapped, and so is the buffer when freed:
  // otherwise every round of allocating and freeing leaves at least 2 MiB more mapped. Rounds are
  // counted rather than the total compared, as another thread of the process (BLAS's) may map
  // its own memory at any moment, once.
  const std::size_t bytes = (std::size_t{5} << 20) + 123;
  free_pages(allocate_pages(bytes).data, bytes);
  int grew = 0;
  for (int i = 0; i < 64; ++i) {
    const long before = mapped_kib();
    ASSERT_GT(before, 0);
    const PageMemory m = allocate_pages(bytes);
    ASSERT_NE(m.data, nullptr);
    static_cast<unsigned char*>(m.data)[bytes / 2] = 1;
    free_pages(m.data, bytes);
    if (mapped_kib() - before >= 2048) ++grew;
  }
  EXPECT_LE(grew, 4) << "rounds of 64 that left 2 MiB or more mapped";
}

// A process that holds as many mappings as the kernel allows (vm.max_map_count) cannot map
// another byte, with memory to spare: the errors say so and how to raise the limit, and once
// mappings are given back allocation works again.
TEST(PageMemory, NamesTheMappingLimitWhenAProcessReachesIt) {
  if (!allocate_pages_maps_memory()) {
    GTEST_SKIP() << "under AddressSanitizer the buffers come from its heap";
  }
  long limit = -1;
  std::ifstream("/proc/sys/vm/max_map_count") >> limit;
  if (limit <= 0 || limit > (1 << 18)) {
    GTEST_SKIP() << "vm.max_map_count is " << limit << ": too many mappings to fill in a test";
  }
  // Single base pages, every other one unreadable, so that neighbours cannot merge into one
  // mapping. The vector's room is reserved first: growing it must not need a mapping of its own.
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  std::vector<void*> pages;
  pages.reserve(static_cast<std::size_t>(limit) + 16);
  for (long i = 0; i < limit + 16; ++i) {
    void* p =
        mmap(nullptr, page, i % 2 ? PROT_READ : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) break;
    pages.push_back(p);
  }
  const std::size_t bytes = std::size_t{8} << 20;
  std::string buffer_error, weight_error;
  try {
    HugePageBuffer b(bytes, "a test buffer");
  } catch (const Error& e) {
    buffer_error = e.what();
  }
  try {
    HugePageVector<float> w(bytes / sizeof(float));
  } catch (const Error& e) {
    weight_error = e.what();
  }
  for (void* p : pages) munmap(p, page);
  ASSERT_LT(static_cast<long>(pages.size()), limit + 16) << "the limit was never reached";
  EXPECT_NE(buffer_error.find("cannot allocate a test buffer of 8388608 bytes"), std::string::npos)
      << buffer_error;
  EXPECT_NE(buffer_error.find("vm.max_map_count = " + std::to_string(limit)), std::string::npos)
      << buffer_error;
  EXPECT_NE(weight_error.find("cannot allocate a weight of 8388608 bytes"), std::string::npos)
      << weight_error;
  EXPECT_NE(weight_error.find("sysctl -w vm.max_map_count="), std::string::npos) << weight_error;
  HugePageBuffer again(bytes, "a test buffer");  // the mappings given back, it fits again
  EXPECT_EQ(again.size(), bytes);
}

TEST(PageMemory, NamesTheKernelsHugePageMode) {
  const std::string mode = transparent_huge_pages();
  EXPECT_TRUE(mode == "always" || mode == "madvise" || mode == "never" || mode == "unavailable")
      << mode;
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (std::getline(f, line)) {
    EXPECT_NE(line.find("[" + mode + "]"), std::string::npos) << line;
  }
}

TEST(PageMemory, VectorsOfWeightsCopyAndCompareLikeAnyVector) {
  HugePageVector<std::uint8_t> a((std::size_t{3} << 20) + 5);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::uint8_t>(i * 7);
  const HugePageVector<std::uint8_t> b = a;
  EXPECT_EQ(a, b);
  HugePageVector<std::uint8_t> c = std::move(a);
  EXPECT_EQ(c, b);
  c.resize(10);
  c.shrink_to_fit();
  EXPECT_TRUE(std::equal(c.begin(), c.end(), b.begin()));
  const std::vector<std::uint8_t> plain(b.begin(), b.end());
  EXPECT_TRUE(std::equal(plain.begin(), plain.end(), b.begin(), b.end()));
}

TEST(KvCache, BalanceAndCapacity) {
  for (int n = 1; n <= 8; ++n) {
    for (int page : {1, 16, 64}) {
      Group g(n, page, 40);
      EXPECT_EQ(g.allocators[0]->capacity_tokens(), 40LL * page * n);  // physical rows x N
      EXPECT_EQ(g.allocators[0]->capacity_tokens(), g.pools[0]->rows() * n);
      for (std::int64_t len = 0; len <= 300 && len <= g.allocators[0]->capacity_tokens(); ++len) {
        g.all([&](KvAllocator& a, KvShard&) {
          a.allocate(len, len);
          return 0;
        });
        std::int64_t lo = len, hi = 0;
        for (int r = 0; r < n; ++r) {
          const std::int64_t rows = g.shards[r]->local_length(len);
          const std::int64_t expect = len > r ? (len - r + n - 1) / n : 0;  // ceil((L - r) / N)
          ASSERT_EQ(rows, expect) << "len " << len << " rank " << r;
          lo = std::min(lo, rows);
          hi = std::max(hi, rows);
        }
        ASSERT_LE(hi - lo, 1);
        g.all([&](KvAllocator& a, KvShard&) {
          a.free(len);
          return 0;
        });
      }
    }
  }
  // Sizing from tokens and from bytes.
  const LatentGeometry ds{512, 64, KvDtype::bf16};
  const LatentPool by_tokens = LatentPool::for_tokens(100000, 4, 64, ds);
  EXPECT_EQ(by_tokens.num_pages(), (100000 + 255) / 256);
  EXPECT_GE(by_tokens.rows() * 4, 100000);
  const LatentPool by_bytes = LatentPool::for_bytes(10 << 20, 64, ds);
  EXPECT_LE(by_bytes.bytes(), std::size_t{10} << 20);
  EXPECT_GT(by_bytes.bytes() + 64 * ds.row_bytes(), std::size_t{10} << 20);
}

TEST(KvCache, RandomOperationsAgainstAModel) {
  auto rng = test::make_rng();
  for (int n : {1, 2, 3, 5}) {
    for (int page : {1, 4}) {
      Group g(n, page, 24);
      const std::int64_t vp = static_cast<std::int64_t>(page) * n;
      const int w = kSmall.width();
      std::map<RequestId, std::vector<float>> model;  // request -> its rows, token order
      RequestId next_id = 0;
      int refusals = 0;
      for (int op = 0; op < 2500; ++op) {
        const Snapshot before(*g.allocators[0]);
        const auto pick = [&]() -> RequestId {
          auto it = model.begin();
          std::advance(it, rng.range(0, static_cast<std::int64_t>(model.size()) - 1));
          return it->first;
        };
        const int kind = model.empty() ? 0 : static_cast<int>(rng.range(0, 5));
        try {
          if (kind == 0) {  // allocate and write
            const RequestId id = next_id++;
            const std::int64_t len = rng.range(0, 3 * vp);
            g.all([&](KvAllocator& a, KvShard&) {
              a.allocate(id, len);
              return 0;
            });
            const auto rows = random_rows(rng, len, w);
            g.all([&](KvAllocator&, KvShard& s) { return s.write(id, 0, len, rows.data()); });
            model[id] = rows;
          } else if (kind == 1 || kind == 2) {  // extend (with copy on write) and write
            const RequestId id = pick();
            const std::int64_t len = static_cast<std::int64_t>(model[id].size()) / w;
            const std::int64_t more = rng.range(0, 2 * vp);
            g.all([&](KvAllocator& a, KvShard& s) {
              s.apply(a.extend(id, more));
              return 0;
            });
            const auto rows = random_rows(rng, more, w);
            g.all([&](KvAllocator&, KvShard& s) { return s.write(id, len, more, rows.data()); });
            model[id].insert(model[id].end(), rows.begin(), rows.end());
          } else if (kind == 3) {  // truncate (speculative rollback)
            const RequestId id = pick();
            const std::int64_t len = static_cast<std::int64_t>(model[id].size()) / w;
            const std::int64_t keep = rng.range(0, len);
            g.all([&](KvAllocator& a, KvShard&) {
              a.truncate(id, keep);
              return 0;
            });
            model[id].resize(static_cast<std::size_t>(keep) * w);
          } else if (kind == 4) {  // share a whole-page prefix
            const RequestId src = pick();
            const std::int64_t len = static_cast<std::int64_t>(model[src].size()) / w;
            const std::int64_t tokens = rng.range(0, len / vp) * vp;
            const RequestId id = next_id++;
            g.all([&](KvAllocator& a, KvShard&) {
              a.share_prefix(src, id, tokens);
              return 0;
            });
            model[id].assign(model[src].begin(), model[src].begin() + tokens * w);
          } else {  // free
            const RequestId id = pick();
            g.all([&](KvAllocator& a, KvShard&) {
              a.free(id);
              return 0;
            });
            model.erase(id);
          }
        } catch (const Error& e) {
          ASSERT_EQ(e.category(), ErrorCategory::capacity) << e.what();
          ASSERT_TRUE(Snapshot(*g.allocators[0]) == before) << "a refusal changed the allocator";
          ++refusals;
        }
        for (const auto& a : g.allocators) a->check_invariants();
        for (int r = 1; r < n; ++r) {
          ASSERT_TRUE(Snapshot(*g.allocators[r]) == Snapshot(*g.allocators[0]))
              << "replicas diverged";
        }
        if (op % 50 == 0 || op == 2499) {  // every request's content is intact
          for (const auto& [id, rows] : model) {
            ASSERT_EQ(g.gather(id), rows) << "request " << id << " corrupted at op " << op;
          }
        }
      }
      EXPECT_GT(refusals, 0) << "the pool never filled: the test is too gentle";
      for (const auto& entry : model) {
        const auto id = entry.first;  // clang 14 lets no lambda capture a structured binding
        g.all([&](KvAllocator& a, KvShard&) {
          a.free(id);
          return 0;
        });
      }
      EXPECT_EQ(g.allocators[0]->free_pages(), 24) << "pages leaked";
    }
  }
}

TEST(KvCache, ChunkedWritesThenGatherAreExact) {
  auto rng = test::make_rng();
  for (KvDtype dtype : {KvDtype::fp32, KvDtype::bf16}) {
    for (int n = 1; n <= 5; ++n) {
      for (int page : {1, 16, 64}) {
        const LatentGeometry geo{8, 4, dtype};
        Group g(n, page, 64, geo);
        const std::int64_t len = rng.range(1, std::min<std::int64_t>(400, 64LL * page * n / 2));
        auto rows = random_rows(rng, len, geo.width());
        if (dtype == KvDtype::bf16)
          for (float& v : rows) v = bf16_to_float(float_to_bf16(v));
        g.all([&](KvAllocator& a, KvShard&) {
          a.allocate(7, 0);
          return 0;
        });
        // Chunks with arbitrary boundaries, alternating the two write paths.
        std::int64_t at = 0;
        bool fixed_shape = false;
        while (at < len) {
          const std::int64_t chunk = std::min(len - at, rng.range(1, 37));
          g.all([&](KvAllocator& a, KvShard& s) {
            s.apply(a.extend(7, chunk));
            return 0;
          });
          for (int r = 0; r < n; ++r) {
            KvShard& s = *g.shards[r];
            if (fixed_shape) {
              std::vector<std::int64_t> dst(static_cast<std::size_t>(chunk));
              s.write_destinations(7, at, chunk, dst.data());
              s.scatter(dst.data(), chunk, rows.data() + at * geo.width());
            } else {
              const std::int64_t stored = s.write(7, at, chunk, rows.data() + at * geo.width());
              ASSERT_EQ(stored, s.layout().chunk_share(at, chunk).rows);
            }
          }
          at += chunk;
          fixed_shape = !fixed_shape;
        }
        ASSERT_EQ(g.gather(7), rows) << "N " << n << " page " << page;
      }
    }
  }
}

TEST(KvCache, GatherSequenceOverACommunicator) {
  auto rng = test::make_rng();
  const std::int64_t len = 203;
  const auto rows = random_rows(rng, len, kSmall.width());
  for (int n : {1, 2, 3, 4}) {
    run_threads(n, [&](Communicator& c) {
      KvAllocator a(n, 16, 32);
      LatentPool pool(32, 16, kSmall);
      pool.poison();
      KvShard s(a, pool, c.rank());
      a.allocate(1, len);
      s.write(1, 0, len, rows.data());
      const auto seq = gather_sequence(c, s, 1);
      if (seq != rows) throw Error(ErrorCategory::internal, "gathered sequence differs");
    });
  }
}

TEST(KvCache, PlannerAgreesWithBruteForce) {
  auto rng = test::make_rng();
  for (int n = 1; n <= 5; ++n) {
    for (int page : {1, 16}) {
      KvAllocator a(n, page, 6 * (500 / (page * n) + 1));  // room for six requests of <= 500
      std::vector<BatchEntry> batch;
      for (RequestId id = 0; id < 6; ++id) {
        const std::int64_t len = rng.range(1, 500);
        a.allocate(id, len);
        batch.push_back(
            {id, static_cast<std::int32_t>(rng.range(1, std::min<std::int64_t>(len, 5)))});
      }
      for (int r = 0; r < n; ++r) {
        const ForwardPlan plan = plan_forward(a, batch, r);
        ASSERT_EQ(plan.num_requests(), 6);
        for (int b = 0; b < 6; ++b) {
          const RequestId id = batch[b].request;
          const std::int64_t len = a.length(id);
          std::int64_t owned = 0;
          for (std::int64_t p = 0; p < len; ++p) {
            if (p % n != r) continue;
            // Local row `owned` must resolve, through the page table, to p's physical row.
            const std::int64_t phys =
                plan.page_table[b * plan.page_table_stride + owned / page] * page + owned % page;
            ASSERT_EQ(phys, a.slot(id, p) / n) << "rank " << r << " request " << id << " p " << p;
            ++owned;
          }
          ASSERT_EQ(plan.local_len[b], owned);
          ASSERT_EQ(plan.global_len[b], len);
          std::int64_t share = 0, first = -1, seen = 0;
          for (std::int64_t p = 0; p < len; ++p) {
            if (p % n != r) continue;
            if (p >= len - batch[b].q_len) {
              if (first < 0) first = seen;
              ++share;
            }
            ++seen;
          }
          ASSERT_EQ(plan.write_share[b].rows, share);
          if (share > 0) {
            ASSERT_EQ(plan.write_share[b].first_row, first);
          }
          for (int t = 0; t < batch[b].q_len; ++t) {
            ASSERT_EQ(plan.q_pos[plan.q_start[b] + t], len - batch[b].q_len + t);
          }
        }
      }
    }
  }
}

TEST(KvCache, PlannedShardsAttendLikeFullAttention) {
  // KV cache -> planner -> kernel on every rank -> merge equals float64 full attention.
  auto rng = test::make_rng();
  const int n = 3, page = 16, heads = 4;
  const LatentGeometry geo{32, 8, KvDtype::bf16};
  Group g(n, page, 40, geo);
  test::ContextSpec spec;
  spec.heads = heads;
  spec.kv_lora_rank = geo.kv_lora_rank;
  spec.rope_dim = geo.rope_dim;
  spec.lengths = {150, 2, 47};
  spec.q_lens = {1, 2, 4};
  const auto in = test::random_context(spec, KvDtype::bf16, rng);
  std::vector<BatchEntry> batch;
  for (RequestId id = 0; id < 3; ++id) {
    const std::int64_t len = spec.lengths[id];
    g.all([&](KvAllocator& a, KvShard& s) {
      a.allocate(id, len);
      return s.write(id, 0, len, in.kv[id].data());
    });
    batch.push_back({id, spec.q_lens[id]});
  }
  const std::int64_t rows = 7 * heads;
  std::vector<float> o_parts, lse_parts;
  for (int r = 0; r < n; ++r) {
    const ForwardPlan plan = plan_forward(*g.allocators[r], batch, r);
    MlaAttentionParams p = plan.kernel_params(*g.pools[r]);
    p.num_heads = heads;
    p.softmax_scale = static_cast<float>(in.softmax_scale);
    p.q = in.q.data();
    std::vector<float> out(static_cast<std::size_t>(rows) * geo.kv_lora_rank), lse(rows);
    p.out = out.data();
    p.lse = lse.data();
    mla_attention(p);
    o_parts.insert(o_parts.end(), out.begin(), out.end());
    lse_parts.insert(lse_parts.end(), lse.begin(), lse.end());
  }
  std::vector<float> out(static_cast<std::size_t>(rows) * geo.kv_lora_rank), lse(rows);
  merge_attention_states(o_parts.data(), lse_parts.data(), n, rows, geo.kv_lora_rank, LseBase::e,
                         out.data(), lse.data());
  const auto expect = ref::full_attention(in);
  EXPECT_TRUE(test::close(out, expect.out, test::kBf16Tol, "O"));
  EXPECT_TRUE(test::lse_close(lse, expect.lse, "LSE"));
}

TEST(KvCache, ErrorsNameTheProblemAndChangeNothing) {
  KvAllocator a(2, 4, 3);  // 3 pages of 8 slots
  a.allocate(1, 10);
  const Snapshot before(a);
  const auto expect_error = [&](auto&& f, ErrorCategory cat, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), cat) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_TRUE(Snapshot(a) == before);
  };
  expect_error([&] { a.allocate(2, 17); }, ErrorCategory::capacity, "KV cache full");
  expect_error([&] { (void)a.extend(1, 15); }, ErrorCategory::capacity, "cannot grow by 15");
  expect_error([&] { a.allocate(1, 1); }, ErrorCategory::invalid_argument, "already exists");
  expect_error([&] { (void)a.extend(9, 1); }, ErrorCategory::invalid_argument, "unknown request 9");
  expect_error([&] { a.free(9); }, ErrorCategory::invalid_argument, "unknown request 9");
  expect_error([&] { a.truncate(1, 11); }, ErrorCategory::invalid_argument,
               "[0, current length 10]");
  expect_error([&] { a.share_prefix(1, 2, 4); }, ErrorCategory::invalid_argument,
               "multiple of the virtual page size 8");
  expect_error([&] { a.allocate(3, -1); }, ErrorCategory::invalid_argument, "must be >= 0");
  expect_error(
      [&] {
        (void)plan_forward(a, {{1, 11}}, 0);
      },
      ErrorCategory::invalid_argument, "q_len 11");
  LatentPool pool(3, 4, kSmall);
  KvShard shard(a, pool, 0);
  std::vector<float> row(60);
  expect_error([&] { shard.write(1, 8, 5, row.data()); }, ErrorCategory::invalid_argument,
               "outside request 1");
  expect_error([&] { pool.write_row(13, row.data()); }, ErrorCategory::invalid_argument,
               "outside the pool");
  expect_error([&] { KvShard(a, pool, 2); }, ErrorCategory::invalid_argument, "dcp_rank = 2");
  LatentPool other(4, 4, kSmall);
  expect_error([&] { KvShard(a, other, 0); }, ErrorCategory::invalid_argument, "disagree");
}

TEST(KvCache, CopyOnWriteKeepsSharedPrefixesIntact) {
  // A request truncated into a page it shares, then extended: the sharer's rows survive.
  Group g(2, 2, 8);  // virtual pages of 4 slots
  const int w = kSmall.width();
  auto rng = test::make_rng();
  const auto a_rows = random_rows(rng, 8, w);
  g.all([&](KvAllocator& a, KvShard& s) {
    a.allocate(1, 8);
    return s.write(1, 0, 8, a_rows.data());
  });
  g.all([&](KvAllocator& a, KvShard&) {
    a.share_prefix(1, 2, 8);
    return 0;
  });
  g.all([&](KvAllocator& a, KvShard&) {
    a.truncate(1, 6);
    return 0;
  });
  std::vector<PageCopy> copies;
  g.all([&](KvAllocator& a, KvShard& s) {
    copies = a.extend(1, 2);
    s.apply(copies);
    return 0;
  });
  ASSERT_EQ(copies.size(), 1u);
  const auto b_rows = random_rows(rng, 2, w);
  g.all([&](KvAllocator&, KvShard& s) { return s.write(1, 6, 2, b_rows.data()); });
  EXPECT_EQ(g.gather(2), a_rows) << "the sharer's prefix was overwritten";
  std::vector<float> expect_1(a_rows.begin(), a_rows.begin() + 6 * w);
  expect_1.insert(expect_1.end(), b_rows.begin(), b_rows.end());
  EXPECT_EQ(g.gather(1), expect_1);
}

}  // namespace
}  // namespace dcp
