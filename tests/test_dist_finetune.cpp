// Fine-tuning data (prepare_text's .jsonl chat rows: loss masks and documents, packed into
// rows) under mpirun: data parallelism over packed rows, tensor parallelism, a two-stage
// pipeline (the documents reach every stage) and context parallelism (documents across the
// ring's chunks; with data and with tensor parallelism) give one process's losses, step by
// step, and (context parallelism) its first step's gradients; a run resumed under another
// layout goes on with the same rows.
#include <gtest/gtest.h>

#include "support/hf_fixture.h"
#include "support/launch.h"
#include "support/outputs.h"
#include "support/testing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "train/checkpoint/lora.h"
#include "train/io/safetensors.h"

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
  // and its first step's gradients in dir_/name/grads.safetensors
  static ShellResult train(const std::string& name, int np, const std::string& args) {
    fs::create_directories(dir_ / name);
    return run_shell((np > 1 ? mpirun(np) : std::string()) + NDT_TRAIN_GPT_BIN + " --config " +
                     (dir_ / "gpt.ini").string() + " --log.metrics " +
                     (dir_ / name / "metrics.jsonl").string() + " --log.grads " +
                     (dir_ / name / "grads.safetensors").string() + " " + args + " 2>&1");
  }
  // Each layout's losses on np ranks equal one process's, step by step, within rel (all runs
  // with `common` args too); with grad_rel > 0, the first step's gradients too, within it.
  static void expect_layouts_equal_one_process(
      const std::vector<std::pair<std::string, std::string>>& layouts, const std::string& single, double rel,
      const std::string& common = "", int np = 2, double grad_rel = 0) {
    ShellResult r = train(single, 1, common);
    ASSERT_EQ(r.rc, 0) << r.out;
    const std::vector<double> want = metric_losses(dir_ / single / "metrics.jsonl");
    ASSERT_EQ(want.size(), 5u);
    for (const auto& [name, args] : layouts) {
      SCOPED_TRACE(name);
      r = train(name, np, args + " " + common);
      ASSERT_EQ(r.rc, 0) << r.out;
      const std::vector<double> got = metric_losses(dir_ / name / "metrics.jsonl");
      ASSERT_EQ(got.size(), 5u);
      for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(got[i], want[i], rel * want[i]) << "step " << i + 1;
      if (grad_rel <= 0) continue;
      const double g = max_rel_diff(dir_ / name / "grads.safetensors", dir_ / single / "grads.safetensors");
      EXPECT_LT(g, grad_rel) << "gradients of the first step";
      std::printf("%-12s %d ranks: losses %.6f..%.6f, first-step gradients within %.1e\n", name.c_str(), np,
                  got.front(), got.back(), g);
    }
  }
  // LoRA's base: the weights of a full run of `args` (trained once per suite, in dir_/name);
  // the arguments of a LoRA run on it (rank 4, every linear)
  static std::string lora_on_base(const std::string& name, const std::string& args) {
    const fs::path w = dir_ / name / "ckpt" / "step_00000005" / "model.safetensors";
    if (!fs::exists(w)) {
      const ShellResult r =
          train(name, 1,
                "--checkpoint.dir " + (dir_ / name / "ckpt").string() + " --checkpoint.format full " + args);
      EXPECT_EQ(r.rc, 0) << r.out;
    }
    return "--model.init_from " + w.string() + " --lora.rank 4 --lora.alpha 16 --lora.targets all-linear " +
           args;
  }
  // LoRA layouts (np ranks) against one process: the losses, the adapters' first-step
  // gradients and the adapters the last step saved, within rel.
  static void expect_lora_layouts_equal_one_process(
      const std::vector<std::pair<std::string, std::string>>& layouts, const std::string& single,
      const std::string& lora, int np = 2, double rel = 1e-4) {
    auto saved = [](const std::string& name) {
      return " --checkpoint.dir " + (dir_ / name / "ckpt").string();
    };
    auto adapters = [](const std::string& name) {
      return dir_ / name / "ckpt" / "step_00000005" / "model.safetensors";
    };
    fs::remove_all(dir_ / single / "ckpt");
    ShellResult r = train(single, 1, lora + saved(single));
    ASSERT_EQ(r.rc, 0) << r.out;
    const std::vector<double> want = metric_losses(dir_ / single / "metrics.jsonl");
    ASSERT_EQ(want.size(), 5u);
    for (const auto& [name, args] : layouts) {
      SCOPED_TRACE(name);
      fs::remove_all(dir_ / name / "ckpt");
      r = train(name, np, args + " " + lora + saved(name));
      ASSERT_EQ(r.rc, 0) << r.out;
      const std::vector<double> got = metric_losses(dir_ / name / "metrics.jsonl");
      ASSERT_EQ(got.size(), 5u);
      for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(got[i], want[i], rel * want[i]) << "step " << i + 1;
      const double g = max_rel_diff(dir_ / name / "grads.safetensors", dir_ / single / "grads.safetensors");
      const double a = max_rel_diff(adapters(name), adapters(single));
      EXPECT_LT(g, rel) << "the adapters' gradients of the first step";
      EXPECT_LT(a, rel) << "the adapters after the last step";
      std::printf(
          "%-14s %d ranks: losses %.6f..%.6f, first-step gradients within %.1e, adapters within %.1e\n",
          name.c_str(), np, got.front(), got.back(), g, a);
    }
  }
  static fs::path dir_;
};
fs::path DistFinetune::dir_;

