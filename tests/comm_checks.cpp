#include "comm_checks.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "dcp/dcp_attention.h"
#include "dcp/error.h"
#include "dcp/merge.h"
#include "dcp/reference.h"
#include "test_util.h"

namespace dcp::test {
namespace {

#define EXPECT_OR_THROW(cond, ...)                                                               \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      throw Error(ErrorCategory::internal,                                                       \
                  str("check failed: " #cond " (", __FILE__, ":", __LINE__, ") ", __VA_ARGS__)); \
    }                                                                                            \
  } while (0)

// A byte that depends on who sent it, to whom, and where: catches misplaced chunks.
std::uint8_t pattern(int from, int to, std::size_t i) {
  return static_cast<std::uint8_t>(from * 37 + to * 11 + i * 7 + (i >> 8));
}

std::vector<std::size_t> payload_sizes(std::size_t max_bytes) {
  std::vector<std::size_t> sizes = {0, 1, 3, 4096};
  for (std::size_t s = 65536; s <= max_bytes; s *= 8) sizes.push_back(s);
  if (sizes.back() != max_bytes && max_bytes > 4096) sizes.push_back(max_bytes);
  return sizes;
}

template <typename T>
void check_all_reduce_type(Communicator& comm, ScalarType type, std::size_t count) {
  const int n = comm.size(), r = comm.rank();
  std::vector<T> send(count), recv(count);
  for (std::size_t i = 0; i < count; ++i)
    send[i] = static_cast<T>((r + 1) * 3 + static_cast<int>(i % 13));
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    comm.all_reduce(send.data(), recv.data(), count, type, op);
    for (std::size_t i = 0; i < count; ++i) {
      const int base = static_cast<int>(i % 13);
      const T expect = op == ReduceOp::sum   ? static_cast<T>(3 * n * (n + 1) / 2 + n * base)
                       : op == ReduceOp::max ? static_cast<T>(n * 3 + base)
                                             : static_cast<T>(3 + base);
      EXPECT_OR_THROW(recv[i] == expect, "all_reduce op ", static_cast<int>(op), " element ", i);
    }
  }
  std::vector<T> inplace = send;  // in place: send == recv
  comm.all_reduce(inplace.data(), inplace.data(), count, type, ReduceOp::sum);
  for (std::size_t i = 0; i < count; ++i) {
    EXPECT_OR_THROW(
        inplace[i] == static_cast<T>(3 * n * (n + 1) / 2 + n * static_cast<int>(i % 13)),
        "in-place all_reduce element ", i);
  }
}

}  // namespace

