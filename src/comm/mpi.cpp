// The MPI backend: a thin mapping of the Communicator onto MPI collectives. Every MPI return
// code goes through check(); communicators use MPI_ERRORS_RETURN so failures become
// dcp::Error rather than aborting the job.
#include <mpi.h>

#include <cstring>
#include <limits>
#include <vector>

#include "dcp/comm_mpi.h"
#include "dcp/error.h"

namespace dcp {
namespace {

void check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw Error(ErrorCategory::comm,
              str("MPI ", what, " failed: ", std::string(text, static_cast<std::size_t>(len))));
}

MPI_Datatype mpi_type(ScalarType t) {
  switch (t) {
    case ScalarType::f32: return MPI_FLOAT;
    case ScalarType::f64: return MPI_DOUBLE;
    case ScalarType::i32: return MPI_INT32_T;
    case ScalarType::i64: return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

int mpi_count(std::size_t n, const char* what) {
  DCP_CHECK(n <= static_cast<std::size_t>(std::numeric_limits<int>::max()), unsupported, what, ": ",
            n, " elements exceed MPI's int count limit");
  return static_cast<int>(n);
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "Comm_size");
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  std::string_view backend() const noexcept override { return "mpi"; }

  void all_gather(const void* send, void* recv, std::size_t bytes) override {
    const void* src =
        send == static_cast<const std::byte*>(recv) + rank_ * bytes ? MPI_IN_PLACE : send;
    const int n = mpi_count(bytes, "all_gather");
    check(MPI_Allgather(src, n, MPI_BYTE, recv, n, MPI_BYTE, comm_), "Allgather");
    count(Collective::all_gather, (size_ - 1) * bytes);
  }

  void all_to_all(const void* send, void* recv, std::size_t bytes) override {
    const int n = mpi_count(bytes, "all_to_all");
    check(MPI_Alltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_), "Alltoall");
    count(Collective::all_to_all, (size_ - 1) * bytes);
  }

  void reduce_scatter(const void* send, void* recv, std::size_t n, ScalarType type,
                      ReduceOp op) override {
    check(MPI_Reduce_scatter_block(send, recv, mpi_count(n, "reduce_scatter"), mpi_type(type),
                                   mpi_op(op), comm_),
          "Reduce_scatter_block");
    count(Collective::reduce_scatter, (size_ - 1) * n * scalar_size(type));
  }

  void all_reduce(const void* send, void* recv, std::size_t n, ScalarType type,
                  ReduceOp op) override {
    const void* src = send == recv ? MPI_IN_PLACE : send;
    check(MPI_Allreduce(src, recv, mpi_count(n, "all_reduce"), mpi_type(type), mpi_op(op), comm_),
          "Allreduce");
    count(Collective::all_reduce, 2 * (size_ - 1) * n * scalar_size(type) / size_);
  }

  void broadcast(void* buf, std::size_t bytes, int root) override {
    check_root(root, "broadcast");
    check(MPI_Bcast(buf, mpi_count(bytes, "broadcast"), MPI_BYTE, root, comm_), "Bcast");
    count(Collective::broadcast, rank_ == root ? (size_ - 1) * bytes : 0);
  }

  void barrier() override {
    check(MPI_Barrier(comm_), "Barrier");
    count(Collective::barrier, 0);
  }

  void send(const void* buf, std::size_t bytes, int peer, int tag) override {
    check_peer(peer, "send");
    check(MPI_Send(buf, mpi_count(bytes, "send"), MPI_BYTE, peer, tag, comm_), "Send");
    count(Collective::send, bytes);
  }

  void recv(void* buf, std::size_t bytes, int peer, int tag) override {
    check_peer(peer, "recv");
    MPI_Status status;
    check(MPI_Recv(buf, mpi_count(bytes, "recv"), MPI_BYTE, peer, tag, comm_, &status), "Recv");
    int got = 0;
    check(MPI_Get_count(&status, MPI_BYTE, &got), "Get_count");
    DCP_CHECK(static_cast<std::size_t>(got) == bytes, comm, "recv from rank ", peer, " tag ", tag,
              ": expected ", bytes, " bytes, the message has ", got);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    DCP_ARG_CHECK(color >= 0, "split: color = ", color, " must be >= 0");
    MPI_Comm sub;
    check(MPI_Comm_split(comm_, color, key, &sub), "Comm_split");
    return std::make_unique<MpiCommunicator>(sub);
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

bool mpi_available() noexcept {
  return true;
}

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  check(MPI_Initialized(&initialized), "Initialized");
  if (!initialized) {
    int provided = 0;
    check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "Init_thread");
    owns_init_ = true;
  }
}

MpiSession::~MpiSession() {
  if (owns_init_) MPI_Finalize();
}

std::unique_ptr<Communicator> MpiSession::world() const {
  MPI_Comm dup;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "Comm_dup");
  return std::make_unique<MpiCommunicator>(dup);
}

}  // namespace dcp
