// Expert parallelism end to end: train_gpt under mpirun with a tiny mixture-of-experts Llama
// (4 experts, top 2, a load-balancing loss of weight 0.1) in every data-parallel layout with
// expert parallelism (ep2 over 2 replicas; ep2 and ep4 over 4; ep2 inside FSDP over 2 and 4 and
// inside HSDP 2 x 2; with cp, sp, tp and tp's sequence parallelism), and MoE under plain DP, against
// the single process on the same global batch: the losses of every step, the first step's
// gradients and the parameters after the last; checkpoints written under ep2 (full, and sharded
// with the experts in units of their own) resume in other layouts with the uninterrupted run's
// losses; a run started from a Hugging Face folder and LoRA on an MoE base under ep2 inside FSDP
// have one process's losses; a step's bytes follow from the routing; bad layouts are refused
// with one line.
#include <gtest/gtest.h>

#include "support/corpus.h"
#include "support/launch.h"
#include "support/outputs.h"
#include "support/testing.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

using namespace ndt;
using namespace ndt::testing;  // Layout, mpirun, run_shell (tests/support/launch.h)
namespace fs = std::filesystem;

namespace {

// a Llama of 2 MoE blocks on C 32: E experts of 16 hidden units, each token through k of them
std::string moe(int E, int k = 2) {
  return " --model.arch llama --model.n_kv_head 2 --model.intermediate_size 48 --model.rope_theta 10000 "
         "--model.n_experts " +
         std::to_string(E) + " --model.n_experts_per_tok " + std::to_string(k) +
         " --model.moe_intermediate_size 16 --model.norm_topk_prob true "
         "--model.router_aux_loss_coef 0.1";
}
const std::string kMoe = moe(4);

class DistEp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = ndt::testing::fresh_dir("dist_ep");
    const int64_t V = ndt::testing::write_word_corpus(dir_ / "data", 8000, 7, 0.0);
    std::ofstream(dir_ / "gpt.ini")
        << "[model]\nn_layer = 2\nn_head = 4\nn_embd = 32\nvocab_multiple = 4\nvocab_size = " << V
        << "\nblock_size = 32\n[data]\ntrain = " << (dir_ / "data" / "train_*.bin").string()
        << "\n[train]\nseq_len = 16\ngrad_accum_steps = 2\nsteps = 5\nthreads = 1\n"
           "[optim]\nlr = 0.01\nwarmup_steps = 1\neps = 1e-4\n[sample]\nevery = -1\n[log]\nevery = 1\n"
           "[checkpoint]\nformat = full\n";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static ShellResult train(const std::string& name, int np, const std::string& args) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    return run_shell((np > 1 ? mpirun(np) : std::string()) + NDT_TRAIN_GPT_BIN + " --config " +
                     (dir_ / "gpt.ini").string() + " --log.metrics " + (d / "metrics.jsonl").string() +
                     " --checkpoint.dir " + (d / "ck").string() + " --log.grads " +
                     (d / "grads.safetensors").string() + " " + args);
  }
  static std::vector<double> losses(const std::string& name) {
    return metric_losses(dir_ / name / "metrics.jsonl");
  }
  static fs::path last_model(const std::string& name) {
    return dir_ / name / "ck" / "step_00000005" / "model.safetensors";
  }

  // Each layout (B sequences per data rank and micro-step) against one process on the global batch.
  static void check_layouts(const std::vector<Layout>& layouts, int B) {
    for (const Layout& L : layouts) {
      SCOPED_TRACE(L.name);
      const std::string ref = "single_b" + std::to_string(B * L.dp());
      if (!fs::exists(dir_ / ref / "metrics.jsonl")) {
        ShellResult r = train(ref, 1, "--train.micro_batch_size " + std::to_string(B * L.dp()) + kMoe);
        ASSERT_EQ(r.rc, 0) << r.out;
      }
      ShellResult r =
          train(L.name, L.np(), "--train.micro_batch_size " + std::to_string(B) + L.args() + kMoe);
      ASSERT_EQ(r.rc, 0) << r.out;
      std::vector<double> got = losses(L.name), want = losses(ref);
      ASSERT_EQ(got.size(), 5u);
      ASSERT_EQ(want.size(), 5u);
      for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << "step " << i + 1;
      const double g = max_rel_diff(dir_ / L.name / "grads.safetensors", dir_ / ref / "grads.safetensors");
      EXPECT_LT(g, 1e-5) << "gradients of the first step";
      const double p = max_rel_diff(last_model(L.name), last_model(ref));
      EXPECT_LT(p, 1e-5) << "parameters after the last step";
      std::printf(
          "%-10s %d ranks: losses %.6f..%.6f, first-step gradients within %.1e, parameters within %.1e\n",
          L.name, L.np(), got.front(), got.back(), g, p);
    }
  }

  static inline fs::path dir_;
};

