// Ranks as threads in one process: the embedded default of the command line and the backend
// of the unit tests.
#pragma once

#include <chrono>
#include <functional>

#include "dcp/comm.h"

namespace dcp {

struct ThreadsOptions {
  // A collective (or recv) waiting longer than this fails with a comm error naming the ranks
  // that never arrived.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

// Runs fn(comm) on `ranks` threads, one communicator per thread, and joins them. If a rank
// throws, the others are released from whatever collective they wait in (they fail too), and
// the first failure is rethrown here as a dcp::Error of its own category, naming the rank.
void run_threads(int ranks, const std::function<void(Communicator&)>& fn,
                 const ThreadsOptions& options = {});

}  // namespace dcp
