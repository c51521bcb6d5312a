// The MPI backend: a thin mapping of the Communicator onto MPI collectives. Every MPI return
// code goes through check(); communicators use MPI_ERRORS_RETURN so failures become
// dcp::Error rather than aborting the job. Each collective is started non-blocking and waited on
// with a deadline (the collective timeout), so that a rank that stalled or died elsewhere ends
// the job with a message instead of hanging it.
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
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

std::atomic<std::int64_t> g_timeout_ms{300'000};

int world_rank() noexcept {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// How a patient wait polls once it has spun for kPatientSpin (a busy server's ranks wait less than
// that between steps, and spin as in every other wait): a test, then a sleep, from
// kPatientPollMin doubling to kPatientPollMax (a short wait is noticed soon, a long one costs about
// a thousand wake-ups a second). An idle server's ranks wait up to its idle tick (50 ms) for the
// next step; spinning there kept every rank but the first at a whole core.
constexpr std::chrono::microseconds kPatientSpin{1000}, kPatientPollMin{50}, kPatientPollMax{1000};

// Waits for `req`, polling, until the collective timeout; then throws naming the collective and
// the group's world ranks (one of which stalled, died or took another path). `patient`: after
// kPatientSpin, it sleeps between polls (MPI makes progress only in them, so a collective that
// forwards data through this rank would slow: only for a small broadcast that may come late).
void wait(MPI_Request& req, MPI_Status* status, const char* what, MPI_Comm comm,
          bool patient = false) {
  const std::int64_t limit_ms = g_timeout_ms.load(std::memory_order_relaxed);
  if (limit_ms <= 0 && !patient) {
    check(MPI_Wait(&req, status ? status : MPI_STATUS_IGNORE), what);
    return;
  }
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline =
      limit_ms > 0 ? start + std::chrono::milliseconds(limit_ms) : Clock::time_point::max();
  bool sleeping = false;  // patient, and past its spin: a test per sleep
  std::chrono::microseconds nap = kPatientPollMin;
  for (unsigned spin = 0;; ++spin) {
    int done = 0;
    check(MPI_Test(&req, &done, status ? status : MPI_STATUS_IGNORE), what);
    if (done) return;
    if (sleeping) {
      if (Clock::now() > deadline) break;
      std::this_thread::sleep_for(nap);
      nap = std::min(2 * nap, kPatientPollMax);
    } else if (spin % 256 == 255) {
      const auto now = Clock::now();
      if (now > deadline) break;
      sleeping = patient && now - start > kPatientSpin;
      sched_yield();  // ranks may oversubscribe the cores
    }
  }
  // The group's members as world ranks, for the message.
  MPI_Group group, world;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int size = 0;
  MPI_Group_size(group, &size);
  std::vector<int> local(static_cast<std::size_t>(size)), global(local.size());
  for (int i = 0; i < size; ++i) local[i] = i;
  MPI_Group_translate_ranks(group, size, local.data(), world, global.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  std::string members;
  for (int r : global) members += (members.empty() ? "" : ", ") + std::to_string(r);
  throw Error(ErrorCategory::comm,
              str("MPI ", what, " over world ranks {", members, "} waited ", limit_ms / 1000.0,
                  " s (comm_timeout) on world rank ", world_rank(),
                  ": a rank of the group stalled, died or took another path"));
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
    MPI_Request req;
    check(MPI_Iallgather(src, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &req), "Allgather");
    wait(req, nullptr, "Allgather", comm_);
    count(Collective::all_gather, (size_ - 1) * bytes);
  }

  void all_to_all(const void* send, void* recv, std::size_t bytes) override {
    const int n = mpi_count(bytes, "all_to_all");
    MPI_Request req;
    check(MPI_Ialltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &req), "Alltoall");
    wait(req, nullptr, "Alltoall", comm_);
    count(Collective::all_to_all, (size_ - 1) * bytes);
  }

  void all_to_all_v(const void* send, const std::size_t* send_bytes, void* recv,
                    const std::size_t* recv_bytes) override {
    std::vector<int> sc(static_cast<std::size_t>(size_)), sd(sc.size()), rc(sc.size()),
        rd(sc.size());
    std::size_t s_at = 0, r_at = 0, sent = 0;
    for (int j = 0; j < size_; ++j) {
      sc[j] = mpi_count(send_bytes[j], "all_to_all_v");
      rc[j] = mpi_count(recv_bytes[j], "all_to_all_v");
      sd[j] = mpi_count(s_at, "all_to_all_v");
      rd[j] = mpi_count(r_at, "all_to_all_v");
      s_at += send_bytes[j];
      r_at += recv_bytes[j];
      if (j != rank_) sent += send_bytes[j];
    }
    MPI_Request req;
    check(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(),
                         MPI_BYTE, comm_, &req),
          "Alltoallv");
    wait(req, nullptr, "Alltoallv", comm_);
    count(Collective::all_to_all, sent);
  }

  void reduce_scatter(const void* send, void* recv, std::size_t n, ScalarType type,
                      ReduceOp op) override {
    MPI_Request req;
    check(MPI_Ireduce_scatter_block(send, recv, mpi_count(n, "reduce_scatter"), mpi_type(type),
                                    mpi_op(op), comm_, &req),
          "Reduce_scatter_block");
    wait(req, nullptr, "Reduce_scatter_block", comm_);
    count(Collective::reduce_scatter, (size_ - 1) * n * scalar_size(type));
  }

  void all_reduce(const void* send, void* recv, std::size_t n, ScalarType type,
                  ReduceOp op) override {
    const void* src = send == recv ? MPI_IN_PLACE : send;
    MPI_Request req;
    check(MPI_Iallreduce(src, recv, mpi_count(n, "all_reduce"), mpi_type(type), mpi_op(op), comm_,
                         &req),
          "Allreduce");
    wait(req, nullptr, "Allreduce", comm_);
    count(Collective::all_reduce, 2 * (size_ - 1) * n * scalar_size(type) / size_);
  }

  void broadcast(void* buf, std::size_t bytes, int root) override {
    check_root(root, "broadcast");
    MPI_Request req;
    check(MPI_Ibcast(buf, mpi_count(bytes, "broadcast"), MPI_BYTE, root, comm_, &req), "Bcast");
    wait(req, nullptr, "Bcast", comm_);
    count(Collective::broadcast, rank_ == root ? (size_ - 1) * bytes : 0);
  }

  void broadcast_patiently(void* buf, std::size_t bytes, int root) override {
    check_root(root, "broadcast");
    MPI_Request req;
    check(MPI_Ibcast(buf, mpi_count(bytes, "broadcast"), MPI_BYTE, root, comm_, &req), "Bcast");
    wait(req, nullptr, "Bcast", comm_, true);
    count(Collective::broadcast, rank_ == root ? (size_ - 1) * bytes : 0);
  }

  void barrier() override {
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "Barrier");
    wait(req, nullptr, "Barrier", comm_);
    count(Collective::barrier, 0);
  }

  void send(const void* buf, std::size_t bytes, int peer, int tag) override {
    check_peer(peer, "send");
    MPI_Request req;
    check(MPI_Isend(buf, mpi_count(bytes, "send"), MPI_BYTE, peer, tag, comm_, &req), "Send");
    wait(req, nullptr, "Send", comm_);
    count(Collective::send, bytes);
  }

  void recv(void* buf, std::size_t bytes, int peer, int tag) override {
    receive(buf, bytes, peer, tag, false);
  }

  void recv_patiently(void* buf, std::size_t bytes, int peer, int tag) override {
    receive(buf, bytes, peer, tag, true);
  }

  bool probe(int peer, int tag) override {
    check_peer(peer, "probe");
    int waiting = 0;
    check(MPI_Iprobe(peer, tag, comm_, &waiting, MPI_STATUS_IGNORE), "Iprobe");
    return waiting != 0;
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    DCP_ARG_CHECK(color >= 0, "split: color = ", color, " must be >= 0");
    MPI_Comm sub;
    check(MPI_Comm_split(comm_, color, key, &sub), "Comm_split");
    return std::make_unique<MpiCommunicator>(sub);
  }

 private:
  void receive(void* buf, std::size_t bytes, int peer, int tag, bool patient) {
    check_peer(peer, "recv");
    MPI_Status status;
    MPI_Request req;
    check(MPI_Irecv(buf, mpi_count(bytes, "recv"), MPI_BYTE, peer, tag, comm_, &req), "Recv");
    wait(req, &status, "Recv", comm_, patient);
    int got = 0;
    check(MPI_Get_count(&status, MPI_BYTE, &got), "Get_count");
    DCP_CHECK(static_cast<std::size_t>(got) == bytes, comm, "recv from rank ", peer, " tag ", tag,
              ": expected ", bytes, " bytes, the message has ", got);
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

bool mpi_available() noexcept {
  return true;
}

void set_mpi_timeout(std::chrono::milliseconds timeout) noexcept {
  g_timeout_ms.store(std::max<std::int64_t>(0, timeout.count()), std::memory_order_relaxed);
}

int mpi_job_rank() noexcept {
  int initialized = 0, finalized = 0, size = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size > 1 ? world_rank() : -1;
}

void mpi_abort_job(int code) noexcept {
  if (mpi_job_rank() < 0) return;
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; if it did, this process must still end
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
