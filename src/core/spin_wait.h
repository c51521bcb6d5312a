// Waiting on another thread of this process: poll for a short while before sleeping.
//
// A thread asleep on a condition variable took ~30 us to wake here, ten times what a small
// collective's copies between rank threads cost, and several times a short kernel call on a worker
// thread. So a waiter first polls an atomic for up to kSpinBeforeSleep, yielding its core between
// rounds (more threads than cores must still make progress), and sleeps only after that: a thread
// waiting on a long computation (prefill, the dense layers) then stops competing for a core.
#pragma once

#include <chrono>
#include <thread>

namespace dcp::detail {

inline constexpr std::chrono::microseconds kSpinBeforeSleep{200};

// Polls done() until it returns true (then true) or kSpinBeforeSleep has passed (then false: the
// caller should sleep). done() must be cheap and read its state with acquire loads.
template <typename Done>
bool spin_until(Done done) {
  const auto until = std::chrono::steady_clock::now() + kSpinBeforeSleep;
  do {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
    }
    std::this_thread::yield();
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

}  // namespace dcp::detail
