// DP attention with DCP inside each attention group: the groups carved from the topology, the
// deal of requests, and whole runs equal to one attention group (DP 1, DCP 1) at the same TP, for
// a dense and a mixture-of-experts (FP8) family, with idle groups and uneven token counts.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "dcp/deployment.h"
#include "dcp/error.h"
#include "dcp/prefix_router.h"
#include "engine_util.h"
#include "naive_model.h"
#include "test_util.h"

namespace dcp {
namespace {

ParallelConfig dp_attention(int tp, int dp, int dcp) {
  ParallelConfig pc;
  pc.tp_size = tp;
  pc.dp_size = dp;
  pc.enable_dp_attention = true;
  pc.dcp_size = dcp;
  return pc;
}

TEST(DpAttention, GroupsAreTheTopologysPlacement) {
  for (const auto [tp, dp, dcp] : {std::array{4, 2, 2}, std::array{8, 4, 2}, std::array{6, 3, 1},
                                   std::array{8, 2, 4}}) {
    const Topology topo = resolve(dp_attention(tp, dp, dcp));
    SCOPED_TRACE("tp " + std::to_string(tp) + " dp " + std::to_string(dp) + " dcp " +
                 std::to_string(dcp));
    const int attn = tp / dp;
    // Clang 14 lets no lambda capture a structured binding by default: name the two it uses.
    auto check = [&, tp = tp, dcp = dcp](Communicator& world, bool) {
      const RankGroups g = carve_groups(world, topo);
      const RankPlacement& me = topo.ranks[static_cast<std::size_t>(world.rank())];
      const int mine = world.rank();
      // The TP group is the whole world, in world order.
      ASSERT_EQ(g.tp->size(), tp);
      EXPECT_EQ(g.tp->rank(), mine);
      // The attention group: `attn` consecutive ranks, ordered by attention-TP rank.
      ASSERT_EQ(g.attn_tp->size(), attn);
      EXPECT_EQ(g.attn_tp->rank(), me.attn_tp_rank);
      std::vector<int> members(static_cast<std::size_t>(attn));
      g.attn_tp->all_gather(&mine, members.data(), sizeof mine);
      for (int k = 0; k < attn; ++k) EXPECT_EQ(members[k], me.attn_tp_group * attn + k);
      EXPECT_EQ(me.dp_rank, me.attn_tp_group);
      // The DCP group lies inside it, as the topology lists it.
      ASSERT_EQ(g.dcp->size(), dcp);
      std::vector<int> dcp_members(static_cast<std::size_t>(dcp));
      g.dcp->all_gather(&mine, dcp_members.data(), sizeof mine);
      EXPECT_EQ(dcp_members, topo.dcp_groups()[static_cast<std::size_t>(me.dcp_group)]);
      for (int m : dcp_members) EXPECT_EQ(m / attn, me.attn_tp_group);
    };
    launch_ranks({RankTransport::threads, topo.world_size, {}}, check);
  }
}

TEST(DpAttention, RequestsGoToTheGroupWithTheMostFreeKv) {
  // Groups start empty: 100 -> 0; group 1 holds the least until it passes 100 (at 115).
  EXPECT_EQ(deal_requests({100, 10, 10, 50, 5, 40, 30}, 2),
            (std::vector<int>{0, 1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(deal_requests({7, 7, 7, 7, 7}, 3), (std::vector<int>{0, 1, 2, 0, 1}));
  EXPECT_EQ(deal_requests({3, 1}, 1), (std::vector<int>{0, 0}));
  EXPECT_TRUE(deal_requests({}, 4).empty());
  // One step, as a server deals: the least loaded group gets it and carries its tokens.
  std::vector<std::int64_t> load{5, 3, 3};
  EXPECT_EQ(deal_request(load, 4), 1);
  EXPECT_EQ(load, (std::vector<std::int64_t>{5, 7, 3}));
  EXPECT_EQ(deal_request(load, 1), 2);
  EXPECT_TRUE(test::throws_error([] { deal_requests({1}, 0); }, ErrorCategory::invalid_argument,
                                 "groups = 0 must be >= 1"));
}

TEST(DpAttention, ThePrefixRouterSendsAPromptWhereItsLongestPrefixWent) {
  const std::vector<std::int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<std::int32_t> b = {9, 9, 9, 9, 8, 8, 8, 8};
  const auto longer = [](std::vector<std::int32_t> p, std::vector<std::int32_t> more) {
    p.insert(p.end(), more.begin(), more.end());
    return p;
  };
  PrefixRouter router(4, 10);  // blocks of 4 tokens; up to 10 tokens past the least loaded
  std::vector<std::int64_t> load{0, 0};
  EXPECT_EQ(router.route(load, a, 10), 0);  // nothing known: the least loaded, as dealt
  EXPECT_EQ(router.route(load, b, 10), 1);
  EXPECT_EQ(load, (std::vector<std::int64_t>{10, 10}));
  // A conversation's next turn goes where its earlier turn went, ties or not.
  EXPECT_EQ(router.route(load, longer(b, {1, 2, 3, 4, 5}), 15), 1);
  EXPECT_EQ(router.route(load, longer(a, {7}), 5), 0);
  EXPECT_EQ(load, (std::vector<std::int64_t>{15, 25}));
  // Sharing the first block only: a's group holds that block too, but the last to take it wins.
  EXPECT_EQ(router.route(load, {9, 9, 9, 9, 0, 0, 0, 0}, 1), 1);
  // Too loaded (25 + 1 > 15 + 10): the least loaded group instead, which now holds b's prefix.
  load = {15, 26};
  EXPECT_EQ(router.route(load, b, 3), 0);
  EXPECT_EQ(load, (std::vector<std::int64_t>{18, 26}));
  EXPECT_EQ(router.route(load, longer(b, {4}), 3), 0);
  // Shorter than a block: nothing to share, dealt by load.
  EXPECT_EQ(router.route(load, {1, 2, 3}, 1), 0);
  load = {30, 0};
  EXPECT_EQ(router.route(load, {1, 2, 3}, 1), 1);

  // It remembers a bounded number of prefixes, the oldest forgotten first.
  PrefixRouter small(2, 100, 3);
  std::vector<std::int64_t> two{0, 5};
  EXPECT_EQ(small.route(two, {1, 1, 2, 2, 3, 3, 4, 4}, 1), 0);  // four prefixes, the first lost
  EXPECT_EQ(small.remembered(), 3U);
  two = {5, 0};
  EXPECT_EQ(small.route(two, {1, 1, 7, 7}, 1), 1);  // only the first block: forgotten
  two = {5, 0};
  EXPECT_EQ(small.route(two, {1, 1, 2, 2, 3, 3, 4, 4, 5}, 1), 0);  // the longest is kept
  // The least recently routed prefix is forgotten, not the first learned: a prompt routed again
  // (a system prompt every conversation opens with) stays.
  PrefixRouter lru(2, 100, 3);
  two = {0, 5};
  EXPECT_EQ(lru.route(two, {1, 1, 2, 2}, 1), 0);  // two prefixes, to group 0
  two = {5, 0};
  EXPECT_EQ(lru.route(two, {5, 5}, 1), 1);  // a third, to group 1
  two = {0, 0};
  EXPECT_EQ(lru.route(two, {1, 1, 2, 2}, 1), 0);  // the first two routed again
  two = {0, 0};
  EXPECT_EQ(lru.route(two, {6, 6}, 1), 0);  // a fourth: {5, 5} is forgotten
  EXPECT_EQ(lru.remembered(), 3U);
  two = {5, 0};
  EXPECT_EQ(lru.route(two, {1, 1, 9, 9}, 1), 0);  // {1, 1} remembered: group 0 despite its load
  two = {0, 5};
  EXPECT_EQ(lru.route(two, {5, 5, 9, 9}, 1), 0);  // {5, 5} forgotten: by load, not group 1
  EXPECT_TRUE(test::throws_error([] { PrefixRouter(0, 1); }, ErrorCategory::invalid_argument,
                                 "block = 0 must be >= 1"));
  EXPECT_TRUE(test::throws_error([] { PrefixRouter(4, -1); }, ErrorCategory::invalid_argument,
                                 "slack = -1 must be >= 0"));
  EXPECT_TRUE(test::throws_error([] { PrefixRouter(4, 1, 0); }, ErrorCategory::invalid_argument,
                                 "remember = 0 must be >= 1"));
}

DeploymentSpec spec_for(const ModelConfig& config, const std::vector<int>& prompt_lens,
                        const std::vector<int>& new_tokens) {
  auto rng = test::make_rng();
  DeploymentSpec s;
  s.model.config = config;
  s.model.synthetic_seed = 29;
  s.model_options.kv_dtype = KvDtype::fp32;
  s.model_options.page_size = 4;
  s.model_options.kv_capacity_tokens = 512;
  s.engine.record_logits = true;
  s.engine.chunked_prefill_size = 16;  // long prompts prefill over steps where others decode
  for (std::size_t i = 0; i < prompt_lens.size(); ++i) {
    s.requests.push_back(test::request(static_cast<RequestId>(i),
                                       test::random_tokens(rng, prompt_lens[i], config.vocab_size),
                                       new_tokens[i]));
  }
  return s;
}

// A router choice closer than this to a tie in the float64 model (the gap between the last expert
// or group chosen and the first not) may go either way in two fp32 runs that round differently
// (about 1e-7 of scores near 1): a hundred times that rounding.
constexpr double kRoutingTie = 1e-5;

// Runs `spec` with DP attention, then the same requests at the same TP with one attention group
// and DCP 1, fed the first run's tokens, and compares. With `routing` (the model's weights, for a
// mixture of experts), a request whose logits part is excused when the float64 model routes one of
// its tokens within kRoutingTie of a tie; at most one request may be excused.
void expect_equals_one_group(DeploymentSpec spec, const ParallelConfig& parallel,
                             test::Tolerance tol, const WeightSource* routing = nullptr) {
  spec.parallel = parallel;
  const Launched<DeploymentReport> run = run_deployment(spec);
  ASSERT_TRUE(run.reporting);
  DeploymentSpec ref = spec;
  ref.parallel = ParallelConfig{};
  ref.parallel.tp_size = parallel.tp_size;
  for (std::size_t i = 0; i < ref.requests.size(); ++i)
    ref.requests[i].forced_outputs = run.report.results[i].output_tokens;
  const Launched<DeploymentReport> one = run_deployment(ref);
  ASSERT_EQ(run.report.results.size(), spec.requests.size());
  int excused = 0;
  for (std::size_t i = 0; i < spec.requests.size(); ++i) {
    const RequestResult& a = run.report.results[i];
    const RequestResult& b = one.report.results[i];
    ASSERT_EQ(a.state, RequestState::finished) << "request " << i << ": " << a.error;
    EXPECT_EQ(a.output_tokens.size(), static_cast<std::size_t>(spec.requests[i].max_new_tokens));
    EXPECT_EQ(a.output_tokens, b.output_tokens) << "request " << i;
    const ::testing::AssertionResult same =
        test::close_runs(a.step_logits, b.step_logits, tol, "DP attention vs DP 1");
    if (!same && routing != nullptr) {
      // The tokens the forwards saw: the prompt and every output but the last.
      std::vector<std::int32_t> seen = spec.requests[i].prompt;
      seen.insert(seen.end(), a.output_tokens.begin(), a.output_tokens.end() - 1);
      double margin = 0;
      test::naive_logits(spec.model.config, *routing, seen, &margin);
      if (margin < kRoutingTie) {
        ++excused;
        continue;
      }
    }
    EXPECT_TRUE(same) << "request " << i;
  }
  EXPECT_LE(excused, 1) << "requests whose routing came within " << kRoutingTie << " of a tie";
  // Every group served what the deal gave it, and holds only its own requests' KV.
  std::vector<std::int64_t> kv_tokens;
  for (const RequestSpec& r : spec.requests)
    kv_tokens.push_back(static_cast<std::int64_t>(r.prompt.size()) + r.max_new_tokens);
  const std::vector<int> deal = deal_requests(kv_tokens, parallel.dp_size);
  for (const RankKv& k : run.report.ranks) {
    std::int64_t dealt = 0;
    for (int g : deal) dealt += g == k.dp_rank;
    EXPECT_EQ(k.requests, dealt) << "rank " << k.rank;
    if (dealt == 0) {
      EXPECT_EQ(k.kv_rows_used, 0) << "an idle group holds no KV, rank " << k.rank;
    } else {
      EXPECT_GT(k.kv_rows_used, 0) << "rank " << k.rank;
    }
  }
}

TEST(DpAttention, DenseEqualsOneAttentionGroupWithUnevenGroups) {
  // Group 0 gets the 70-token prompt (5 prefill chunks); group 1 the three short ones, which
  // decode while group 0 still prefills, and finish at different steps.
  const DeploymentSpec spec =
      spec_for(preset_config("tiny", 2), {70, 9, 23, 5}, {4, 7, 2, 5});
  expect_equals_one_group(spec, dp_attention(4, 2, 2), {1e-10, 1e-5});
  expect_equals_one_group(spec, dp_attention(4, 4, 1), {1e-10, 1e-5});
}

TEST(DpAttention, MixtureOfExpertsEqualsOneAttentionGroup) {
  // DeepSeek-V3's family: FP8 projections, noaux_tc routing, a shared expert; the experts are
  // sharded over all 8 ranks while attention runs in groups of 4 and 2.
  // A token the router sends within rounding of a tie may rightly go to other experts in one of
  // the runs: such a request's logits are not compared (kRoutingTie).
  const DeploymentSpec spec =
      spec_for(family_config("deepseek-v3"), {33, 12, 20, 7, 15}, {3, 5, 4, 2, 3});
  const auto weights =
      make_synthetic_weights(spec.model.synthetic_seed, spec.model.config, spec.model.synthetic_dtype);
  expect_equals_one_group(spec, dp_attention(8, 2, 2), {1e-7, 1e-3}, weights.get());
  expect_equals_one_group(spec, dp_attention(8, 4, 2), {1e-7, 1e-3}, weights.get());
}

TEST(DpAttention, IdleGroupsTakePartWithoutKv) {
  // One request for four attention groups: three groups run every forward with no tokens.
  const DeploymentSpec spec = spec_for(preset_config("tiny", 2), {21}, {4});
  expect_equals_one_group(spec, dp_attention(8, 4, 2), {1e-10, 1e-5});
}

TEST(DpAttention, SpeculativeDecodingRunsInEachGroup) {
  // The draft is replicated on every rank; each group verifies its own drafts in the shared
  // decode forwards, and an idle group joins them empty. Greedy: equal to one group without a
  // draft.
  DeploymentSpec spec = spec_for(preset_config("tiny", 2), {30, 8, 14}, {6, 3, 5});
  spec.draft = spec.model;
  spec.draft->config.num_hidden_layers = 1;
  spec.engine.num_draft_tokens = 2;
  DeploymentSpec plain = spec;
  plain.draft.reset();
  plain.engine.num_draft_tokens = 0;
  plain.parallel.tp_size = 4;
  const Launched<DeploymentReport> one = run_deployment(plain);
  spec.parallel = dp_attention(4, 2, 2);
  spec.engine.record_logits = false;
  const Launched<DeploymentReport> run = run_deployment(spec);
  ASSERT_EQ(run.report.results.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(run.report.results[i].output_tokens, one.report.results[i].output_tokens)
        << "request " << i;
  }
  EXPECT_GT(run.report.stats.spec_verifications, 0);
}

}  // namespace
}  // namespace dcp
