// Worker threads kept between parallel calls.
//
// Starting and joining std::threads on every parallel mla_attention call costs tens of
// microseconds, and every new thread begins with empty per-thread kernel buffers (the AMX path
// keeps about 1 MB of them at 128 heads), allocated and faulted in again on every call. A
// WorkerPool keeps its threads between calls: after a job a worker polls for the next one for a
// short while, then sleeps on a condition variable (a wake-up costs about as long as a short
// kernel call).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dcp {

class WorkerPool {
 public:
  // Starts `workers` threads (>= 0).
  explicit WorkerPool(int workers);
  // Stops and joins the workers.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int workers() const noexcept { return static_cast<int>(threads_.size()); }

  // Runs job(i) for every i in [0, count): i = 0 on the calling thread, i >= 1 on worker i - 1,
  // so count may be at most workers() + 1. Returns when every part has returned; if parts threw,
  // rethrows the exception of the lowest i. One run at a time per pool.
  void run(int count, const std::function<void(int)>& job);

  // Whether a run is in progress.
  bool busy();

 private:
  void work(int worker);

  // Everything is written under mutex_; the atomics are also polled without it.
  std::mutex mutex_;
  std::condition_variable start_, finished_;
  const std::function<void(int)>* job_ = nullptr;  // the current run's job
  int count_ = 0;                                  // its part count
  std::atomic<int> running_{0};                    // its worker parts not yet returned
  std::atomic<std::uint64_t> generation_{0};       // runs started; a worker waits for a new one
  std::atomic<bool> stop_{false};
  std::vector<std::exception_ptr> errors_;  // [count_] per part
  std::vector<std::thread> threads_;        // last: started once the state above exists
};

// The calling thread's pool, with at least `workers` workers (it is replaced by a larger one when
// a call needs more). Per thread, so that ranks running as threads in one process never wait on
// each other's workers, and a job may itself use its own thread's pool.
WorkerPool& this_thread_worker_pool(int workers);

}  // namespace dcp
