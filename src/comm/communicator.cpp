#include "dcp/comm.h"

#include <algorithm>

#include "dcp/error.h"

namespace dcp {

std::size_t scalar_size(ScalarType t) noexcept {
  switch (t) {
    case ScalarType::f32: return 4;
    case ScalarType::f64: return 8;
    case ScalarType::i32: return 4;
    case ScalarType::i64: return 8;
  }
  return 0;
}

std::string_view to_string(Collective c) noexcept {
  switch (c) {
    case Collective::all_gather: return "all_gather";
    case Collective::all_to_all: return "all_to_all";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_reduce: return "all_reduce";
    case Collective::broadcast: return "broadcast";
    case Collective::barrier: return "barrier";
    case Collective::send: return "send";
    case Collective::count_: break;
  }
  return "?";
}

std::uint64_t CommStats::total_calls() const noexcept {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < kNumCollectives; ++i) {
    if (static_cast<Collective>(i) != Collective::barrier) n += by_kind[i].calls;
  }
  return n;
}

std::uint64_t CommStats::total_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const auto& e : by_kind) n += e.bytes_sent;
  return n;
}

CommStats CommStats::operator-(const CommStats& earlier) const {
  CommStats d;
  for (std::size_t i = 0; i < kNumCollectives; ++i) {
    d.by_kind[i].calls = by_kind[i].calls - earlier.by_kind[i].calls;
    d.by_kind[i].bytes_sent = by_kind[i].bytes_sent - earlier.by_kind[i].bytes_sent;
  }
  return d;
}

void Communicator::check_root(int root, const char* what) const {
  DCP_ARG_CHECK(root >= 0 && root < size(), what, ": root = ", root, " must be in [0, ", size(),
                ")");
}

void Communicator::check_peer(int peer, const char* what) const {
  DCP_ARG_CHECK(peer >= 0 && peer < size() && peer != rank(), what, ": peer = ", peer,
                " must be in [0, ", size(), ") and not this rank (", rank(), ")");
}

std::vector<std::vector<std::uint8_t>> all_gather_bytes(Communicator& group,
                                                        const std::vector<std::uint8_t>& mine) {
  const std::int64_t size = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(group.size()));
  group.all_gather(&size, sizes.data(), sizeof size);
  const std::size_t longest =
      static_cast<std::size_t>(*std::max_element(sizes.begin(), sizes.end()));
  std::vector<std::uint8_t> send(mine);
  send.resize(longest);  // all_gather moves equal blocks: pad to the longest
  std::vector<std::uint8_t> all(longest * sizes.size());
  if (longest > 0) group.all_gather(send.data(), all.data(), longest);
  std::vector<std::vector<std::uint8_t>> out;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const auto begin = all.begin() + static_cast<std::ptrdiff_t>(k * longest);
    out.emplace_back(begin, begin + sizes[k]);
  }
  return out;
}

void broadcast_bytes(Communicator& group, std::vector<std::uint8_t>& bytes, int root,
                     bool patiently) {
  std::int64_t size = static_cast<std::int64_t>(bytes.size());
  if (patiently) {  // the wait is for the size; the bytes follow at once
    group.broadcast_patiently(&size, sizeof size, root);
  } else {
    group.broadcast(&size, sizeof size, root);
  }
  bytes.resize(static_cast<std::size_t>(size));
  if (size > 0) group.broadcast(bytes.data(), bytes.size(), root);
}

void send_bytes(Communicator& group, const std::vector<std::uint8_t>& bytes, int peer, int tag) {
  const std::int64_t size = static_cast<std::int64_t>(bytes.size());
  group.send(&size, sizeof size, peer, tag);
  if (size > 0) group.send(bytes.data(), bytes.size(), peer, tag + 1);
}

std::vector<std::uint8_t> recv_bytes(Communicator& group, int peer, int tag, bool patiently) {
  std::int64_t size = 0;
  if (patiently) {  // the wait is for the size; the bytes follow at once
    group.recv_patiently(&size, sizeof size, peer, tag);
  } else {
    group.recv(&size, sizeof size, peer, tag);
  }
  DCP_CHECK(size >= 0, comm, "recv_bytes from rank ", peer, " tag ", tag, ": a size of ", size);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  if (size > 0) group.recv(bytes.data(), bytes.size(), peer, tag + 1);
  return bytes;
}

}  // namespace dcp