void check_collectives(Communicator& comm, std::size_t max_bytes) {
  const int n = comm.size(), r = comm.rank();
  for (std::size_t bytes : payload_sizes(max_bytes)) {
    // all_gather, out of place and in place.
    std::vector<std::uint8_t> send(bytes), recv(bytes * n, 0xee);
    for (std::size_t i = 0; i < bytes; ++i) send[i] = pattern(r, 0, i);
    comm.all_gather(send.data(), recv.data(), bytes);
    for (int j = 0; j < n; ++j) {
      for (std::size_t i = 0; i < bytes; ++i) {
        EXPECT_OR_THROW(recv[j * bytes + i] == pattern(j, 0, i), "all_gather bytes ", bytes,
                        " from ", j, " at ", i);
      }
    }
    std::vector<std::uint8_t> inplace(bytes * n, 0xee);
    std::copy(send.begin(), send.end(), inplace.begin() + static_cast<std::ptrdiff_t>(r * bytes));
    comm.all_gather(inplace.data() + r * bytes, inplace.data(), bytes);
    EXPECT_OR_THROW(inplace == recv, "in-place all_gather, bytes ", bytes);

    // all_to_all: chunk j of my send goes to rank j.
    std::vector<std::uint8_t> a2a_send(bytes * n), a2a_recv(bytes * n, 0xee);
    for (int j = 0; j < n; ++j) {
      for (std::size_t i = 0; i < bytes; ++i) a2a_send[j * bytes + i] = pattern(r, j, i);
    }
    comm.all_to_all(a2a_send.data(), a2a_recv.data(), bytes);
    for (int j = 0; j < n; ++j) {
      for (std::size_t i = 0; i < bytes; ++i) {
        EXPECT_OR_THROW(a2a_recv[j * bytes + i] == pattern(j, r, i), "all_to_all bytes ", bytes,
                        " from ", j);
      }
    }

    // all_to_all_v: rank r sends (r + 2j + 1) % 3 * bytes / 2 bytes to rank j, so chunks
    // differ per pair and some are empty.
    const auto chunk = [&](int from, int to) { return (from + 2 * to + 1) % 3 * bytes / 2; };
    std::vector<std::size_t> sb(static_cast<std::size_t>(n)), rb(sb.size());
    std::size_t s_total = 0, r_total = 0;
    for (int j = 0; j < n; ++j) {
      sb[j] = chunk(r, j);
      rb[j] = chunk(j, r);
      s_total += sb[j];
      r_total += rb[j];
    }
    std::vector<std::uint8_t> v_send(s_total), v_recv(r_total, 0xee);
    for (int j = 0, at = 0; j < n; at += static_cast<int>(sb[j]), ++j) {
      for (std::size_t i = 0; i < sb[j]; ++i) v_send[at + i] = pattern(r, j, i);
    }
    comm.all_to_all_v(v_send.data(), sb.data(), v_recv.data(), rb.data());
    for (int j = 0, at = 0; j < n; at += static_cast<int>(rb[j]), ++j) {
      for (std::size_t i = 0; i < rb[j]; ++i) {
        EXPECT_OR_THROW(v_recv[at + i] == pattern(j, r, i), "all_to_all_v bytes ", rb[j], " from ",
                        j, " at ", i);
      }
    }

    // broadcast from every root.
    for (int root = 0; root < n; ++root) {
      std::vector<std::uint8_t> buf(bytes);
      for (std::size_t i = 0; i < bytes; ++i) buf[i] = r == root ? pattern(root, 1, i) : 0;
      comm.broadcast(buf.data(), bytes, root);
      for (std::size_t i = 0; i < bytes; ++i) {
        EXPECT_OR_THROW(buf[i] == pattern(root, 1, i), "broadcast root ", root, " bytes ", bytes);
      }
    }

    // reduce_scatter of integer-valued floats (sums are exact).
    const std::size_t count = bytes / 4;
    std::vector<float> rs_send(count * n), rs_recv(count, -1.0f);
    for (int j = 0; j < n; ++j) {
      for (std::size_t k = 0; k < count; ++k)
        rs_send[j * count + k] = static_cast<float>(r * 100 + j * 10 + static_cast<int>(k % 9));
    }
    comm.reduce_scatter(rs_send.data(), rs_recv.data(), count, ScalarType::f32, ReduceOp::sum);
    for (std::size_t k = 0; k < count; ++k) {
      const float expect =
          static_cast<float>(100 * n * (n - 1) / 2 + n * (r * 10 + static_cast<int>(k % 9)));
      EXPECT_OR_THROW(rs_recv[k] == expect, "reduce_scatter element ", k, ": ", rs_recv[k], " vs ",
                      expect);
    }

    // point to point: a ring with two tags; ordered so that blocking (rendezvous) sends cannot
    // deadlock.
    if (n > 1) {
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      std::vector<std::uint8_t> m1(bytes), m2(bytes), got1(bytes), got2(bytes);
      for (std::size_t i = 0; i < bytes; ++i) {
        m1[i] = pattern(r, next, i);
        m2[i] = pattern(r, next, i + 1);
      }
      if (r % 2 == 0) {
        comm.send(m1.data(), bytes, next, 1);
        comm.send(m2.data(), bytes, next, 2);
        comm.recv(got1.data(), bytes, prev, 1);
        comm.recv(got2.data(), bytes, prev, 2);
      } else {
        comm.recv(got1.data(), bytes, prev, 1);
        comm.recv(got2.data(), bytes, prev, 2);
        comm.send(m1.data(), bytes, next, 1);
        comm.send(m2.data(), bytes, next, 2);
      }
      for (std::size_t i = 0; i < bytes; ++i) {
        EXPECT_OR_THROW(got1[i] == pattern(prev, r, i) && got2[i] == pattern(prev, r, i + 1),
                        "send/recv bytes ", bytes);
      }
    }
  }
  check_all_reduce_type<float>(comm, ScalarType::f32, 1000);
  check_all_reduce_type<double>(comm, ScalarType::f64, 77);
  check_all_reduce_type<std::int32_t>(comm, ScalarType::i32, 5);
  check_all_reduce_type<std::int64_t>(comm, ScalarType::i64, 1);
  comm.barrier();
}

