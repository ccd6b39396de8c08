// train_gpt --plan against the run it plans: for several layouts (one process, FSDP, DP,
// TP, CP, HSDP, FSDP x CP x TP on 8 ranks, and activation checkpointing), the planned peak
// bytes of rank 0 are within 10% of the allocator's measured peak (mem_peak of a step after
// the first, in metrics.jsonl), and the planned bytes sent per step within 10% of the
// communicators' counters (comm_bytes). --plan needs no MPI, no data and no memory; a
// dp_shard_size of -1 needs --plan.world.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>
#include "support/corpus.h"
#include "support/launch.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

using namespace ndt;
using namespace ndt::testing;  // Layout, mpirun, run_shell (tests/support/launch.h)
namespace fs = std::filesystem;

namespace {

using Result = ShellResult;

class DistPlan : public ::testing::TestWithParam<Layout> {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("ndt_test_dist_plan_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    const int64_t V = ndt::testing::write_word_corpus(dir_ / "data", 20000, 7, 0.0);
    // a model whose activations outweigh its parameters, so the bound tests the activations
    std::ofstream(dir_ / "gpt.ini")
        << "[model]\nn_layer = 2\nn_head = 4\nn_embd = 64\nvocab_multiple = 8\n"
           "vocab_size = "
        << V << "\nblock_size = 64\n[data]\ntrain = " << (dir_ / "data" / "train_*.bin").string()
        << "\n[train]\nmicro_batch_size = 8\nseq_len = 64\nsteps = 3\nthreads = 1\n"
           "eval_every = 0\n[sample]\nevery = -1\n[log]\nevery = 1\n";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static fs::path dir_;
};
fs::path DistPlan::dir_;

TEST_P(DistPlan, PlannedBytesMatchTheRun) {
  const Layout& l = GetParam();
  const std::string base =
      std::string(NDT_TRAIN_GPT_BIN) + " --config " + (dir_ / "gpt.ini").string() + l.args();
  const Result planned = run_shell(base + " --plan --json");
  ASSERT_EQ(planned.rc, 0) << planned.out;
  const nlohmann::json plan = nlohmann::json::parse(planned.out);
  const fs::path metrics = dir_ / (std::string(l.name) + ".jsonl");
  const Result run =
      run_shell((l.np() > 1 ? mpirun(l.np()) : std::string()) + base + " --log.metrics " + metrics.string());
  ASSERT_EQ(run.rc, 0) << run.out;
  // step 3: the first step warms the allocator's cache and the communicators
  nlohmann::json last;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("mem_peak")) last = j;
  }
  ASSERT_FALSE(last.is_null());
  ASSERT_EQ(last["step"].get<int64_t>(), 3);
  const double mem = last["mem_peak"].get<double>(), comm = last["comm_bytes"].get<double>();
  const double pmem = plan["memory"]["peak"].get<double>(), pcomm = plan["comm_bytes"].get<double>();
  std::printf(
      "[ plan     ] %-22s peak planned %9.0f measured %9.0f (%+.1f%%) | comm planned %9.0f measured %9.0f\n",
      l.name, pmem, mem, 100 * (pmem / mem - 1), pcomm, comm);
  EXPECT_NEAR(pmem / mem, 1.0, 0.10) << "planned peak " << pmem << " measured " << mem << "\n" << planned.out;
  if (l.np() == 1)
    EXPECT_EQ(comm, 0);
  else
    EXPECT_NEAR(pcomm / comm, 1.0, 0.10) << "planned comm " << pcomm << " measured " << comm << "\n"
                                         << planned.out;
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DistPlan,
    ::testing::Values(Layout{"single", 1, 1, 1, 1}, Layout{"fsdp2", 1, 2, 1, 1}, Layout{"dp2", 2, 1, 1, 1},
                      Layout{"tp2", 1, 1, 1, 2}, Layout{"cp2", 1, 1, 2, 1}, Layout{"hsdp2x2", 2, 2, 1, 1},
                      Layout{"shard2_cp2_tp2", 1, 2, 2, 2},
                      Layout{"fsdp2_full_ac", 1, 2, 1, 1, "--train.activation_checkpointing full"},
                      Layout{"tp2_selective_ac_accum2", 1, 1, 1, 2,
                             "--train.activation_checkpointing selective --train.grad_accum_steps 2"}),
    [](const ::testing::TestParamInfo<Layout>& i) { return std::string(i.param.name); });

TEST(Plan, NeedsTheWorldForTheRestOfIt) {
  const std::string bin = NDT_TRAIN_GPT_BIN;
  Result r = run_shell(bin + " --plan --parallel.dp_shard_size -1");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--plan.world"), std::string::npos) << r.out;
  r = run_shell(bin + " --plan --json --parallel.dp_shard_size -1 --parallel.tp_size 2 --plan.world 8");
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["layout"]["dp_shard"].get<int64_t>(), 4);
  // a layout that does not fill the world is refused like the trainer refuses it
  r = run_shell(bin + " --plan --parallel.dp_shard_size 3 --plan.world 8");
  EXPECT_EQ(r.rc, 2) << r.out;
}

TEST(Plan, SizesBeyond64BitsAreOneConfigErrorNamingTheCount) {
  // every size within its key's range, the products beyond int64: one line naming what
  // overflowed, exit 2 -- never a wrapped count such as "= 0 ranks" or "0 tokens per step"
  const std::string bin = std::string(NDT_TRAIN_GPT_BIN) + " --plan";
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      // 2^20 sequences x 2^20 accumulation x 2^40 data-parallel ranks
      {" --train.micro_batch_size 1048576 --train.seq_len 1 --train.grad_accum_steps 1048576"
       " --parallel.dp_replicate_size 1048576 --parallel.dp_shard_size 1048576",
       "a count of the batch (train.micro_batch_size x grad_accum_steps x data-parallel ranks x seq_len)"},
      // B NH T^2 attention probabilities of 2^61 elements in each of 1024 blocks
      {" --model.n_layer 1024 --model.n_head 1024 --model.n_embd 65536 --model.block_size 1048576"
       " --train.seq_len 1048576 --train.micro_batch_size 2048",
       "a count of the activations of one micro-step"},
      // 2^20 x 2^20 x 2^16 x 2^16 ranks
      {" --parallel.dp_replicate_size 1048576 --parallel.dp_shard_size 1048576 --parallel.cp_size 65536"
       " --parallel.tp_size 65536 --model.block_size 131072 --train.seq_len 131072"
       " --train.micro_batch_size 1",
       "the world, parallel.dp_replicate_size x dp_shard_size x cp_size x tp_size, does not fit in 64 bits"},
      {" --plan.world 4611686018427387904 --parallel.dp_shard_size -1",
       "plan.world = 4611686018427387904 is outside"},
  };
  for (const Case& c : cases) {
    const Result r = run_shell(bin + c.args);
    EXPECT_EQ(r.rc, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find("train_gpt: config error: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line: " << r.out;
  }
  // the largest world --plan.world takes, with a batch that fits, plans
  const Result r = run_shell(bin + " --json --plan.world 1099511627776 --parallel.dp_shard_size -1");
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["layout"]["world"].get<int64_t>(), int64_t(1) << 40);
  EXPECT_GT(j["batch"]["tokens"].get<int64_t>(), 0);
}

}  // namespace
