// train_gpt end to end, in-process: config parsing and its errors, training that learns,
// bit-exact resume, and bad input (one clear line, non-zero exit, checkpoints untouched).
#include <gtest/gtest.h>

#include "support/corpus.h"
#include "support/outputs.h"
#include "support/testing.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "models/generate.h"
#include "models/gpt.h"
#include "tensor/cuda/runtime.h"
#include "train/checkpoint/checkpoint.h"
#include "train/data/data.h"
#include "train/data/vocab.h"
#include "train/planner/cluster.h"
#include "train/step_log.h"
#include "train/trainer.h"

using namespace ndt;
namespace fs = std::filesystem;
using ndt::testing::snapshot;  // to show a failed run changed nothing

namespace {

using ndt::testing::RunResult;
RunResult run(std::vector<std::string> args) { return ndt::testing::run_train_gpt(std::move(args)); }

// The small run of tests/support/corpus.h in a directory of its own.
fs::path make_data(const std::string& name) {
  fs::path d = ndt::testing::fresh_dir("train_" + name);
  ndt::testing::write_small_run(d);
  return d;
}

}  // namespace

TEST(TrainGpt, HelpListsEveryKeyWithDefaults) {
  RunResult r = run({"--help"});
  EXPECT_EQ(r.rc, 0);
  for (const char* key : {"model.n_layer",
                          "model.n_head",
                          "model.n_embd",
                          "model.vocab_size",
                          "model.block_size",
                          "model.init_from",
                          "data.train",
                          "data.val",
                          "data.shuffle",
                          "train.micro_batch_size",
                          "train.seq_len",
                          "train.grad_accum_steps",
                          "train.steps",
                          "train.eval_every",
                          "train.eval_steps",
                          "train.seed",
                          "train.device",
                          "train.dtype",
                          "train.activation_checkpointing",
                          "train.ac_every",
                          "optim.lr",
                          "optim.min_lr_frac",
                          "optim.warmup_steps",
                          "optim.schedule",
                          "optim.weight_decay",
                          "optim.beta1",
                          "optim.beta2",
                          "optim.eps",
                          "optim.grad_clip",
                          "checkpoint.dir",
                          "checkpoint.every",
                          "checkpoint.resume",
                          "log.metrics",
                          "log.every",
                          "sample.every",
                          "sample.length",
                          "sample.temperature",
                          "sample.top_k",
                          "sample.prompt",
                          "parallel.dp_replicate_size",
                          "parallel.dp_shard_size",
                          "parallel.tp_size",
                          "parallel.cp_size"})
    EXPECT_NE(r.out.find(key), std::string::npos) << key;
  EXPECT_NE(r.out.find("(=0.001)"), std::string::npos);  // defaults are shown
}

// A model.vocab_size far past the tokenizer's ids (Hub configs pad theirs): the samples
// never draw an id without text, the run says so once and finishes with its report.
// The routers' two losses are logged apart from the loss they are part of: the step line,
// metrics.jsonl (read back by a resumed run's report) and TensorBoard; none without them.
TEST(StepLog, ShowsTheLoadBalancingAndRouterZLossesApart) {
  train::StepLog s;
  s.steps = 10, s.loss = 4.5, s.sec = 0.5, s.tokens = 100;
  s.aux_loss = 2.0, s.z_loss = 0.125;
  EXPECT_NE(train::step_line(s).find("loss 4.5000 (load-balancing 2.0000) (router z 0.1250) |"),
            std::string::npos)
      << train::step_line(s);
  const nlohmann::json j = train::step_json(s);
  EXPECT_EQ(j.at("z_loss").get<double>(), 0.125);
  EXPECT_EQ(train::step_from_json(j, 1, 10, false).z_loss, 0.125);
  int found = 0;
  for (const auto& [tag, v] : train::step_scalars(s)) found += tag == "loss/router_z" && v == 0.125;
  EXPECT_EQ(found, 1);
  s.z_loss = -1;  // none
  EXPECT_EQ(train::step_line(s).find("router z"), std::string::npos);
  EXPECT_FALSE(train::step_json(s).contains("z_loss"));
  EXPECT_EQ(train::step_from_json(train::step_json(s), 1, 10, false).z_loss, -1);
}

