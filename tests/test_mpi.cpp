// The same communicator and DCP-step checks on MPI, one process per rank. ctest runs this
// binary under mpirun with 2 and 4 processes. A failed check aborts the MPI job (no hang).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "comm_checks.h"
#include "dcp/comm_mpi.h"
#include "dcp/error.h"
#include "test_util.h"

namespace dcp {
namespace {

Communicator* g_world = nullptr;

// Runs a check on every rank; a failure on any rank fails the test on every rank.
template <typename F>
void on_all_ranks(F&& check) {
  int failed = 0;
  try {
    check(*g_world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s\n", g_world->rank(), e.what());
    failed = 1;
  }
  int any = 0;
  g_world->all_reduce(&failed, &any, 1, ScalarType::i32, ReduceOp::max);
  EXPECT_EQ(any, 0) << "a check failed on some rank (see stderr)";
}

TEST(CommMpi, Collectives) {
  on_all_ranks([](Communicator& c) { test::check_collectives(c, 1 << 20); });
}
TEST(CommMpi, Split) {
  on_all_ranks([](Communicator& c) { test::check_split(c); });
}
TEST(CommMpi, PatientBroadcast) {
  on_all_ranks([](Communicator& c) { test::check_patient_broadcast(c); });
}
TEST(CommMpi, ProbeAndMessages) {
  on_all_ranks([](Communicator& c) { test::check_probe_and_messages(c); });
}
TEST(CommMpi, ByteAccounting) {
  on_all_ranks([](Communicator& c) { test::check_byte_accounting(c); });
}

TEST(DcpAttentionMpi, EqualsFullAttentionOnEveryConfiguration) {
  std::uint64_t seed = test::test_seed();  // rank 0's seed for everyone
  g_world->broadcast(&seed, sizeof seed, 0);
  on_all_ranks([seed](Communicator& c) { test::check_dcp_step(c, seed); });
}

}  // namespace
}  // namespace dcp

int main(int argc, char** argv) {
  dcp::MpiSession mpi(&argc, &argv);
  std::unique_ptr<dcp::Communicator> world = mpi.world();
  dcp::g_world = world.get();
  ::testing::InitGoogleTest(&argc, argv);
  if (world->rank() != 0) {  // one rank prints the report; failures still reach stderr
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  world.reset();
  return rc;
}
