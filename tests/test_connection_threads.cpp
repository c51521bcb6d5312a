// ConnectionThreads (dcp serve's HTTP connection threads): tasks that block do not keep later
// ones waiting while the bound allows a thread more; past the bound tasks wait their turn; idle
// threads end down to the warm ones; shutdown runs what is queued and joins everything.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "serve/connection_threads.h"

namespace dcp::serve {
namespace {

using namespace std::chrono_literals;

// Tasks that each hold their thread until released, as an idle connection does.
struct Holders {
  std::mutex mu;
  std::condition_variable changed;
  int running = 0, most = 0, done = 0;
  bool released = false;

  std::function<void()> task() {
    return [this] {
      std::unique_lock lock(mu);
      most = std::max(most, ++running);
      changed.notify_all();
      changed.wait(lock, [this] { return released; });
      --running;
      ++done;
      changed.notify_all();
    };
  }
  // Waits (bounded: a failure, not a hang) until `pred` holds.
  template <class Pred>
  bool wait_until(Pred pred) {
    std::unique_lock lock(mu);
    return changed.wait_for(lock, 60s, [&] { return pred(*this); });
  }
  void release() {
    std::lock_guard lock(mu);
    released = true;
    changed.notify_all();
  }
};

// Each test declares its tasks' state before the threads, which join before it goes.
TEST(ConnectionThreads, TasksThatHoldTheirThreadDoNotKeepOthersWaiting) {
  Holders h, again;
  ConnectionThreads threads(2, 64, 30s);
  // 40 tasks on 2 warm threads: each starts a thread of its own, or the 40 never run at once.
  for (int i = 0; i < 40; ++i) threads.enqueue(h.task());
  EXPECT_TRUE(h.wait_until([](Holders& s) { return s.running == 40; })) << h.running;
  EXPECT_EQ(threads.threads(), 40u);
  EXPECT_EQ(threads.peak_threads(), 40u);
  h.release();
  EXPECT_TRUE(h.wait_until([](Holders& s) { return s.done == 40; })) << h.done;
  // Threads idle again take the next tasks: no thread more starts for them.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (threads.idle_threads() < 40 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(threads.idle_threads(), 40u);
  for (int i = 0; i < 40; ++i) threads.enqueue(again.task());
  EXPECT_TRUE(again.wait_until([](Holders& s) { return s.running == 40; }));
  EXPECT_EQ(threads.peak_threads(), 40u);
  again.release();
}

TEST(ConnectionThreads, PastTheBoundTasksWaitForAThread) {
  Holders h;
  ConnectionThreads threads(1, 4, 30s);
  for (int i = 0; i < 10; ++i) threads.enqueue(h.task());
  EXPECT_TRUE(h.wait_until([](Holders& s) { return s.running == 4; }));
  EXPECT_EQ(threads.threads(), 4u);
  h.release();
  EXPECT_TRUE(h.wait_until([](Holders& s) { return s.done == 10; })) << h.done;
  EXPECT_EQ(h.most, 4);  // never more at once than the bound
  EXPECT_EQ(threads.peak_threads(), 4u);
}

TEST(ConnectionThreads, IdleThreadsEndDownToTheWarmOnes) {
  Holders h, again;
  ConnectionThreads threads(3, 32, 20ms);
  for (int i = 0; i < 12; ++i) threads.enqueue(h.task());
  EXPECT_TRUE(h.wait_until([](Holders& s) { return s.running == 12; }));
  h.release();
  EXPECT_TRUE(h.wait_until([](Holders& s) { return s.done == 12; }));
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (threads.threads() > 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(threads.threads(), 3u);
  std::this_thread::sleep_for(100ms);  // five idle periods more: the warm threads stay
  EXPECT_EQ(threads.threads(), 3u);
  // Ended threads are joined, and the pool grows again when asked.
  for (int i = 0; i < 8; ++i) threads.enqueue(again.task());
  EXPECT_TRUE(again.wait_until([](Holders& s) { return s.running == 8; }));
  again.release();
  EXPECT_TRUE(again.wait_until([](Holders& s) { return s.done == 8; }));
}

TEST(ConnectionThreads, ShutdownRunsWhatIsQueuedAndJoinsEveryThread) {
  std::atomic<int> ran{0};
  ConnectionThreads threads(1, 1, 30s);
  for (int i = 0; i < 20; ++i) {
    threads.enqueue([&ran] {
      std::this_thread::sleep_for(1ms);
      ran.fetch_add(1);
    });
  }
  threads.shutdown();
  EXPECT_EQ(ran.load(), 20);
  EXPECT_EQ(threads.threads(), 0u);
  threads.enqueue([&ran] { ran.fetch_add(1); });  // after shutdown: not run
  threads.shutdown();                             // twice: nothing left to do
  EXPECT_EQ(ran.load(), 20);
}

TEST(ConnectionThreads, RefusesBoundsThatCannotHold) {
  EXPECT_THROW(ConnectionThreads(0, 4, 1s), std::invalid_argument);
  EXPECT_THROW(ConnectionThreads(5, 4, 1s), std::invalid_argument);
}

}  // namespace
}  // namespace dcp::serve