TEST(TrainGpt, SamplesOnlyTheTokenizersIdsOfAPaddedVocabulary) {
  fs::path d = make_data("padded_vocab");
  RunResult r = run({"--config", (d / "gpt.ini").string(), "--train.steps", "2", "--model.vocab_size", "4096",
                     "--sample.every", "1", "--sample.length", "300", "--sample.temperature", "3",
                     "--log.report", (d / "report.html").string()});
  ASSERT_EQ(r.rc, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("samples: drawn from the "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(model.vocab_size 4096: the ids past them have no text)"), std::string::npos);
  EXPECT_NE(r.out.find("sample at step 2"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d / "report.html"));
}

// Slow steps still show progress: a step line whenever log.progress_seconds have passed
// since the last one, whatever log.every (here every step: each takes longer than 1 us);
// 0 leaves log.every alone.
TEST(TrainGpt, PrintsProgressAfterLogProgressSecondsWhateverLogEvery) {
  fs::path d = make_data("progress");
  auto step_lines = [](const std::string& out) {
    int n = 0;  // the training steps' lines ("step     3/6 | loss ..."), not the evaluations'
    for (size_t at = out.find("/6 | loss"); at != std::string::npos; at = out.find("/6 | loss", at + 1)) ++n;
    return n;
  };
  RunResult every = run({"--config", (d / "gpt.ini").string(), "--train.steps", "6", "--log.every", "1000",
                         "--log.progress_seconds", "0.000001", "--sample.every", "-1"});
  ASSERT_EQ(every.rc, 0) << every.err;
  EXPECT_EQ(step_lines(every.out), 6) << every.out;
  RunResult off = run({"--config", (d / "gpt.ini").string(), "--train.steps", "6", "--log.every", "1000",
                       "--log.progress_seconds", "0", "--sample.every", "-1"});
  ASSERT_EQ(off.rc, 0) << off.err;
  EXPECT_EQ(step_lines(off.out), 2) << off.out;  // the first and the last
  RunResult bad = run({"--config", (d / "gpt.ini").string(), "--log.progress_seconds", "-1"});
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("log.progress_seconds must be a finite number >= 0"), std::string::npos) << bad.err;
}

// --out: every output of the run in one folder (relative output paths inside it, the
// checkpoints, metrics and report by default); a second run into it is refused in one line
// naming what is there and the ways on, and changes nothing; it resumes with
// checkpoint.resume; another folder is a run of its own.
TEST(TrainGpt, ARunFolderHoldsEveryOutputAndIsNeverSilentlyReplaced) {
  fs::path d = make_data("run_folder");
  const std::string ini = (d / "gpt.ini").string(), out = (d / "runs" / "a").string();
  const std::vector<std::string> base = {"--config", ini, "--sample.every", "-1", "--log.tensorboard", "tb"};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = base;
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  RunResult first = run(with({"--out", out, "--train.steps", "3"}));
  ASSERT_EQ(first.rc, 0) << first.err;
  for (const char* f : {"ckpt/latest", "ckpt/step_00000003", "metrics.jsonl", "report.html", "tb"})
    EXPECT_TRUE(fs::exists(fs::path(out) / f)) << f;
  const auto before = snapshot(d / "runs");
  RunResult again = run(with({"--out", out, "--train.steps", "5"}));
  EXPECT_EQ(again.rc, 2);
  EXPECT_NE(again.err.find("the run folder " + out + " holds an earlier run's results (a checkpoint (" + out +
                           "/ckpt/step_00000003), " + out + "/metrics.jsonl, " + out + "/report.html, " +
                           "TensorBoard events in " + out +
                           "/tb), which this run would replace: resume that run "
                           "with --checkpoint.resume true (the same model), or give this run its own folder "
                           "with --out DIR"),
            std::string::npos)
      << again.err;
  EXPECT_EQ(std::count(again.err.begin(), again.err.end(), '\n'), 1) << again.err;
  EXPECT_EQ(snapshot(d / "runs"), before) << "a refused run changes nothing";
  // outputs without a checkpoint: only the other folder is offered
  RunResult no_ckpt =
      run(with({"--out", out, "--train.steps", "3", "--checkpoint.dir", (d / "elsewhere").string()}));
  EXPECT_EQ(no_ckpt.rc, 2);
  EXPECT_NE(no_ckpt.err.find("which this run would replace: give this run its own folder with --out DIR"),
            std::string::npos)
      << no_ckpt.err;
  RunResult resumed = run(with({"--out", out, "--train.steps", "5", "--checkpoint.resume", "true"}));
  ASSERT_EQ(resumed.rc, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos);
  EXPECT_EQ(ndt::testing::metric_losses(fs::path(out) / "metrics.jsonl").size(), 5u);
  RunResult other = run(with({"--out", (d / "runs" / "b").string(), "--train.steps", "3"}));
  ASSERT_EQ(other.rc, 0) << other.err;
  EXPECT_EQ(ndt::testing::metric_losses(d / "runs" / "b" / "metrics.jsonl").size(), 3u);
  EXPECT_EQ(ndt::testing::metric_losses(fs::path(out) / "metrics.jsonl").size(), 5u)
      << "the first run's folder is its own";
}

TEST(TrainGpt, TrainsEvaluatesSamplesAndReports) {
  fs::path d = make_data("learn");
  RunResult r = run({"--config", (d / "gpt.ini").string(), "--train.steps", "30", "--log.metrics",
                     (d / "m.jsonl").string(), "--log.report", (d / "report.html").string(), "--sample.every",
                     "0", "--sample.length", "20", "--checkpoint.dir", (d / "ckpt").string(),
                     "--log.tensorboard", (d / "tb").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<double> l = ndt::testing::metric_losses(d / "m.jsonl");
  ASSERT_EQ(l.size(), 30u);
  EXPECT_LT(l.back(), l.front() - 0.8) << r.out;  // it learns
  EXPECT_NE(r.out.find("parameters: "), std::string::npos);
  EXPECT_NE(r.out.find("tokens per step"), std::string::npos);
  EXPECT_NE(r.out.find("val loss"), std::string::npos);
  EXPECT_NE(r.out.find("sample at step 30"), std::string::npos);
  EXPECT_NE(r.out.find("GFLOP/s"), std::string::npos);
  std::ifstream rep(d / "report.html");
  std::stringstream ss;
  ss << rep.rdbuf();
  EXPECT_NE(ss.str().find("<svg"), std::string::npos);
  EXPECT_NE(ss.str().find("<polyline"), std::string::npos);
  // every step's loss, every evaluation (steps 0, 4, ..., 28 and the end), the sample
  EXPECT_NE(ss.str().find("data-series='train' data-points='30'"), std::string::npos);
  EXPECT_NE(ss.str().find("data-series='validation' data-points='9'"), std::string::npos);
  EXPECT_NE(ss.str().find("<pre class='sample' data-step='30'>"), std::string::npos);
  // TensorBoard: one event file, a record per step and per evaluation after the version's
  std::vector<fs::path> events;
  for (const auto& e : fs::directory_iterator(d / "tb")) events.push_back(e.path());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].filename().string().rfind("events.out.tfevents.", 0), 0u);
  EXPECT_GT(fs::file_size(events[0]), 40u * 100);
  // the final checkpoint loads back as weights (init_from)
  EXPECT_TRUE(fs::exists(d / "ckpt" / "step_00000030" / "model.safetensors"));
  RunResult r2 = run({"--config", (d / "gpt.ini").string(), "--train.steps", "1", "--model.init_from",
                      (d / "ckpt" / "step_00000030" / "model.safetensors").string(), "--log.metrics",
                      (d / "m2.jsonl").string()});
  ASSERT_EQ(r2.rc, 0) << r2.err;
  EXPECT_LT(ndt::testing::metric_losses(d / "m2.jsonl")[0],
            l.front() - 0.8);  // starts where training left off
}

TEST(TrainGpt, ResumedRunMatchesUninterruptedRunBitForBit) {
  fs::path d = make_data("resume");
  const std::string ini = (d / "gpt.ini").string();
  for (const char* shuffle : {"false", "true"}) {
    for (const char* f : {"a", "b", "full.jsonl", "b.jsonl"}) fs::remove_all(d / f);  // the last round's
    RunResult full = run({"--config", ini, "--data.shuffle", shuffle, "--train.grad_accum_steps", "2",
                          "--log.metrics", (d / "full.jsonl").string()});
    ASSERT_EQ(full.rc, 0) << full.err;
    RunResult part =
        run({"--config", ini, "--data.shuffle", shuffle, "--train.grad_accum_steps", "2", "--log.metrics",
             (d / "b.jsonl").string(), "--checkpoint.dir", (d / "b").string(), "--train.stop_after", "3"});
    ASSERT_EQ(part.rc, 0) << part.err;
    EXPECT_NE(part.out.find("stopped after 3 steps"), std::string::npos);
    EXPECT_EQ(ndt::testing::metric_losses(d / "b.jsonl").size(), 3u);
    RunResult rest = run({"--config", ini, "--data.shuffle", shuffle, "--train.grad_accum_steps", "2",
                          "--log.metrics", (d / "b.jsonl").string(), "--checkpoint.dir", (d / "b").string(),
                          "--checkpoint.resume", "true"});
    ASSERT_EQ(rest.rc, 0) << rest.err;
    EXPECT_NE(rest.out.find("resumed from"), std::string::npos);
    std::vector<double> a = ndt::testing::metric_losses(d / "full.jsonl"),
                        b = ndt::testing::metric_losses(d / "b.jsonl");
    ASSERT_EQ(a.size(), 8u);
    ASSERT_EQ(b.size(), 8u);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1 << " shuffle " << shuffle;
  }
}

TEST(TrainGpt, ActivationCheckpointingModesTrainTheSameBits) {
  // none, full (also spelled true, as when the key was a bool), selective and every 2nd
  // block: the same losses, bit for bit; false still means none
  fs::path d = make_data("ac");
  const std::string ini = (d / "gpt.ini").string();
  auto train = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "--config",           ini, "--train.steps", "3",
        "--train.eval_every", "0", "--log.metrics", (d / (name + ".jsonl")).string()};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r = run(args);
    EXPECT_EQ(r.rc, 0) << name << ": " << r.err;
    return std::make_pair(ndt::testing::metric_losses(d / (name + ".jsonl")), r.out);
  };
  const auto [none, none_out] = train("none", {});
  ASSERT_EQ(none.size(), 3u);
  EXPECT_EQ(none_out.find("activation checkpointing"), std::string::npos);
  const auto [off, off_out] = train("false", {"--train.activation_checkpointing", "false"});
  EXPECT_EQ(off, none);
  EXPECT_EQ(off_out.find("activation checkpointing"), std::string::npos);
  const auto [full, full_out] = train("true", {"--train.activation_checkpointing", "true"});
  EXPECT_EQ(full, none);
  EXPECT_NE(
      full_out.find("activation checkpointing: full (the whole block recomputed in backward) in every block"),
      std::string::npos)
      << full_out;
  const auto [sel, sel_out] =
      train("selective", {"--train.activation_checkpointing", "selective", "--train.ac_every", "2"});
  EXPECT_EQ(sel, none);
  EXPECT_NE(sel_out.find("activation checkpointing: selective (the attention core recomputed in backward) in "
                         "blocks 0, 2, 4, ..."),
            std::string::npos)
      << sel_out;
  const auto [every3, every3_out] = train("every3", {"--train.ac_every", "3"});  // ignored, with a warning
  EXPECT_EQ(every3, none);
  EXPECT_NE(every3_out.find("warning: train.ac_every = 3 has no effect"), std::string::npos) << every3_out;
}

