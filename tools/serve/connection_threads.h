// The threads `dcp serve` runs its HTTP connections on.
//
// cpp-httplib serves a connection on one thread from its accept to its close, and that thread
// waits in a read while the connection idles: a keep-alive connection between two requests, a
// client that opened a socket and sent nothing yet, an open stream. A fixed pool of such threads
// makes every client past its size wait until some connection closes or times out (with 130 idle
// sockets open to the old pool of 128, a request waited 4.5 s). So a connection that finds no
// idle thread starts one, up to `max_threads`; past that, connections wait in arrival order. A
// thread idle for `idle_exit` ends, down to `warm_threads`.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace dcp::serve {

class ConnectionThreads {
 public:
  // Throws std::invalid_argument unless 1 <= warm_threads <= max_threads.
  ConnectionThreads(std::size_t warm_threads, std::size_t max_threads,
                    std::chrono::milliseconds idle_exit);
  ~ConnectionThreads();  // shutdown()
  ConnectionThreads(const ConnectionThreads&) = delete;
  ConnectionThreads& operator=(const ConnectionThreads&) = delete;

  // Runs `task` on an idle thread, a new one, or (at max_threads) the first to become idle.
  void enqueue(std::function<void()> task);
  // Runs every task already queued, then joins all threads. Later enqueues run nothing.
  void shutdown();

  // Threads alive now, those of them waiting for a task, and the most alive at once so far.
  std::size_t threads() const;
  std::size_t idle_threads() const;
  std::size_t peak_threads() const;

 private:
  void work();
  void join_finished();  // joins the threads that have ended; call without the lock

  const std::size_t warm_, max_;
  const std::chrono::milliseconds idle_exit_;
  mutable std::mutex mu_;
  std::condition_variable ready_;     // a task was queued, or shutdown began
  std::condition_variable all_gone_;  // the last thread ended
  std::deque<std::function<void()>> tasks_;
  std::map<std::thread::id, std::thread> live_;
  std::vector<std::thread> finished_;  // ended threads, not yet joined
  std::size_t idle_ = 0;               // threads waiting for a task
  std::size_t peak_ = 0;
  bool stopping_ = false;
};

}  // namespace dcp::serve