void check_patient_broadcast(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  for (int root = 0; root < n; ++root) {
    for (const int late_ms : {0, 3, 30}) {
      if (r == root) std::this_thread::sleep_for(std::chrono::milliseconds(late_ms));
      std::uint64_t word = r == root ? 0x5eed0000u + static_cast<std::uint64_t>(root) : 0;
      comm.broadcast_patiently(&word, sizeof word, root);
      EXPECT_OR_THROW(word == 0x5eed0000u + static_cast<std::uint64_t>(root),
                      "broadcast_patiently from ", root, " after ", late_ms, " ms");
      if (r == root) std::this_thread::sleep_for(std::chrono::milliseconds(late_ms));
      std::vector<std::uint8_t> bytes;
      if (r == root) {
        for (int i = 0; i < 37 + root; ++i) bytes.push_back(pattern(root, late_ms, i));
      }
      broadcast_bytes(comm, bytes, root, true);
      EXPECT_OR_THROW(bytes.size() == static_cast<std::size_t>(37 + root),
                      "patient broadcast_bytes from ", root, ": ", bytes.size(), " bytes");
      for (std::size_t i = 0; i < bytes.size(); ++i) {
        EXPECT_OR_THROW(bytes[i] == pattern(root, late_ms, i), "patient broadcast_bytes from ",
                        root, " at ", i);
      }
      int sum = 0;
      comm.all_reduce(&r, &sum, 1, ScalarType::i32);
      EXPECT_OR_THROW(sum == n * (n - 1) / 2, "all_reduce after a patient broadcast: ", sum);
    }
  }
}

void check_probe_and_messages(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  constexpr int kTag = 4100;
  if (n < 2) return;
  if (r <= 1) {
    EXPECT_OR_THROW(!comm.probe(1 - r, kTag), "probe before anything was sent");
  }
  comm.barrier();
  const auto message = [](int from, int length) {
    std::vector<std::uint8_t> bytes;
    for (int i = 0; i < length; ++i) bytes.push_back(pattern(from, length, i));
    return bytes;
  };
  if (r == 0) {
    send_bytes(comm, message(0, 41), 1, kTag);
    send_bytes(comm, {}, 1, kTag);  // an empty message is one too
    // The reply comes late: a patient receive waits for it.
    EXPECT_OR_THROW(recv_bytes(comm, 1, kTag, true) == message(1, 1000), "the reply");
  } else if (r == 1) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!comm.probe(0, kTag)) {
      EXPECT_OR_THROW(std::chrono::steady_clock::now() < deadline, "probe never saw the message");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_OR_THROW(recv_bytes(comm, 0, kTag) == message(0, 41), "the message");
    EXPECT_OR_THROW(recv_bytes(comm, 0, kTag).empty(), "the empty message");
    EXPECT_OR_THROW(!comm.probe(0, kTag), "probe after the messages were received");
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    send_bytes(comm, message(1, 1000), 0, kTag);
  }
  comm.barrier();
}

void check_split(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  // Two colours; within a colour, reverse order of parent rank (key = -rank).
  auto sub = comm.split(r % 2, -r);
  int members = 0;
  for (int j = 0; j < n; ++j) members += j % 2 == r % 2;
  EXPECT_OR_THROW(sub->size() == members, "split size ", sub->size(), " vs ", members);
  int higher = 0;  // same colour, larger parent rank: they come first
  for (int j = r + 1; j < n; ++j) higher += j % 2 == r % 2;
  EXPECT_OR_THROW(sub->rank() == higher, "split rank ", sub->rank(), " vs ", higher);
  std::vector<int> parents(sub->size());
  sub->all_gather(&r, parents.data(), sizeof(int));
  for (int k = 0; k < sub->size(); ++k) {
    EXPECT_OR_THROW(parents[k] % 2 == r % 2, "split: member ", parents[k], " has another colour");
    if (k > 0) EXPECT_OR_THROW(parents[k] < parents[k - 1], "split order");
  }
  // Groups of 2 (like DCP slices), split again from the sub-group: nesting works.
  auto pairs = comm.split(r / 2, r);
  EXPECT_OR_THROW(pairs->rank() == r % 2, "pair rank");
  auto nested = pairs->split(0, 0);
  int sum = 0, one = 1;
  nested->all_reduce(&one, &sum, 1, ScalarType::i32);
  EXPECT_OR_THROW(sum == pairs->size(), "nested split all_reduce ", sum);
}

