// The DCP attention step on the threads backend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "comm_checks.h"
#include "dcp/comm_threads.h"
#include "dcp/dcp_attention.h"
#include "dcp/error.h"
#include "test_util.h"

namespace dcp {
namespace {

TEST(DcpAttention, EqualsFullAttentionOnEveryConfiguration) {
  const std::uint64_t seed = test::test_seed();
  for (int n : {1, 2, 3, 4}) {
    SCOPED_TRACE("N " + std::to_string(n));
    run_threads(n, [seed](Communicator& c) { test::check_dcp_step(c, seed); });
  }
}

TEST(DcpAttention, SizeOneIsBitwiseTheLocalKernel) {
  auto rng = test::make_rng();
  test::ContextSpec spec;
  spec.heads = 3;
  spec.lengths = {50, 7};
  spec.q_lens = {1, 2};
  const auto in = test::random_context(spec, KvDtype::bf16, rng);
  const auto shards = test::stripe(in, 1, 1, 8, KvDtype::bf16, rng);
  MlaAttentionParams p = test::shard_params(in, shards[0], KvDtype::bf16, 8, 1, 0, 1);
  const std::size_t n_out = 3u * 3 * in.kv_lora_rank;
  std::vector<float> direct(n_out), direct_lse(9), stepped(n_out), stepped_lse(9);
  p.out = direct.data();
  p.lse = direct_lse.data();
  mla_attention(p);
  run_threads(1, [&](Communicator& c) {
    DcpAttention step(c, {CombineBackend::ag_rs, false, 3});
    step.forward(in.q.data(), p, nullptr, stepped.data(), stepped_lse.data());
    EXPECT_EQ(c.stats().total_calls(), 0u);
  });
  EXPECT_EQ(std::memcmp(direct.data(), stepped.data(), n_out * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(direct_lse.data(), stepped_lse.data(), 9 * sizeof(float)), 0);
}

TEST(DcpAttention, RejectsMisconfigurationNamingTheParameterAndWritingNothing) {
  auto rng = test::make_rng();
  test::ContextSpec spec;
  spec.heads = 4;
  spec.lengths = {9};
  spec.q_lens = {1};
  const auto in = test::random_context(spec, KvDtype::fp32, rng);
  const auto shards = test::stripe(in, 2, 1, 4, KvDtype::fp32, rng);
  run_threads(2, [&](Communicator& c) {
    using test::throws_error;
    EXPECT_TRUE(throws_error(
        [&] {
          DcpAttention(c, {CombineBackend::fi_a2a, false, 2});
        },
        ErrorCategory::unsupported, "backend = fi_a2a needs Blackwell"));
    EXPECT_TRUE(throws_error(
        [&] {
          DcpAttention(c, {CombineBackend::ag_rs, true, 2});
        },
        ErrorCategory::invalid_argument, "replicated_q needs an all-to-all combine"));
    EXPECT_TRUE(throws_error(
        [&] {
          DcpAttention(c, {CombineBackend::a2a, false, 0});
        },
        ErrorCategory::invalid_argument, "local_heads = 0 must be >= 1"));

    // A valid step given metadata for another group: refused before any collective or write.
    DcpAttention step(c, {CombineBackend::a2a, false, 2});
    const std::size_t rows = 2;  // one token, H_loc heads
    std::vector<float> out(rows * in.kv_lora_rank, 7.0f), lse(rows, 7.0f);
    const CommStats before = c.stats();
    MlaAttentionParams p =
        test::shard_params(in, shards[c.rank()], KvDtype::fp32, 4, 2, c.rank(), 1);
    p.dcp_size = 3;
    EXPECT_TRUE(throws_error([&] { step.forward(in.q.data(), p, nullptr, out.data(), lse.data()); },
                             ErrorCategory::invalid_argument,
                             "shard.dcp_size = 3 must equal the DCP group size 2"));
    p.dcp_size = 2;
    p.dcp_rank = 1 - c.rank();
    EXPECT_TRUE(throws_error([&] { step.forward(in.q.data(), p, nullptr, out.data(), lse.data()); },
                             ErrorCategory::invalid_argument, "must equal this rank's place"));
    EXPECT_EQ(c.stats().total_calls(), before.total_calls()) << "a collective ran";
    for (float x : out) ASSERT_EQ(x, 7.0f) << "the output was written";
    for (float x : lse) ASSERT_EQ(x, 7.0f) << "the LSE was written";
  });
}

}  // namespace
}  // namespace dcp