TEST_F(DistEp, LayoutsEqualOneProcess) {
  check_layouts({{"moe_dp2", 2},
                 {"ep2_dp2", 2, 1, 1, 1, " --parallel.ep_size 2"},
                 {"ep2_dp4", 4, 1, 1, 1, " --parallel.ep_size 2"},
                 {"ep4_dp4", 4, 1, 1, 1, " --parallel.ep_size 4"},
                 {"ep2_fsdp2", 1, 2, 1, 1, " --parallel.ep_size 2"},
                 {"ep2_fsdp4", 1, 4, 1, 1, " --parallel.ep_size 2"},
                 {"ep2_hsdp2x2", 2, 2, 1, 1, " --parallel.ep_size 2"},
                 // the all-to-alls run again in the recompute of each block's backward
                 {"ep2_dp2_ac", 2, 1, 1, 1, " --parallel.ep_size 2 --train.activation_checkpointing full"},
                 {"ep2_fsdp2_ac", 1, 2, 1, 1, " --parallel.ep_size 2 --train.activation_checkpointing full"},
                 {"moe_dp2_ac", 2, 1, 1, 1, " --train.activation_checkpointing full"}},
                1);
}

// EP groups of the data ranks at one cp / sp / tp position; tp's ranks hold the same experts
// (the gradient norm counts them once: a norm summed tp times moves ep2_dp2_tp2's parameters)
TEST_F(DistEp, WithSequenceAndTensorParallelismEqualsOneProcess) {
  check_layouts(
      {{"ep2_fsdp2_cp2", 1, 2, 2, 1, " --parallel.ep_size 2"},
       {"ep2_dp2_cp2", 2, 1, 2, 1, " --parallel.ep_size 2"},
       {"ep2_fsdp2_sp2", 1, 2, 1, 1, " --parallel.ep_size 2", 1, 2},
       {"ep2_dp2_tp2", 2, 1, 1, 2, " --parallel.ep_size 2"},
       {"ep2_dp2_tp2_sp", 2, 1, 1, 2, " --parallel.ep_size 2 --parallel.sequence_parallel true"},
       {"ep2_fsdp2_tp2", 1, 2, 1, 2, " --parallel.ep_size 2"},
       {"ep2_fsdp2_tp2_sp", 1, 2, 1, 2, " --parallel.ep_size 2 --parallel.sequence_parallel true"},
       {"ep2_fsdp2_cp2_tp2_sp", 1, 2, 2, 2, " --parallel.ep_size 2 --parallel.sequence_parallel true"}},
      1);
}

