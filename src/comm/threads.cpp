// Ranks as threads. Every collective is a rendezvous on shared state: each rank posts its
// buffer pointers, waits for all, reads what it needs straight from its peers' buffers, and
// waits again so that no buffer is released while a peer still reads it. Waits poll a
// world-wide abort flag and a deadline, so one failing rank never leaves the others hanging.
// A barrier polls for a short while before it sleeps (core/spin_wait.h).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/spin_wait.h"
#include "dcp/comm_threads.h"
#include "dcp/error.h"
#include "dcp/timing.h"
#include "reduce.h"

namespace dcp {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(10);

// Shared by every group made under one run_threads call.
struct World {
  explicit World(std::chrono::milliseconds t) : timeout(t) {}
  const std::chrono::milliseconds timeout;
  std::atomic<bool> aborted{false};
  std::mutex mu;
  int failed_rank = -1;  // the first rank that failed: the root cause
  std::string reason;

  void abort(int world_rank, const std::string& why) {
    std::lock_guard lk(mu);
    if (aborted.load()) return;
    failed_rank = world_rank;
    reason = why;
    aborted.store(true);
  }
  std::string abort_message() {
    std::lock_guard lk(mu);
    return str("rank ", failed_rank, " failed: ", reason);
  }
};

struct Posted {
  const void* send = nullptr;
  void* recv = nullptr;
  const std::size_t* send_bytes = nullptr;  // all_to_all_v: bytes of each chunk
  const void* reduced = nullptr;  // all_reduce: this rank's chunk of the result
  int color = 0, key = 0;
  std::shared_ptr<struct Group> made;  // split: the group a leader created
};

struct Group {
  Group(std::shared_ptr<World> w, std::vector<int> ranks)
      : world(std::move(w)),
        world_ranks(std::move(ranks)),
        posted(world_ranks.size()),
        arrived_gen(world_ranks.size(), 0) {}
  const std::shared_ptr<World> world;
  const std::vector<int> world_ranks;  // group rank -> world rank
  std::mutex mu;
  std::condition_variable cv;
  // Changed under `mu`; read without it while a barrier spins.
  std::atomic<std::uint64_t> generation{1};
  int arrived = 0;
  std::vector<Posted> posted;
  std::vector<std::uint64_t> arrived_gen;  // the generation each rank last arrived at
  std::map<std::tuple<int, int, int>, std::deque<std::vector<std::byte>>> mail;  // (src, dst, tag)

  int size() const { return static_cast<int>(world_ranks.size()); }

  // Waits on `cv` until `done()`, failing on abort or timeout. Caller holds `lk`.
  template <typename Done, typename Missing>
  void wait(std::unique_lock<std::mutex>& lk, int rank, std::string_view what, Done done,
            Missing missing) {
    const auto deadline = Clock::now() + world->timeout;
    while (!done()) {
      if (world->aborted.load()) {
        throw Error(ErrorCategory::comm, str(what, " on rank ", world_ranks[rank],
                                             " abandoned: ", world->abort_message()));
      }
      if (Clock::now() > deadline) {
        const std::string why =
            str(what, " timed out after ", world->timeout.count() / 1000.0,
                " s (comm_timeout) waiting for ", missing());
        world->abort(world_ranks[rank], why);
        throw Error(ErrorCategory::comm, why);
      }
      cv.wait_for(lk, kPoll);
    }
  }

  void barrier(int rank, std::string_view what) {
    std::unique_lock lk(mu);
    const std::uint64_t gen = generation.load(std::memory_order_relaxed);
    arrived_gen[rank] = gen;
    if (++arrived == size()) {
      arrived = 0;
      // Release: whatever every rank posted before arriving is visible to a rank that sees the
      // new generation while it spins (the posts and arrivals all happened under `mu`).
      generation.store(gen + 1, std::memory_order_release);
      cv.notify_all();
      return;
    }
    lk.unlock();
    if (detail::spin_until([&] { return generation.load(std::memory_order_acquire) != gen; })) {
      return;
    }
    lk.lock();
    wait(
        lk, rank, what, [&] { return generation.load(std::memory_order_relaxed) != gen; },
        [&] {
          std::string ranks;
          for (int r = 0; r < size(); ++r) {
            if (arrived_gen[r] != gen)
              ranks += (ranks.empty() ? "" : ", ") + std::to_string(world_ranks[r]);
          }
          return str("rank(s) ", ranks, " that never arrived");
        });
  }
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return g_->size(); }
  std::string_view backend() const noexcept override { return "threads"; }

  void all_gather(const void* send, void* recv, std::size_t bytes) override {
    post(send, recv);
    g_->barrier(rank_, "all_gather");
    for (int j = 0; j < size(); ++j) {
      void* dst = static_cast<std::byte*>(recv) + j * bytes;
      const void* src = g_->posted[j].send;
      if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
    }
    g_->barrier(rank_, "all_gather");
    count(Collective::all_gather, (size() - 1) * bytes);
  }

