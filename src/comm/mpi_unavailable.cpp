// Linked when dcp is built without MPI: the API exists and says clearly that it is absent.
#include "dcp/comm_mpi.h"
#include "dcp/error.h"

namespace dcp {

bool mpi_available() noexcept {
  return false;
}

void set_mpi_timeout(std::chrono::milliseconds) noexcept {}

int mpi_job_rank() noexcept {
  return -1;
}

void mpi_abort_job(int) noexcept {}

MpiSession::MpiSession(int*, char***) {
  throw Error(ErrorCategory::unsupported,
              "this dcp was built without MPI (install libopenmpi-dev and reconfigure with "
              "-DDCP_WITH_MPI=ON)");
}

MpiSession::~MpiSession() {
  static_cast<void>(owns_init_);  // only the MPI build initialises MPI
}

std::unique_ptr<Communicator> MpiSession::world() const {
  throw Error(ErrorCategory::unsupported, "this dcp was built without MPI");
}

}  // namespace dcp