void check_byte_accounting(Communicator& comm) {
  const int n = comm.size();
  const std::uint64_t peers = static_cast<std::uint64_t>(n - 1);
  std::vector<float> a(64 * n), b(64 * n);
  const CommStats before = comm.stats();
  comm.all_gather(a.data(), b.data(), 64 * sizeof(float));
  comm.all_to_all(a.data(), b.data(), 64 * sizeof(float));
  comm.reduce_scatter(a.data(), b.data(), 64, ScalarType::f32);
  comm.all_reduce(a.data(), b.data(), 64 * n, ScalarType::f32);
  comm.broadcast(a.data(), 100, 0);
  // all_to_all_v: 4 (j + 1) bytes to rank j; only those to other ranks count.
  std::vector<std::size_t> to(static_cast<std::size_t>(n)), from(to.size(), 4 * (comm.rank() + 1));
  std::uint64_t v_sent = 0;
  for (int j = 0; j < n; ++j) {
    to[j] = 4 * static_cast<std::size_t>(j + 1);
    if (j != comm.rank()) v_sent += to[j];
  }
  comm.all_to_all_v(a.data(), to.data(), b.data(), from.data());
  const CommStats d = comm.stats() - before;
  EXPECT_OR_THROW(d[Collective::all_gather].bytes_sent == peers * 256, "all_gather bytes");
  EXPECT_OR_THROW(d[Collective::all_to_all].bytes_sent == peers * 256 + v_sent,
                  "all_to_all (and _v) bytes");
  EXPECT_OR_THROW(d[Collective::reduce_scatter].bytes_sent == peers * 256, "reduce_scatter bytes");
  EXPECT_OR_THROW(d[Collective::all_reduce].bytes_sent == 2 * peers * 256, "all_reduce bytes");
  EXPECT_OR_THROW(d[Collective::broadcast].bytes_sent == (comm.rank() == 0 ? peers * 100 : 0),
                  "broadcast bytes");
  EXPECT_OR_THROW(d.total_calls() == 6, "calls ", d.total_calls());
}

namespace {

// Mask variants exercised through the DCP step.
enum class Mask { causal, window, sinks, softcap, topk };

void check_step_once(Communicator& comm, Rng& rng, CombineBackend backend, bool replicated,
                     Mask mask, int h_loc, const ContextSpec& base_spec) {
  const int n = comm.size(), r = comm.rank();
  ContextSpec spec = base_spec;
  spec.heads = n * h_loc;
  ref::FullAttentionInput in = random_context(spec, KvDtype::fp32, rng);
  if (mask == Mask::window) in.window = 7;
  if (mask == Mask::softcap) in.softcap = 2.0;
  if (mask == Mask::sinks) {
    for (int h = 0; h < spec.heads; ++h) in.sinks.push_back(rng.uniform(-1, 3));
  }
  if (mask == Mask::topk) {
    in.topk_k = 5;
    const int width = in.kv_lora_rank + in.rope_dim;
    for (std::size_t b = 0; b < in.kv.size(); ++b) {
      const std::int64_t len = static_cast<std::int64_t>(in.kv[b].size()) / width;
      for (int t = in.q_start[b]; t < in.q_start[b + 1]; ++t) {
        for (int i = 0; i < in.topk_k; ++i) {
          // Distinct positions len-1, len-3, ...; -1 past the start.
          const std::int64_t pos = len - 1 - 2 * i;
          in.topk.push_back(pos >= 0 ? static_cast<std::int32_t>(pos) : -1);
        }
      }
    }
  }
  const int page = 5;
  const auto shards = stripe(in, n, 1, page, KvDtype::fp32, rng);
  MlaAttentionParams shard = shard_params(in, shards[r], KvDtype::fp32, page, n, r, 1);

  const std::int64_t tokens = in.q_start.back();
  const int width = in.kv_lora_rank + in.rope_dim, dc = in.kv_lora_rank;
  // This rank's query: its own head block, or the whole group's heads.
  std::vector<float> q_mine;
  if (replicated) {
    q_mine = in.q;
  } else {
    for (std::int64_t t = 0; t < tokens; ++t) {
      const float* src = in.q.data() + (t * spec.heads + r * h_loc) * width;
      q_mine.insert(q_mine.end(), src, src + static_cast<std::ptrdiff_t>(h_loc) * width);
    }
  }
  DcpAttention step(comm, {backend, replicated, h_loc});
  std::vector<float> out(static_cast<std::size_t>(tokens) * h_loc * dc, std::nanf("")),
      lse(static_cast<std::size_t>(tokens) * h_loc, std::nanf(""));
  const CommStats before = comm.stats();
  step.forward(q_mine.data(), shard, in.sinks.empty() ? nullptr : in.sinks.data(), out.data(),
               lse.data());
  const CommStats d = comm.stats() - before;

  // Expected: full attention, this rank's head block.
  const ref::AttentionResult full = ref::full_attention(in);
  std::vector<double> expect_o, expect_l;
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (int h = 0; h < h_loc; ++h) {
      const std::size_t row = static_cast<std::size_t>(t) * spec.heads + r * h_loc + h;
      expect_o.insert(expect_o.end(), full.out.begin() + static_cast<std::ptrdiff_t>(row * dc),
                      full.out.begin() + static_cast<std::ptrdiff_t>((row + 1) * dc));
      expect_l.push_back(full.lse[row]);
    }
  }
  const std::string what = str("N=", n, " rank ", r, " ", to_string(backend),
                               replicated ? " replicated-q" : " gathered-q", " mask ",
                               static_cast<int>(mask), " tokens ", tokens);
  const auto o_ok = close(out, expect_o, kFp32Tol, "O");
  EXPECT_OR_THROW(o_ok, what, ": ", o_ok.message());
  const auto l_ok = lse_close(lse, expect_l, "LSE");
  EXPECT_OR_THROW(l_ok, what, ": ", l_ok.message());

