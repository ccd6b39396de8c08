// main() of the distributed test programs (tests/test_mpi_*.cpp), run under mpirun:
// every rank runs every test; rank 0 prints the usual report, the other ranks only their
// failures (prefixed with the rank); the program fails when any rank failed.
// Like train_gpt, each rank first picks the OpenBLAS kernel (may re-execute, before MPI
// starts), so that every rank and every program computes with the same GEMM kernels.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "dist/comm/mpi.h"
#include "dist_testing.h"
#include "tensor/threads.h"

namespace ndt::testing {
namespace {
std::shared_ptr<dist::Communicator> g_world;

// The failures of a rank other than 0, one line each with its rank, test and place.
class RankFailures : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailures(int rank) : rank_(rank) {}
  void OnTestStart(const ::testing::TestInfo& t) override {
    test_ = std::string(t.test_suite_name()) + "." + t.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {  // gtest's lock is held here
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: %s\n", rank_, test_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }

 private:
  int rank_;
  std::string test_;
};
}  // namespace
std::shared_ptr<dist::Communicator> world() { return g_world; }
}  // namespace ndt::testing

int main(int argc, char** argv) {
  ndt::use_cpu_defaults(argv);
  ::testing::InitGoogleTest(&argc, argv);
  ndt::testing::g_world = ndt::dist::init_world(/*force_mpi=*/true);
  ndt::set_num_threads(1);
  auto& world = *ndt::testing::g_world;
  if (world.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new ndt::testing::RankFailures(world.rank()));
  }
  const int rc = RUN_ALL_TESTS();
  // a failure on any rank fails the program on every rank
  const double failed = world.all_reduce_scalar(rc != 0 ? 1.0 : 0.0, ndt::dist::ReduceOp::kMax);
  if (world.rank() == 0)
    std::printf("[dist] %d ranks: %s\n", world.size(),
                failed > 0 ? "FAILED on some rank" : "passed on every rank");
  return failed > 0 ? 1 : 0;
}
