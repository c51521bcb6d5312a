// The MPI backend: one process per rank. This header carries no MPI type; a build without
// MPI still links, and mpi_available() says whether the backend is there.
#pragma once

#include <memory>

#include "dcp/comm.h"

namespace dcp {

bool mpi_available() noexcept;

// Initialises MPI (thread level FUNNELED) on construction and finalises it on destruction.
// Throws dcp::Error(unsupported) if dcp was built without MPI.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  // A communicator over MPI_COMM_WORLD (a duplicate, so dcp's traffic is isolated).
  std::unique_ptr<Communicator> world() const;

 private:
  bool owns_init_ = false;
};

}  // namespace dcp
