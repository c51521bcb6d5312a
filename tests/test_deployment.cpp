// The library deployment: groups carved from the topology, results moved as bytes, whole runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dcp/deployment.h"
#include "dcp/serving.h"
#include "dcp/error.h"
#include "dcp/weights.h"
#include "engine_util.h"
#include "test_util.h"

namespace dcp {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(Deployment, ResultsRoundTripExactlyPastFloatPrecision) {
  std::vector<RequestResult> in(3);
  in[0].id = (std::int64_t{1} << 40) + 3;  // ids and tokens a float cannot hold
  in[0].state = RequestState::finished;
  in[0].finish_reason = FinishReason::stop;
  in[0].logprobs = {{{7, -0.25f}, {{7, -0.25f}, {2, -3.5f}}}, {{1, -1e-30f}, {}}};
  in[0].output_tokens = {(1 << 24) + 1, 0, std::numeric_limits<std::int32_t>::max()};
  in[0].step_logits = {1.5f, -0.0f, std::numeric_limits<float>::quiet_NaN(),
                       -std::numeric_limits<float>::infinity(), 1e-40f};
  in[0].prompt_logprobs = {{{3, -2.0f}, {{3, -2.0f}}}};
  in[0].cached_prompt_tokens = (std::int64_t{1} << 33) + 1;
  in[0].spec_verify_steps = (std::int64_t{1} << 35) + 9;
  in[1].id = -7;
  in[1].state = RequestState::rejected;
  in[1].error = std::string("needs \0 bytes \xff too", 19);
  in[2].id = 5;  // nothing at all
  const std::vector<std::uint8_t> bytes = pack_results(in);
  const std::vector<RequestResult> out = unpack_results(bytes);
  ASSERT_EQ(out.size(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].id, in[i].id);
    EXPECT_EQ(out[i].state, in[i].state);
    EXPECT_EQ(out[i].output_tokens, in[i].output_tokens);
    EXPECT_TRUE(same_bits(out[i].step_logits, in[i].step_logits)) << "request " << i;
    EXPECT_EQ(out[i].error, in[i].error);
    EXPECT_EQ(out[i].finish_reason, in[i].finish_reason);
    EXPECT_EQ(out[i].cached_prompt_tokens, in[i].cached_prompt_tokens);
    EXPECT_EQ(out[i].spec_verify_steps, in[i].spec_verify_steps);
    for (const auto member : {&RequestResult::logprobs, &RequestResult::prompt_logprobs}) {
      const std::vector<StepLogprobs>& a = out[i].*member;
      const std::vector<StepLogprobs>& b = in[i].*member;
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t k = 0; k < b.size(); ++k) {
        EXPECT_EQ(a[k].chosen.token, b[k].chosen.token);
        EXPECT_EQ(a[k].chosen.logprob, b[k].chosen.logprob);
        ASSERT_EQ(a[k].top.size(), b[k].top.size());
        for (std::size_t j = 0; j < b[k].top.size(); ++j) {
          EXPECT_EQ(a[k].top[j].token, b[k].top[j].token);
          EXPECT_EQ(a[k].top[j].logprob, b[k].top[j].logprob);
        }
      }
    }
  }
  // A cut buffer is an error, never a read past its end.
  for (std::size_t cut : {std::size_t{1}, std::size_t{9}, bytes.size() - 1}) {
    const std::vector<std::uint8_t> part(bytes.begin(), bytes.begin() + static_cast<long>(cut));
    EXPECT_TRUE(test::throws_error([&] { unpack_results(part); }, ErrorCategory::internal,
                                   "packed bytes"))
        << "cut at " << cut;
  }
}

TEST(Deployment, GroupsAreTheTopologysPlacement) {
  for (const auto [tp, dp, dcp] : {std::array{4, 2, 2}, std::array{6, 1, 3}, std::array{2, 3, 1}}) {
    ParallelConfig pc;
    pc.tp_size = tp;
    pc.dp_size = dp;
    pc.dcp_size = dcp;
    const Topology topo = resolve(pc);
    const auto groups = topo.dcp_groups();
    SCOPED_TRACE("tp " + std::to_string(tp) + " dp " + std::to_string(dp) + " dcp " +
                 std::to_string(dcp));
    // Clang 14 lets no lambda capture a structured binding by default: name the two it uses.
    auto check = [&, tp = tp, dcp = dcp](Communicator& world, bool) {
      const RankGroups g = carve_groups(world, topo);
      const RankPlacement& me = topo.ranks[static_cast<std::size_t>(world.rank())];
      EXPECT_EQ(g.tp->size(), tp);
      EXPECT_EQ(g.tp->rank(), me.tp_rank);
      EXPECT_EQ(g.dcp->size(), dcp);
      EXPECT_EQ(g.dcp->rank(), me.dcp_rank);
      // The DCP group's members, in DCP-rank order, are the topology's.
      const int mine = world.rank();
      std::vector<int> members(static_cast<std::size_t>(dcp));
      g.dcp->all_gather(&mine, members.data(), sizeof mine);
      EXPECT_EQ(members, groups[static_cast<std::size_t>(me.dcp_group)]);
      std::vector<int> replica(static_cast<std::size_t>(tp));
      g.tp->all_gather(&mine, replica.data(), sizeof mine);
      for (int k = 0; k < tp; ++k) EXPECT_EQ(replica[k], me.dp_rank * tp + k);
    };
    launch_ranks({RankTransport::threads, topo.world_size, {}}, check);
  }
}

