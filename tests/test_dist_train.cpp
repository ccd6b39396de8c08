// train_gpt under mpirun, end to end: every data-parallel layout (dp2, fsdp2, fsdp3 with
// padding, fsdp4, hsdp 2x2), with gradient accumulation 2, against the single process on
// the same global batch and data: the losses of every step, the gradients of the first
// step and the parameters after the last; a checkpoint written under fsdp2 resumes under
// dp2 and under one process; a failing rank brings the job down; bad layouts are refused.
// The same for a tiny Llama (kLlama: grouped-query attention, rotary embeddings with Llama
// 3's scaling, SwiGLU, RMSNorms, an untied head) in every layout, bf16, activation
// checkpointing and checkpoints resharded across layouts; and Qwen3's options (kQwen3). Checkpoints of either
// format written under pipeline parallelism resume in other pipeline layouts and without one, and the other
// way.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "support/cluster.h"
#include "support/corpus.h"
#include "support/launch.h"
#include "support/outputs.h"
#include "support/testing.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "train/checkpoint/tokenizer_files.h"
#include "train/data/data.h"
#include "train/data/vocab.h"
#include "train/io/safetensors.h"

using namespace ndt;
using namespace ndt::testing;  // Layout, mpirun, run_shell (tests/support/launch.h)
namespace fs = std::filesystem;

namespace {

using Result = ShellResult;

// The model a test trains: gpt.ini's GPT-2, or it changed by arguments that every run of
// the model takes (the reference runs too); its runs' directories start with `tag`.
struct Model {
  std::string tag, args;
  int accum = 2;  // micro-batches per step (gpt.ini's train.grad_accum_steps unless args change it)
};
const Model kGPT2{};
// A tiny Llama 3 on gpt.ini's sizes (2 blocks, C 32): 4 query heads reading 2 key/value
// heads, a SwiGLU MLP of 48, RMSNorms, an untied lm_head, and rotary embeddings (head size
// 8: wavelengths 6.3, 63, 628, 6283 positions) with Llama 3's scaling from an original
// context of 8 positions: the first frequency blended, the other three stretched 4x; the
// sequences have 16 tokens, so every token's angles depend on the scaling.
const Model kLlama{
    "llama_",
    " --model.arch llama --model.n_kv_head 2 --model.intermediate_size 48 --model.rope_theta 10000 "
    "--model.rope_scaling llama3 --model.rope_factor 4 --model.rope_low_freq_factor 1 "
    "--model.rope_high_freq_factor 4 --model.rope_original_max_position 8"};
// For the pipeline: 4 blocks (2 stages of 2, 4 of 1, or 2 ranks x 2 chunks of 1) and 4
// micro-batches per step, so that the schedules differ (1F1B's warm-up, steady state and
// cool-down; interleaved's chunks)
const Model kPipeGPT2{"pp_", " --model.n_layer 4 --train.grad_accum_steps 4", 4};
// Qwen2's options on it: biases on q, k and v, and the logits through wte (tied)
const Model kLlamaTiedBias{"llama_tb_",
                           kLlama.args + " --model.attention_bias true --model.tie_embeddings true"};

// Qwen3's options on it: q_norm and k_norm, and 4 heads of 12 channels (q 48 wide from a
// width of 32: the head size is not n_embd / n_head), plain rotary embeddings
const Model kQwen3{
    "qwen3_",
    " --model.arch llama --model.n_kv_head 2 --model.intermediate_size 48 --model.rope_theta 10000 "
    "--model.head_dim 12 --model.qk_norm true"};

// A mixture of experts on it (Qwen3-MoE's block): block 0 dense, block 1 a router over 4
// SwiGLU experts of 24, each token through its top 2, and the load-balancing loss in the loss
const Model kQwen3Moe{"qwen3moe_", kQwen3.args +
                                       " --model.n_experts 4 --model.n_experts_per_tok 2 "
                                       "--model.moe_intermediate_size 24 --model.dense_layers 0 "
                                       "--model.router_aux_loss_coef 0.1"};

class DistTrain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = ndt::testing::fresh_dir("dist_train");
    const int64_t V = V_ = ndt::testing::write_word_corpus(dir_ / "data", 8000, 7, 0.0);
    std::ofstream(dir_ / "gpt.ini")
        << "[model]\nn_layer = 2\nn_head = 4\nn_embd = 32\nvocab_multiple = 4\nvocab_size = " << V
        << "\nblock_size = 32\n[data]\ntrain = " << (dir_ / "data" / "train_*.bin").string()
        << "\n[train]\nseq_len = 16\ngrad_accum_steps = 2\nsteps = 5\nthreads = 1\n"
           "[optim]\nlr = 0.01\nwarmup_steps = 1\neps = 1e-4\n[sample]\nevery = -1\n[log]\nevery = 1\n"
           "[checkpoint]\nformat = full  # the tests compare model.safetensors files\n";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // AdamW's eps is 1e-4, not 1e-8: with a tiny eps an element whose gradient is near zero
  // moves by about +-lr whatever its size, so float32 rounding (which differs between
  // layouts: sums in another order) would decide its sign. With eps above those gradients
  // the update is smooth in the gradient and the layouts can be compared tightly. (The
  // float64 component tests compare the default eps.)
  // train_gpt (under mpirun when np > 1) with its metrics, final checkpoint and first-step
  // gradients in dir_/name.
  // With a cluster, the ranks are spread evenly over its hosts.
  static Result train(const std::string& name, int np, const std::string& args, const Cluster* on = nullptr) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    const std::string launch = on ? on->mpirun(np) : np > 1 ? mpirun(np) : std::string();
    const std::string cmd = launch + NDT_TRAIN_GPT_BIN + " --config " + (dir_ / "gpt.ini").string() +
                            " --log.metrics " + (d / "metrics.jsonl").string() + " --checkpoint.dir " +
                            (d / "ck").string() + " --log.grads " + (d / "grads.safetensors").string() + " " +
                            args;
    return run_shell(cmd);
  }
  static std::vector<double> losses(const std::string& name) {
    return metric_losses(dir_ / name / "metrics.jsonl");
  }
  static fs::path last_model(const std::string& name) {
    return dir_ / name / "ck" / "step_00000005" / "model.safetensors";
  }

  // Each layout against one process on the same global batch and data (B sequences per
  // data-parallel rank and micro-step): the losses of every step, the first step's
  // gradients and the parameters after the last.
  static void check_layouts(const std::vector<Layout>& layouts, int B, const Cluster* on = nullptr,
                            const Model& model = kGPT2) {
    for (const Layout& L : layouts) {
      SCOPED_TRACE(model.tag + L.name);
      const std::string name = model.tag + L.name, ref = model.tag + "single_b" + std::to_string(B * L.dp());
      if (!fs::exists(dir_ / ref / "metrics.jsonl")) {
        Result r = train(ref, 1, "--train.micro_batch_size " + std::to_string(B * L.dp()) + model.args);
        ASSERT_EQ(r.rc, 0) << r.out;
      }
      Result r =
          train(name, L.np(), "--train.micro_batch_size " + std::to_string(B) + L.args() + model.args, on);
      ASSERT_EQ(r.rc, 0) << r.out;
      EXPECT_NE(r.out.find("= " + std::to_string(B * model.accum * L.dp()) + " sequences"), std::string::npos)
          << r.out;
      for (int h = 0; on && h < on->hosts(); ++h)  // the layout printout names each rank's host
        for (int k = 0; k < L.np() / on->hosts(); ++k) {
          const int rank = h * (L.np() / on->hosts()) + k;
          EXPECT_NE(r.out.find("\n  rank " + std::to_string(rank) + ": "), std::string::npos) << r.out;
          const size_t at = r.out.find("\n  rank " + std::to_string(rank) + ": ");
          const std::string where = " on h" + std::to_string(h) + " (local rank " + std::to_string(k) + ")";
          EXPECT_NE(r.out.substr(at, r.out.find('\n', at + 1) - at).find(where), std::string::npos)
              << "rank " << rank << " should be" << where << ": " << r.out;
        }
      std::vector<double> got = losses(name), want = losses(ref);
      ASSERT_EQ(got.size(), 5u);
      ASSERT_EQ(want.size(), 5u);
      for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << "step " << i + 1;
      const double g = max_rel_diff(dir_ / name / "grads.safetensors", dir_ / ref / "grads.safetensors");
      EXPECT_LT(g, 1e-5) << "gradients of the first step";
      const double p = max_rel_diff(last_model(name), last_model(ref));
      EXPECT_LT(p, 3e-5) << "parameters after the last step";
      std::printf(
          "%-20s %2d ranks: losses %.6f..%.6f, first-step gradients within %.1e, parameters within %.1e\n",
          name.c_str(), L.np(), got.front(), got.back(), g, p);
    }
  }

  // Mixed precision: bf16 parameters and activations, f32 master, gradients reduced in f32;
  // each layout (4 sequences per micro-step in all) against the bf16 single process, within
  // bf16's precision: the losses of every step and the first step's gradients.
  static void check_bf16_layouts(const std::vector<Layout>& layouts, const Model& model = kGPT2) {
    const std::string bf16 = " --train.dtype bfloat16" + model.args, ref = model.tag + "bf16_single";
    Result one = train(ref, 1, "--train.micro_batch_size 4" + bf16);
    ASSERT_EQ(one.rc, 0) << one.out;
    for (const Layout& L : layouts) {
      const std::string name = model.tag + L.name;
      SCOPED_TRACE(name);
      Result r =
          train(name, L.np(), "--train.micro_batch_size " + std::to_string(4 / L.dp()) + L.args() + bf16);
      ASSERT_EQ(r.rc, 0) << r.out;
      std::vector<double> got = losses(name), want = losses(ref);
      ASSERT_EQ(got.size(), 5u);
      double worst = 0;
      for (size_t i = 0; i < 5; ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / want[i]);
      const double g = max_rel_diff(dir_ / name / "grads.safetensors", dir_ / ref / "grads.safetensors");
      std::printf("%-20s losses within %.1e, first-step gradients within %.1e\n", name.c_str(), worst, g);
      EXPECT_LT(worst, 1e-2) << "losses";
      EXPECT_LT(g, 3e-2) << "first-step gradients";
    }
  }

  // One run carried through a chain of layouts, each stage resuming the checkpoint that the
  // one before wrote when it stopped (its train.stop_after), against one uninterrupted
  // process (4 sequences per micro-step): the losses of every step, and the last
  // checkpoint's weights (a sharded one exported to one file first). `common` goes to every
  // run, the reference's too (train.steps, the model).
  struct Stage {
    int np;
    std::string args;  // the layout, train.micro_batch_size, train.stop_after, checkpoint.format
  };
  static void check_chain(const std::string& name, const std::vector<Stage>& stages,
                          const std::string& common, int steps) {
    Result ref = train(name + "_ref", 1, "--train.micro_batch_size 4 " + common);
    ASSERT_EQ(ref.rc, 0) << ref.out;
    for (size_t i = 0; i < stages.size(); ++i) {
      Result r =
          train(name, stages[i].np, stages[i].args + " " + common + (i ? " --checkpoint.resume true" : ""));
      ASSERT_EQ(r.rc, 0) << "stage " << i << ": " << r.out;
      if (i) EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
    }
    std::vector<double> got = losses(name), want = losses(name + "_ref");
    ASSERT_EQ(got.size(), static_cast<size_t>(steps));
    ASSERT_EQ(want.size(), static_cast<size_t>(steps));
    double worst = 0;  // the largest relative difference of a step's loss
    for (int i = 0; i < steps; ++i) {
      EXPECT_NEAR(got[i], want[i], 2e-5 * want[i]) << "step " << i + 1;
      worst = std::max(worst, std::abs(got[i] - want[i]) / want[i]);
    }
    char step[32];
    std::snprintf(step, sizeof(step), "step_%08d", steps);
    const fs::path last = dir_ / name / "ck" / step;
    fs::path weights = last / "model.safetensors";
    if (!fs::exists(weights)) {  // sharded: the shards as one file
      weights = dir_ / name / "exported.safetensors";
      Result x = run_shell(std::string(NDT_EXPORT_BIN) + " " + last.string() + " " + weights.string());
      ASSERT_EQ(x.rc, 0) << x.out;
    }
    const double p = max_rel_diff(weights, dir_ / (name + "_ref") / "ck" / step / "model.safetensors");
    EXPECT_LT(p, 3e-5);
    std::printf("%-20s %zu layouts: losses %.6f..%.6f within %.1e, final weights within %.1e\n", name.c_str(),
                stages.size(), got.front(), got.back(), worst, p);
  }

  // A one-process run whose padded vocabulary is odd, checkpointed at step 2 in either format,
  // continues under tp 2 with a model.vocab_multiple that pads to fewer rows (2) or to more:
  // the padded rows of wte (and of an untied lm_head) are zeros that nothing trains (their
  // logits are masked), dropped or added on load; the losses are the one-process run's.
  static void check_repadded_resume(const Model& model) {
    auto padded = [](int64_t multiple) { return (V_ + multiple - 1) / multiple * multiple; };
    int64_t vm = 1;
    while (padded(vm) % 2 == 0) ++vm;
    int64_t more = 2;  // an even padding past the odd one
    while (padded(more) <= padded(vm)) more += 2;
    const std::string odd = " --model.vocab_multiple " + std::to_string(vm), ref = model.tag + "repad_ref";
    Result one = train(
        ref, 1, "--train.micro_batch_size 4 --train.steps 4 --checkpoint.format sharded" + odd + model.args);
    ASSERT_EQ(one.rc, 0) << one.out;
    for (const std::string format : {"sharded", "full"})
      for (const int64_t multiple : {int64_t(2), more}) {
        const std::string name = model.tag + "repad_" + format + "_" + std::to_string(multiple),
                          args = " --train.micro_batch_size 4 --train.steps 4 --checkpoint.format " + format +
                                 model.args;
        SCOPED_TRACE(name);
        Result a = train(name, 1, "--train.stop_after 2" + odd + args);
        ASSERT_EQ(a.rc, 0) << a.out;
        if (multiple == 2) {
          // under tp 2 the odd padding is refused by one message that says what to do ...
          Result bad = train(name, 2, "--parallel.tp_size 2 --checkpoint.resume true" + odd + args);
          EXPECT_NE(bad.rc, 0) << bad.out;
          EXPECT_NE(bad.out.find("set model.vocab_multiple to a multiple of 2"), std::string::npos)
              << bad.out;
        }
        // ... and doing it resumes the checkpoint
        Result b = train(name, 2,
                         "--parallel.tp_size 2 --checkpoint.resume true --model.vocab_multiple " +
                             std::to_string(multiple) + args);
        ASSERT_EQ(b.rc, 0) << b.out;
        std::vector<double> got = losses(name), want = losses(ref);
        ASSERT_EQ(got.size(), 4u);
        ASSERT_EQ(want.size(), 4u);
        for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(got[i], want[i], 2e-5 * want[i]) << "step " << i + 1;
      }
  }

  // A run that must be refused before any step: exit code 2 and the message `expect`.
  struct Refused {
    std::string name;
    int np;
    std::string args;
    std::string expect;  // in the message
  };
  static Result expect_refused(const Refused& c) {
    Result r = train(c.name, c.np, c.args);
    EXPECT_EQ(r.rc, 2) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.name << ": " << r.out;
    EXPECT_TRUE(losses(c.name).empty()) << c.name << ": nothing trained";
    return r;
  }

  // An error every rank finds alike: one "config error" line (rank 0's), and no rank aborts.
  static void expect_one_line(const Refused& c, const Result& r) {
    size_t lines = 0;
    for (size_t at = r.out.find("config error"); at != std::string::npos;
         at = r.out.find("config error", at + 1))
      ++lines;
    EXPECT_EQ(lines, 1u) << c.name << ": one line: " << r.out;
    EXPECT_EQ(r.out.find("MPI_ABORT"), std::string::npos) << c.name << ": no rank aborts: " << r.out;
  }

  static fs::path dir_;
  static int64_t V_;  // the corpus's vocabulary size
};
fs::path DistTrain::dir_;
int64_t DistTrain::V_ = 0;