// Stopped after 3 steps under ep2 (a full checkpoint: the experts gathered whole), resumed on one
// process: the uninterrupted run's losses; the same under ep2 inside fsdp2 with a sharded one; and
// ep2 x dp2's continued under ep4 inside fsdp4. Sharded checkpoints of ep2 inside FSDP hold each
// ep rank's experts in units of their own, sharded over the writers holding them: over one
// writer (fsdp2), two (fsdp4, and fsdp2 x cp2: the cp ranks shard them too); read by one
// process, by ep4 inside fsdp4 and by fsdp2 without EP.
TEST_F(DistEp, CheckpointUnderEp2ResumesOnOneProcess) {
  ShellResult ref = train("resume_ref", 1, "--train.micro_batch_size 4" + kMoe);
  ASSERT_EQ(ref.rc, 0) << ref.out;
  struct Run {
    std::string name;
    int first_np;       // 3 steps on first_np ranks under ep2 in `first`
    std::string first;  //
    int np;             // then 2 steps on np ranks in `then`
    std::string then;
  };
  const std::string full = " --checkpoint.format full", sharded = " --checkpoint.format sharded";
  const std::string one = "--train.micro_batch_size 4",
                    ep4_fsdp4 =
                        "--train.micro_batch_size 1 --parallel.dp_shard_size 4 "
                        "--parallel.ep_size 4";
  const Run runs[] = {
      {"resume_dp", 2, "--train.micro_batch_size 2 --parallel.dp_replicate_size 2" + full, 1, one},
      {"resume_fsdp", 2, "--train.micro_batch_size 2 --parallel.dp_shard_size 2" + sharded, 1, one},
      // the experts' slices of a full checkpoint, read as FSDP shards of whole experts
      {"resume_dp_fsdp4", 2, "--train.micro_batch_size 2 --parallel.dp_replicate_size 2" + full, 4,
       ep4_fsdp4},
      {"resume_fsdp_ep4", 2, "--train.micro_batch_size 2 --parallel.dp_shard_size 2" + sharded, 4, ep4_fsdp4},
      {"resume_fsdp4", 4, "--train.micro_batch_size 1 --parallel.dp_shard_size 4" + sharded, 2,
       "--train.micro_batch_size 2 --parallel.dp_shard_size 2"},
      {"resume_fsdp_cp", 4,
       "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --parallel.cp_size 2" + sharded, 1, one}};
  for (const Run& run : runs) {
    SCOPED_TRACE(run.name);
    ShellResult a =
        train(run.name, run.first_np, run.first + " --parallel.ep_size 2 --train.stop_after 3" + kMoe);
    ASSERT_EQ(a.rc, 0) << a.out;
    ShellResult b = train(run.name, run.np, run.then + " --checkpoint.resume true" + full + kMoe);
    ASSERT_EQ(b.rc, 0) << b.out;
    EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
    std::vector<double> got = losses(run.name), want = losses("resume_ref");
    ASSERT_EQ(got.size(), 5u);
    ASSERT_EQ(want.size(), 5u);
    for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << "step " << i + 1;
    EXPECT_LT(max_rel_diff(last_model(run.name), last_model("resume_ref")), 3e-5);
  }
}

// model.init_from a Hugging Face folder (the Mixtral a one-process run exported): each rank of ep2
// inside fsdp2 reads only its own experts' tensors; the losses equal one process started from the
// same folder.
TEST_F(DistEp, Ep2StartsFromAModelFolderAsOneProcess) {
  ShellResult made =
      train("hf_src", 1, "--train.micro_batch_size 4 --train.steps 2 --checkpoint.format sharded" + kMoe);
  ASSERT_EQ(made.rc, 0) << made.out;
  const fs::path folder = dir_ / "hf_folder";
  ShellResult ex = run_shell(std::string(NDT_EXPORT_BIN) + " " +
                             (dir_ / "hf_src" / "ck" / "step_00000002").string() + " " + folder.string());
  ASSERT_EQ(ex.rc, 0) << ex.out;
  const std::string from = " --train.steps 2 --model.init_from " + folder.string();
  ShellResult one = train("hf_one", 1, "--train.micro_batch_size 4" + from);
  ASSERT_EQ(one.rc, 0) << one.out;
  ShellResult ep =
      train("hf_ep2", 2, "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --parallel.ep_size 2" + from);
  ASSERT_EQ(ep.rc, 0) << ep.out;
  const std::vector<double> a = losses("hf_one"), b = losses("hf_ep2");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "step " << i + 1;
    std::printf("step %zu from the folder: loss %.6f on one process, %.6f under ep2 x fsdp2\n", i + 1, a[i],
                b[i]);
  }
  EXPECT_LT(a[0], losses("hf_src")[0]) << "the folder's weights are trained, not a fresh init";
}

// LoRA adapters on a mixture-of-experts base under ep2 inside fsdp2 and fsdp4: the frozen
// base's experts in units of their own, gathered with their blocks; one process's losses.
TEST_F(DistEp, LoraOnAnMoeBaseUnderEp2InsideFsdpEqualsOneProcess) {
  ShellResult base = train("lora_base", 1, "--train.micro_batch_size 4 --train.steps 2" + kMoe);
  ASSERT_EQ(base.rc, 0) << base.out;
  const std::string lora = " --lora.rank 4 --model.init_from " + (dir_ / "lora_base" / "ck").string() + kMoe;
  ASSERT_EQ(train("lora_one", 1, "--train.micro_batch_size 4" + lora).rc, 0);
  const std::vector<double> want = losses("lora_one");
  ASSERT_EQ(want.size(), 5u);
  for (const auto& [name, np, args] :
       {std::tuple{"lora_ep2_fsdp2", 2, "--train.micro_batch_size 2 --parallel.dp_shard_size 2"},
        std::tuple{"lora_ep2_fsdp4", 4, "--train.micro_batch_size 1 --parallel.dp_shard_size 4"}}) {
    SCOPED_TRACE(name);
    ShellResult r = train(name, np, std::string(args) + " --parallel.ep_size 2" + lora);
    ASSERT_EQ(r.rc, 0) << r.out;
    const std::vector<double> got = losses(name);
    ASSERT_EQ(got.size(), 5u);
    for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << "step " << i + 1;
    std::printf("%s: losses %.6f..%.6f as one process\n", name, got.front(), got.back());
  }
}

