// Topology validation and group construction.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "dcp/error.h"
#include "dcp/topology.h"
#include "test_util.h"

namespace dcp {
namespace {

ParallelConfig config(int tp, int dp, bool dp_attn, int dcp) {
  ParallelConfig c;
  c.tp_size = tp;
  c.dp_size = dp;
  c.enable_dp_attention = dp_attn;
  c.dcp_size = dcp;
  return c;
}

std::string rejection(const ParallelConfig& c) {
  try {
    validate(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Topology, SeedExampleTp64Dp4) {
  // TP 64, DP 4 with DP attention: attention TP 16. DCP 16 gives four 16-rank replicas.
  const Topology t = resolve(config(64, 4, true, 16));
  EXPECT_EQ(t.attn_tp_size, 16);
  EXPECT_EQ(t.num_dcp_groups, 4);
  const auto groups = t.dcp_groups();
  ASSERT_EQ(groups.size(), 4u);
  for (int g = 0; g < 4; ++g) {
    for (int k = 0; k < 16; ++k) EXPECT_EQ(groups[g][k], g * 16 + k);
  }
  // DCP 32 divides TP 64 (what upstream checks) but crosses a DP replica: rejected.
  const std::string why = rejection(config(64, 4, true, 32));
  EXPECT_NE(why.find("dcp_size = 32"), std::string::npos) << why;
  EXPECT_NE(why.find("attention TP size 16"), std::string::npos) << why;
  EXPECT_NE(why.find("legal dcp_size values: 1, 2, 4, 8, 16"), std::string::npos) << why;
}

TEST(Topology, ExhaustiveSmallConfigurations) {
  int accepted = 0;
  for (int tp = 1; tp <= 16; ++tp) {
    for (int dp = 1; dp <= 8; ++dp) {
      for (bool dp_attn : {false, true}) {
        for (int dcp = 1; dcp <= 16; ++dcp) {
          const ParallelConfig c = config(tp, dp, dp_attn, dcp);
          // The rule, stated independently of the implementation.
          const bool legal = tp % dcp == 0 && (!dp_attn || (tp % dp == 0 && (tp / dp) % dcp == 0));
          if (!legal) {
            EXPECT_THROW(validate(c), Error) << tp << " " << dp << " " << dp_attn << " " << dcp;
            continue;
          }
          ++accepted;
          const Topology t = resolve(c);
          const int world = dp_attn ? tp : tp * dp;
          ASSERT_EQ(t.world_size, world);
          std::set<int> seen;
          for (const auto& group : t.dcp_groups()) {
            ASSERT_EQ(static_cast<int>(group.size()), dcp);
            const int attn_group = t.ranks[group[0]].attn_tp_group;
            for (int k = 0; k < dcp; ++k) {
              const RankPlacement& p = t.ranks[group[k]];
              ASSERT_TRUE(seen.insert(group[k]).second) << "rank in two DCP groups";
              ASSERT_EQ(p.attn_tp_group, attn_group) << "DCP group crosses attention-TP groups";
              ASSERT_EQ(p.dcp_rank, k);
              ASSERT_EQ(p.dcp_rank, p.attn_tp_rank % dcp);
              if (k > 0) {
                ASSERT_EQ(group[k], group[k - 1] + 1) << "DCP groups are contiguous";
              }
            }
          }
          ASSERT_EQ(static_cast<int>(seen.size()), world) << "DCP groups partition the ranks";
        }
      }
    }
  }
  EXPECT_GT(accepted, 100);
}

TEST(Topology, BackendAutoRuleAndRejections) {
  ParallelConfig c = config(8, 1, false, 4);
  EXPECT_EQ(effective_backend(c), CombineBackend::a2a);  // CPU has an all-to-all path
  c.platform = Platform::blackwell_mnnvl();
  EXPECT_EQ(effective_backend(c), CombineBackend::fi_a2a);
  c.platform = Platform::cpu();
  c.platform.has_all_to_all = false;
  EXPECT_EQ(effective_backend(c), CombineBackend::ag_rs);
  EXPECT_EQ(effective_backend(config(8, 1, false, 1)), CombineBackend::ag_rs);

  c = config(8, 1, false, 4);
  c.dcp_comm_backend = CombineBackend::fi_a2a;
  try {
    validate(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::unsupported);
    EXPECT_NE(std::string(e.what()).find("MNNVL"), std::string::npos) << e.what();
  }
  c.platform = Platform::blackwell_mnnvl();
  EXPECT_NO_THROW(validate(c));

  c = config(8, 1, false, 1);
  c.dcp_comm_backend = CombineBackend::a2a;
  EXPECT_NE(rejection(c).find("needs dcp_size > 1"), std::string::npos);
  c.dcp_comm_backend = CombineBackend::ag_rs;
  EXPECT_EQ(rejection(c), "");

  c = config(8, 1, false, 4);
  c.replicate_q_proj = true;
  EXPECT_EQ(rejection(c), "");  // auto resolves to a2a
  c.dcp_comm_backend = CombineBackend::ag_rs;
  EXPECT_NE(rejection(c).find("replicate_q_proj needs an all-to-all"), std::string::npos);
  c = config(8, 1, false, 1);
  c.replicate_q_proj = true;
  EXPECT_NE(rejection(c).find("replicate_q_proj needs dcp_size > 1"), std::string::npos);

  c = config(8, 1, false, 2);
  c.pcp_size = 2;
  EXPECT_NE(rejection(c).find("prefill context parallelism"), std::string::npos);
  EXPECT_NE(rejection(config(8, 1, false, 0)).find("dcp_size = 0 must be >= 1"), std::string::npos);
  EXPECT_NE(rejection(config(8, 3, true, 1)).find("dp_size = 3 must divide tp_size = 8"),
            std::string::npos);
  EXPECT_NE(rejection(config(6, 1, false, 4)).find("legal dcp_size values: 1, 2, 3, 6"),
            std::string::npos);
  EXPECT_TRUE(test::throws_error([] { parse_combine_backend("nccl"); },
                                 ErrorCategory::invalid_argument,
                                 "dcp_comm_backend = 'nccl' is not one of: ag_rs, a2a, fi_a2a"));
  EXPECT_TRUE(test::throws_error([] { Platform::parse("tpu"); }, ErrorCategory::invalid_argument,
                                 "platform = 'tpu' is not one of: cpu, cuda, blackwell-mnnvl"));
}

}  // namespace
}  // namespace dcp