// ---- across hosts: the simulated cluster of scripts/cluster.sh (TCP between hosts) ------

TEST_F(DistTrain, LayoutsAcrossTwoHostsEqualOneProcess) {
  Cluster two(2);
  if (!two.ok()) GTEST_SKIP() << two.why_not();
  // 2 ranks per host: HSDP with each shard group inside a host, FSDP over both hosts, and
  // TP inside a host with FSDP across
  check_layouts({{"mh_hsdp2x2", 2, 2}, {"mh_fsdp4", 1, 4}, {"mh_fsdp2_tp2", 1, 2, 1, 2}}, 1, &two);
  // one rank per host: the context-parallel ring and the tensor-parallel all-reduces cross
  // the hosts
  check_layouts({{"mh_cp2", 1, 1, 2, 1}, {"mh_tp2", 1, 1, 1, 2}}, 2, &two);
}

TEST_F(DistTrain, ThreeHostsEqualOneProcess) {
  Cluster three(3);
  if (!three.ok()) GTEST_SKIP() << three.why_not();
  check_layouts({{"mh3_fsdp3", 1, 3}, {"mh3_dp3", 3, 1}}, 1, &three);
}

TEST_F(DistTrain, ACheckpointFromTwoHostsResumesOnOneAndBack) {
  Cluster two(2);
  if (!two.ok()) GTEST_SKIP() << two.why_not();
  // 5 steps in one process; 3 under HSDP on two hosts, resumed under fsdp2 on one host;
  // 3 under fsdp2 on one host, resumed under HSDP on two (sharded checkpoints)
  const std::string sharded = " --checkpoint.format sharded";
  Result ref = train("mh_ref", 1, "--train.micro_batch_size 4" + sharded);
  ASSERT_EQ(ref.rc, 0) << ref.out;
  const std::string hsdp =
      "--train.micro_batch_size 1 --parallel.dp_replicate_size 2 --parallel.dp_shard_size 2";
  const std::string fsdp2 = "--train.micro_batch_size 2 --parallel.dp_shard_size 2";
  Result a = train("mh_down", 4, hsdp + sharded + " --train.stop_after 3", &two);
  ASSERT_EQ(a.rc, 0) << a.out;
  Result b = train("mh_down", 2, fsdp2 + sharded + " --checkpoint.resume true");
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
  Result c = train("mh_up", 2, fsdp2 + sharded + " --train.stop_after 3");
  ASSERT_EQ(c.rc, 0) << c.out;
  Result d = train("mh_up", 4, hsdp + sharded + " --checkpoint.resume true", &two);
  ASSERT_EQ(d.rc, 0) << d.out;
  const std::vector<double> want = losses("mh_ref");
  for (const char* name : {"mh_down", "mh_up"}) {
    const std::vector<double> got = losses(name);
    ASSERT_EQ(got.size(), 5u) << name;
    for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(got[i], want[i], 2e-5 * want[i]) << name << " step " << i + 1;
  }
}

TEST_F(DistTrain, EveryDataParallelLayoutEqualsOneProcess) {
  check_layouts({{"dp2", 2, 1},
                 {"fsdp2", 1, 2},
                 {"fsdp3", 1, 3},
                 {"fsdp4", 1, 4},
                 {"hsdp2x2", 2, 2},
                 {"fsdp2_gathered", 1, 2, 1, 1, "--parallel.reshard_after_forward false"}},
                2);
}

