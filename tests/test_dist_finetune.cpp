// Fine-tuning data (prepare_text's .jsonl chat rows: loss masks and documents, packed into
// rows) under mpirun: data parallelism over packed rows, tensor parallelism and a two-stage
// pipeline (the documents reach every stage) give one process's losses, step by step; context
// parallelism refuses such data at start with one line naming parallel.cp_size.
#include <gtest/gtest.h>

#include "support/hf_fixture.h"
#include "support/launch.h"
#include "support/testing.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

using namespace ndt;
using namespace ndt::testing;
namespace fs = std::filesystem;

namespace {

// Chat rows whose answers follow from their questions, some with a system message.
std::string chat_rows(int n) {
  std::string rows;
  for (int i = 0; i < n; ++i) {
    const std::string k = std::to_string(i % 5);
    const std::string system = i % 2 ? R"({"role": "system", "content": "be short"}, )" : "";
    rows += R"({"messages": [)" + system + R"({"role": "user", "content": "the cat )" + k +
            R"("}, {"role": "assistant", "content": "the hat )" + k + k + R"("}]})" + "\n";
  }
  return rows;
}

std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> l;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) l.push_back(j["loss"].get<double>());
  }
  return l;
}

class DistFinetune : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fresh_dir("dist_finetune");
    write_tiny_hf_folder(dir_ / "model");
    write_tiny_chat_template(dir_ / "model");
    std::ofstream(dir_ / "chat.jsonl") << chat_rows(60);
    const ShellResult r = run_shell(std::string(NDT_PREPARE_TEXT_BIN) + " --out " + (dir_ / "chat").string() +
                                    " --tokenizer " + (dir_ / "model").string() + " --val_fraction 0.15 " +
                                    (dir_ / "chat.jsonl").string() + " 2>&1");
    ASSERT_EQ(r.rc, 0) << r.out;
    std::ofstream(dir_ / "gpt.ini")
        << "[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nvocab_size = 264\n"
           "vocab_multiple = 4\nblock_size = 128\n[data]\ntrain = "
        << (dir_ / "chat" / "train_*.bin").string() << "\nval = " << (dir_ / "chat" / "val_*.bin").string()
        << "\n[train]\nseq_len = 128\nmicro_batch_size = 2\ngrad_accum_steps = 2\n"
           "steps = 5\nthreads = 1\nseed = 3\n[optim]\nlr = 0.01\nwarmup_steps = 1\n"
           "eps = 1e-4\n[sample]\nevery = -1\n[log]\nevery = 1\n";
  }
  // train_gpt on np ranks (mpirun when np > 1) with `args`; its losses in dir_/name/metrics.jsonl
  static ShellResult train(const std::string& name, int np, const std::string& args) {
    fs::create_directories(dir_ / name);
    return run_shell((np > 1 ? mpirun(np) : std::string()) + NDT_TRAIN_GPT_BIN + " --config " +
                     (dir_ / "gpt.ini").string() + " --log.metrics " +
                     (dir_ / name / "metrics.jsonl").string() + " " + args + " 2>&1");
  }
  // Each layout's losses on np = 2 ranks equal one process's, step by step, within rel (all
  // runs with `common` args too).
  static void expect_layouts_equal_one_process(
      const std::vector<std::pair<std::string, std::string>>& layouts, const std::string& single, double rel,
      const std::string& common = "") {
    ShellResult r = train(single, 1, common);
    ASSERT_EQ(r.rc, 0) << r.out;
    const std::vector<double> want = losses(dir_ / single / "metrics.jsonl");
    ASSERT_EQ(want.size(), 5u);
    for (const auto& [name, args] : layouts) {
      SCOPED_TRACE(name);
      r = train(name, 2, args + " " + common);
      ASSERT_EQ(r.rc, 0) << r.out;
      const std::vector<double> got = losses(dir_ / name / "metrics.jsonl");
      ASSERT_EQ(got.size(), 5u);
      for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(got[i], want[i], rel * want[i]) << "step " << i + 1;
    }
  }
  static fs::path dir_;
};
fs::path DistFinetune::dir_;

// Data parallelism: the ranks' micro-batches train unequal numbers of tokens (rows with and
// without a system message), and the step's loss is the mean over every trained token of the
// global batch, as one process on the whole batch, not a mean of the ranks' means.
TEST_F(DistFinetune, DataParallelLayoutsEqualOneProcessOverUnequalTrainedTokens) {
  expect_layouts_equal_one_process({{"dp2", "--parallel.dp_replicate_size 2 --train.micro_batch_size 1"},
                                    {"fsdp2", "--parallel.dp_shard_size 2 --train.micro_batch_size 1"}},
                                   "single_dp", 1e-5);
}

// Packed rows, shuffled each epoch by the seed (rows of 256: 5 steps of 4 rows cross two
// epochs' ends): two data-parallel ranks of one row each read the rows one process reads two
// at a time.
TEST_F(DistFinetune, DataParallelRanksReadOneProcessPackedRowsAcrossEpochs) {
  expect_layouts_equal_one_process(
      {{"dp2_shuffled", "--parallel.dp_replicate_size 2 --train.micro_batch_size 1"}}, "single_shuffled",
      1e-5, "--data.shuffle true --model.block_size 256 --train.seq_len 256");
}

TEST_F(DistFinetune, TensorAndPipelineParallelLayoutsEqualOneProcessOnChatData) {
  expect_layouts_equal_one_process({{"tp2", "--parallel.tp_size 2"}, {"pp2", "--parallel.pp_size 2"}},
                                   "single", 1e-4);
}

// LoRA on the weights a full run trained: the adapters, whole on every rank, averaged over the
// data-parallel ranks; under FSDP the frozen base sharded, gathered for each block and never
// reduced (also with activation checkpointing's recompute in backward). Tensor parallelism is
// refused at start with one line.
TEST_F(DistFinetune, LoraDataParallelAndFsdpEqualOneProcess) {
  const ShellResult base =
      train("lora_base", 1,
            "--checkpoint.dir " + (dir_ / "lora_base" / "ckpt").string() + " --checkpoint.format full");
  ASSERT_EQ(base.rc, 0) << base.out;
  const std::string lora = "--model.init_from " +
                           (dir_ / "lora_base" / "ckpt" / "step_00000005" / "model.safetensors").string() +
                           " --lora.rank 4 --lora.alpha 16 --lora.targets all-linear";
  expect_layouts_equal_one_process({{"lora_dp2", "--parallel.dp_replicate_size 2 --train.micro_batch_size 1"},
                                    {"lora_fsdp2", "--parallel.dp_shard_size 2 --train.micro_batch_size 1"},
                                    {"lora_fsdp2_ac",
                                     "--parallel.dp_shard_size 2 --train.micro_batch_size 1 "
                                     "--train.activation_checkpointing full"}},
                                   "lora_single", 1e-5, lora);
  const ShellResult tp = train("lora_tp2", 2, "--parallel.tp_size 2 " + lora);
  EXPECT_NE(tp.rc, 0) << tp.out;
  EXPECT_NE(
      tp.out.find("parallel.tp_size = 2: LoRA (lora.rank > 0) does not run with tensor parallelism yet"),
      std::string::npos)
      << tp.out;
}

TEST_F(DistFinetune, ContextParallelismRefusesDocumentsAtStartNamingTheKey) {
  const ShellResult r = train("cp2", 2, "--parallel.cp_size 2");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("parallel.cp_size = 2: the data"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step    1/"), std::string::npos) << "refused before any step:\n" << r.out;
}

}  // namespace
