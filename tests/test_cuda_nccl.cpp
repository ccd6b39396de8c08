// NCCL's deadline on a real GPU (dist/comm/nccl.h): an operation that never completes --
// here a receive that no send matches -- is noticed by the watch thread after the group's
// timeout, every communicator is aborted (ncclCommAbort) and on_failure ends the process
// with one line naming the operation. One GPU cannot hold two ranks of one NCCL
// communicator, so the stuck rank is a communicator of one, run in a child process (this
// test binary again) so that its end does not end the test. Skips without a GPU or NCCL.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <unistd.h>

#include "dist/comm/communicator.h"
#include "dist/comm/nccl.h"
#include "support/launch.h"
#include "tensor/cuda/runtime.h"
#include "tensor/tensor.h"

using namespace ndt;

namespace {

constexpr int kExitStuck = 6;  // train_gpt's exit code for a collective past its deadline

// The child: a receive from itself that nothing sends, with a 2 s deadline.
[[noreturn]] void stuck_receive() {
  auto group = dist::local_communicator("the stuck group");
  group->set_timeout(2);
  auto nccl = dist::nccl_communicator(group, 0, [](const std::string& line) {
    std::fprintf(stderr, "deadline: %s\n", line.c_str());
    std::fflush(stderr);
    std::_Exit(kExitStuck);
  });
  Tensor t = Tensor::zeros({4096}, DType::f32, Device::cuda(0));
  dist::WorkPtr w;
  try {
    w = nccl->recv(t, 0);  // queued: the host does not block in NCCL
  } catch (const std::exception& e) {
    std::fprintf(stderr, "the receive was refused: %s\n", e.what());
    std::_Exit(3);
  }
  std::this_thread::sleep_for(std::chrono::seconds(60));
  std::fprintf(stderr, "the watch never fired\n");
  std::_Exit(1);
}

TEST(CudaNccl, AnOperationPastItsDeadlineEndsTheProcessWithOneLine) {
  if (std::getenv("NDT_NCCL_STUCK_CHILD")) stuck_receive();
  if (!cuda::available() || !dist::nccl_compiled()) GTEST_SKIP() << "no GPU or no NCCL in this build";
  const auto t0 = std::chrono::steady_clock::now();
  const ndt::testing::ShellResult r = ndt::testing::run_shell(
      "NDT_NCCL_STUCK_CHILD=1 /proc/" + std::to_string(::getpid()) +
      "/exe --gtest_filter=CudaNccl.AnOperationPastItsDeadlineEndsTheProcessWithOneLine");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.rc, kExitStuck) << r.out;
  EXPECT_NE(r.out.find("deadline: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("recv"), std::string::npos) << "the line names the operation: " << r.out;
  EXPECT_LT(secs, 30) << "2 s deadline, then the abort: " << r.out;
}

}  // namespace