TEST(TrainGpt, ConfigErrorsExitWithCode2AndNameTheKey) {
  fs::path d = make_data("config");
  const std::string ini = (d / "gpt.ini").string();
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  std::ofstream(d / "unknown.ini") << "[model]\nn_layers = 4\n";
  std::ofstream(d / "badval.ini") << "[train]\nsteps = many\n";
  const std::vector<Case> cases = {
      {{"--config", (d / "unknown.ini").string()}, "unknown key 'model.n_layers'"},
      {{"--config", (d / "badval.ini").string()}, "bad value for 'train.steps'"},
      {{"--config", ini, "--data.shuffle", "maybe"}, "bad value for 'data.shuffle'"},
      {{"--config", ini, "--optim.lr", "fast"}, "it takes a number"},
      {{"--config", ini, "--sample.every", "0", "--sample.prompt", "Zebra"},
       "sample.prompt cannot be encoded"},
      {{"--config", (d / "missing.ini").string()}, "cannot read config file"},
      {{"--config", ini, "--train.bogus", "1"}, "unknown key 'train.bogus'"},
      {{"--config", ini, "--train.seq_len", "64"}, "train.seq_len (64) must be <= model.block_size (32)"},
      {{"--config", ini, "--parallel.tp_size", "2"}, "tp_size 2 multiply to 2 ranks but the job has 1"},
      {{"--config", ini, "--optim.schedule", "exp"}, "optim.schedule must be cosine, linear or constant"},
      {{"--config", ini, "--train.dtype", "float16"}, "train.dtype must be float32 or bfloat16"},
      {{"--config", ini, "--train.device", "tpu"}, "train.device must be cpu, cuda or cuda:N"},
      {{"--config", ini, "--model.n_head", "3"}, "model.n_embd (32) must be a multiple of model.n_head (3)"},
      {{"--config", ini, "--train.activation_checkpointing", "partial"},
       "train.activation_checkpointing must be none, full or selective"},
      {{"--config", ini, "--train.ac_every", "0"}, "train.ac_every = 0 is outside [1, 1024]"},
      {{"--config", ini, "--train.ac_every", "two"}, "bad value for 'train.ac_every'"},
      {{"--config", ini, "--train.tf32", "sometimes"}, "bad value for 'train.tf32'"},
      {{"--config", ini, "--parallel.backend", "gloo"}, "parallel.backend must be auto, mpi or nccl"},
      {{"--config", ini, "--parallel.backend", "nccl"}, "parallel.backend = nccl needs train.device = cuda"},
  };
  if (!cuda::available()) {  // on a machine without a GPU, asking for one is a config error
    RunResult r = run({"--config", ini, "--train.device", "cuda"});
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_NE(r.err.find("no CUDA device is visible"), std::string::npos) << r.err;
    // and says why: no backend, no device, or a driver older than the CUDA runtime
    EXPECT_FALSE(cuda::unavailable_reason().empty());
    EXPECT_NE(r.err.find("(" + cuda::unavailable_reason() + ")"), std::string::npos) << r.err;
  }
  for (const Case& c : cases) {
    RunResult r = run(c.args);
    EXPECT_EQ(r.rc, 2) << c.expect << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  }
}

