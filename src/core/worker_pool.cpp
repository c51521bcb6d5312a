#include "dcp/worker_pool.h"

#include <memory>

#include "core/spin_wait.h"
#include "dcp/error.h"

namespace dcp {

WorkerPool::WorkerPool(int workers) {
  DCP_ARG_CHECK(workers >= 0, "WorkerPool: workers = ", workers, " must be >= 0");
  threads_.reserve(static_cast<std::size_t>(workers));
  for (int w = 0; w < workers; ++w) threads_.emplace_back([this, w] { work(w); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true, std::memory_order_release);
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::run(int count, const std::function<void(int)>& job) {
  DCP_ARG_CHECK(count >= 0 && count <= workers() + 1, "WorkerPool::run: count = ", count,
                " must be in [0, workers + 1 = ", workers() + 1, "]");
  if (count == 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    DCP_CHECK(job_ == nullptr, internal,
              "WorkerPool::run called while this pool runs another job (a nested parallel call "
              "on the same thread's pool)");
    job_ = &job;
    count_ = count;
    running_.store(count - 1, std::memory_order_relaxed);
    errors_.assign(static_cast<std::size_t>(count), nullptr);
    // Release: a worker that sees the new generation while it polls sees the job above too.
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (count > 1) start_.notify_all();
  std::exception_ptr mine;
  try {
    job(0);
  } catch (...) {
    mine = std::current_exception();
  }
  detail::spin_until([this] { return running_.load(std::memory_order_acquire) == 0; });
  std::unique_lock<std::mutex> lock(mutex_);
  finished_.wait(lock, [this] { return running_.load(std::memory_order_relaxed) == 0; });
  job_ = nullptr;
  errors_[0] = mine;
  for (const std::exception_ptr& e : errors_) {
    if (e) std::rethrow_exception(e);
  }
}

bool WorkerPool::busy() {
  std::lock_guard<std::mutex> lock(mutex_);
  return job_ != nullptr;
}

void WorkerPool::work(int worker) {
  std::uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  const auto next = [&] {
    return stop_.load(std::memory_order_acquire) ||
           generation_.load(std::memory_order_acquire) != seen;
  };
  for (;;) {
    lock.unlock();
    detail::spin_until(next);  // then the mutex, and sleep only if nothing came
    lock.lock();
    start_.wait(lock, next);
    if (stop_) return;
    seen = generation_.load(std::memory_order_relaxed);
    const int part = worker + 1;
    if (part >= count_) continue;  // this run needs fewer parts
    const std::function<void(int)>* job = job_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*job)(part);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    errors_[static_cast<std::size_t>(part)] = error;
    if (running_.fetch_sub(1, std::memory_order_acq_rel) == 1) finished_.notify_one();
  }
}

WorkerPool& this_thread_worker_pool(int workers) {
  thread_local std::unique_ptr<WorkerPool> pool;
  DCP_CHECK(!pool || !pool->busy(), internal,
            "this thread's worker pool is running a job that asked for it again (a nested "
            "parallel call on one thread)");
  if (!pool || pool->workers() < workers) {
    pool.reset();  // join the old workers before starting more
    pool = std::make_unique<WorkerPool>(workers);
  }
  return *pool;
}

}  // namespace dcp