TEST(Deployment, TheWorldMustMatchTheTopology) {
  ParallelConfig pc;
  pc.tp_size = 4;
  pc.dcp_size = 2;
  const Topology topo = resolve(pc);
  launch_ranks({RankTransport::threads, 2, {}}, [&](Communicator& world, bool) {
    EXPECT_TRUE(test::throws_error([&] { carve_groups(world, topo); },
                                   ErrorCategory::invalid_argument, "world_size = 4"));
  });
}

TEST(Deployment, ReplicasServeEveryRequestOnceAndAgreeWithOneReplica) {
  auto rng = test::make_rng();
  DeploymentSpec spec;
  spec.model.config = preset_config("tiny", 1);
  spec.model.synthetic_seed = 17;
  spec.model_options.kv_dtype = KvDtype::fp32;
  spec.model_options.page_size = 8;
  spec.model_options.kv_capacity_tokens = 1024;
  spec.engine.record_logits = true;
  for (int i = 0; i < 5; ++i) {
    spec.requests.push_back(test::request(
        10 - i, test::random_tokens(rng, 20 + 13 * i, spec.model.config.vocab_size), 3));
  }
  spec.parallel.tp_size = 2;
  spec.parallel.dcp_size = 2;
  const Launched<DeploymentReport> one = run_deployment(spec);
  spec.parallel.dp_size = 2;
  const Launched<DeploymentReport> two = run_deployment(spec);
  ASSERT_TRUE(one.reporting && two.reporting && one.active && two.active);
  const std::vector<RequestResult>& a = one.report.results;
  const std::vector<RequestResult>& b = two.report.results;
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].id, static_cast<RequestId>(6 + i)) << "results are in id order";
    EXPECT_EQ(b[i].id, a[i].id);
    EXPECT_EQ(b[i].state, RequestState::finished);
    EXPECT_TRUE(test::same_greedy_run(b[i], a[i], spec.model.config.vocab_size, {1e-12, 1e-5}))
        << "replicas, request " << a[i].id;
  }
  EXPECT_EQ(two.report.ranks.size(), 4u);  // TP 2 x DP 2
  EXPECT_GT(one.report.logical_capacity_tokens, 0);
}

TEST(Deployment, RefusesWhatItCannotRunBeforeStartingRanks) {
  DeploymentSpec spec;
  spec.model.config = preset_config("tiny", 1);
  spec.parallel.tp_size = 4;
  spec.parallel.dp_size = 2;
  spec.parallel.dcp_size = 3;
  EXPECT_TRUE(test::throws_error([&] { run_deployment(spec); }, ErrorCategory::invalid_argument,
                                 "dcp_size = 3 must divide tp_size = 4"));
  EXPECT_TRUE(test::throws_error([&] { parse_rank_transport("nccl"); },
                                 ErrorCategory::invalid_argument,
                                 "comm = 'nccl' is not one of: threads, mpi"));
}

}  // namespace
}  // namespace dcp

namespace dcp {
namespace {

TEST(Deployment, RefusesWhatOnlyTheTopologyDescribes) {
  DeploymentSpec spec;
  spec.model.config = preset_config("tiny", 1);
  spec.parallel.pcp_size = 2;
  EXPECT_TRUE(test::throws_error([&] { run_deployment(spec); }, ErrorCategory::unsupported,
                                 "pcp_size = 2: prefill context parallelism is not implemented"));
  spec.parallel.pcp_size = 1;
  spec.parallel.platform = Platform::blackwell_mnnvl();
  EXPECT_TRUE(test::throws_error([&] { ServingDeployment served(spec); },
                                 ErrorCategory::unsupported, "(legal: cpu)"));
}

}  // namespace
}  // namespace dcp