TEST(TrainGpt, BadInputFailsCleanlyAndLeavesCheckpointsAlone) {
  fs::path d = make_data("badinput");
  const std::string ini = (d / "gpt.ini").string(), ck = (d / "ckpt").string();
  ASSERT_EQ(run({"--config", ini, "--train.steps", "2", "--checkpoint.dir", ck}).rc, 0);
  const auto before = snapshot(d / "ckpt");
  ASSERT_FALSE(before.empty());
  // corrupt and truncated shards, a token >= vocab_size, a bad init_from file
  {
    std::ifstream in(d / "data" / "train_000000.bin", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string bytes = ss.str();
    std::ofstream(d / "trunc.bin", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    std::string bad = bytes;
    bad[0] = 'X';
    std::ofstream(d / "magic.bin", std::ios::binary) << bad;
  }
  data::write_shard((d / "bigtok.bin").string(), std::vector<uint16_t>(1000, 500));
  std::ofstream(d / "junk.safetensors") << "not a safetensors file at all";
  models::GPTConfig other;
  other.n_layer = 1, other.n_head = 2, other.n_embd = 32, other.vocab_size = 20, other.block_size = 32;
  models::GPT og(other);
  nn::FlatParams op = nn::materialize(og.units(), Device::cpu(), DType::f32, 1);
  ckpt::save_weights((d / "other.safetensors").string(), og, op);
  struct Case {
    std::vector<std::string> args;
    std::string expect;
    int rc = 1;  // 2: a config error, found before anything starts
  };
  const std::vector<Case> cases = {
      {{"--data.train", (d / "nothing_*.bin").string()}, "no data files match"},
      {{"--data.train", (d / "trunc.bin").string()}, "truncated or corrupt"},
      {{"--data.train", (d / "magic.bin").string()}, "bad magic"},
      {{"--data.train", (d / "bigtok.bin").string()}, "token 500 at position"},
      {{"--model.init_from", (d / "junk.safetensors").string()}, "junk.safetensors"},
      {{"--model.init_from", (d / "other.safetensors").string()}, "missing tensors: h.1."},
      {{"--model.init_from", (d / "nope.safetensors").string()}, "nope.safetensors does not exist", 2},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--config", ini, "--checkpoint.dir", ck, "--checkpoint.resume", "true"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    if (c.args[0] == "--model.init_from")  // init_from applies to fresh runs, in a folder of their own
      args[3] = (d / "fresh").string(), args[5] = "false";
    RunResult r = run(args);
    EXPECT_EQ(r.rc, c.rc) << c.expect << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    EXPECT_EQ(snapshot(d / "ckpt"), before) << c.expect;
  }
}

TEST(TrainGpt, AnOldCheckpointThatCannotBeDeletedIsAWarningAndTrainingGoesOn) {
  // checkpoint.keep = 1 prunes at every save; the old step 2 cannot be deleted (a file with
  // the immutable attribute): one warning naming it, every save succeeds, exit 0
  fs::path d = make_data("prune");
  const std::string ini = (d / "gpt.ini").string(), ck = (d / "ckpt").string();
  ASSERT_EQ(run({"--config", ini, "--train.steps", "2", "--checkpoint.dir", ck}).rc, 0);
  const fs::path stuck = d / "ckpt" / "step_00000002";
  ndt::testing::Immutable pin(stuck / "model.safetensors");
  if (!pin.error().empty()) GTEST_SKIP() << "cannot make a file immutable here (" << pin.error() << ")";
  RunResult r = run({"--config", ini, "--checkpoint.dir", ck, "--checkpoint.resume", "true",
                     "--checkpoint.every", "2", "--checkpoint.keep", "1"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  const std::string warning =
      "warning: checkpoint.keep = 1: cannot delete the old checkpoint " + stuck.string();
  size_t at = r.out.find(warning), warnings = 0;
  for (size_t i = at; i != std::string::npos; i = r.out.find("warning: checkpoint.keep", i + 1)) ++warnings;
  EXPECT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(warnings, 1u) << "once per path:\n" << r.out;
  for (const char* s : {"step_00000004", "step_00000006", "step_00000008"})
    EXPECT_NE(r.out.find(std::string("checkpoint: ") + (d / "ckpt" / s).string()), std::string::npos) << s;
  EXPECT_EQ(ckpt::latest_checkpoint(ck).value_or(""), (d / "ckpt" / "step_00000008").string());
  EXPECT_FALSE(fs::exists(d / "ckpt" / "step_00000006"));  // pruned as usual
}

namespace {

// The fortunes text that scripts/setup.sh installs (the main job's data), as char shards;
// empty when the text is not installed.
fs::path fortunes_data() {
  const fs::path src = "/usr/share/games/fortunes";
  if (!fs::is_directory(src)) return {};
  std::string text;
  std::vector<fs::path> files;
  for (auto& e : fs::directory_iterator(src))
    if (e.is_regular_file() && e.path().extension() != ".dat" && e.path().extension() != ".u8")
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    text += std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  if (text.size() < 100000) return {};
  fs::path d = ndt::testing::fresh_dir("fortunes");
  data::Vocab v = data::Vocab::build_char(text);
  std::vector<uint16_t> t = v.encode(text);
  const size_t split = t.size() * 95 / 100;
  data::write_shard((d / "train_000000.bin").string(), {t.begin(), t.begin() + split});
  data::write_shard((d / "val_000000.bin").string(), {t.begin() + split, t.end()});
  std::ofstream(d / "vocab_size") << v.size();
  return d;
}

}  // namespace

TEST(TrainGpt, Bfloat16LossesAreLoggedAtFloat32Resolution) {
  // a bf16 run's loss is computed and logged in f32 (as PyTorch's under autocast): a loss
  // rounded to bf16 would step by 2^-6 between 2 and 4 (4.5625, 4.53125, ...)
  fs::path d = make_data("bf16_loss");
  RunResult r = run({"--config", (d / "gpt.ini").string(), "--train.dtype", "bfloat16", "--train.steps", "4",
                     "--train.grad_accum_steps", "3", "--log.metrics", (d / "m.jsonl").string()});
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::vector<double> l = ndt::testing::metric_losses(d / "m.jsonl");
  ASSERT_EQ(l.size(), 4u);
  for (double v : l) {
    const double as_bf16 = Tensor::from_vector(std::vector<double>{v}, {1}).to(DType::bf16).item();
    const double as_f32 = static_cast<double>(static_cast<float>(v));
    EXPECT_NE(v, as_bf16) << "the loss " << v << " is a bf16 number";
    EXPECT_NEAR(v, as_f32, 1e-6 * v) << "the metrics keep the loss's f32 digits";
  }
  fs::remove_all(d);
}

TEST(TrainGpt, Bfloat16FollowsFloat32OnTheMainJobsData) {
  // mixed precision (bf16 parameters and activations, f32 master, AdamW and loss) against
  // f32 on the fortunes text: after 200 steps the losses agree within 2%
  const fs::path d = fortunes_data();
  if (d.empty()) GTEST_SKIP() << "the fortunes text is not installed (scripts/setup.sh installs it)";
  std::ifstream vs(d / "vocab_size");
  int64_t V = 0;
  vs >> V;
  auto train = [&](const std::string& dtype) {
    RunResult r = run({"--data.train", (d / "train_*.bin").string(), "--data.val", (d / "val_*.bin").string(),
                       // the main job's model and batch (configs/fortunes_char.ini), 200 steps
                       "--model.vocab_size", std::to_string(V), "--model.n_layer", "4", "--model.n_embd",
                       "128", "--model.n_head", "4", "--model.block_size", "64", "--train.seq_len", "64",
                       "--train.micro_batch_size", "32", "--train.steps", "200", "--train.eval_every", "0",
                       "--train.eval_steps", "20", "--optim.lr", "2e-3", "--optim.warmup_steps", "20",
                       "--data.shuffle", "true", "--sample.every", "-1", "--log.metrics",
                       (d / ("m_" + dtype + ".jsonl")).string(), "--train.dtype", dtype});
    EXPECT_EQ(r.rc, 0) << r.err;
    std::vector<double> l = ndt::testing::metric_losses(d / ("m_" + dtype + ".jsonl"));
    double last = 0;
    for (size_t i = l.size() - 20; i < l.size(); ++i) last += l[i] / 20;  // the mean of the last 20 steps
    const size_t at = r.out.find("final val loss ");
    EXPECT_NE(at, std::string::npos) << r.out;
    return std::pair<double, double>{last, std::stod(r.out.substr(at + 15))};
  };
  const auto [f32, f32_val] = train("float32");
  const auto [b16, b16_val] = train("bfloat16");
  std::printf("after 200 steps: train loss f32 %.4f bf16 %.4f, val loss f32 %.4f bf16 %.4f\n", f32, b16,
              f32_val, b16_val);
  EXPECT_LT(f32, 2.8);  // it learned (the text's unigram entropy is 3.3 nats)
  EXPECT_NEAR(b16, f32, 0.02 * f32);
  EXPECT_NEAR(b16_val, f32_val, 0.02 * f32_val);
  fs::remove_all(d);
}

// MFU is measured against the device's own dense peak for the training dtype (a bf16 run on
// an H100 against 989 TFLOP/s, not the f32 67 it once used for every run), or not at all.
TEST(TrainGpt, MfuFollowsTheDeviceAndTheDtype) {
  EXPECT_DOUBLE_EQ(train::device_peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16", true), 989.4);
  EXPECT_DOUBLE_EQ(train::device_peak_tflops("NVIDIA H100 80GB HBM3", "float32", true), 494.7);  // TF32
  EXPECT_DOUBLE_EQ(train::device_peak_tflops("NVIDIA H100 80GB HBM3", "float32", false), 66.9);
  EXPECT_DOUBLE_EQ(train::device_peak_tflops("NVIDIA H100 PCIe", "bfloat16", true), 756);
  EXPECT_DOUBLE_EQ(train::device_peak_tflops("NVIDIA H200", "bfloat16", true), 989.4);
  EXPECT_DOUBLE_EQ(train::device_peak_tflops("NVIDIA A100-SXM4-80GB", "bfloat16", true), 312);
  EXPECT_EQ(train::device_peak_tflops("NVIDIA GeForce RTX 4090", "bfloat16", true), 0);
  // 400 TFLOP/s per GPU in bf16 on an H100: 40% (the old default said 597%)
  EXPECT_EQ(
      train::speed_text(400e3, 1e12 * train::device_peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16", true)),
      "MFU 40%");
  EXPECT_EQ(train::speed_text(123.7, 0), "123 GFLOP/s");  // peak not known: no MFU
  EXPECT_NE(train::mfu_peak_line("NVIDIA H100 80GB HBM3", 989.4e12, "bfloat16").find("989.4 TFLOP/s"),
            std::string::npos);
  const std::string unknown = train::mfu_peak_line("NVIDIA GeForce RTX 4090", 0, "bfloat16");
  EXPECT_NE(unknown.find("not known"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("log.peak_tflops"), std::string::npos) << unknown;
}