  void all_to_all(const void* send, void* recv, std::size_t bytes) override {
    post(send, recv);
    g_->barrier(rank_, "all_to_all");
    for (int j = 0; j < size(); ++j) {
      const std::byte* src = static_cast<const std::byte*>(g_->posted[j].send) + rank_ * bytes;
      if (bytes > 0) std::memcpy(static_cast<std::byte*>(recv) + j * bytes, src, bytes);
    }
    g_->barrier(rank_, "all_to_all");
    count(Collective::all_to_all, (size() - 1) * bytes);
  }

  void all_to_all_v(const void* send, const std::size_t* send_bytes, void* recv,
                    const std::size_t* recv_bytes) override {
    {
      std::lock_guard lk(g_->mu);
      g_->posted[rank_].send = send;
      g_->posted[rank_].recv = recv;
      g_->posted[rank_].send_bytes = send_bytes;
    }
    g_->barrier(rank_, "all_to_all_v");
    std::size_t at = 0, sent = 0;
    for (int j = 0; j < size(); ++j) {
      const Posted& p = g_->posted[j];
      std::size_t offset = 0;  // where rank j's chunk for this rank starts in its send buffer
      for (int k = 0; k < rank_; ++k) offset += p.send_bytes[k];
      const std::size_t bytes = p.send_bytes[rank_];
      if (bytes != recv_bytes[j]) {
        const std::string why = str("all_to_all_v on rank ", g_->world_ranks[rank_], ": expects ",
                                    recv_bytes[j], " bytes from group rank ", j, ", which sends ",
                                    bytes);
        g_->world->abort(g_->world_ranks[rank_], why);
        throw Error(ErrorCategory::comm, why);
      }
      if (bytes > 0) {
        std::memcpy(static_cast<std::byte*>(recv) + at,
                    static_cast<const std::byte*>(p.send) + offset, bytes);
      }
      at += bytes;
      if (j != rank_) sent += send_bytes[j];
    }
    g_->barrier(rank_, "all_to_all_v");
    count(Collective::all_to_all, sent);
  }

  void reduce_scatter(const void* send, void* recv, std::size_t n, ScalarType type,
                      ReduceOp op) override {
    const std::size_t bytes = n * scalar_size(type);
    post(send, recv);
    g_->barrier(rank_, "reduce_scatter");
    // Into a private buffer first: recv may be part of a send buffer that peers still read.
    acc_.resize(bytes);
    reduce_chunk(acc_.data(), rank_ * bytes, n, type, op);  // in rank order: identical everywhere
    if (bytes > 0) std::memcpy(recv, acc_.data(), bytes);
    g_->barrier(rank_, "reduce_scatter");
    count(Collective::reduce_scatter, (size() - 1) * bytes);
  }

  // Reduce-scatter, then all-gather: each rank reduces its 1/N of the elements (in rank order,
  // so the result is identical everywhere) into a buffer of its own, and then every rank copies
  // all chunks into recv. Reducing the whole buffer on every rank did N times the work.
  void all_reduce(const void* send, void* recv, std::size_t n, ScalarType type,
                  ReduceOp op) override {
    const std::size_t elem = scalar_size(type), bytes = n * elem;
    const auto chunk_begin = [&](int r) { return n * r / size() * elem; };
    const std::size_t lo = chunk_begin(rank_), hi = chunk_begin(rank_ + 1);
    post(send, recv);
    g_->barrier(rank_, "all_reduce");
    reduced_.resize(hi - lo);
    reduce_chunk(reduced_.data(), lo, (hi - lo) / elem, type, op);  // rank order, as above
    {
      std::lock_guard lk(g_->mu);
      g_->posted[rank_].reduced = reduced_.data();
    }
    g_->barrier(rank_, "all_reduce");  // every chunk reduced; no rank reads `send` any more
    for (int j = 0; j < size(); ++j) {
      const std::size_t begin = chunk_begin(j), end = chunk_begin(j + 1);
      if (end > begin) {
        std::memcpy(static_cast<std::byte*>(recv) + begin, g_->posted[j].reduced, end - begin);
      }
    }
    g_->barrier(rank_, "all_reduce");  // no rank reads this rank's chunk any more
    count(Collective::all_reduce, 2 * (size() - 1) * bytes / size());
  }

  void broadcast(void* buf, std::size_t bytes, int root) override {
    check_root(root, "broadcast");
    post(buf, buf);
    g_->barrier(rank_, "broadcast");
    if (rank_ != root && bytes > 0) std::memcpy(buf, g_->posted[root].send, bytes);
    g_->barrier(rank_, "broadcast");
    count(Collective::broadcast, rank_ == root ? (size() - 1) * bytes : 0);
  }

  void barrier() override {
    g_->barrier(rank_, "barrier");
    count(Collective::barrier, 0);
  }

  void send(const void* buf, std::size_t bytes, int peer, int tag) override {
    check_peer(peer, "send");
    std::vector<std::byte> msg(bytes);
    if (bytes > 0) std::memcpy(msg.data(), buf, bytes);
    {
      std::lock_guard lk(g_->mu);
      g_->mail[{rank_, peer, tag}].push_back(std::move(msg));
    }
    g_->cv.notify_all();
    count(Collective::send, bytes);
  }