TEST_F(DistTrain, TensorAndContextParallelLayoutsEqualOneProcess) {
  check_layouts({{"tp2", 1, 1, 1, 2},
                 {"tp4", 1, 1, 1, 4},
                 {"cp2", 1, 1, 2, 1},
                 {"cp4", 1, 1, 4, 1},
                 {"fsdp2_tp2", 1, 2, 1, 2},
                 {"fsdp2_cp2", 1, 2, 2, 1},
                 {"hsdp2x2_tp2", 2, 2, 1, 2},
                 {"s2_cp2_tp2", 1, 2, 2, 2}},
                2);
}

TEST_F(DistTrain, SequenceParallelLayoutsEqualOneProcess) {
  // LayerNorms, residuals and embeddings on each tp rank's part of the sequence; the
  // LayerNorms', biases' and wpe's gradients summed over the tp group (with DP and FSDP
  // after their reductions); activation checkpointing recomputes the gathers
  const char* sp = "--parallel.sequence_parallel true";
  check_layouts({{"tp2_sp", 1, 1, 1, 2, sp},
                 {"tp4_sp", 1, 1, 1, 4, sp},
                 {"fsdp2_tp2_sp", 1, 2, 1, 2, sp},
                 {"dp2_tp2_sp", 2, 1, 1, 2, sp},
                 {"s2_cp2_tp2_sp", 1, 2, 2, 2, sp},
                 {"tp2_sp_full_ac", 1, 1, 1, 2,
                  "--parallel.sequence_parallel true --train.activation_checkpointing full"},
                 {"tp2_sp_selective_ac", 1, 1, 1, 2,
                  "--parallel.sequence_parallel true --train.activation_checkpointing selective"}},
                2);
  // a rank's tokens of a sequence that do not split among tp: one clear error, before any step
  Result bad = train("sp_bad", 4,
                     "--train.micro_batch_size 2 --parallel.tp_size 4 --train.seq_len 18 " + std::string(sp));
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_NE(
      bad.out.find("sequence parallelism: each rank's train.seq_len / cp_size = 18 / 1 tokens of a sequence "
                   "must be divisible by tp_size = 4"),
      std::string::npos)
      << bad.out;
}

TEST_F(DistTrain, UlyssesLayoutsEqualOneProcess) {
  // Ulysses sequence parallelism: each rank a contiguous half (quarter) of every sequence,
  // attention all-to-all'ed to its heads of the whole sequence; its ranks shard parameters
  // (FSDP over sp), with data-parallel replicas too
  check_layouts({{"sp2", 1, 1, 1, 1, "", 1, 2},
                 {"sp4", 1, 1, 1, 1, "", 1, 4},
                 {"dp2_sp2", 2, 1, 1, 1, "", 1, 2},
                 {"hsdp2x2_sp2", 2, 2, 1, 1, "", 1, 2},
                 {"sp2_full_ac", 1, 1, 1, 1, "--train.activation_checkpointing full", 1, 2}},
                2);
}

TEST_F(DistTrain, LlamaUlyssesLayoutsEqualOneProcess) {
  // grouped-query attention, 4 heads over 2 kv heads: sp2 splits the kv heads, sp4 replicates
  // each twice
  check_layouts({{"sp2", 1, 1, 1, 1, "", 1, 2}, {"sp4", 1, 1, 1, 1, "", 1, 4}}, 2, nullptr, kLlama);
}

TEST_F(DistTrain, UlyssesWithTensorParallelEqualsOneProcess) {
  // sp x tp: each tp rank's heads (2 of 4) all-to-all'ed over its 2 sp ranks; with TP's sequence
  // parallelism each sp rank's 8 tokens cut into 4 per tp rank between the linears
  check_layouts({{"sp2_tp2", 1, 1, 1, 2, "", 1, 2},
                 {"sp2_tp2_seqpar", 1, 1, 1, 2, "--parallel.sequence_parallel true", 1, 2}},
                2);
  // grouped-query attention: 2 kv heads, 1 per tp rank, replicated over the 2 sp ranks
  check_layouts({{"sp2_tp2", 1, 1, 1, 2, "", 1, 2},
                 {"sp2_tp2_seqpar", 1, 1, 1, 2, "--parallel.sequence_parallel true", 1, 2}},
                2, nullptr, kLlama);
}

TEST_F(DistTrain, UlyssesInsideTheRingEqualsOneProcess) {
  // USP: each cp rank's two chunks of 4 tokens, one per sp rank; the all-to-all gives each sp
  // rank 2 of the 4 heads (llama: 1 of the 2 kv heads) on both chunks, and ring attention runs
  // on them
  check_layouts({{"sp2_cp2", 1, 1, 2, 1, "", 1, 2}}, 2);
  // and on 8 ranks with tensor parallelism and its sequence parallelism: each tp rank's kv head
  // replicated over sp, its 2 tokens of a chunk between the linears
  check_layouts({{"sp2_cp2", 1, 1, 2, 1, "", 1, 2},
                 {"sp2_cp2_tp2_seqpar", 1, 1, 2, 2, "--parallel.sequence_parallel true", 1, 2}},
                2, nullptr, kLlama);
}

TEST_F(DistTrain, UlyssesInsidePipelineStagesEqualsOneProcess) {
  // 2 stages of 2 blocks, Ulysses over 2 ranks inside each; the stages pass (B, T/sp, C)
  // with every schedule: 1f1b (the default), interleaved's two chunks a stage, zb-h1's deferred
  // weight gradients (the all-to-alls' backward runs in the input-gradient half)
  check_layouts({{"sp2_pp2", 1, 1, 1, 1, "", 2, 2},
                 {"sp2_pp2_interleaved", 1, 1, 1, 1,
                  "--parallel.pp_schedule interleaved --parallel.pp_virtual 2", 2, 2},
                 {"sp2_pp2_zb", 1, 1, 1, 1, "--parallel.pp_schedule zb-h1", 2, 2}},
                2, nullptr, kPipeGPT2);
}

TEST_F(DistTrain, UlyssesSamplesAndEvaluatesAsOneProcess) {
  // evaluation under Ulysses (each rank its part of the validation rows) and sampling (whole
  // sequences: every rank draws the same tokens), alone, inside the ring and with tp
  const std::string common =
      " --model.n_layer 2 --train.steps 2 --sample.every 2 --sample.length 24 "
      "--sample.prompt 'the cat ' --train.micro_batch_size 2 --train.eval_every 2 "
      "--train.eval_steps 2 --data.val " +
      (dir_ / "data" / "train_*.bin").string();
  Result one = train("sp_sample_single", 1, common);
  ASSERT_EQ(one.rc, 0) << one.out;
  // from `start` to the end of the line after it ("sample at step 2:\n<the text>")
  auto line = [](const std::string& out, const std::string& start) {
    const size_t at = out.find(start);
    return at == std::string::npos ? std::string("(none)")
                                   : out.substr(at, out.find('\n', at + start.size() + 1) - at);
  };
  ASSERT_NE(line(one.out, "sample at step 2:"), "(none)") << one.out;
  ASSERT_NE(line(one.out, "final val loss"), "(none)") << one.out;
  const std::pair<const char*, int> layouts[] = {{" --parallel.sp_size 2", 2},
                                                 {" --parallel.sp_size 2 --parallel.cp_size 2", 4},
                                                 {" --parallel.sp_size 2 --parallel.tp_size 2", 4}};
  int n = 0;  // each layout in a folder of its own
  for (const auto& [layout, np] : layouts) {
    Result r = train("sp_sample_" + std::to_string(n++), np, common + layout);
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(line(r.out, "sample at step 2:"), line(one.out, "sample at step 2:")) << layout;
    const double want = std::stod(line(one.out, "final val loss").substr(15));
    EXPECT_NEAR(std::stod(line(r.out, "final val loss").substr(15)), want, 1e-5 * want) << layout;
  }
}

TEST_F(DistTrain, UlyssesCheckpointsResumeInAnotherLayout) {
  // the sp ranks' FSDP shards (sharded) and the whole model (full) written under sp2, read by
  // fsdp2 x sp2, then by one process
  for (const std::string format : {"sharded", "full"}) {
    const std::string f = " --checkpoint.format " + format;
    check_chain("sp_chain_" + format,
                {{2, "--train.micro_batch_size 4 --parallel.sp_size 2 --train.stop_after 2" + f},
                 {4,
                  "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --parallel.sp_size 2 "
                  "--train.stop_after 2" +
                      f},
                 {1, "--train.micro_batch_size 4" + f}},
                "", 5);
  }
}

TEST_F(DistTrain, BadUlyssesLayoutsAreOneClearLine) {
  const std::vector<Refused> cases = {
      {"bad_sp1", 4, "--parallel.sp_size 2 --parallel.tp_size 2 --model.n_head 2",
       "model.n_head = 2 must be divisible by parallel.tp_size x sp_size = 2 x 2"},
      {"bad_sp2", 4,
       "--parallel.sp_size 2 --parallel.tp_size 2 --parallel.sequence_parallel true --train.seq_len 18",
       "sequence parallelism: each rank's train.seq_len / (cp_size x sp_size) = 18 / (1 x 2) tokens of a "
       "sequence must be divisible by tp_size = 2"},
      {"bad_sp3", 6, "--parallel.sp_size 3 --parallel.cp_size 2 --train.seq_len 20",
       "train.seq_len = 20 must be divisible by parallel.cp_size x sp_size = 2 x 3"},
      {"bad_sp4", 3, "--parallel.sp_size 3 --train.seq_len 18",
       "model.n_head = 4 must be divisible by parallel.sp_size = 3"},
      {"bad_sp5", 3, "--parallel.sp_size 3", "train.seq_len = 16 must be divisible by parallel.sp_size = 3"},
      {"bad_sp6", 2, "--parallel.sp_size 0", "parallel.sp_size = 0 is outside [1, 65536]"},
  };
  for (const Refused& c : cases) expect_one_line(c, expect_refused(c));
}