// A Llama with grouped-query attention (4 query heads over 2 kv heads, packed q/k/v)
const std::string kLlamaGqa =
    "--model.arch llama --model.n_head 4 --model.n_kv_head 2 --model.intermediate_size 48";

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

// The data position survives a change of layout: a run of 10 steps on shuffled packed rows
// (rows of 256, crossing epochs), stopped every 2 steps and resumed under another layout
// (FSDP over 2 ranks, then tensor parallelism, a two-stage pipeline, context parallelism, one process),
// trains on the rows the uninterrupted run trains on: the same losses, step by step.
TEST_F(DistFinetune, ResumedUnderAnotherLayoutTheRunTrainsOnTheSameRows) {
  const std::string common =
      "--data.shuffle true --model.block_size 256 --train.seq_len 256 --train.steps 10 "
      "--train.micro_batch_size 1";
  ShellResult r = train("whole", 1, common);
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::vector<double> want = metric_losses(dir_ / "whole" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 10u);
  const std::string ckpt = " --checkpoint.dir " + (dir_ / "relay" / "ckpt").string();
  const std::vector<std::pair<int, std::string>> legs = {
      {2, "--parallel.dp_shard_size 2 --train.grad_accum_steps 1"},
      {2, "--parallel.tp_size 2 --checkpoint.resume true"},
      {2, "--parallel.pp_size 2 --checkpoint.resume true"},
      {2, "--parallel.cp_size 2 --checkpoint.resume true"},
      {1, "--checkpoint.resume true"}};
  for (size_t k = 0; k < legs.size(); ++k) {
    const std::string stop = k + 1 < legs.size() ? " --train.stop_after " + std::to_string(2 * (k + 1)) : "";
    r = train("relay", legs[k].first, common + " " + legs[k].second + ckpt + stop);
    ASSERT_EQ(r.rc, 0) << "leg " << k << "\n" << r.out;
  }
  const std::vector<double> got = metric_losses(dir_ / "relay" / "metrics.jsonl");
  ASSERT_EQ(got.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_NEAR(got[i], want[i], 1e-4 * want[i]) << "step " << i + 1;
}

// Context parallelism: each row's 128 tokens in 4 chunks of 32, the documents (and their
// trained tokens) falling unequally on the two ranks, some across chunks; the positions
// restart at each document's start on whichever rank holds it: GPT-2's learned positions, and
// a Llama's rotary ones (grouped-query attention, 2 query heads over 1 kv head).
TEST_F(DistFinetune, ContextParallelEqualsOneProcessOnChatData) {
  expect_layouts_equal_one_process({{"cp2", "--parallel.cp_size 2"}}, "single_cp", 1e-5, "", 2, 1e-5);
  expect_layouts_equal_one_process({{"llama_cp2", "--parallel.cp_size 2"}}, "llama_single_cp", 1e-5,
                                   "--model.arch llama --model.n_kv_head 1 --model.intermediate_size 48", 2,
                                   1e-5);
}

// ... and with data parallelism (one row per rank and micro-step) and with tensor parallelism
TEST_F(DistFinetune, ContextParallelWithDataOrTensorParallelEqualsOneProcessOnChatData) {
  expect_layouts_equal_one_process({{"cp2_dp2",
                                     "--parallel.cp_size 2 --parallel.dp_replicate_size 2 "
                                     "--train.micro_batch_size 1"},
                                    {"cp2_tp2", "--parallel.cp_size 2 --parallel.tp_size 2"}},
                                   "single_cp4", 1e-5, "", 4, 1e-5);
}

// The other layouts on packed chat rows: HSDP (2 replicas of 2 shards), tensor parallelism
// with sequence parallelism (the documents' rows split between the attention and the MLP),
// and the 3-D mesh of context, tensor and pipeline parallelism over 8 ranks.
TEST_F(DistFinetune, HsdpSequenceParallelAndThreeDimensionsEqualOneProcessOnChatData) {
  expect_layouts_equal_one_process(
      {{"hsdp",
        "--parallel.dp_replicate_size 2 --parallel.dp_shard_size 2 --train.micro_batch_size 1 "
        "--train.grad_accum_steps 1"}},
      "single_hsdp", 1e-5, "", 4);
  expect_layouts_equal_one_process({{"tp2_sp", "--parallel.tp_size 2 --parallel.sequence_parallel true"}},
                                   "single_tp_sp", 1e-4);
  expect_layouts_equal_one_process(
      {{"cp2_tp2_pp2", "--parallel.cp_size 2 --parallel.tp_size 2 --parallel.pp_size 2"}}, "single_3d", 1e-4,
      "", 8);
}

// Ulysses sequence parallelism on packed rows: each rank a contiguous half of every row, the
// attention over the whole row with the whole rows' documents (no extra traffic), the trained
// tokens falling unequally on the two ranks; a Llama with one kv head, replicated to both ranks.
TEST_F(DistFinetune, UlyssesEqualsOneProcessOnChatData) {
  expect_layouts_equal_one_process({{"sp2", "--parallel.sp_size 2"}}, "single_sp", 1e-5, "", 2, 1e-5);
  expect_layouts_equal_one_process({{"llama_sp2", "--parallel.sp_size 2"}}, "llama_single_sp", 1e-5,
                                   "--model.arch llama --model.n_kv_head 1 --model.intermediate_size 48", 2,
                                   1e-5);
}

// Ulysses inside the ring (USP, 4 ranks: cp 2 x sp 2) on packed rows: each cp rank's two chunks
// of 32 tokens, one per sp rank; the documents cross the chunks and the ranks, and every rank
// holds the whole rows' for the ring's masks and the positions; GPT-2, and a Llama with one kv
// head, replicated to both sp ranks.
TEST_F(DistFinetune, UlyssesInsideTheRingEqualsOneProcessOnChatData) {
  expect_layouts_equal_one_process({{"sp2_cp2", "--parallel.sp_size 2 --parallel.cp_size 2"}}, "single_sp_cp",
                                   1e-5, "", 4, 1e-5);
  expect_layouts_equal_one_process(
      {{"llama_sp2_cp2", "--parallel.sp_size 2 --parallel.cp_size 2"}}, "llama_single_sp_cp", 1e-5,
      "--model.arch llama --model.n_kv_head 1 --model.intermediate_size 48", 4, 1e-5);
}

// LoRA on the weights a full run trained: the adapters, whole on every rank, averaged over the
// data-parallel ranks; under FSDP the frozen base sharded, gathered for each block and never
// reduced (also with activation checkpointing's recompute in backward).
TEST_F(DistFinetune, LoraDataParallelAndFsdpEqualOneProcess) {
  const std::string lora = lora_on_base("lora_base", "");
  expect_layouts_equal_one_process({{"lora_dp2", "--parallel.dp_replicate_size 2 --train.micro_batch_size 1"},
                                    {"lora_fsdp2", "--parallel.dp_shard_size 2 --train.micro_batch_size 1"},
                                    {"lora_fsdp2_ac",
                                     "--parallel.dp_shard_size 2 --train.micro_batch_size 1 "
                                     "--train.activation_checkpointing full"}},
                                   "lora_single", 1e-5, lora);
}

// Tensor parallelism, Megatron's LoRA: on column-parallel linears B split with the linear's
// columns (GPT-2's c_attn in its q, k and v blocks; the Llama's packed q/k/v by kv groups,
// 4 query heads over 2 kv heads) and A whole, its gradient summed over the tp ranks; on
// row-parallel ones A split with the rows and B whole, the partial deltas summed with the
// GEMM's. With sequence parallelism too, and inside FSDP and context parallelism. The losses, the first
// step's gradients and the adapters after 5 steps equal one process's.
TEST_F(DistFinetune, LoraTensorParallelEqualsOneProcess) {
  expect_lora_layouts_equal_one_process(
      {{"lora_tp2", "--parallel.tp_size 2"},
       {"lora_tp2_sp", "--parallel.tp_size 2 --parallel.sequence_parallel true"}},
      "lora_single_tp", lora_on_base("lora_base", ""));
  expect_lora_layouts_equal_one_process({{"lora_llama_tp2", "--parallel.tp_size 2"}}, "lora_llama_single",
                                        lora_on_base("lora_llama_base", kLlamaGqa));
  // ... with FSDP (the base sharded too, the adapters averaged over the data ranks) and with
  // context parallelism (over the cp ranks)
  expect_lora_layouts_equal_one_process(
      {{"lora_fsdp2_tp2", "--parallel.dp_shard_size 2 --parallel.tp_size 2 --train.micro_batch_size 1"},
       {"lora_cp2_tp2", "--parallel.cp_size 2 --parallel.tp_size 2"}},
      "lora_llama_single4", lora_on_base("lora_llama_base", kLlamaGqa), 4);
}

// lora.dropout: the mask of an element is keyed by its token in the micro-step's tokens over
// the data ranks and its channel of the linear's whole input, so a data-parallel rank (its
// rows) and a tensor-parallel one (a row-parallel linear's input columns: o_proj, down_proj)
// drop what one process drops, and a pipeline's stages (the schedule's order of micro-batches)
// too: the losses, gradients and adapters equal one process's. And
// the dropout is there: the run's later losses differ from the same run without it.
TEST_F(DistFinetune, LoraDropoutUnderDataAndTensorParallelismEqualsOneProcess) {
  const std::string lora = lora_on_base("lora_llama_base", kLlamaGqa);
  expect_lora_layouts_equal_one_process(
      {{"lora_drop_dp2", "--parallel.dp_replicate_size 2 --train.micro_batch_size 1"},
       {"lora_drop_tp2", "--parallel.tp_size 2"},
       {"lora_drop_pp2", "--parallel.pp_size 2"}},
      "lora_drop_single", lora + " --lora.dropout 0.3");
  ASSERT_EQ(train("lora_nodrop_single", 1, lora).rc, 0);
  const std::vector<double> drop = metric_losses(dir_ / "lora_drop_single" / "metrics.jsonl"),
                            none = metric_losses(dir_ / "lora_nodrop_single" / "metrics.jsonl");
  ASSERT_EQ(drop.size(), none.size());
  EXPECT_EQ(drop.front(), none.front());  // step 1: B = 0, the adapters add nothing either way
  EXPECT_NE(drop.back(), none.back());
}

// ... and under context parallelism (each rank its head and tail chunks of every row),
// Ulysses (a contiguous half of every row) and both (USP over 4 ranks: a half of each cp rank's
// chunks; and cp with tp, a row-parallel linear's columns of the chunks), where a rank's tokens
// of a row are pieces of it: keyed by their positions in the row
// (not in their documents: the rows are packed chat documents, whose positions restart at each
// document's start), the losses, gradients and adapters equal one process's.
TEST_F(DistFinetune, LoraDropoutUnderContextParallelAndUlyssesEqualsOneProcess) {
  const std::string lora = lora_on_base("lora_llama_base", kLlamaGqa) + " --lora.dropout 0.3";
  expect_lora_layouts_equal_one_process(
      {{"lora_drop_cp2", "--parallel.cp_size 2"}, {"lora_drop_sp2", "--parallel.sp_size 2"}},
      "lora_drop_single_seq", lora);
  expect_lora_layouts_equal_one_process({{"lora_drop_sp2_cp2", "--parallel.sp_size 2 --parallel.cp_size 2"},
                                         {"lora_drop_cp2_tp2", "--parallel.cp_size 2 --parallel.tp_size 2"}},
                                        "lora_drop_single_usp", lora, 4);
}

// Context parallelism and Ulysses: the adapters are per-token linears, averaged over the
// ranks that split the sequence as over data-parallel ones.
TEST_F(DistFinetune, LoraContextParallelAndUlyssesEqualOneProcess) {
  expect_lora_layouts_equal_one_process(
      {{"lora_cp2", "--parallel.cp_size 2"}, {"lora_sp2", "--parallel.sp_size 2"}}, "lora_single_seq",
      lora_on_base("lora_base", ""));
}

// A two-stage pipeline (each stage its blocks' adapters, the checkpoint all of them), and
// tensor parallelism inside each stage.
TEST_F(DistFinetune, LoraPipelineAndPipelineWithTensorParallelEqualOneProcess) {
  expect_lora_layouts_equal_one_process({{"lora_pp2", "--parallel.pp_size 2"}}, "lora_single_pp",
                                        lora_on_base("lora_llama_base", kLlamaGqa));
  expect_lora_layouts_equal_one_process({{"lora_tp2_pp2", "--parallel.tp_size 2 --parallel.pp_size 2"}},
                                        "lora_single_pp4", lora_on_base("lora_llama_base", kLlamaGqa), 4);
}

// A PEFT folder (lora.init_from, exported from a one-process run) read into each rank's
// part of the adapters: under tensor parallelism in a two-stage pipeline, the losses, the
// first step's gradients (of A too: B is no longer zero) and the adapters after 5 steps of one
// process started from it.
TEST_F(DistFinetune, LoraStartsFromAPeftFolderInAnyLayout) {
  const std::string lora = lora_on_base("lora_llama_base", kLlamaGqa);
  const fs::path ckpt = dir_ / "lora_peft_source" / "ckpt";
  const ShellResult r = train("lora_peft_source", 1, lora + " --checkpoint.dir " + ckpt.string());
  ASSERT_EQ(r.rc, 0) << r.out;
  std::ostringstream note;
  ckpt::export_lora((ckpt / "step_00000005").string(), (dir_ / "peft").string(), false, DType::f32, note);
  const std::string from =
      "--model.init_from " +
      (dir_ / "lora_llama_base" / "ckpt" / "step_00000005" / "model.safetensors").string() +
      " --lora.init_from " + (dir_ / "peft").string() + " " + kLlamaGqa;
  expect_lora_layouts_equal_one_process({{"lora_peft_tp2_pp2", "--parallel.tp_size 2 --parallel.pp_size 2"}},
                                        "lora_peft_single", from, 4);
}

// Adapters saved under tensor parallelism (whole, gathered from the slices) resume on one
// process, and those saved on one process under tensor parallelism with a pipeline: the same
// losses as the run that never stopped.
TEST_F(DistFinetune, LoraResumedInAnotherLayoutGivesTheSameLosses) {
  const std::string lora = lora_on_base("lora_llama_base", kLlamaGqa) + " --train.steps 6";
  ShellResult r = train("lora_whole", 1, lora);
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::vector<double> want = metric_losses(dir_ / "lora_whole" / "metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  const std::string ckpt = " --checkpoint.dir " + (dir_ / "lora_relay" / "ckpt").string();
  const std::vector<std::pair<int, std::string>> legs = {
      {2, "--parallel.tp_size 2 --train.stop_after 2"},
      {1, "--checkpoint.resume true --train.stop_after 4"},
      {4, "--parallel.tp_size 2 --parallel.pp_size 2 --checkpoint.resume true"}};
  for (size_t k = 0; k < legs.size(); ++k) {
    r = train("lora_relay", legs[k].first, lora + " " + legs[k].second + ckpt);
    ASSERT_EQ(r.rc, 0) << "leg " << k << "\n" << r.out;
  }
  const std::vector<double> got = metric_losses(dir_ / "lora_relay" / "metrics.jsonl");
  ASSERT_EQ(got.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(got[i], want[i], 1e-4 * want[i]) << "step " << i + 1;
}

}  // namespace
