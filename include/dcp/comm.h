// The communicator: collectives over a group of ranks, with NCCL-like semantics so that a
// GPU backend is a thin wrapper. Buffers are plain pointers (host memory for the threads and
// MPI backends, device memory for a future NCCL one); no backend type appears here.
//
// Semantics (every rank of the group calls each collective, in the same order):
//   all_gather      send [bytes]            -> recv [size * bytes], rank-major
//   all_to_all      send [size * bytes]     -> recv [size * bytes]; chunk j of send goes to
//                                              rank j, chunk i of recv came from rank i
//   all_to_all_v    like all_to_all with a size per chunk: send_bytes[j] to rank j, packed in
//                   rank order; recv_bytes[i] from rank i, packed likewise. recv_bytes[i] must
//                   equal rank i's send_bytes[rank] (exchange the counts first)
//   reduce_scatter  send [size * count]     -> recv [count]: sum over ranks of chunk `rank`
//   all_reduce      send [count]            -> recv [count]: elementwise reduction
//   broadcast       buf [bytes] on root     -> buf on every rank
//   send / recv     point to point, matched by (peer, tag), in order. send may block until
//                   the matching recv is posted (as MPI_Send and NCCL do): order them so.
//   probe           whether a message from (peer, tag) waits to be received; never blocks
// In place: all_gather with send == recv + rank * bytes, all_reduce with send == recv.
// Other overlaps between send and recv are not allowed.
//
// Byte accounting: each rank counts the payload bytes it sends to *other* ranks, as the
// algorithmically minimal exchange would: all_gather (size-1)*bytes, all_to_all
// (size-1)*bytes (all_to_all_v: the bytes to other ranks, counted as all_to_all), reduce_scatter
// (size-1)*count*elem, all_reduce 2*(size-1)/size*count*elem (ring), broadcast bytes*(size-1) on
// the root, send bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace dcp {

enum class ScalarType : std::uint8_t { f32, f64, i32, i64 };
enum class ReduceOp : std::uint8_t { sum, max, min };

std::size_t scalar_size(ScalarType t) noexcept;

enum class Collective : std::uint8_t {
  all_gather,
  all_to_all,
  reduce_scatter,
  all_reduce,
  broadcast,
  barrier,
  send,
  count_
};
constexpr std::size_t kNumCollectives = static_cast<std::size_t>(Collective::count_);
std::string_view to_string(Collective c) noexcept;

struct CommStats {
  struct Entry {
    std::uint64_t calls = 0;
    std::uint64_t bytes_sent = 0;
  };
  std::array<Entry, kNumCollectives> by_kind{};

  const Entry& operator[](Collective c) const { return by_kind[static_cast<std::size_t>(c)]; }
  Entry& operator[](Collective c) { return by_kind[static_cast<std::size_t>(c)]; }
  std::uint64_t total_calls() const noexcept;  // barriers excluded
  std::uint64_t total_bytes() const noexcept;
  CommStats operator-(const CommStats& earlier) const;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  // "threads" or "mpi" (or "nccl").
  virtual std::string_view backend() const noexcept = 0;

  virtual void all_gather(const void* send, void* recv, std::size_t bytes) = 0;
  virtual void all_to_all(const void* send, void* recv, std::size_t bytes_per_rank) = 0;
  // send_bytes and recv_bytes: size() entries each.
  virtual void all_to_all_v(const void* send, const std::size_t* send_bytes, void* recv,
                            const std::size_t* recv_bytes) = 0;
  virtual void reduce_scatter(const void* send, void* recv, std::size_t count, ScalarType type,
                              ReduceOp op = ReduceOp::sum) = 0;
  virtual void all_reduce(const void* send, void* recv, std::size_t count, ScalarType type,
                          ReduceOp op = ReduceOp::sum) = 0;
  virtual void broadcast(void* buf, std::size_t bytes, int root) = 0;
  // A broadcast the other ranks may wait long for (an idle server's next step): they wait
  // without keeping a core busy, and may see it later by up to the time they waited (at most a
  // millisecond). The threads backend's waits already sleep after a short spin.
  virtual void broadcast_patiently(void* buf, std::size_t bytes, int root) {
    broadcast(buf, bytes, root);
  }
  virtual void barrier() = 0;
  virtual void send(const void* buf, std::size_t bytes, int peer, int tag) = 0;
  virtual void recv(void* buf, std::size_t bytes, int peer, int tag) = 0;
  // A receive the rank may wait long for: as broadcast_patiently waits.
  virtual void recv_patiently(void* buf, std::size_t bytes, int peer, int tag) {
    recv(buf, bytes, peer, tag);
  }
  // Lets a loop that must not wait on a peer look before it receives.
  virtual bool probe(int peer, int tag) = 0;

  // Collective over this group, like MPI_Comm_split: ranks with equal `color` form a new
  // group, ordered by (key, rank). Every rank gets the group it belongs to.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  const CommStats& stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = {}; }

 protected:
  void count(Collective c, std::uint64_t bytes) noexcept {
    auto& e = stats_[c];
    ++e.calls;
    e.bytes_sent += bytes;
  }
  // Argument checks shared by every backend (throw dcp::Error naming the argument).
  void check_root(int root, const char* what) const;
  void check_peer(int peer, const char* what) const;

 private:
  CommStats stats_;
};

// Variable-size byte messages over a group, built on the fixed-size collectives: every rank
// gets every rank's bytes (in rank order), or the root's.
std::vector<std::vector<std::uint8_t>> all_gather_bytes(Communicator& group,
                                                        const std::vector<std::uint8_t>& mine);
// `patiently`: the ranks may wait long for the root (Communicator::broadcast_patiently).
void broadcast_bytes(Communicator& group, std::vector<std::uint8_t>& bytes, int root,
                     bool patiently = false);
// A variable-size message to one peer: its size with `tag`, then its bytes with `tag + 1`
// (probe for `tag`).
void send_bytes(Communicator& group, const std::vector<std::uint8_t>& bytes, int peer, int tag);
std::vector<std::uint8_t> recv_bytes(Communicator& group, int peer, int tag,
                                     bool patiently = false);

}  // namespace dcp
