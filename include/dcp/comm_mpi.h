// The MPI backend: one process per rank. This header carries no MPI type; a build without
// MPI still links, and mpi_available() says whether the backend is there.
#pragma once

#include <chrono>
#include <memory>

#include "dcp/comm.h"

namespace dcp {

bool mpi_available() noexcept;

// How long any MPI collective (or send / recv) of this process may wait before it fails with a
// comm error naming the collective and its group's world ranks; 0 waits forever. Default 300 s.
void set_mpi_timeout(std::chrono::milliseconds timeout) noexcept;
// This process's rank in a running MPI job of more than one process; -1 otherwise (no MPI, a
// single process, not initialised or already finalised).
int mpi_job_rank() noexcept;
// Ends every process of the job with exit status `code` (MPI_Abort), when mpi_job_rank() >= 0;
// returns otherwise. For an error on one rank: the others may wait in a collective for it, and
// MPI_Finalize would wait for them.
void mpi_abort_job(int code) noexcept;

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
