// The threads backend: every collective, splits, byte accounting, and failure handling.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "comm_checks.h"
#include "dcp/comm_threads.h"
#include "dcp/error.h"

namespace dcp {
namespace {

constexpr int kSizes[] = {1, 2, 3, 4, 7};

TEST(CommThreads, Collectives) {
  for (int n : kSizes) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    run_threads(n, [](Communicator& c) { test::check_collectives(c, 3 << 20); });
  }
}

TEST(CommThreads, Split) {
  for (int n : kSizes) {
    run_threads(n, [](Communicator& c) { test::check_split(c); });
  }
}

TEST(CommThreads, PatientBroadcast) {
  for (int n : kSizes) {
    run_threads(n, [](Communicator& c) { test::check_patient_broadcast(c); });
  }
}

TEST(CommThreads, ProbeAndMessages) {
  for (int n : kSizes) {
    run_threads(n, [](Communicator& c) { test::check_probe_and_messages(c); });
  }
}

TEST(CommThreads, ByteAccounting) {
  for (int n : kSizes) {
    run_threads(n, [](Communicator& c) { test::check_byte_accounting(c); });
  }
}

// A barrier spins for a while, then sleeps: ranks arriving within the spin and long after it
// (here up to 20 ms late) must all meet, each collective seeing the data of its own round.
TEST(CommThreads, RanksArrivingAtDifferentTimesMeetInEveryRound) {
  const std::chrono::microseconds delays[] = {
      std::chrono::microseconds(0), std::chrono::microseconds(30), std::chrono::microseconds(2000),
      std::chrono::microseconds(20000)};
  for (int n : {2, 3, 5}) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    run_threads(n, [&](Communicator& c) {
      for (int round = 0; round < 12; ++round) {
        std::this_thread::sleep_for(delays[(round + c.rank()) % 4]);
        const int mine = 100 * round + c.rank();
        std::vector<int> all(static_cast<std::size_t>(c.size()), -1);
        c.all_gather(&mine, all.data(), sizeof mine);
        for (int j = 0; j < c.size(); ++j)
          ASSERT_EQ(all[j], 100 * round + j) << "rank " << c.rank();
        std::vector<int> sum(1, 0);
        std::vector<int> ones(static_cast<std::size_t>(c.size()), round);
        c.reduce_scatter(ones.data(), sum.data(), 1, ScalarType::i32, ReduceOp::sum);
        ASSERT_EQ(sum[0], round * c.size()) << "rank " << c.rank();
      }
    });
  }
}

TEST(CommThreads, RankFailingMidCollectiveFailsTheOthers) {
  std::atomic<int> released{0};
  try {
    run_threads(4, [&](Communicator& c) {
      std::vector<float> a(16), b(64);
      c.all_gather(a.data(), b.data(), 64);  // one collective that succeeds
      if (c.rank() == 2) throw Error(ErrorCategory::capacity, "KV cache full on purpose");
      try {
        c.all_gather(a.data(), b.data(), 64);  // rank 2 never arrives
      } catch (const Error& e) {
        EXPECT_EQ(e.category(), ErrorCategory::comm);
        EXPECT_NE(std::string(e.what()).find("rank 2 failed"), std::string::npos) << e.what();
        ++released;
        throw;
      }
    });
    FAIL() << "expected the failure to be rethrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::capacity);  // the root cause, not the fallout
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("on purpose"), std::string::npos) << e.what();
  }
  EXPECT_EQ(released.load(), 3);
}

TEST(CommThreads, MissingRankTimesOutWithItsName) {
  ThreadsOptions opt;
  opt.timeout = std::chrono::milliseconds(200);
  try {
    run_threads(
        3,
        [](Communicator& c) {
          if (c.rank() == 1) return;  // leaves without joining the collective
          c.barrier();
        },
        opt);
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::comm);
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank(s) 1 "), std::string::npos) << e.what();
  }
}

TEST(CommThreads, RecvOfWrongSizeAndBadPeersAreErrors) {
  EXPECT_THROW(run_threads(2,
                           [](Communicator& c) {
                             std::vector<char> buf(8);
                             if (c.rank() == 0)
                               c.send(buf.data(), 4, 1, 0);
                             else
                               c.recv(buf.data(), 8, 0, 0);
                           }),
               Error);
  EXPECT_THROW(run_threads(2,
                           [](Communicator& c) {
                             char x = 0;
                             c.send(&x, 1, c.rank(), 0);
                           }),
               Error);
  EXPECT_THROW(run_threads(2,
                           [](Communicator& c) {
                             char x = 0;
                             c.broadcast(&x, 1, 5);
                           }),
               Error);
  EXPECT_THROW(run_threads(0, [](Communicator&) {}), Error);
}

}  // namespace
}  // namespace dcp