TEST_F(DistTrain, Bfloat16LayoutsFollowOneProcess) {
  // every layout against the bf16 single process; then gradients reduced in bf16
  check_bf16_layouts({{"bf16_fsdp2", 1, 2},
                      {"bf16_dp2", 2, 1},
                      {"bf16_tp2", 1, 1, 1, 2},
                      {"bf16_cp2", 1, 1, 2, 1},
                      {"bf16_tp2_sp", 1, 1, 1, 2, "--parallel.sequence_parallel true"}});
  const std::string bf16 = " --train.dtype bfloat16";
  Result rd = train("bf16_fsdp2_rd", 2,
                    "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --parallel.reduce_dtype "
                    "bfloat16" +
                        bf16);
  ASSERT_EQ(rd.rc, 0) << rd.out;
  std::vector<double> got = losses("bf16_fsdp2_rd"), want = losses("bf16_single");
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(got[i], want[i], 1e-2 * want[i]) << "reduce_dtype bfloat16, step " << i + 1;
}

TEST_F(DistTrain, Bfloat16AccumulationSumsInTheMaster) {
  // with gradient accumulation, bf16 gradients are added into the f32 master every
  // micro-step on every layout (the embeddings' too, under FSDP): FSDP and DP then agree to
  // f32 rounding (summing a unit's micro-steps in bf16 would differ by bf16's, ~4e-3)
  const std::string common =
      " --train.micro_batch_size 2 --train.grad_accum_steps 2 --train.dtype bfloat16 "
      "--train.steps 1";
  Result dp = train("bf16_acc_dp2", 2, "--parallel.dp_replicate_size 2" + common);
  ASSERT_EQ(dp.rc, 0) << dp.out;
  Result fsdp = train("bf16_acc_fsdp2", 2, "--parallel.dp_shard_size 2" + common);
  ASSERT_EQ(fsdp.rc, 0) << fsdp.out;
  EXPECT_LT(max_rel_diff(dir_ / "bf16_acc_fsdp2" / "grads.safetensors",
                         dir_ / "bf16_acc_dp2" / "grads.safetensors"),
            1e-5);
}

TEST_F(DistTrain, FourDimensionsOnSixteenRanks) {
  // replicate 2 x shard 2 x cp 2 x tp 2: every dimension at once
  check_layouts({{"r2_s2_cp2_tp2", 2, 2, 2, 2}}, 1);
}

// ---- pipeline parallelism ------------------------------------------------------------

TEST_F(DistTrain, EveryPipelineScheduleEqualsOneProcess) {
  // each schedule alone: the micro-batches' forwards and backwards in another order, the
  // same losses, gradients and weights (the tied wte: its gradients from both ends summed)
  check_layouts(
      {{"pp2_gpipe", 1, 1, 1, 1, "--parallel.pp_schedule gpipe", 2},
       {"pp2_1f1b", 1, 1, 1, 1, "--parallel.pp_schedule 1f1b", 2},
       {"pp4_gpipe", 1, 1, 1, 1, "--parallel.pp_schedule gpipe", 4},
       {"pp4_1f1b", 1, 1, 1, 1, "--parallel.pp_schedule 1f1b", 4},
       {"pp2_interleaved", 1, 1, 1, 1, "--parallel.pp_schedule interleaved --parallel.pp_virtual 2", 2},
       {"pp2_split_3_1", 1, 1, 1, 1, "--parallel.pp_split 3,1", 2},
       // zero bubble: backward split into input gradients (B) and deferred weight gradients (W)
       {"pp2_zb", 1, 1, 1, 1, "--parallel.pp_schedule zb-h1", 2},
       {"pp4_zb", 1, 1, 1, 1, "--parallel.pp_schedule zb-h1", 4}},
      2, nullptr, kPipeGPT2);
}

TEST_F(DistTrain, OneStageRunsEveryScheduleThroughTheSameExecutor) {
  // without a pipeline the step is the one-stage schedule: 1f1b's F0 B0 F1 B1 ... is plain
  // gradient accumulation (the one process these are compared with); gpipe's F0 F1 B0 B1 and
  // zb-h1's deferred weight gradients change only the order, alone and under FSDP
  check_layouts({{"one_stage_gpipe", 1, 1, 1, 1, "--parallel.pp_schedule gpipe", 1},
                 {"one_stage_zb", 1, 1, 1, 1, "--parallel.pp_schedule zb-h1", 1},
                 {"fsdp2_one_stage_gpipe", 1, 2, 1, 1, "--parallel.pp_schedule gpipe", 1},
                 {"dp2_one_stage_zb", 2, 1, 1, 1, "--parallel.pp_schedule zb-h1", 1}},
                2, nullptr, kPipeGPT2);
}

