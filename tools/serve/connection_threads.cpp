#include "serve/connection_threads.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <system_error>

namespace dcp::serve {

ConnectionThreads::ConnectionThreads(std::size_t warm_threads, std::size_t max_threads,
                                     std::chrono::milliseconds idle_exit)
    : warm_(warm_threads), max_(max_threads), idle_exit_(idle_exit) {
  if (warm_threads < 1 || warm_threads > max_threads)
    throw std::invalid_argument("ConnectionThreads: need 1 <= warm_threads (" +
                                std::to_string(warm_threads) + ") <= max_threads (" +
                                std::to_string(max_threads) + ")");
}

ConnectionThreads::~ConnectionThreads() {
  shutdown();
}

void ConnectionThreads::enqueue(std::function<void()> task) {
  join_finished();
  std::lock_guard lock(mu_);
  if (stopping_) return;
  tasks_.push_back(std::move(task));
  // Every queued task beyond the idle threads would wait: start a thread for it while allowed.
  if (idle_ < tasks_.size() && live_.size() < max_) {
    try {
      std::thread t([this] { work(); });
      const std::thread::id id = t.get_id();
      live_.emplace(id, std::move(t));
      peak_ = std::max(peak_, live_.size());
    } catch (const std::system_error&) {
      // The system gives no more threads: the task waits for a running one, if there is any.
      if (live_.empty()) {
        tasks_.pop_back();
        throw;
      }
    }
  }
  ready_.notify_one();
}

void ConnectionThreads::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    ++idle_;
    const bool woken =
        ready_.wait_for(lock, idle_exit_, [this] { return !tasks_.empty() || stopping_; });
    --idle_;
    if (!tasks_.empty()) {
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      task = nullptr;  // what it captured (a socket's state) goes before the lock is taken
      lock.lock();
      continue;
    }
    if (stopping_ || (!woken && live_.size() > warm_)) break;
  }
  // Hand this thread's own handle over to be joined by whoever enqueues or shuts down next.
  const auto self = live_.find(std::this_thread::get_id());
  finished_.push_back(std::move(self->second));
  live_.erase(self);
  if (live_.empty()) all_gone_.notify_all();
}

void ConnectionThreads::shutdown() {
  {
    std::unique_lock lock(mu_);
    stopping_ = true;
    ready_.notify_all();
    all_gone_.wait(lock, [this] { return live_.empty(); });
  }
  join_finished();
}

void ConnectionThreads::join_finished() {
  std::vector<std::thread> ended;
  {
    std::lock_guard lock(mu_);
    ended.swap(finished_);
  }
  for (std::thread& t : ended) t.join();
}

std::size_t ConnectionThreads::threads() const {
  std::lock_guard lock(mu_);
  return live_.size();
}

std::size_t ConnectionThreads::idle_threads() const {
  std::lock_guard lock(mu_);
  return idle_;
}

std::size_t ConnectionThreads::peak_threads() const {
  std::lock_guard lock(mu_);
  return peak_;
}

}  // namespace dcp::serve