// The bytes a step's exchanges send, through train_gpt's own counters: with k = E every token
// goes to every expert, so the routing, and the bytes, are known without running it. Against
// fsdp2 without EP, ep2 inside fsdp2 adds the EP group's bytes: per MoE layer and micro-step,
// the counts' all-gather ((n-1) E int32) and four exchanges (dispatch and combine, forward and
// backward) of the rows bound to the other member's experts, N E/ep (ep-1) rows of C floats.
// And it drops the experts' FSDP traffic: each rank holds its own experts in a unit sharded over
// the fsdp / ep = 1 ranks holding the same ones, so nothing gathers them, where fsdp2 without EP
// all-gathers and reduce-scatters half of every layer's experts (3 E C I floats): in each
// micro-step's forward, in its backward for every layer but the last, and their gradients.
TEST_F(DistEp, ExchangedBytesPerStepFollowFromTheRouting) {
  auto comm_bytes = [](const std::string& name) {  // rank 0's, every step
    std::vector<int64_t> out;
    std::ifstream f(dir_ / name / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("comm_bytes")) out.push_back(j["comm_bytes"].get<int64_t>());
    }
    return out;
  };
  const std::string every_expert = moe(4, 4) + " --train.micro_batch_size 1";
  const std::string fsdp2 = " --parallel.dp_shard_size 2";
  ASSERT_EQ(train("bytes_fsdp2", 2, every_expert + fsdp2).rc, 0);
  ShellResult r = train("bytes_ep2_fsdp2", 2, every_expert + fsdp2 + " --parallel.ep_size 2");
  ASSERT_EQ(r.rc, 0) << r.out;
  const int64_t N = 16, E = 4, ep = 2, C = 32, I = 16, layers = 2, micro = 2;  // gpt.ini's and moe()'s
  const int64_t rows = N * E / ep * (ep - 1);
  const int64_t exchanges = layers * micro * ((ep - 1) * E * 4 + 4 * rows * C * 4);
  const int64_t experts_fsdp = 3 * E * C * I * 4 / 2 * micro * (layers + (layers - 1) + layers);
  const int64_t want = exchanges - experts_fsdp;
  const std::vector<int64_t> with = comm_bytes("bytes_ep2_fsdp2"), without = comm_bytes("bytes_fsdp2");
  ASSERT_EQ(with.size(), 5u);
  ASSERT_EQ(without.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(with[i] - without[i], want) << "step " << i + 1;
  std::printf(
      "ep2 in fsdp2, k = E = 4: %lld bytes a step more than fsdp2 (%lld planned: %lld exchanged, %lld of the "
      "experts' FSDP traffic gone)\n",
      static_cast<long long>(with[0] - without[0]), static_cast<long long>(want),
      static_cast<long long>(exchanges), static_cast<long long>(experts_fsdp));
}

// Bad layouts: one line naming the key and the fix, before anything trains.
TEST_F(DistEp, BadLayoutsAreRefused) {
  struct Case {
    int np;
    std::string args, words;
  };
  const Case cases[] = {
      {2, " --parallel.dp_replicate_size 2 --parallel.ep_size 2", "model.n_experts = 0"},  // GPT-2
      {2, " --parallel.dp_replicate_size 2 --parallel.ep_size 3" + kMoe, "must divide dp_replicate_size = 2"},
      {4, " --parallel.dp_replicate_size 4 --parallel.ep_size 4" + moe(6), "must divide model.n_experts = 6"},
      {2, " --parallel.dp_replicate_size 2 --parallel.ep_size 2 --checkpoint.format sharded" + kMoe,
       "needs checkpoint.format = full"},
      {4, " --parallel.dp_replicate_size 2 --parallel.dp_shard_size 2 --parallel.ep_size 4" + kMoe,
       "must divide dp_shard_size = 2"},
  };
  for (const Case& c : cases) {
    ShellResult r = train("bad", c.np, "--train.micro_batch_size 1" + c.args);
    EXPECT_NE(r.rc, 0) << c.args;
    EXPECT_NE(r.out.find(c.words), std::string::npos) << c.args << ": " << r.out;
  }
}

}  // namespace