TEST_F(DistTrain, TheReportNamesTheLayoutAsTheConsoleDoes) {
  // every dimension in use, as the mesh's printout says it, and the step's schedule
  struct Case {
    const char* name;
    std::string args, layout, schedule;
  };
  for (const Case& c :
       {Case{"report_tp2", "--parallel.tp_size 2", "(TP)", "1f1b over 2 micro-batches, one stage"},
        Case{"report_pp2", "--parallel.pp_size 2", "(PP)", "1f1b over 2 micro-batches, 2 stages"}}) {
    const fs::path report = dir_ / c.name / "report.html";
    Result r = train(c.name, 2,
                     c.args + " --train.steps 1 --train.grad_accum_steps 2 --log.report " + report.string());
    ASSERT_EQ(r.rc, 0) << r.out;
    std::ifstream f(report);
    const std::string html((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(html.find(c.layout), std::string::npos) << c.name;
    EXPECT_EQ(html.find("single process"), std::string::npos) << c.name;
    EXPECT_NE(html.find(c.schedule), std::string::npos) << c.name;
  }
}

TEST_F(DistTrain, PipelineWithEveryOtherDimensionEqualsOneProcess) {
  // the data-parallel strategies inside each stage (a chunk's units synced in the backward
  // of its last micro-batch), tensor parallelism with sequence parallelism, context parallelism
  check_layouts(
      {{"pp2_dp2", 2, 1, 1, 1, "", 2},
       {"pp2_fsdp2", 1, 2, 1, 1, "", 2},
       {"pp2_fsdp2_interleaved", 1, 2, 1, 1, "--parallel.pp_schedule interleaved --parallel.pp_virtual 2", 2},
       {"pp2_dp2_interleaved", 2, 1, 1, 1, "--parallel.pp_schedule interleaved --parallel.pp_virtual 2", 2},
       {"pp2_hsdp2x2", 2, 2, 1, 1, "", 2},
       {"pp2_fsdp2_gathered", 1, 2, 1, 1, "--parallel.reshard_after_forward false", 2},
       {"pp2_tp2_sp", 1, 1, 1, 2, "--parallel.sequence_parallel true", 2},
       {"pp2_cp2", 1, 1, 2, 1, "", 2},
       {"pp2_full_ac", 1, 1, 1, 1, "--train.activation_checkpointing full", 2},
       // zero bubble: the groups reduce once every deferred weight gradient is in; under
       // sequence parallelism the weight pass gathers the linears' inputs again
       {"pp2_dp2_zb", 2, 1, 1, 1, "--parallel.pp_schedule zb-h1", 2},
       {"pp2_fsdp2_zb", 1, 2, 1, 1, "--parallel.pp_schedule zb-h1", 2},
       {"pp2_tp2_sp_zb", 1, 1, 1, 2, "--parallel.sequence_parallel true --parallel.pp_schedule zb-h1", 2},
       {"pp2_zb_full_ac", 1, 1, 1, 1, "--parallel.pp_schedule zb-h1 --train.activation_checkpointing full",
        2}},
      1, nullptr, kPipeGPT2);
}

TEST_F(DistTrain, PipelineOnSixteenRanks) {
  // pp 2 x dp_shard 2 x cp 2 x tp 2
  check_layouts({{"pp2_s2_cp2_tp2", 1, 2, 2, 2, "", 2}}, 1, nullptr, kPipeGPT2);
}

TEST_F(DistTrain, LlamaPipelineEqualsOneProcess) {
  // an untied head: wte on the first stage, ln_f and lm_head on the last; and tied (Qwen2's
  // options): wte on both ends
  const Model llama{"llama_pp_", kLlama.args + kPipeGPT2.args, 4},
      tied{"llama_tb_pp_", kLlamaTiedBias.args + kPipeGPT2.args, 4};
  check_layouts(
      {{"pp2_1f1b", 1, 1, 1, 1, "", 2},
       {"pp2_fsdp2_interleaved", 1, 2, 1, 1, "--parallel.pp_schedule interleaved --parallel.pp_virtual 2", 2},
       {"pp2_zb", 1, 1, 1, 1, "--parallel.pp_schedule zb-h1", 2}},
      1, nullptr, llama);
  check_layouts({{"pp2_tp2", 1, 1, 1, 2, "", 2}}, 1, nullptr, tied);
}

TEST_F(DistTrain, BadPipelineLayoutsAreOneClearLine) {
  struct Bad {
    int np;
    std::string args, says;
  };
  const std::vector<Bad> bad = {
      {2, "--parallel.pp_size 2 --parallel.pp_split 3,x",
       "parallel.pp_split = '3,x': each entry must be a number"},
      {2, "--parallel.pp_size 2 --parallel.pp_split 1,2",
       "it needs 2 entries (parallel.pp_size x parallel.pp_virtual) summing to model.n_layer = 4"},
      {4, "--parallel.pp_size 4 --train.grad_accum_steps 2 --model.n_layer 3",
       "parallel.pp_size x parallel.pp_virtual = 4 pipeline stages need at least that many blocks, but "
       "model.n_layer is 3"},
      {2,
       "--parallel.pp_size 2 --parallel.pp_schedule interleaved --parallel.pp_virtual 2 "
       "--train.grad_accum_steps 3",
       "train.grad_accum_steps = 3 (m): pipeline schedule interleaved: m (micro-batches) must be a multiple "
       "of p"},
      {2, "--parallel.pp_size 2 --parallel.pp_virtual 2",
       "pipeline schedule 1f1b: v (chunks per rank) must be 1, got 2; only interleaved runs several chunks"},
      {2, "--parallel.pp_size 2 --parallel.pp_schedule zb",
       "parallel.pp_schedule: pipeline schedule 'zb' is not one of: gpipe, 1f1b, interleaved, zb-h1"},
      {2, "--parallel.pp_size 2 --parallel.pp_schedule interleaved --parallel.pp_virtual 3",
       "parallel.pp_size x parallel.pp_virtual = 6 pipeline stages need at least that many blocks"},
      // one stage runs its schedule too: interleaving needs stages to interleave
      {1, "--parallel.pp_schedule interleaved --parallel.pp_virtual 2", "needs p (pipeline ranks) >= 2"},
  };
  for (const Bad& b : bad) {
    const std::string layers = b.args.find("n_layer") == std::string::npos ? "--model.n_layer 4 " : "";
    Result r = train("pp_bad", b.np, layers + "--train.micro_batch_size 2 " + b.args);
    EXPECT_EQ(r.rc, 2) << b.args << "\n" << r.out;
    EXPECT_NE(r.out.find(b.says), std::string::npos) << b.args << "\n" << r.out;
    EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << r.out;
  }
}

TEST_F(DistTrain, PipelineSamplesTheTextOneProcessSamples) {
  // generation through the stages: each runs its blocks with its own key/value cache, the last
  // stage's logits go to every rank, which all draw the same token
  const std::string common =
      " --model.n_layer 4 --train.steps 2 --sample.every 2 --sample.length 24 --sample.prompt "
      "'the cat ' --train.micro_batch_size 2";
  Result one = train("pp_sample_single", 1, common);
  ASSERT_EQ(one.rc, 0) << one.out;
  int n = 0;  // each layout in a folder of its own
  for (const char* layout : {" --parallel.pp_size 2",
                             " --parallel.pp_size 2 --parallel.pp_schedule interleaved "
                             "--parallel.pp_virtual 2"}) {
    Result pp = train("pp_sample_pp2_" + std::to_string(n++), 2, common + layout);
    ASSERT_EQ(pp.rc, 0) << pp.out;
    auto sample = [](const std::string& out) {
      const size_t at = out.find("sample at step 2:");
      return at == std::string::npos ? std::string("(none)") : out.substr(at, out.find('\n', at + 18) - at);
    };
    EXPECT_NE(sample(one.out), "(none)") << one.out;
    EXPECT_EQ(sample(pp.out), sample(one.out)) << layout;
  }
}

TEST_F(DistTrain, Bfloat16PipelineFollowsOneProcess) {
  check_bf16_layouts({{"bf16_pp2", 1, 1, 1, 1, "", 2},
                      {"bf16_pp2_fsdp2", 1, 2, 1, 1, "", 2},
                      {"bf16_pp2_zb", 1, 1, 1, 1, "--parallel.pp_schedule zb-h1", 2}},
                     Model{"pp4l_", " --model.n_layer 4"});
}

TEST_F(DistTrain, CheckpointOfOneLayoutResumesInAnother) {
  // 5 uninterrupted steps in one process; the same run stopped after 3 under fsdp2, then
  // continued under dp2 and (separately) under one process
  Result ref = train("resume_ref", 1, "--train.micro_batch_size 4");
  ASSERT_EQ(ref.rc, 0) << ref.out;
  Result a =
      train("resume_fsdp2", 2, "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --train.stop_after 3");
  ASSERT_EQ(a.rc, 0) << a.out;
  ASSERT_TRUE(fs::exists(dir_ / "resume_fsdp2" / "ck" / "step_00000003"));
  fs::copy(dir_ / "resume_fsdp2", dir_ / "resume_single", fs::copy_options::recursive);
  fs::copy(dir_ / "resume_fsdp2", dir_ / "resume_half", fs::copy_options::recursive);
  Result b = train("resume_fsdp2", 2,
                   "--train.micro_batch_size 2 --parallel.dp_replicate_size 2 --checkpoint.resume true");
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("resumed from"), std::string::npos) << b.out;
  Result c = train("resume_single", 1, "--train.micro_batch_size 4 --checkpoint.resume true");
  ASSERT_EQ(c.rc, 0) << c.out;
  // another global batch: the data goes on from the same token (3 steps x 2 micro-steps x
  // 4 sequences x 16 tokens = 384), now in windows of 2 sequences
  Result h = train("resume_half", 1, "--train.micro_batch_size 2 --checkpoint.resume true");
  ASSERT_EQ(h.rc, 0) << h.out;
  EXPECT_NE(h.out.find("this run reads 32; the data continues at token 384 of epoch 0"), std::string::npos)
      << h.out;
  std::vector<double> want = losses("resume_ref");
  for (const char* name : {"resume_fsdp2", "resume_single"}) {
    std::vector<double> got = losses(name);  // 3 steps, then 2 more after the resume
    ASSERT_EQ(got.size(), 5u) << name;
    for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(got[i], want[i], 2e-5 * want[i]) << name << " step " << i + 1;
    EXPECT_LT(max_rel_diff(last_model(name), last_model("resume_ref")), 2e-5) << name;
  }
}

TEST_F(DistTrain, ChainOfLayoutsTp2ThenFsdp2CpThenOneProcess) {
  // tensor-parallel slices, FSDP shards and CP chunks all write and read the one format
  check_chain(
      "chain",
      {{2, "--train.micro_batch_size 4 --parallel.tp_size 2 --train.stop_after 2"},
       {4, "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --parallel.cp_size 2 --train.stop_after 2"},
       {1, "--train.micro_batch_size 4"}},
      "", 5);
}

TEST_F(DistTrain, ShardedCheckpointsReshardAcrossLayouts) {
  // every rank writes its own shards; fsdp2 x tp2 -> hsdp 2x2 -> cp2 -> one process, each
  // reading the previous layout's files, continue one process's run
  Result ref = train("sharded_ref", 1, "--train.micro_batch_size 4 --train.steps 6");
  ASSERT_EQ(ref.rc, 0) << ref.out;
  const std::string sharded = " --checkpoint.format sharded --train.steps 6";
  // every layout's checkpoints carry the run's vocabulary (rank 0 writes it beside the shards)
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  auto carries_vocab = [&](const char* step) {
    const fs::path at = dir_ / "sharded" / "ck" / step;
    EXPECT_EQ(read(at / "vocab.json"), read(dir_ / "data" / "vocab.json")) << at;
    EXPECT_EQ(ckpt::read_tokenizer_files(at.string()).vocabulary, "vocab.json") << at;
  };
  Result a = train("sharded", 4,
                   "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --parallel.tp_size 2 "
                   "--train.stop_after 2" +
                       sharded);
  ASSERT_EQ(a.rc, 0) << a.out;
  carries_vocab("step_00000002");
  const fs::path step2 = dir_ / "sharded" / "ck" / "step_00000002";
  for (const char* f : {"shard_tp0_fsdp0.safetensors", "shard_tp0_fsdp1.safetensors",
                        "shard_tp1_fsdp0.safetensors", "shard_tp1_fsdp1.safetensors", "checkpoint.json"})
    EXPECT_TRUE(fs::exists(step2 / f)) << f;
  Result b = train("sharded", 4,
                   "--train.micro_batch_size 1 --parallel.dp_replicate_size 2 --parallel.dp_shard_size 2 "
                   "--train.stop_after 1 --checkpoint.resume true" +
                       sharded);
  ASSERT_EQ(b.rc, 0) << b.out;
  carries_vocab("step_00000003");
  // HSDP: the replicas hold copies, only replicate 0 writes (2 shard files)
  int files = 0;
  for (auto& e : fs::directory_iterator(dir_ / "sharded" / "ck" / "step_00000003"))
    files += e.path().extension() == ".safetensors";
  EXPECT_EQ(files, 2);
  Result c = train("sharded", 2,
                   "--train.micro_batch_size 4 --parallel.cp_size 2 --train.stop_after 2 "
                   "--checkpoint.resume true" +
                       sharded);
  ASSERT_EQ(c.rc, 0) << c.out;
  carries_vocab("step_00000005");
  Result d = train("sharded", 1, "--train.micro_batch_size 4 --checkpoint.resume true" + sharded);
  ASSERT_EQ(d.rc, 0) << d.out;
  carries_vocab("step_00000006");
  std::vector<double> got = losses("sharded"), want = losses("sharded_ref");
  ASSERT_EQ(got.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(got[i], want[i], 2e-5 * want[i]) << "step " << i + 1;
  // the last checkpoint as one file with GPT-2 names equals the reference run's weights
  const fs::path exported = dir_ / "sharded" / "exported.safetensors";
  Result x = run_shell(std::string(NDT_EXPORT_BIN) + " " +
                       (dir_ / "sharded" / "ck" / "step_00000006").string() + " " + exported.string());
  ASSERT_EQ(x.rc, 0) << x.out;
  EXPECT_LT(max_rel_diff(exported, dir_ / "sharded_ref" / "ck" / "step_00000006" / "model.safetensors"),
            3e-5);
  // a sharded checkpoint's directory as model.init_from, in yet another layout: it starts
  // from the trained weights (a lower first loss than the random init's)
  Result init = train("init_sharded", 2,
                      "--train.micro_batch_size 2 --parallel.tp_size 2 --train.steps 1 "
                      "--model.init_from " +
                          (dir_ / "sharded" / "ck" / "step_00000006").string());
  ASSERT_EQ(init.rc, 0) << init.out;
  ASSERT_EQ(losses("init_sharded").size(), 1u);
  EXPECT_LT(losses("init_sharded")[0], want[0] - 0.2);
  // a damaged shard is one clear line naming the file
  const fs::path bad = dir_ / "damaged" / "ck" / "step_00000006";
  fs::create_directories(bad.parent_path());
  fs::copy(dir_ / "sharded" / "ck" / "step_00000006", bad);
  std::ofstream(bad.parent_path() / "latest") << "step_00000006\n";
  {
    std::fstream f(bad / "shard_tp0_fsdp0.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2000);
    f.put('\x55');
  }
  Result e = train("damaged", 2,
                   "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --checkpoint.resume true" +
                       std::string(" --checkpoint.format sharded --train.steps 8"));
  EXPECT_NE(e.rc, 0) << e.out;
  EXPECT_NE(e.out.find("shard_tp0_fsdp0.safetensors fails its checksum"), std::string::npos) << e.out;
}

TEST_F(DistTrain, ACheckpointResumesUnderATensorParallelismItsVocabularyPaddingDoesNotDivide) {
  check_repadded_resume(kGPT2);
}

TEST_F(DistTrain, OneFailingRankEndsTheJobWithItsMessage) {
  // rank 1 cannot write its trace file (a directory is in the way): it fails at start,
  // while rank 0 goes on to the first collective; the whole job must end, quickly
  fs::create_directories(dir_ / "fail" / "trace.rank1.json");
  Result r = train("fail", 2,
                   "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --log.trace " +
                       (dir_ / "fail" / "trace.json").string());
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_LT(r.seconds, 10.0) << r.out;
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("log.trace"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is a directory"), std::string::npos) << r.out;
  for (auto& e : fs::recursive_directory_iterator(dir_ / "fail"))  // nothing half-written
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST_F(DistTrain, SigtermToTheJobSavesAndResumesBitIdentically) {
  // the uninterrupted run
  Result ref = train("sig_ref", 2, "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --train.steps 300");
  ASSERT_EQ(ref.rc, 0) << ref.out;
  // the same run, and SIGTERM to one of its ranks after 2 steps
  const fs::path d = dir_ / "sig";
  fs::create_directories(d);
  const std::string cmd = mpirun(2) + NDT_TRAIN_GPT_BIN + " --config " + (dir_ / "gpt.ini").string() +
                          " --log.metrics " + (d / "metrics.jsonl").string() + " --checkpoint.dir " +
                          (d / "ck").string() +
                          " --train.micro_batch_size 2 --parallel.dp_shard_size 2 --train.steps 300 > " +
                          (d / "out.txt").string() + " 2>&1";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setpgid(0, 0);
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 600 && losses("sig").size() < 2; ++i) ::usleep(20000);
  ASSERT_GE(losses("sig").size(), 2u) << "no step within 12 s";
  // one rank gets the signal (as when a scheduler signals tasks, or a node is preempted):
  // every rank must stop after the same step
  std::vector<pid_t> ranks;
  {
    Result ps = run_shell("pgrep -f -- '--checkpoint.dir " + (d / "ck").string() + "'");
    std::istringstream is(ps.out);
    for (pid_t p; is >> p;) {  // mpirun and the shell running pgrep match too
      std::ifstream comm("/proc/" + std::to_string(p) + "/comm");
      std::string name;
      std::getline(comm, name);
      if (name == "train_gpt") ranks.push_back(p);
    }
  }
  ASSERT_EQ(ranks.size(), 2u) << "the two train_gpt ranks";
  ::kill(ranks.back(), SIGTERM);
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  std::ifstream f(d / "out.txt");
  const std::string out((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(out.find("stopped by signal 15 after step"), std::string::npos) << out;
  const size_t done = losses("sig").size();
  ASSERT_LT(done, 300u) << "the signal came too late to test anything";
  ASSERT_TRUE(fs::exists(d / "ck" / "latest")) << out;
  for (auto& e : fs::directory_iterator(d / "ck"))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos) << e.path();
  // resume: the rest of the run, the same numbers as without the signal
  Result r = train(
      "sig", 2,
      "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --train.steps 300 --checkpoint.resume true");
  ASSERT_EQ(r.rc, 0) << r.out;
  std::vector<double> got = losses("sig"), want = losses("sig_ref");
  ASSERT_EQ(got.size(), 300u);
  for (size_t i = 0; i < 300; ++i)
    EXPECT_EQ(got[i], want[i]) << "step " << i + 1 << " (stopped after " << done << ")";
}

TEST_F(DistTrain, BadLayoutsAreOneClearLine) {
  const std::vector<Refused> cases = {
      {"bad1", 2, "--parallel.dp_shard_size 3", "multiply to 3 ranks but the job has 2"},
      {"bad2", 3, "--parallel.tp_size 3", "model.n_head = 4 is not divisible by tp_size = 3"},
      {"bad2b", 3, "--parallel.cp_size 3",
       "train.seq_len = 16 must be divisible by 2 x parallel.cp_size = 6"},
      {"bad2c", 2, "--parallel.tp_size 2 --model.vocab_multiple 1 --model.vocab_size 17",
       "vocabulary of 17 rows"},
      {"bad3", 1, "--parallel.dp_shard_size -2", "parallel.dp_shard_size"},
      {"bad3b", 2, "--train.device cuda --parallel.backend mpi",  // before looking for a GPU
       "parallel.backend = mpi moves CPU tensors, but train.device = cuda on 2 ranks"},
      {"bad3c", 2, "--train.device cuda:0", "puts all 2 ranks of this node on one GPU"},
      {"bad4", 1, "--optim.lr_scaling linear", "optim.lr_base_batch"},
  };
  for (const Refused& c : cases) {
    const Result r = expect_refused(c);
    // the sizes and the model every rank checks alike: one line from rank 0, no abort
    if (c.name.rfind("bad2", 0) == 0 || c.name == "bad1") expect_one_line(c, r);
  }
}

TEST_F(DistTrain, EffectiveBatchAndLearningRateScaling) {
  Result r = train("lrscale", 2,
                   "--train.micro_batch_size 2 --parallel.dp_shard_size -1 --optim.lr_scaling sqrt "
                   "--optim.lr_base_batch 2 "
                   "--train.steps 1");
  ASSERT_EQ(r.rc, 0) << r.out;
  // 2 sequences x 2 accumulation x 2 ranks = 8 sequences; sqrt(8 / 2) = 2: lr 0.02
  EXPECT_NE(r.out.find("= 8 sequences = 128 tokens per step"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("= 0.02 (optim.lr_scaling = sqrt)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mesh: dp_replicate 1 x dp_shard 2 x cp 1 x tp 1 = 2 ranks (FSDP)"), std::string::npos)
      << r.out;
}

// ---- the Llama family: every layout of the GPT-2 tests above, on kLlama ------------------

TEST_F(DistTrain, LlamaDataParallelLayoutsEqualOneProcess) {
  check_layouts({{"dp2", 2, 1}, {"fsdp2", 1, 2}, {"hsdp2x2", 2, 2}}, 2, nullptr, kLlama);
}

TEST_F(DistTrain, LlamaTensorAndContextParallelLayoutsEqualOneProcess) {
  // TP: whole kv groups of c_attn per rank, lm_head split by vocabulary rows; CP: the
  // rotary angles of each rank's two chunks at their global positions
  check_layouts(
      {{"tp2", 1, 1, 1, 2}, {"cp2", 1, 1, 2, 1}, {"fsdp2_tp2", 1, 2, 1, 2}, {"cp2_tp2", 1, 1, 2, 2}}, 2,
      nullptr, kLlama);
}

TEST_F(DistTrain, LlamaSequenceParallelLayoutsEqualOneProcess) {
  // the RMSNorms on each tp rank's part of the sequence: their weights' partial gradients
  // summed over the tp group (with FSDP after its reduce-scatter)
  const char* sp = "--parallel.sequence_parallel true";
  check_layouts(
      {{"tp2_sp", 1, 1, 1, 2, sp}, {"fsdp2_tp2_sp", 1, 2, 1, 2, sp}, {"cp2_tp2_sp", 1, 1, 2, 2, sp}}, 2,
      nullptr, kLlama);
}

TEST_F(DistTrain, LlamaActivationCheckpointingEqualsOneProcess) {
  // full recomputes the block, selective the attention core with the forward's rotary tables
  // (on one process, under CP's ring, under sequence parallelism and under FSDP)
  check_layouts({{"full_ac", 1, 1, 1, 1, "--train.activation_checkpointing full"},
                 {"selective_ac", 1, 1, 1, 1, "--train.activation_checkpointing selective"},
                 {"cp2_selective_ac", 1, 1, 2, 1, "--train.activation_checkpointing selective"},
                 {"tp2_sp_full_ac", 1, 1, 1, 2,
                  "--parallel.sequence_parallel true --train.activation_checkpointing full"},
                 {"fsdp2_selective_ac", 1, 2, 1, 1, "--train.activation_checkpointing selective"}},
                2, nullptr, kLlama);
}

TEST_F(DistTrain, LlamaWithQkvBiasesAndATiedHeadEqualsOneProcess) {
  // Qwen2's q, k, v biases split with c_attn's kv groups; wte's gradient from both ends
  check_layouts(
      {{"fsdp2", 1, 2}, {"tp2", 1, 1, 1, 2}, {"cp2_tp2_sp", 1, 1, 2, 2, "--parallel.sequence_parallel true"}},
      2, nullptr, kLlamaTiedBias);
}

TEST_F(DistTrain, Qwen3LayoutsEqualOneProcess) {
  // q_norm and k_norm whole on every tp rank, each rank's gradient of them from its own heads
  // summed over the tp group (with and without sequence parallelism); c_attn's kv groups and
  // c_proj's rows of 12-channel heads; the ring's chunks; a pipeline of two stages
  const Model piped{"qwen3_pp_", kQwen3.args + kPipeGPT2.args, 4};
  check_layouts({{"tp2", 1, 1, 1, 2},
                 {"tp2_sp", 1, 1, 1, 2, "--parallel.sequence_parallel true"},
                 {"fsdp2_tp2", 1, 2, 1, 2},
                 {"cp2", 1, 1, 2, 1}},
                2, nullptr, kQwen3);
  check_layouts({{"pp2_1f1b", 1, 1, 1, 1, "", 2}}, 1, nullptr, piped);
}

TEST_F(DistTrain, MixtureOfExpertsDataParallelLayoutsEqualOneProcess) {
  // the experts are parameters as any other: whole on every rank (DP) or sharded (FSDP, HSDP);
  // each rank routes its own tokens, and the load-balancing loss is the micro-step's whole
  // batch's from every data rank's statistics, as one process computes it
  check_layouts({{"dp2", 2, 1}, {"fsdp2", 1, 2}, {"hsdp_r2_s2", 2, 2}}, 2, nullptr, kQwen3Moe);
}

TEST_F(DistTrain, MixtureOfExpertsSplitSequencesEqualOneProcess) {
  // each rank routes its part of every sequence; the load-balancing loss from the whole
  // sequences' counts and probabilities, summed over the cp (and sp) ranks
  check_layouts({{"cp2", 1, 1, 2, 1}, {"fsdp2_cp2", 1, 2, 2, 1}, {"sp2", 1, 1, 1, 1, "", 1, 2}}, 2, nullptr,
                kQwen3Moe);
}

TEST_F(DistTrain, MixtureOfExpertsRouterZLossLayoutsEqualOneProcess) {
  // the z-loss's token mean over the whole batch: its sums and rows summed over the data ranks
  // (dp2) and over the ranks holding parts of the sequences (fsdp2 x cp2), beside the
  // load-balancing loss's statistics
  const Model z{"qwen3moe_z_", kQwen3Moe.args + " --model.router_z_loss_coef 0.5"};
  check_layouts({{"dp2", 2, 1}, {"fsdp2_cp2", 1, 2, 2, 1}}, 2, nullptr, z);
}

TEST_F(DistTrain, Qwen2MoeSharedExpertLayoutsEqualOneProcess) {
  // Qwen2-MoE's block: q, k, v biases, the routed experts beside a shared expert of 40 gated by
  // sigmoid(x Wg); sharded whole by FSDP, and under tp with sequence parallelism the shared
  // expert split as the llama MLP (gate and up by columns, down by rows) while its gate stays
  // whole on every rank, as the router (without sequence parallelism every rank gates every token)
  const Model q2{"qwen2moe_",
                 kLlama.args +
                     " --model.attention_bias true --model.n_experts 4 --model.n_experts_per_tok 2 "
                     "--model.moe_intermediate_size 24 --model.dense_layers 0 "
                     "--model.shared_expert_intermediate_size 40 --model.router_aux_loss_coef 0.1"};
  check_layouts(
      {{"fsdp2", 1, 2}, {"tp2", 1, 1, 1, 2}, {"tp2_sp", 1, 1, 1, 2, "--parallel.sequence_parallel true"}}, 2,
      nullptr, q2);
}

TEST_F(DistTrain, MixtureOfExpertsUnderTensorParallelismEqualsOneProcess) {
  // the attention split over tp, the router and the experts whole on every rank: every rank
  // routes every token alike; with sequence parallelism each its part of the sequence (the
  // experts' gradients summed over tp, the routers' statistics too)
  check_layouts({{"tp2", 1, 1, 1, 2},
                 {"tp2_sp", 1, 1, 1, 2, "--parallel.sequence_parallel true"},
                 {"fsdp2_tp2_sp", 1, 2, 1, 2, "--parallel.sequence_parallel true"}},
                2, nullptr, kQwen3Moe);
}

TEST_F(DistTrain, MixtureOfExpertsPipelinesEqualOneProcess) {
  // 4 blocks (a dense one, then 3 MoE) in 2 or 4 stages: the load-balancing loss couples
  // every stage's layers, so each stage's router statistics go forward with the activations
  // and the whole model's come back with the gradients, in every schedule; with data
  // parallelism inside the stages, and with activation checkpointing's recompute
  const Model moe_pp{"qwen3moe_pp_", kQwen3Moe.args + kPipeGPT2.args, 4};
  check_layouts(
      {{"pp2_1f1b", 1, 1, 1, 1, "", 2},
       {"pp4_1f1b", 1, 1, 1, 1, "", 4},
       {"pp2_interleaved", 1, 1, 1, 1, "--parallel.pp_schedule interleaved --parallel.pp_virtual 2", 2},
       {"pp2_zb", 1, 1, 1, 1, "--parallel.pp_schedule zb-h1", 2},
       {"pp2_dp2_ac", 2, 1, 1, 1, "--train.activation_checkpointing full", 2},
       {"pp2_fsdp2_ep2", 1, 2, 1, 1, "--parallel.ep_size 2", 2}},
      1, nullptr, moe_pp);
  // with the router z-loss beside it: its sums travel too
  const Model moe_pp_z{"qwen3moe_pp_z_", moe_pp.args + " --model.router_z_loss_coef 0.5", 4};
  check_layouts({{"pp2_1f1b", 1, 1, 1, 1, "", 2}, {"pp2_zb", 1, 1, 1, 1, "--parallel.pp_schedule zb-h1", 2}},
                1, nullptr, moe_pp_z);
}

TEST_F(DistTrain, MixtureOfExpertsFiveDimensionsWithExpertParallelismOnSixteenRanks) {
  // pp 2 x dp_shard 2 x cp 2 x tp 2 (with its sequence parallelism), the experts over ep 2
  // of the shard ranks: every dimension at once
  const Model moe_pp{"qwen3moe_pp_", kQwen3Moe.args + kPipeGPT2.args, 4};
  check_layouts(
      {{"pp2_s2_cp2_tp2_ep2", 1, 2, 2, 2, "--parallel.ep_size 2 --parallel.sequence_parallel true", 2}}, 1,
      nullptr, moe_pp);
}

TEST_F(DistTrain, LlamaBfloat16LayoutsFollowOneProcess) {
  check_bf16_layouts({{"bf16_fsdp2", 1, 2},
                      {"bf16_sp2", 1, 1, 1, 1, "", 1, 2},
                      {"bf16_dp2", 2, 1},
                      {"bf16_tp2", 1, 1, 1, 2},
                      {"bf16_cp2", 1, 1, 2, 1},
                      {"bf16_tp2_sp", 1, 1, 1, 2, "--parallel.sequence_parallel true"}},
                     kLlama);
}

// bf16 mixed precision with the experts inside FSDP: sharded over two ranks (ep2 in fsdp4),
// and over one (ep2 in fsdp2: the whole buffer borrows the rank's bf16 compute shard)
TEST_F(DistTrain, MixtureOfExpertsBfloat16UnderExpertParallelismFollowsOneProcess) {
  check_bf16_layouts({{"bf16_ep2_fsdp2", 1, 2, 1, 1, "--parallel.ep_size 2"},
                      {"bf16_ep2_fsdp4", 1, 4, 1, 1, "--parallel.ep_size 2"}},
                     kQwen3Moe);
}

TEST_F(DistTrain, LlamaFourDimensionsOnSixteenRanks) {
  check_layouts({{"r2_s2_cp2_tp2", 2, 2, 2, 2}}, 1, nullptr, kLlama);
}

TEST_F(DistTrain, LlamaUlyssesInFiveDimensionsOnSixteenRanks) {
  // dp_shard 2 x cp 2 x sp 2 x tp 2 with tp's sequence parallelism (USP: Ulysses inside the
  // ring; each tp rank's kv head replicated over sp), and pp 2 x cp 2 x sp 2 x tp 2
  check_layouts({{"s2_cp2_sp2_tp2_seqpar", 1, 2, 2, 2, "--parallel.sequence_parallel true", 1, 2}}, 1,
                nullptr, kLlama);
  const Model piped{"llama_pp_", kLlama.args + kPipeGPT2.args, 4};
  check_layouts({{"pp2_cp2_sp2_tp2", 1, 1, 2, 2, "", 2, 2}}, 1, nullptr, piped);
}

TEST_F(DistTrain, LlamaShardedCheckpointsReshardAcrossLayouts) {
  // fsdp2 x tp2 -> cp2 -> one process, each reading the shards of the one before (lm_head's
  // vocabulary slices and FSDP shards); the last checkpoint exported to one file
  const std::string sharded = " --checkpoint.format sharded";
  check_chain(
      "llama_sharded",
      {{4, "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --parallel.tp_size 2 --train.stop_after 2" +
               sharded},
       {2, "--train.micro_batch_size 4 --parallel.cp_size 2 --train.stop_after 2" + sharded},
       {1, "--train.micro_batch_size 4" + sharded}},
      "--train.steps 6" + kLlama.args, 6);
}

TEST_F(DistTrain, MixtureOfExpertsShardedCheckpointsReshardAcrossLayouts) {
  // tp2 -> sp2 (FSDP over the sp ranks: the experts' stacked matrices in its shards) -> one
  // process; every layout with the reference's micro-batches of 4 (each one's load-balancing loss)
  const std::string sharded = " --train.micro_batch_size 4 --checkpoint.format sharded";
  check_chain("moe_sharded",
              {{2, "--parallel.tp_size 2 --train.stop_after 2" + sharded},
               {2, "--parallel.sp_size 2 --train.stop_after 2" + sharded},
               {1, sharded}},
              "--train.steps 6" + kQwen3Moe.args, 6);
}

TEST_F(DistTrain, LlamaFullCheckpointsResumeAcrossLayouts) {
  // tp2 -> fsdp2 -> one process through model.safetensors, which holds the untied lm_head
  check_chain("llama_full",
              {{2, "--train.micro_batch_size 4 --parallel.tp_size 2 --train.stop_after 2"},
               {2, "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --train.stop_after 2"},
               {1, "--train.micro_batch_size 4"}},
              "--train.steps 6" + kLlama.args, 6);
}

// ---- pipeline parallelism: checkpoints written by one pipeline layout resume in another ------
// (4 blocks, so that up to 4 stages hold one each; the reference runs take them too)

// The files and the stages of a pipeline run's sharded checkpoint: one file per stage and
// tensor-parallel rank (fsdp 1), the blocks of each stage summing to the model's 4, and the
// tied embeddings (wte, wpe, ln_f) of the first and the last stage the same values and
// moments, bit for bit (their gradients are summed between the two before each step).
void expect_pipeline_files(const fs::path& ckpt, int pp, int tp) {
  auto file = [&](int s, int t) {
    return ckpt / ("shard_pp" + std::to_string(s) + "_tp" + std::to_string(t) + "_fsdp0.safetensors");
  };
  for (int s = 0; s < pp; ++s)
    for (int t = 0; t < tp; ++t) EXPECT_TRUE(fs::exists(file(s, t))) << file(s, t);
  for (int t = 0; t < tp; ++t) {
    io::SafeTensorsReader first(file(0, t).string()), last(file(pp - 1, t).string());
    for (const char* n : {"data.embeddings", "m.embeddings", "v.embeddings"}) {
      const std::vector<float> a = first.get(n).to_vector<float>(), b = last.get(n).to_vector<float>();
      EXPECT_FALSE(a.empty()) << n;
      EXPECT_EQ(a, b) << n << " of tp rank " << t << " differs between the first and the last stage";
    }
  }
  std::ifstream in(ckpt / "checkpoint.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  EXPECT_EQ(m["layout"]["pp"], pp) << m.dump();
  int64_t blocks = 0;
  for (const auto& b : m["layout"]["pp_blocks"]) blocks += b.get<int64_t>();
  EXPECT_EQ(m["layout"]["pp_blocks"].size(), static_cast<size_t>(pp)) << m.dump();
  EXPECT_EQ(blocks, 4) << m.dump();
  EXPECT_EQ(m["files"].size(), static_cast<size_t>(pp * tp)) << m.dump();
}

TEST_F(DistTrain, PipelineShardedCheckpointsReshardAcrossLayouts) {
  // each stage writes its own files (shard_pp<s>_...); every reader finds each of its
  // parameters by name in the stage that wrote it: pp 2 -> pp 4 (one block a stage, the
  // middle stages' embeddings empty) -> pp 2 x fsdp 2 (each stage's units sharded) -> fsdp 2
  // -> one process, against one process
  const std::string sharded = " --checkpoint.format sharded";
  check_chain(
      "pp_sharded",
      {{2, "--train.micro_batch_size 4 --parallel.pp_size 2 --train.stop_after 2" + sharded},
       {4, "--train.micro_batch_size 4 --parallel.pp_size 4 --train.stop_after 1" + sharded},
       {4, "--train.micro_batch_size 2 --parallel.pp_size 2 --parallel.dp_shard_size 2 --train.stop_after 1" +
               sharded},
       {2, "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --train.stop_after 1" + sharded},
       {1, "--train.micro_batch_size 4" + sharded}},
      "--model.n_layer 4 --train.steps 6", 6);
  // and the other way: one process -> pp 2 x tp 2, whose last checkpoint is exported
  check_chain("pp_sharded_up",
              {{1, "--train.micro_batch_size 4 --train.stop_after 2" + sharded},
               {4, "--train.micro_batch_size 4 --parallel.pp_size 2 --parallel.tp_size 2" + sharded}},
              "--model.n_layer 4 --train.steps 4", 4);
  expect_pipeline_files(dir_ / "pp_sharded_up" / "ck" / "step_00000004", 2, 2);
  // interleaved: each rank holds two chunks (blocks 0 and 2 on rank 0, 1 and 3 on rank 1)
  // and writes both; read back by 1f1b stages of two consecutive blocks
  check_chain("pp_sharded_interleaved",
              {{2,
                "--train.micro_batch_size 4 --parallel.pp_size 2 --parallel.pp_schedule interleaved "
                "--parallel.pp_virtual 2 --train.stop_after 2" +
                    sharded},
               {2, "--train.micro_batch_size 4 --parallel.pp_size 2" + sharded}},
              "--model.n_layer 4 --train.steps 4", 4);
}

TEST_F(DistTrain, PipelineStagesStartFromAModelFolder) {
  // model.init_from a Hugging Face folder: every stage checks the folder whole and reads its own
  // tensors; the losses equal one process started from the same folder
  const std::string common = " --model.n_layer 4 --train.micro_batch_size 2 --checkpoint.format sharded";
  Result made = train("pp_hf_src", 2, "--parallel.pp_size 2 --train.steps 2" + common);
  ASSERT_EQ(made.rc, 0) << made.out;
  const fs::path folder = dir_ / "pp_hf_folder";
  Result ex = run_shell(std::string(NDT_EXPORT_BIN) + " " +
                        (dir_ / "pp_hf_src" / "ck" / "step_00000002").string() + " " + folder.string());
  ASSERT_EQ(ex.rc, 0) << ex.out;
  const std::string from = " --train.steps 2 --model.init_from " + folder.string();
  Result one = train("pp_hf_one", 1, common + from);
  ASSERT_EQ(one.rc, 0) << one.out;
  Result pp = train("pp_hf_pp4", 4, "--parallel.pp_size 4" + common + from);
  ASSERT_EQ(pp.rc, 0) << pp.out;
  const std::vector<double> a = losses("pp_hf_one"), b = losses("pp_hf_pp4");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(b[i], a[i], 1e-6 * a[i]) << "step " << i + 1;
  EXPECT_LT(a[0], losses("pp_hf_src")[0]) << "the folder's weights are trained, not a fresh init";
}

TEST_F(DistTrain, PipelineFullCheckpointsResumeAcrossLayouts) {
  // model.safetensors holds the whole model (gathered from the stages); a stage reads its
  // units from it by name: pp 2 -> one process -> pp 2 x fsdp 2
  check_chain("pp_full",
              {{2, "--train.micro_batch_size 4 --parallel.pp_size 2 --train.stop_after 2"},
               {1, "--train.micro_batch_size 4 --train.stop_after 2"},
               {4, "--train.micro_batch_size 2 --parallel.pp_size 2 --parallel.dp_shard_size 2"}},
              "--model.n_layer 4 --train.steps 6", 6);
}

TEST_F(DistTrain, LlamaPipelineShardedCheckpointsReshardAcrossLayouts) {
  // untied: wte on the first stage's files, ln_f and lm_head on the last's; pp 2 -> one process
  const std::string sharded = " --checkpoint.format sharded";
  check_chain("llama_pp_sharded",
              {{2, "--train.micro_batch_size 4 --parallel.pp_size 2 --train.stop_after 2" + sharded},
               {1, "--train.micro_batch_size 4" + sharded}},
              "--model.n_layer 4 --train.steps 4" + kLlama.args, 4);
  // and through model.safetensors, whose lm_head is the last stage's own parameter (not a
  // tied copy of wte): pp 2 -> pp 2 x tp 2
  check_chain("llama_pp_full",
              {{2, "--train.micro_batch_size 4 --parallel.pp_size 2 --train.stop_after 2"},
               {4, "--train.micro_batch_size 4 --parallel.pp_size 2 --parallel.tp_size 2"}},
              "--model.n_layer 4 --train.steps 4" + kLlama.args, 4);
}

TEST_F(DistTrain, LlamaCheckpointResumesUnderATensorParallelismItsVocabularyPaddingDoesNotDivide) {
  check_repadded_resume(kLlama);  // the untied lm_head's padded rows as wte's
}

TEST_F(DistTrain, LlamaKeysAndLayoutsThatDoNotFitAreOneClearLine) {
  // said once, by rank 0, and no rank aborts: every rank finds the same error
  const std::vector<Refused> cases = {
      {"llama_tp4", 4, "--parallel.tp_size 4" + kLlama.args,
       "tensor parallelism: model.n_kv_head = 2 key/value heads are not divisible by tp_size = 4"},
      {"gpt2_kv", 2, "--parallel.dp_shard_size 2 --model.n_kv_head 2",
       "model.n_kv_head = 2 is for model.arch = llama; leave it out for model.arch = gpt2"},
      {"gpt2_mlp", 1, "--model.intermediate_size 48",
       "model.intermediate_size = 48 is for model.arch = llama"},
      {"gpt2_bias", 1, "--model.attention_bias true",
       "model.attention_bias = true is for model.arch = llama"},
      {"gpt2_tied", 1, "--model.tie_embeddings true",
       "model.tie_embeddings = true is for model.arch = llama"},
      {"gpt2_theta", 2, "--parallel.tp_size 2 --model.rope_theta 500000",
       "model.rope_theta = 500000 is for model.arch = llama"},
      {"gpt2_scaling", 1, "--model.rope_scaling llama3",
       "model.rope_theta and model.rope_scaling are for model.arch = llama"},
      {"moe_fields", 1, "--model.n_experts_per_tok 2" + kLlama.args,
       "are for mixture-of-experts models: set model.n_experts > 0 or leave them out"},
      {"moe_k", 1,
       kQwen3.args + " --model.n_experts 4 --model.n_experts_per_tok 5 --model.moe_intermediate_size 8",
       "model.n_experts_per_tok (5) must be 1..model.n_experts (4)"},
      {"moe_dense", 1,
       kQwen3.args + " --model.n_experts 4 --model.n_experts_per_tok 2 --model.moe_intermediate_size 8 "
                     "--model.dense_layers 0,x",
       "model.dense_layers = \"0,x\": 'x' is not a layer 0..1"},
      {"rope_factor", 1,
       "--model.rope_factor 4" + kLlama.args.substr(0, kLlama.args.find(" --model.rope_scaling")),
       "are llama3 scaling's: set model.rope_scaling = llama3"},
  };
  for (const Refused& c : cases) {
    expect_one_line(c, expect_refused(c));
  }
}

}  // namespace
