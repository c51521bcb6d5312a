// WorkerPool: every part runs exactly once per run, on distinct threads, runs can repeat with
// fewer parts, errors come back to the caller, and misuse is reported instead of hanging.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "dcp/error.h"
#include "dcp/worker_pool.h"

namespace dcp {
namespace {

TEST(WorkerPool, EveryPartRunsOnceOnItsOwnThread) {
  WorkerPool pool(3);
  for (int round = 0; round < 50; ++round) {
    for (int count = 0; count <= 4; ++count) {
      std::vector<std::atomic<int>> runs(4);
      std::vector<std::thread::id> ids(4);
      pool.run(count, [&](int i) {
        runs[i].fetch_add(1);
        ids[i] = std::this_thread::get_id();
      });
      std::set<std::thread::id> distinct;
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(runs[i].load(), i < count ? 1 : 0) << "part " << i << " of " << count;
        if (i < count) distinct.insert(ids[i]);
      }
      EXPECT_EQ(static_cast<int>(distinct.size()), count);
      if (count > 0) {
        EXPECT_EQ(ids[0], std::this_thread::get_id()) << "part 0 is the caller's";
      }
    }
  }
}

// Workers and the caller poll for a while before they sleep: runs that start soon after the last
// and long after it (workers asleep), and parts that finish at once or late (the caller asleep),
// must each run every part exactly once and return only when all have.
TEST(WorkerPool, RunsAfterShortAndLongPausesRunEveryPart) {
  const std::chrono::microseconds pauses[] = {std::chrono::microseconds(0),
                                              std::chrono::microseconds(30),
                                              std::chrono::microseconds(2000),
                                              std::chrono::microseconds(20000)};
  WorkerPool pool(3);
  for (int round = 0; round < 16; ++round) {
    std::this_thread::sleep_for(pauses[round % 4]);
    const int count = 1 + round % 4;
    std::vector<std::atomic<int>> runs(4);
    pool.run(count, [&](int i) {
      if (i == count - 1) std::this_thread::sleep_for(pauses[(round / 4) % 4]);
      runs[i].fetch_add(1);
    });
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(runs[i].load(), i < count ? 1 : 0) << "round " << round << ", part " << i;
    }
  }
}

TEST(WorkerPool, PartsRunAtTheSameTime) {
  // Each part waits (up to 10 s, so a serial pool fails instead of hanging) until all have
  // started: every part sees all three only if they run concurrently.
  WorkerPool pool(2);
  std::atomic<int> started{0};
  std::vector<int> saw_all(3, 0);
  pool.run(3, [&](int i) {
    started.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 3 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    saw_all[i] = started.load() == 3;
  });
  EXPECT_EQ(saw_all, std::vector<int>(3, 1));
}

TEST(WorkerPool, ErrorsReachTheCallerAndThePoolKeepsWorking) {
  WorkerPool pool(2);
  EXPECT_THROW(pool.run(3,
                        [](int i) {
                          if (i == 2) throw std::runtime_error("part 2 failed");
                        }),
               std::runtime_error);
  try {  // the lowest failing part's error wins
    pool.run(3, [](int i) {
      if (i >= 1) throw std::runtime_error("part " + std::to_string(i));
    });
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "part 1");
  }
  std::atomic<int> total{0};
  pool.run(3, [&](int i) { total += i + 1; });
  EXPECT_EQ(total.load(), 6);
}

TEST(WorkerPool, RejectsMorePartsThanThreadsAndNestedRuns) {
  WorkerPool pool(1);
  EXPECT_THROW(pool.run(3, [](int) {}), Error);
  EXPECT_THROW(pool.run(-1, [](int) {}), Error);
  EXPECT_THROW(WorkerPool(-1), Error);
  // A job that asks its own thread's pool for another run gets an error, not a deadlock.
  WorkerPool& mine = this_thread_worker_pool(1);
  EXPECT_THROW(mine.run(2,
                        [&](int i) {
                          if (i == 0) this_thread_worker_pool(1).run(2, [](int) {});
                        }),
               Error);
  std::atomic<int> total{0};
  this_thread_worker_pool(1).run(2, [&](int i) { total += i + 1; });
  EXPECT_EQ(total.load(), 3);
}

TEST(WorkerPool, ThisThreadsPoolGrowsAndIsPerThread) {
  WorkerPool& small = this_thread_worker_pool(1);
  EXPECT_GE(small.workers(), 1);
  WorkerPool& large = this_thread_worker_pool(3);
  EXPECT_GE(large.workers(), 3);
  EXPECT_EQ(&this_thread_worker_pool(2), &large) << "a large enough pool is kept";
  WorkerPool* other = nullptr;
  std::thread([&] { other = &this_thread_worker_pool(1); }).join();
  EXPECT_NE(other, &large);
}

}  // namespace
}  // namespace dcp
