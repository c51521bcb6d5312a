// Expert parallelism of the MoE layer: experts partitioned over EP ranks, each token dispatched
// to the ranks holding its experts by one all_to_all of counts and one all_to_all_v of rows, and
// back. Checked against the TP-sliced layer on the same weights, and the dispatch's entries and
// bytes against their formula.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "dcp/deployment.h"
#include "dcp/error.h"
#include "dcp/feed_forward.h"
#include "dcp/model_config.h"
#include "dcp/weights.h"
#include "test_util.h"

namespace dcp {
namespace {

struct RankOut {
  std::vector<float> y;  // the layer's output: partial outputs summed over the ranks
  MoeStats stats;
  std::uint64_t a2a_bytes = 0;  // all_to_all (and _v) bytes this rank sent
  int local_experts = 0;
};

// Runs layer 1 of `c` on `ranks` thread ranks with expert parallelism `ep` (1: TP-sliced).
std::vector<RankOut> run_layer(const ModelConfig& c, const WeightSource& w, int ranks, int ep,
                               const std::vector<float>& x, std::int64_t tokens) {
  std::vector<RankOut> out(static_cast<std::size_t>(ranks));
  launch_ranks({RankTransport::threads, ranks, {}}, [&](Communicator& world, bool) {
    const MoeLayer layer(c, w, 1, world.rank(), ranks, {ep, &world});
    RankOut& o = out[static_cast<std::size_t>(world.rank())];
    o.y.assign(static_cast<std::size_t>(tokens * c.hidden_size), -1.0f);
    const CommStats before = world.stats();
    layer.forward(x.data(), tokens, o.y.data(), &o.stats);
    o.a2a_bytes = (world.stats() - before)[Collective::all_to_all].bytes_sent;
    o.local_experts = layer.local_experts();
    if (tokens > 0) world.all_reduce(o.y.data(), o.y.data(), o.y.size(), ScalarType::f32);
  });
  return out;
}

TEST(ExpertParallel, EqualsTheSlicedLayerAndSendsWhatTheFormulaSays) {
  auto rng = test::make_rng();
  for (const char* family : {"deepseek-v3", "deepseek-v2-lite"}) {
    const ModelConfig c = family_config(family);
    ASSERT_TRUE(c.is_moe_layer(1));
    const auto w = make_synthetic_weights(rng.range(1, 1000), c, WeightDtype::bf16);
    const std::int64_t hidden = c.hidden_size;
    const int k = c.num_experts_per_tok;
    for (const auto [ranks, ep] : {std::array{4, 4}, std::array{4, 2}, std::array{6, 2},
                                   std::array{2, 2}}) {
      // Fewer tokens than ranks (ranks that route nothing), and more.
      for (const std::int64_t tokens : {std::int64_t{0}, std::int64_t{3}, std::int64_t{13}}) {
        const std::string what = str(family, ": ", ranks, " ranks, ep ", ep, ", ", tokens,
                                     " tokens");
        SCOPED_TRACE(what);
        std::vector<float> x(static_cast<std::size_t>(tokens * hidden));
        for (float& v : x) v = rng.normal();
        const std::vector<RankOut> sliced = run_layer(c, *w, ranks, 1, x, tokens);
        const std::vector<RankOut> parallel = run_layer(c, *w, ranks, ep, x, tokens);
        const int holders = ranks / ep;  // ranks holding slices of one expert
        std::int64_t entries = 0, sent = 0;
        std::uint64_t returned = 0;
        for (int r = 0; r < ranks; ++r) {
          const RankOut& o = parallel[static_cast<std::size_t>(r)];
          EXPECT_TRUE(test::close_runs(o.y, sliced[0].y, {1e-12, 1e-5}, what.c_str()))
              << "rank " << r;
          EXPECT_EQ(o.local_experts, c.n_routed_experts / ep);
          entries += o.stats.entries;
          sent += o.stats.entries_sent;
          returned += o.stats.return_bytes_sent;
          // Each entry: the expert (4 bytes) and the hidden state; counts are 8 bytes per peer.
          EXPECT_EQ(o.stats.dispatch_bytes_sent,
                    static_cast<std::size_t>(o.stats.entries_sent) * (hidden + 1) * 4);
          EXPECT_EQ(o.a2a_bytes, 8u * (ranks - 1) + o.stats.dispatch_bytes_sent +
                                     o.stats.return_bytes_sent);
        }
        // Every token goes to its k experts, each held in slices by `holders` ranks.
        EXPECT_EQ(entries, tokens * k * holders);
        // What went to other ranks comes back as outputs, one hidden row per entry.
        EXPECT_EQ(returned, static_cast<std::uint64_t>(sent) * hidden * 4);
      }
    }
  }
}

TEST(ExpertParallel, RefusesAPartitionThatDoesNotDivide) {
  const ModelConfig c = family_config("deepseek-v3");  // 32 routed experts
  const auto w = make_synthetic_weights(5, c, WeightDtype::bf16);
  launch_ranks({RankTransport::threads, 1, {}}, [&](Communicator& world, bool) {
    EXPECT_TRUE(test::throws_error([&] { MoeLayer(c, *w, 1, 0, 4, {3, &world}); },
                                   ErrorCategory::invalid_argument,
                                   "ep_size = 3 must divide tp_size = 4 and the model's "
                                   "n_routed_experts = 32; legal ep_size values: 1, 2, 4"));
    EXPECT_TRUE(test::throws_error([&] { MoeLayer(c, *w, 1, 0, 4, {2, nullptr}); },
                                   ErrorCategory::invalid_argument,
                                   "expert parallelism needs the layer's group"));
  });
  ParallelConfig pc;
  pc.tp_size = 4;
  pc.ep_size = 3;
  EXPECT_TRUE(test::throws_error([&] { resolve(pc); }, ErrorCategory::invalid_argument,
                                 "ep_size = 3 must divide tp_size = 4; legal ep_size values: 1, "
                                 "2, 4"));
}

}  // namespace
}  // namespace dcp