  // Traffic, by the formulas of the issue (written out here, not taken from the code under test):
  // with H = N x H_loc heads, the query gather sends (N-1)/N of T x H x W x 4; a2a sends (N-1)/N
  // of T x H x (D x 4 + 4) in one collective; ag_rs all-gathers T x H LSEs and reduce-scatters
  // (N-1)/N of T x H x D x 4.
  const std::uint64_t heads_all = static_cast<std::uint64_t>(n) * h_loc, peers = n - 1, T = tokens;
  const std::uint64_t row = static_cast<std::uint64_t>(width);  // D + rope
  const std::uint64_t q_gather = replicated ? 0 : peers * T * heads_all * row * 4 / n;
  const std::uint64_t combine =
      backend == CombineBackend::a2a
          ? peers * T * heads_all * (dc * 4 + 4) / n
          : peers * T * heads_all * 4 + peers * T * heads_all * dc * 4 / n;
  EXPECT_OR_THROW(d.total_bytes() == q_gather + combine, what, ": bytes ", d.total_bytes(),
                  " vs formula ", q_gather + combine);
  // The library's own formula (used by dcp plan) must say the same.
  const DcpAttentionOptions opts{backend, replicated, h_loc};
  EXPECT_OR_THROW(
      DcpAttention::expected_bytes_sent(opts, n, tokens, dc, in.rope_dim) == q_gather + combine,
      what, ": expected_bytes_sent disagrees with the formula");
  const std::uint64_t expect_calls =
      n == 1 ? 0 : (replicated ? 0 : 1) + (backend == CombineBackend::ag_rs ? 2 : 1);
  EXPECT_OR_THROW(d.total_calls() == expect_calls, what, ": ", d.total_calls(),
                  " collectives, expected ", expect_calls);
}

}  // namespace

void check_dcp_step(Communicator& comm, std::uint64_t seed) {
  const int n = comm.size();
  Rng rng(seed);
  // Decode over mixed lengths (one shorter than N, one empty) and a multi-token query (k+1 = 4).
  ContextSpec decode;
  decode.kv_lora_rank = 32;
  decode.rope_dim = 8;
  decode.lengths = {97, n > 1 ? n - 1 : 0, 0, 40};
  decode.q_lens = {1, 1, 1, 1};
  ContextSpec verify = decode;
  verify.lengths = {61, 3};
  verify.q_lens = {4, 3};
  for (CombineBackend backend : {CombineBackend::ag_rs, CombineBackend::a2a}) {
    for (bool replicated : {false, true}) {
      if (replicated && backend != CombineBackend::a2a) continue;
      for (Mask mask : {Mask::causal, Mask::window, Mask::sinks, Mask::softcap, Mask::topk}) {
        check_step_once(comm, rng, backend, replicated, mask, 2, decode);
        check_step_once(comm, rng, backend, replicated, mask, 3, verify);
      }
    }
  }
}

}  // namespace dcp::test
