// Layout index math against brute force: exact integer equality everywhere.
#include <gtest/gtest.h>

#include <vector>

#include "dcp/error.h"
#include "dcp/layout.h"
#include "test_util.h"

namespace dcp {
namespace {

// Brute-force striping: walk positions in order and hand them out by blocks of I.
struct BruteForce {
  std::vector<int> owner;
  std::vector<std::int64_t> row;
  BruteForce(int n, int interleave, std::int64_t length) {
    std::vector<std::int64_t> next_row(n, 0);
    for (std::int64_t p = 0; p < length; ++p) {
      const int o = static_cast<int>((p / interleave) % n);
      owner.push_back(o);
      row.push_back(next_row[o]++);
    }
  }
  std::int64_t count(std::int64_t x, int r) const {
    std::int64_t c = 0;
    for (std::int64_t p = 0; p < x; ++p) c += owner[p] == r;
    return c;
  }
};

TEST(Layout, MatchesBruteForce) {
  for (int interleave : {1, 2, 16}) {
    for (int n = 1; n <= 8; ++n) {
      const std::int64_t max_len = 300;
      BruteForce bf(n, interleave, max_len + 1);
      for (std::int64_t p = 0; p <= max_len; ++p) {
        ASSERT_EQ(layout::owner(p, n, interleave), bf.owner[p]) << "p " << p << " n " << n;
        ASSERT_EQ(layout::row(p, n, interleave), bf.row[p]) << "p " << p << " n " << n;
        ASSERT_EQ(layout::position(bf.row[p], bf.owner[p], n, interleave), p);
      }
      for (int r = 0; r < n; ++r) {
        std::int64_t expected = 0;  // running brute-force count
        for (std::int64_t x = 0; x <= max_len; ++x) {
          ASSERT_EQ(layout::count(x, r, n, interleave), expected)
              << "x " << x << " r " << r << " n " << n << " I " << interleave;
          expected += bf.owner[x] == r;
        }
      }
    }
  }
}

TEST(Layout, CountClosedFormForInterleaveOne) {
  // DESIGN.md: count_r(x) = max(0, ceil((x - r) / N)).
  for (int n = 1; n <= 8; ++n) {
    for (int r = 0; r < n; ++r) {
      for (std::int64_t x = -3; x <= 300; ++x) {
        const std::int64_t d = x - r;
        const std::int64_t ceil_div = d > 0 ? (d + n - 1) / n : 0;
        ASSERT_EQ(layout::count(x, r, n), ceil_div) << "x " << x << " r " << r << " n " << n;
      }
    }
  }
}

TEST(Layout, ChunkSharesPartitionEveryChunk) {
  auto rng = test::make_rng();
  for (int interleave : {1, 2, 16}) {
    for (int n = 1; n <= 8; ++n) {
      BruteForce bf(n, interleave, 700);
      for (int trial = 0; trial < 200; ++trial) {
        const std::int64_t a = rng.range(0, 400);
        const std::int64_t len = rng.range(0, 299);
        std::int64_t total = 0;
        for (int r = 0; r < n; ++r) {
          const ChunkShare share = ShardLayout(n, r, interleave).chunk_share(a, len);
          // Brute force: the owned positions of [a, a+len) and their local rows.
          std::vector<std::int64_t> rows;
          for (std::int64_t p = a; p < a + len; ++p) {
            if (bf.owner[p] == r) rows.push_back(bf.row[p]);
          }
          ASSERT_EQ(share.rows, static_cast<std::int64_t>(rows.size()));
          for (std::size_t k = 0; k < rows.size(); ++k) {
            ASSERT_EQ(rows[k], share.first_row + static_cast<std::int64_t>(k))
                << "owned rows of a chunk are contiguous";
          }
          total += share.rows;
        }
        ASSERT_EQ(total, len);
      }
    }
  }
}

TEST(Layout, BalancedWithinOneBlock) {
  for (int interleave : {1, 2, 16}) {
    for (int n = 1; n <= 8; ++n) {
      for (std::int64_t len = 0; len <= 300; ++len) {
        std::int64_t lo = len, hi = 0;
        for (int r = 0; r < n; ++r) {
          const std::int64_t c = layout::count(len, r, n, interleave);
          lo = std::min(lo, c);
          hi = std::max(hi, c);
        }
        ASSERT_LE(hi - lo, interleave) << "len " << len << " n " << n;
      }
    }
  }
}

TEST(Layout, WidenedPagesMapOneVirtualPageToOnePhysicalPage) {
  for (int interleave : {1, 2, 16}) {
    for (int n = 1; n <= 8; ++n) {
      for (int page : {16, 32, 64}) {
        const WidenedPages w(n, 5, page, interleave);
        EXPECT_EQ(w.virtual_capacity(), 5LL * page * n);
        EXPECT_EQ(w.virtual_page_size(), static_cast<std::int64_t>(page) * n);
        for (std::int64_t v = 0; v < w.virtual_capacity(); ++v) {
          const std::int64_t vpage = v / w.virtual_page_size();
          ASSERT_EQ(w.physical(v) / page, vpage) << "v " << v;
          ASSERT_EQ(w.owner(v), layout::owner(v, n, interleave));
        }
        // Every (owner, physical row) pair is hit exactly once.
        std::vector<int> hits(static_cast<std::size_t>(w.physical_rows()) * n, 0);
        for (std::int64_t v = 0; v < w.virtual_capacity(); ++v) {
          ++hits[w.physical(v) * n + w.owner(v)];
        }
        for (int h : hits) ASSERT_EQ(h, 1);
      }
    }
  }
}

TEST(Layout, RejectsInvalidArguments) {
  using test::throws_error;
  const auto bad = ErrorCategory::invalid_argument;
  EXPECT_TRUE(throws_error([] { ShardLayout(0, 0); }, bad, "dcp_size = 0 must be >= 1"));
  EXPECT_TRUE(throws_error([] { ShardLayout(4, 4); }, bad, "dcp_rank = 4"));
  EXPECT_TRUE(throws_error([] { ShardLayout(4, -1); }, bad, "dcp_rank = -1"));
  EXPECT_TRUE(throws_error([] { ShardLayout(4, 0, 0); }, bad, "interleave = 0 must be >= 1"));
  EXPECT_TRUE(throws_error([] { WidenedPages(0, 1, 16); }, bad, "dcp_size = 0 must be >= 1"));
  EXPECT_TRUE(throws_error([] { WidenedPages(2, 1, 0); }, bad, "page_size = 0 must be >= 1"));
  EXPECT_TRUE(throws_error([] { WidenedPages(2, -1, 16); }, bad, "physical_pages = -1"));
  EXPECT_TRUE(throws_error([] { WidenedPages(2, 1, 24, 16); }, bad,  // page not a multiple
                           "page_size = 24"));
  try {
    ShardLayout(4, 7);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("dcp_rank = 7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[0, dcp_size = 4)"), std::string::npos) << e.what();
  }
}

static_assert(layout::owner(10, 4) == 2 && layout::row(10, 4) == 2);
static_assert(layout::count(0, 0, 4) == 0 && layout::count(1, 0, 4) == 1 &&
              layout::count(1, 1, 4) == 0);

}  // namespace
}  // namespace dcp