  void recv(void* buf, std::size_t bytes, int peer, int tag) override {
    check_peer(peer, "recv");
    std::unique_lock lk(g_->mu);
    auto& box = g_->mail[{peer, rank_, tag}];
    g_->wait(
        lk, rank_, "recv", [&] { return !box.empty(); },
        [&] { return str("a message from rank ", g_->world_ranks[peer], " with tag ", tag); });
    std::vector<std::byte> msg = std::move(box.front());
    box.pop_front();
    DCP_CHECK(msg.size() == bytes, comm, "recv from rank ", peer, " tag ", tag, ": expected ",
              bytes, " bytes, the message has ", msg.size());
    if (bytes > 0) std::memcpy(buf, msg.data(), bytes);
  }

  bool probe(int peer, int tag) override {
    check_peer(peer, "probe");
    std::lock_guard lk(g_->mu);
    const auto it = g_->mail.find({peer, rank_, tag});
    return it != g_->mail.end() && !it->second.empty();
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    {
      std::lock_guard lk(g_->mu);
      g_->posted[rank_].color = color;
      g_->posted[rank_].key = key;
      g_->posted[rank_].made.reset();
    }
    g_->barrier(rank_, "split");
    // Members of my colour, ordered by (key, rank).
    std::vector<int> members;
    for (int j = 0; j < size(); ++j) {
      if (g_->posted[j].color == color) members.push_back(j);
    }
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return g_->posted[a].key < g_->posted[b].key; });
    const int leader = *std::min_element(members.begin(), members.end());
    if (rank_ == leader) {
      std::vector<int> world_ranks;
      for (int m : members) world_ranks.push_back(g_->world_ranks[m]);
      auto made = std::make_shared<Group>(g_->world, std::move(world_ranks));
      std::lock_guard lk(g_->mu);
      g_->posted[rank_].made = std::move(made);
    }
    g_->barrier(rank_, "split");
    std::shared_ptr<Group> mine;
    {
      std::lock_guard lk(g_->mu);
      mine = g_->posted[leader].made;
    }
    g_->barrier(rank_, "split");
    const int new_rank =
        static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    return std::make_unique<ThreadCommunicator>(std::move(mine), new_rank);
  }

 private:
  void post(const void* send, void* recv) {
    std::lock_guard lk(g_->mu);
    g_->posted[rank_].send = send;
    g_->posted[rank_].recv = recv;
  }
  // acc = reduction over ranks (in rank order) of the n elements at byte `offset` of each send
  // buffer. acc must be this rank's own (no peer reads it before the next barrier).
  void reduce_chunk(std::byte* acc, std::size_t offset, std::size_t n, ScalarType type,
                    ReduceOp op) {
    const std::size_t bytes = n * scalar_size(type);
    if (bytes == 0) return;
    std::memcpy(acc, static_cast<const std::byte*>(g_->posted[0].send) + offset, bytes);
    for (int j = 1; j < size(); ++j) {
      detail::reduce_into(acc, static_cast<const std::byte*>(g_->posted[j].send) + offset, n, type,
                          op);
    }
  }

  std::shared_ptr<Group> g_;
  int rank_;
  std::vector<std::byte> acc_;      // reduce_scatter: this rank's reduced chunk before recv
  std::vector<std::byte> reduced_;  // all_reduce: this rank's reduced chunk, read by its peers
};

}  // namespace

void run_threads(int ranks, const std::function<void(Communicator&)>& fn,
                 const ThreadsOptions& options) {
  DCP_ARG_CHECK(ranks >= 1, "ranks = ", ranks, " must be >= 1");
  DCP_ARG_CHECK(options.timeout.count() > 0, "timeout must be > 0 ms");
  auto world = std::make_shared<World>(options.timeout);
  std::vector<int> all(ranks);
  std::iota(all.begin(), all.end(), 0);
  auto group = std::make_shared<Group>(world, all);
  std::vector<std::exception_ptr> errors(ranks);
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadCommunicator comm(group, r);
        fn(comm);
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        world->abort(r, e.what());
        group->cv.notify_all();
      } catch (...) {
        errors[r] = std::current_exception();
        world->abort(r, "unknown exception");
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!world->aborted.load()) return;
  // Rethrow the root cause, keeping its category.
  const int failed = world->failed_rank;
  try {
    if (errors[failed]) std::rethrow_exception(errors[failed]);
  } catch (const Error& e) {
    throw Error(e.category(), str("rank ", failed, ": ", e.what()));
  } catch (const std::exception& e) {
    throw Error(ErrorCategory::internal, str("rank ", failed, ": ", e.what()));
  } catch (...) {
    throw Error(ErrorCategory::internal, str("rank ", failed, ": unknown exception"));
  }
  throw Error(ErrorCategory::comm, world->abort_message());
}

}  // namespace dcp
