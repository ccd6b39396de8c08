// train_gpt against hostile input and faults: runs and checkpoints are never lost or
// silently wrong. In-process through train_main like tests/test_train.cpp, and, for
// signals, kills and concurrent runs, the real train_gpt binary as a child process.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>
#include "support/corpus.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist/flight.h"
#include "models/gpt.h"
#include "support/testing.h"
#include "tensor/threads.h"
#include "train/checkpoint/checkpoint.h"
#include "train/config.h"
#include "train/data/data.h"
#include "train/data/vocab.h"
#include "train/guard.h"
#include "train/io/files.h"
#include "train/io/safetensors.h"
#include "train/trainer.h"

using namespace ndt;
using ndt::testing::error_of;
using ndt::testing::snapshot;
namespace fs = std::filesystem;

namespace {

using ndt::testing::RunResult;
RunResult run(std::vector<std::string> args) { return ndt::testing::run_train_gpt(std::move(args)); }

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }
bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// A bit-exact comparison between this process and a train_gpt child holds only when both
// compute with the same GEMM kernel (tests/support/gtest_main.cpp picks it as train_gpt does).
std::string same_kernel_line() { return "OpenBLAS kernel " + ndt::blas_core(); }

// The small run of tests/support/corpus.h in a directory of its own.
fs::path make_data(const std::string& name) {
  fs::path d = ndt::testing::fresh_dir("robust_" + name);
  ndt::testing::write_small_run(d);
  return d;
}

// Losses by step; a step logged twice (a killed run, then its resume) keeps the last.
std::map<int64_t, double> losses(const fs::path& metrics) {
  std::map<int64_t, double> l;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) l[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return l;
}

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void flip_byte(const fs::path& p, size_t at) {
  std::string b = read_all(p);
  ASSERT_LT(at, b.size());
  b[at] = static_cast<char>(b[at] ^ 0x5A);
  std::ofstream(p, std::ios::binary | std::ios::trunc) << b;
}

// ---- the real binary as a child process ------------------------------------------

struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;  // its stdout and stderr together
  std::string seen;

  explicit Child(std::vector<std::string> args) {
    args.insert(args.begin(), NDT_TRAIN_GPT_BIN);
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    pid = ::fork();
    if (pid == 0) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out = ::fdopen(fds[0], "r");
  }
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      wait();
    }
    if (out) ::fclose(out);
  }
  // Reads output until a line contains `what`; false at end of output.
  bool wait_for(const std::string& what) {
    char buf[4096];
    while (std::fgets(buf, sizeof(buf), out)) {
      seen += buf;
      if (has(buf, what)) return true;
    }
    return false;
  }
  // Waits for exit; returns the exit code, or 128 + signal.
  int wait() {
    char buf[4096];
    while (out && std::fgets(buf, sizeof(buf), out)) seen += buf;
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

bool has_temporaries(const fs::path& dir) {
  for (auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".tmp_", 0) == 0 || n.rfind(".old_", 0) == 0 || n.find(".tmp") != std::string::npos)
      return true;
  }
  return false;
}

}  // namespace

// ---- runs and checkpoints that must not be lost or wrong --------------------------

TEST(Robust, ResumeWithFewerStepsThanTheCheckpointRefusesAndTouchesNothing) {
  fs::path d = make_data("fewer");
  const std::string ini = (d / "gpt.ini").string(), ck = (d / "ck").string();
  ASSERT_EQ(
      run({"--config", ini, "--train.steps", "10", "--checkpoint.dir", ck, "--checkpoint.keep", "1"}).rc, 0);
  const auto before = snapshot(ck);
  RunResult r =
      run({"--config", ini, "--train.steps", "5", "--checkpoint.dir", ck, "--checkpoint.resume", "true"});
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_TRUE(has(r.err, "is at step 10 but train.steps is 5")) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  EXPECT_EQ(snapshot(ck), before);
  RunResult again =
      run({"--config", ini, "--train.steps", "12", "--checkpoint.dir", ck, "--checkpoint.resume", "true"});
  EXPECT_EQ(again.rc, 0) << again.err;
  EXPECT_TRUE(has(again.out, "at step 10")) << again.out;
}

TEST(Robust, BadTokenInAnyShardIsFoundBeforeTraining) {
  fs::path d = make_data("valtoken");
  std::vector<uint16_t> val(3000, 1);
  val[1000] = 200;
  data::write_shard((d / "badval.bin").string(), val);
  RunResult r = run({"--config", (d / "gpt.ini").string(), "--data.val", (d / "badval.bin").string(),
                     "--checkpoint.dir", (d / "ck").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "badval.bin: token 200 at position 1000")) << r.err;
  EXPECT_FALSE(has(r.out, "step ")) << "no step may run before the data is checked:\n" << r.out;
}

TEST(Robust, AnEvaluationThatFailsMidRunSavesTheStepsFirst) {
  fs::path d = make_data("evalfail");
  const std::string ck = (d / "ck").string();
  Child c({"--config", (d / "gpt.ini").string(), "--train.steps", "100000", "--train.eval_every", "4",
           "--checkpoint.dir", ck});
  ASSERT_TRUE(c.wait_for("step     3/")) << c.seen;
  fs::resize_file(d / "data" / "val_000000.bin", 2048);  // the next evaluation cannot read it
  EXPECT_EQ(c.wait(), 1) << c.seen;
  const size_t at = c.seen.find("evaluation failed at step ");
  ASSERT_NE(at, std::string::npos) << c.seen;
  EXPECT_TRUE(has(c.seen, "(checkpoint saved)")) << c.seen;
  EXPECT_TRUE(has(c.seen, "val_000000.bin changed size during the run")) << c.seen;
  const int64_t step = std::stoll(c.seen.substr(at + 26));
  auto latest = ckpt::latest_checkpoint(ck);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(ckpt::step_of(fs::path(*latest).filename().string()).value(), step);
}

TEST(Robust, NonFiniteStepIsNeitherAppliedNorSaved) {
  fs::path d = make_data("nan");
  const std::string ck = (d / "ck").string();
  RunResult r = run({"--config", (d / "gpt.ini").string(), "--optim.lr", "1e6", "--optim.grad_clip", "0",
                     "--checkpoint.every", "1", "--checkpoint.dir", ck, "--train.steps", "30"});
  ASSERT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(has(r.err, "not applied")) << r.err;
  EXPECT_TRUE(has(r.err, "is NaN") || has(r.err, "Inf")) << r.err;
  EXPECT_TRUE(has(r.err, "step ")) << r.err;
  EXPECT_EQ(lines(r.err), 1) << r.err;
  // every checkpoint left behind is finite and `latest` names one of them: it resumes
  auto latest = ckpt::latest_checkpoint(ck);
  ASSERT_TRUE(latest.has_value());
  for (auto& e : fs::directory_iterator(ck)) {
    if (!ckpt::step_of(e.path().filename().string())) continue;
    io::SafeTensorsReader st((e.path() / "model.safetensors").string());
    for (auto& [name, entry] : st.entries())
      for (float v : st.get(name).to_vector<float>())
        ASSERT_TRUE(std::isfinite(v)) << e.path() << " " << name;
  }
  // the failing step is named, and the newest checkpoint is the step before it
  const int64_t failed = std::stoll(r.err.substr(r.err.find("step ") + 5));
  EXPECT_EQ(ckpt::step_of(fs::path(*latest).filename().string()).value(), failed - 1) << r.err;
}

TEST(Robust, NonFiniteInitFromWeightsHaveTheirOwnMessage) {
  fs::path d = make_data("naninit");
  ASSERT_EQ(run({"--config", (d / "gpt.ini").string(), "--train.steps", "1", "--checkpoint.dir",
                 (d / "ck").string()})
                .rc,
            0);
  // a plain weights file (no checkpoint.json beside it) with one NaN
  io::SafeTensorsReader src((d / "ck" / "step_00000001" / "model.safetensors").string());
  io::SafeTensorsWriter w;
  for (auto& [name, e] : src.entries()) {
    Tensor t = src.get(name);
    if (name == "h.1.mlp.c_fc.weight") t.data<float>()[7] = NAN;
    w.add(name, t);
  }
  w.write((d / "nan.safetensors").string());
  RunResult r =
      run({"--config", (d / "gpt.ini").string(), "--model.init_from", (d / "nan.safetensors").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "h.1.mlp.c_fc.weight holds NaN")) << r.err;
  EXPECT_FALSE(has(r.err, "optim.lr")) << r.err;
}

TEST(Robust, UnwritableOutputsAreFoundAtStart) {
  fs::path d = make_data("outputs");
  const std::string ini = (d / "gpt.ini").string();
  std::ofstream(d / "plainfile") << "x";
  fs::create_directories(d / "adir");
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"--checkpoint.dir", (d / "plainfile").string()}, "checkpoint.dir: "},
      {{"--checkpoint.dir", (d / "plainfile" / "ck").string()}, "checkpoint.dir: cannot create"},
      {{"--checkpoint.dir", "/proc/ndt_ck"}, "checkpoint.dir: cannot create"},  // a read-only file system
      {{"--log.metrics", (d / "adir").string()}, "log.metrics: "},
      {{"--log.report", "/proc/ndt/report.html"}, "log.report: cannot create"},
      {{"--log.metrics", "/proc/version"}, "log.metrics: cannot write"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--config", ini};
    args.insert(args.end(), c.args.begin(), c.args.end());
    RunResult r = run(args);
    EXPECT_EQ(r.rc, 2) << c.expect << "\n" << r.err;
    EXPECT_TRUE(has(r.err, c.expect)) << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_FALSE(has(r.out, "step ")) << r.out;
  }
}

// Outputs written through a temporary file and a rename (weights, the report, the gradient
// dump, a calibration) never replace what is not a regular file: a character device is
// written through, as tools do with /dev/null; a FIFO with no reader, a socket or a directory
// is refused (a FIFO with a reader is written through: OutputsWriteThroughFifoWithReader).
// On nodes the test makes in its own folder, never the system's.
TEST(Robust, OutputsNeverReplaceDevicesOrFifos) {
  fs::path d = make_data("nodes");
  const fs::path null_dev = d / "null", fifo = d / "fifo", dir = d / "adir";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  fs::create_directories(dir);
  for (const fs::path& p : {fifo, dir}) {
    const std::string e = ndt::testing::error_of([&] { io::write_file_atomic(p.string(), "x"); });
    EXPECT_TRUE(has(e, "cannot write " + p.string() + ": it is a")) << e;
    EXPECT_FALSE(fs::exists(p.string() + ".tmp"));
  }
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_directory(dir));
  // and at the start of a run, before any work
  RunResult r = run({"--config", (d / "gpt.ini").string(), "--log.report", fifo.string()});
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_TRUE(has(r.err, "log.report: " + fifo.string() + " is not a regular file (a FIFO with no reader)"))
      << r.err;
  EXPECT_TRUE(fs::is_fifo(fifo));
  // a private /dev/null (needs root): written through, still a device after a whole run
  if (::mknod(null_dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) GTEST_SKIP() << "mknod needs root";
  EXPECT_NO_THROW(io::write_file_atomic(null_dev.string(), "x"));
  r = run({"--config", (d / "gpt.ini").string(), "--train.steps", "2", "--log.report", null_dev.string(),
           "--log.grads", null_dev.string()});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(fs::is_character_file(null_dev));
  EXPECT_FALSE(fs::exists(null_dev.string() + ".tmp"));
}

// An output given as a symlink is written at the link's target, atomically in the target's
// folder; the link stays a link (a report, metrics file or export linked elsewhere is never
// cut loose from its target). Chains are followed, and a dangling link's target is created.
TEST(Robust, OutputsWriteThroughSymlinks) {
  const fs::path d = fs::temp_directory_path() / ("ndt_robust_links_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "here");
  fs::create_directories(d / "there");
  auto read = [](const fs::path& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  auto no_tmp = [&] {
    for (const auto& e : fs::recursive_directory_iterator(d))
      EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  };
  // one link to a file in another folder
  { std::ofstream(d / "there" / "report.html") << "old"; }
  fs::create_symlink(d / "there" / "report.html", d / "here" / "report.html");
  io::write_file_atomic((d / "here" / "report.html").string(), "new");
  EXPECT_TRUE(fs::is_symlink(d / "here" / "report.html"));
  EXPECT_EQ(read(d / "there" / "report.html"), "new");
  no_tmp();
  // a chain of two links, the second relative
  fs::create_symlink("../there/report.html", d / "here" / "second");
  fs::create_symlink(d / "here" / "second", d / "here" / "first");
  io::write_file_atomic((d / "here" / "first").string(), "chained");
  EXPECT_TRUE(fs::is_symlink(d / "here" / "first"));
  EXPECT_TRUE(fs::is_symlink(d / "here" / "second"));
  EXPECT_EQ(read(d / "there" / "report.html"), "chained");
  no_tmp();
  // a dangling link: its target is created, the link kept
  fs::create_symlink(d / "there" / "metrics.jsonl", d / "here" / "metrics.jsonl");
  io::write_file_atomic((d / "here" / "metrics.jsonl").string(), "{}\n");
  EXPECT_TRUE(fs::is_symlink(d / "here" / "metrics.jsonl"));
  EXPECT_EQ(read(d / "there" / "metrics.jsonl"), "{}\n");
  no_tmp();
  // a link to a character device (/dev/null): written through, nothing replaced
  fs::create_symlink("/dev/null", d / "here" / "null");
  EXPECT_NO_THROW(io::write_file_atomic((d / "here" / "null").string(), "x"));
  EXPECT_TRUE(fs::is_symlink(d / "here" / "null"));
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  EXPECT_NO_THROW(io::write_file_atomic("/dev/null", "x"));
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  EXPECT_FALSE(fs::exists("/dev/null.tmp"));
  no_tmp();
  fs::remove_all(d);
}

// A FIFO with a reader (/dev/stdout piped into less) is written through; with none it is
// refused rather than waited on.
TEST(Robust, OutputsWriteThroughFifoWithReader) {
  const fs::path d = fs::temp_directory_path() / ("ndt_robust_fifo_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  const fs::path fifo = d / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const int r = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(r, 0);
  EXPECT_NO_THROW(io::write_file_atomic(fifo.string(), "through"));
  char buf[16] = {};
  EXPECT_EQ(::read(r, buf, sizeof(buf)), 7);
  EXPECT_EQ(std::string(buf, 7), "through");
  ::close(r);
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_FALSE(fs::exists(fifo.string() + ".tmp"));
  fs::remove_all(d);
}

TEST(Robust, ACheckpointDirectoryHasOneTrainerAtATime) {
  fs::path d = make_data("lock");
  const std::string ck = (d / "ck").string();
  fs::create_directories(ck);
  {
    train::RunLock held(ck);  // flock conflicts between open files, even in one process
    RunResult r = run({"--config", (d / "gpt.ini").string(), "--checkpoint.dir", ck});
    EXPECT_EQ(r.rc, 1);
    EXPECT_TRUE(has(r.err, "in use by another train_gpt (pid " + std::to_string(::getpid()) + ")")) << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_FALSE(fs::exists(fs::path(ck) / "latest"));
  }
  EXPECT_EQ(run({"--config", (d / "gpt.ini").string(), "--checkpoint.dir", ck, "--train.steps", "1"}).rc, 0);
}

TEST(Robust, TwoTrainerProcessesOnOneDirectory) {
  fs::path d = make_data("lock2");
  const std::string ck = (d / "ck").string();
  Child first({"--config", (d / "gpt.ini").string(), "--checkpoint.dir", ck, "--train.steps", "100000"});
  ASSERT_TRUE(first.wait_for("step ")) << first.seen;
  Child second({"--config", (d / "gpt.ini").string(), "--checkpoint.dir", ck, "--train.steps", "3"});
  EXPECT_EQ(second.wait(), 1) << second.seen;
  EXPECT_TRUE(has(second.seen, "(pid " + std::to_string(first.pid) + ")")) << second.seen;
  ::kill(first.pid, SIGKILL);
  first.wait();
}

TEST(Robust, AFlippedByteInAnyCheckpointFileIsCaught) {
  fs::path d = make_data("flip");
  const std::string ini = (d / "gpt.ini").string(), ck = (d / "ck").string();
  ASSERT_EQ(run({"--config", ini, "--train.steps", "2", "--checkpoint.dir", ck}).rc, 0);
  const fs::path step = fs::path(ck) / "step_00000002";
  const auto good = snapshot(ck);
  struct Case {
    fs::path file;
    double where;  // fraction of the file
    std::string expect;
  };
  const std::vector<Case> cases = {
      {step / "model.safetensors", 0.7, "model.safetensors fails its checksum"},
      {step / "model.safetensors", 0.0, "model.safetensors fails its checksum"},  // the header length
      {step / "state.safetensors", 0.9, "state.safetensors fails its checksum"},
      {step / "state.safetensors", 0.01, "state.safetensors fails its checksum"},  // the JSON header
      {step / "checkpoint.json", 0.5, "checkpoint"},
      {fs::path(ck) / "latest", 0.5, "latest"},
  };
  for (const Case& c : cases) {
    for (auto& [p, bytes] : good)
      if (fs::is_regular_file(p)) std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
    flip_byte(c.file, static_cast<size_t>(c.where * static_cast<double>(fs::file_size(c.file))));
    RunResult r =
        run({"--config", ini, "--train.steps", "4", "--checkpoint.dir", ck, "--checkpoint.resume", "true"});
    EXPECT_EQ(r.rc, 1) << c.file << " " << r.out;
    EXPECT_TRUE(has(r.err, c.expect)) << c.file << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    if (c.file.filename() == "model.safetensors") {  // init_from of our own checkpoint checks it too
      RunResult i = run({"--config", ini, "--model.init_from", c.file.string()});
      EXPECT_EQ(i.rc, 1);
      EXPECT_TRUE(has(i.err, "fails its checksum")) << i.err;
    }
  }
}

// A failure after the last step (the final evaluation here) never costs the run's outputs:
// the final checkpoint, the metrics and the report are written, then the failure is said.
TEST(Robust, AFailureAfterTheLastStepLeavesTheCheckpointMetricsAndReport) {
  fs::path d = make_data("finalfail");
  const std::string ck = (d / "ck").string();
  Child c({"--config", (d / "gpt.ini").string(), "--train.steps", "3000", "--train.eval_every", "0",
           "--checkpoint.dir", ck, "--log.metrics", (d / "m.jsonl").string(), "--log.report",
           (d / "report.html").string()});
  ASSERT_TRUE(c.wait_for("step     1/")) << c.seen;  // the first evaluation read the data
  ::kill(c.pid, SIGSTOP);
  fs::resize_file(d / "data" / "val_000000.bin", 2048);  // the final evaluation cannot read it
  ::kill(c.pid, SIGCONT);
  EXPECT_EQ(c.wait(), 1) << c.seen;
  EXPECT_TRUE(has(c.seen, "evaluation failed at step 3000: ")) << c.seen;
  EXPECT_TRUE(has(c.seen, "val_000000.bin changed size during the run")) << c.seen;
  EXPECT_TRUE(has(c.seen, "(after the last step: its checkpoint, metrics and report are written)")) << c.seen;
  EXPECT_TRUE(fs::exists(d / "ck" / "step_00003000" / "checkpoint.json"));
  EXPECT_EQ(losses(d / "m.jsonl").size(), 3000u);
  EXPECT_TRUE(has(read_all(d / "report.html"), "data-series='train' data-points='2000'"));
}

TEST(Robust, MetricsWriteFailureIsAnErrorAfterTheCheckpoint) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  fs::path d = make_data("full");
  RunResult r = run({"--config", (d / "gpt.ini").string(), "--log.metrics", "/dev/full", "--checkpoint.dir",
                     (d / "ck").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "/dev/full")) << r.err;
  EXPECT_TRUE(has(r.err, "No space left on device")) << r.err;
  EXPECT_TRUE(has(r.out, "warning: writing /dev/full failed")) << r.out;
  EXPECT_TRUE(fs::exists(d / "ck" / "step_00000008" / "checkpoint.json"));
}

TEST(Robust, PruningKeepsTheNewestByStepNumber) {
  fs::path d = ndt::testing::fresh_dir("robust_prune");
  models::GPTConfig mc{.n_layer = 1, .n_head = 1, .n_embd = 8, .vocab_size = 10, .block_size = 4};
  models::GPT gpt(mc);
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f32, 1);
  optim::AdamW opt(params, optim::AdamWConfig{});
  for (int64_t step : {99999998ll, 99999999ll, 100000000ll, 100000001ll}) {
    ckpt::TrainState st;
    st.step = step;
    ckpt::save_checkpoint(d.string(), gpt, params, opt, st, /*keep=*/2);
  }
  EXPECT_TRUE(fs::exists(d / "step_100000001"));
  EXPECT_TRUE(fs::exists(d / "step_100000000"));
  EXPECT_FALSE(fs::exists(d / "step_99999999"));
  EXPECT_FALSE(fs::exists(d / "step_99999998"));
  EXPECT_EQ(ckpt::latest_checkpoint(d.string()).value(), (d / "step_100000001").string());
}

// A crash between a checkpoint's rename into place and latest's update: latest is missing
// (the first checkpoint) or names the one before. Resume finds the newest complete one; an
// incomplete directory (no manifest) is never taken. Then a run resumes from it.
TEST(Robust, ResumeFindsTheNewestCompleteCheckpointWhenLatestIsMissingOrBehind) {
  fs::path d = make_data("latest_behind");
  const std::string ini = (d / "gpt.ini").string(), ck = (d / "ck").string();
  ASSERT_EQ(
      run({"--config", ini, "--train.steps", "8", "--checkpoint.dir", ck, "--checkpoint.every", "4"}).rc, 0);
  ASSERT_TRUE(fs::exists(d / "ck" / "step_00000004") && fs::exists(d / "ck" / "step_00000008"));
  fs::create_directories(d / "ck" / "step_00000012");  // no manifest: a write that never finished
  std::ofstream(d / "ck" / "latest", std::ios::trunc) << "step_00000004\n";  // behind
  EXPECT_EQ(ckpt::latest_checkpoint(ck).value_or(""), (d / "ck" / "step_00000008").string());
  fs::remove(d / "ck" / "latest");  // missing
  EXPECT_EQ(ckpt::latest_checkpoint(ck).value_or(""), (d / "ck" / "step_00000008").string());
  fs::remove_all(d / "ck" / "step_00000012");
  RunResult r =
      run({"--config", ini, "--train.steps", "10", "--checkpoint.dir", ck, "--checkpoint.resume", "true"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "resumed from " + (d / "ck" / "step_00000008").string() + " at step 8")) << r.out;
  EXPECT_FALSE(has(r.out, "starting from scratch")) << r.out;
  EXPECT_TRUE(ckpt::latest_checkpoint(fs::path(ck).parent_path().string() + "/none").has_value() == false);
}

// A run that went on past its last checkpoint before it stopped: its metrics file holds steps
// that the resumed run trains again. The resume keeps the file as it stood at the checkpoint
// (and drops a line cut short), appends, and its report charts the whole run.
TEST(Robust, AResumeKeepsTheMetricsUpToItsCheckpointAndReportsTheWholeRun) {
  fs::path d = make_data("resume_metrics");
  const std::string ini = (d / "gpt.ini").string(), ck = (d / "ck").string();
  const std::string metrics = (d / "metrics.jsonl").string(), report = (d / "report.html").string();
  ASSERT_EQ(run({"--config", ini, "--train.steps", "6", "--train.eval_every", "3", "--log.metrics",
                 (d / "full.jsonl").string()})
                .rc,
            0);
  ASSERT_EQ(run({"--config", ini, "--train.steps", "6", "--train.eval_every", "3", "--checkpoint.dir", ck,
                 "--checkpoint.every", "3", "--log.metrics", metrics})
                .rc,
            0);
  fs::remove_all(d / "ck" / "step_00000006");  // as if it stopped after step 6's metrics, before its save
  fs::remove(d / "ck" / "latest");
  std::ofstream(metrics, std::ios::app) << "{\"step\": 7, \"lo";  // and a line cut short
  RunResult r = run({"--config", ini, "--train.steps", "6", "--train.eval_every", "3", "--checkpoint.dir", ck,
                     "--checkpoint.resume", "true", "--log.metrics", metrics, "--log.report", report});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "resumed from " + (d / "ck" / "step_00000003").string() + " at step 3")) << r.out;
  EXPECT_TRUE(has(r.out, "metrics: " + metrics + " as it stood at step 3 (")) << r.out;
  // every step once, with the losses of the run that never stopped
  std::map<int64_t, int> seen;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);  // every line parses
    if (j.contains("loss")) ++seen[j["step"].get<int64_t>()];
  }
  EXPECT_EQ(seen, (std::map<int64_t, int>{{1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}}));
  EXPECT_EQ(losses(metrics), losses(d / "full.jsonl"));
  const std::string page = read_all(report);
  EXPECT_TRUE(has(page, "steps 1 to 6 of 6")) << "the report's summary";
  EXPECT_TRUE(has(page, "data-series='train' data-points='6'")) << "the loss chart has every step";
}

TEST(Robust, LatestThatIsEmptyADirectoryOrEscapesIsRefusedClearly) {
  fs::path d = ndt::testing::fresh_dir("robust_latest");
  std::ofstream(d / "latest") << "";
  EXPECT_TRUE(has(error_of([&] { ckpt::latest_checkpoint(d.string()); }), "latest is empty"));
  for (const char* bad : {"..\n", "../x\n", "step_12a\n", "/etc\n"}) {
    std::ofstream(d / "latest", std::ios::trunc) << bad;
    EXPECT_TRUE(has(error_of([&] { ckpt::latest_checkpoint(d.string()); }), "is malformed")) << bad;
  }
  fs::remove(d / "latest");
  fs::create_directories(d / "latest");
  EXPECT_TRUE(has(error_of([&] { ckpt::latest_checkpoint(d.string()); }), "is not a file"));
}

TEST(Robust, StopAfterNeedsACheckpointDirectory) {
  fs::path d = make_data("stopafter");
  RunResult r = run({"--config", (d / "gpt.ini").string(), "--train.stop_after", "2"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_TRUE(has(r.err, "train.stop_after needs checkpoint.dir")) << r.err;
}

// ---- signals and kills --------------------------------------------------------------

TEST(Robust, FirstStopSignalSetsTheFlagTheSecondKills) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    train::StopSignals s;
    if (train::stop_requested()) ::_exit(10);
    ::raise(SIGTERM);
    if (!train::stop_requested() || train::stop_signal() != SIGTERM) ::_exit(11);
    // `timeout` signals the process and its group: the same request twice, microseconds apart
    ::raise(SIGTERM);
    if (train::stop_signal() != SIGTERM) ::_exit(13);
    ::usleep(static_cast<useconds_t>(train::kSignalRepeatWindowS * 1e6) + 200000);
    ::raise(SIGINT);  // a second request, after the window: the process dies of it
    ::_exit(12);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  train::StopSignals s;  // a new run starts with the flag clear
  EXPECT_FALSE(train::stop_requested());
}

// A child that installs the stop signals and a watchdog of 0.5 s, with an operation pending
// in its flight recorder or not, asks itself to stop and then never progresses: its exit
// code (or 0 when the watchdog left it alone for 3 s).
int stuck_after_a_stop(bool in_a_collective) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    train::StopSignals s;
    dist::FlightRecorder flight;
    flight.set_job("test");
    if (in_a_collective) flight.started(flight.queued("dp@0", 1, "dp.all_reduce", 4));
    train::Watchdog w(0.5, /*watch_launcher=*/false, 0, nullptr, &flight);
    ::raise(SIGTERM);
    ::sleep(3);  // stuck
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(Robust, AStopThatCannotFinishOutsideACollectiveEndsWithCode4) {
  EXPECT_EQ(stuck_after_a_stop(false), train::kExitStuck);
}

TEST(Robust, AStopWaitingInACollectiveIsLeftToTheCollectivesDeadline) {
  // the collective's own deadline ends it with exit 6 (dist/comm); the watchdog does not
  // race it with its 4
  EXPECT_EQ(stuck_after_a_stop(true), 0);
}

TEST(Robust, AKeepaliveLongerThanTheTimeoutUnderOpenMpiGetsANote) {
  ::unsetenv("OMPI_MCA_oob_tcp_keepalive_time");
  ::unsetenv("OMPI_MCA_oob_tcp_keepalive_intvl");
  ::unsetenv("OMPI_MCA_oob_tcp_keepalive_probes");
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(train::launcher_keepalive_note(300), "");  // not under Open MPI
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  // Open MPI's defaults: 300 + 9 x 20 = 480 s
  EXPECT_TRUE(has(train::launcher_keepalive_note(300), "keepalive gives up after 480 s"))
      << train::launcher_keepalive_note(300);
  ::setenv("OMPI_MCA_oob_tcp_keepalive_time", "5", 1);
  ::setenv("OMPI_MCA_oob_tcp_keepalive_intvl", "2", 1);
  ::setenv("OMPI_MCA_oob_tcp_keepalive_probes", "5", 1);
  EXPECT_EQ(train::launcher_keepalive_note(300), "");                  // 15 s
  EXPECT_TRUE(has(train::launcher_keepalive_note(10), "after 15 s"));  // not before the deadline
  ::setenv("OMPI_MCA_oob_tcp_keepalive_time", "0", 1);                 // keepalive off
  EXPECT_TRUE(has(train::launcher_keepalive_note(300), "after inf s"));
  ::unsetenv("OMPI_MCA_oob_tcp_keepalive_time");
  ::unsetenv("OMPI_MCA_oob_tcp_keepalive_intvl");
  ::unsetenv("OMPI_MCA_oob_tcp_keepalive_probes");
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
}

TEST(Robust, SigtermSavesACheckpointAndTheResumedRunContinuesBitForBit) {
  fs::path d = make_data("sigterm");
  const std::string ini = (d / "gpt.ini").string(), ck = (d / "ck").string();
  ASSERT_EQ(run({"--config", ini, "--train.steps", "40", "--log.metrics", (d / "full.jsonl").string()}).rc,
            0);
  Child c({"--config", ini, "--train.steps", "40", "--checkpoint.dir", ck, "--log.metrics",
           (d / "part.jsonl").string()});
  ASSERT_TRUE(c.wait_for("step     3/40")) << c.seen;
  ::kill(c.pid, SIGTERM);
  EXPECT_EQ(c.wait(), train::kExitPreempted) << c.seen;
  EXPECT_TRUE(has(c.seen, "stopped by signal 15")) << c.seen;
  ASSERT_TRUE(has(c.seen, same_kernel_line()))
      << "the child ran another GEMM kernel than this test: " << c.seen;
  EXPECT_FALSE(has_temporaries(ck));
  auto latest = ckpt::latest_checkpoint(ck);
  ASSERT_TRUE(latest.has_value());
  const int64_t stopped_at = ckpt::step_of(fs::path(*latest).filename().string()).value();
  EXPECT_GE(stopped_at, 3);
  EXPECT_LT(stopped_at, 40);
  RunResult rest = run({"--config", ini, "--train.steps", "40", "--checkpoint.dir", ck, "--checkpoint.resume",
                        "true", "--log.metrics", (d / "part.jsonl").string()});
  ASSERT_EQ(rest.rc, 0) << rest.err;
  EXPECT_EQ(losses(d / "part.jsonl"), losses(d / "full.jsonl"));
}

TEST(Robust, Kill9DuringCheckpointWritesThenResumeIsBitIdentical) {
  fs::path d = make_data("kill9");
  const std::string ini = (d / "gpt.ini").string(), ck = (d / "ck").string();
  ASSERT_EQ(run({"--config", ini, "--train.steps", "24", "--log.metrics", (d / "full.jsonl").string()}).rc,
            0);
  // a checkpoint every step, killed just as step k's checkpoint starts to be written
  for (int k : {2, 7, 13}) {
    Child c({"--config", ini, "--train.steps", "24", "--checkpoint.every", "1", "--checkpoint.dir", ck,
             "--checkpoint.resume", "true", "--log.metrics", (d / "part.jsonl").string()});
    char line[32];
    std::snprintf(line, sizeof(line), "step %5d/24", k);
    ASSERT_TRUE(c.wait_for(line)) << c.seen;
    ASSERT_TRUE(has(c.seen, same_kernel_line()))
        << "the child ran another GEMM kernel than this test: " << c.seen;
    ::kill(c.pid, SIGKILL);
    EXPECT_EQ(c.wait(), 128 + SIGKILL);
  }
  RunResult rest = run({"--config", ini, "--train.steps", "24", "--checkpoint.every", "1", "--checkpoint.dir",
                        ck, "--checkpoint.resume", "true", "--log.metrics", (d / "part.jsonl").string()});
  ASSERT_EQ(rest.rc, 0) << rest.err;
  EXPECT_FALSE(has_temporaries(ck));
  EXPECT_EQ(losses(d / "part.jsonl"), losses(d / "full.jsonl"));
}

TEST(Robust, LeftoversOfACrashedWriteAreCleanedAtStart) {
  fs::path d = make_data("leftovers");
  const std::string ini = (d / "gpt.ini").string(), ck = (d / "ck").string();
  ASSERT_EQ(run({"--config", ini, "--train.steps", "2", "--checkpoint.dir", ck}).rc, 0);
  fs::create_directories(fs::path(ck) / ".tmp_step_00000003");
  std::ofstream(fs::path(ck) / ".tmp_step_00000003" / "model.safetensors") << "half";
  std::ofstream(fs::path(ck) / "latest.tmp") << "step_000";
  // a crash between the two renames of a re-save: only .old_ holds the checkpoint
  fs::rename(fs::path(ck) / "step_00000002", fs::path(ck) / ".old_step_00000002");
  RunResult r =
      run({"--config", ini, "--train.steps", "4", "--checkpoint.dir", ck, "--checkpoint.resume", "true"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "at step 2")) << r.out;
  EXPECT_FALSE(has_temporaries(ck));
}

// ---- memory safety and hangs -----------------------------------------------------------

TEST(Robust, OverflowSizedConfigValuesFailInOneLineBeforeAllocating) {
  fs::path d = make_data("overflow");
  const std::string ini = (d / "gpt.ini").string();
  const std::vector<std::vector<std::string>> cases = {
      {"--model.vocab_multiple", "576460752303423488"},
      {"--model.block_size", "4611686018427387904"},
      {"--train.micro_batch_size", "4611686018427387904", "--train.seq_len", "4"},
      {"--model.n_layer", "1000000000"},
      {"--model.n_embd", "65536", "--model.n_layer", "1024", "--model.n_head", "1"},  // 52 T parameters
      {"--train.grad_accum_steps", "9223372036854775807"},
      {"--train.steps", "9223372036854775807"},
      {"--sample.length", "1000000000000"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> args = {"--config", ini};
    args.insert(args.end(), c.begin(), c.end());
    RunResult r = run(args);
    EXPECT_EQ(r.rc, 2) << c[0] << ": " << r.err;
    EXPECT_TRUE(has(r.err, c[0].substr(2)) || has(r.err, "parameters")) << r.err;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_FALSE(has(r.out, "parameters: ")) << "nothing may be allocated:\n" << r.out;
  }
}

TEST(Robust, ElementCountsAndByteSizesAreChecked) {
  const int64_t big = int64_t(1) << 62;
  EXPECT_TRUE(has(error_of([&] { numel_of({big, 4}); }), "64-bit count"));
  EXPECT_TRUE(has(error_of([&] { contiguous_strides({4, big, 2}); }), "64-bit count"));
  EXPECT_TRUE(has(error_of([&] { Tensor::empty({big / 2}, DType::f32); }), "overflows"));
  EXPECT_EQ(numel_of({3, 0, big}), 0);
}

TEST(Robust, ShardsMustBeRegularFilesThatDoNotChangeUnderTheRun) {
  fs::path d = make_data("fifo");
  ASSERT_EQ(::mkfifo((d / "fifo.bin").c_str(), 0644), 0);
  RunResult r = run({"--config", (d / "gpt.ini").string(), "--data.train", (d / "fifo.bin").string()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "fifo.bin: is not a regular file")) << r.err;
  // truncated while open: an error naming the shard, not SIGBUS
  data::write_shard((d / "t.bin").string(), std::vector<uint16_t>(5000, 3));
  data::DataLoader dl((d / "t.bin").string(), 2, 8, 0, 1, false, 0, 10);
  dl.next();
  fs::resize_file(d / "t.bin", 2000);
  EXPECT_TRUE(has(error_of([&] { dl.next(); }), "t.bin changed size during the run"));
  // rewritten in place at the same size (other tokens): found too. The file's time is set
  // back first, as the rewrite could otherwise fall in the same clock tick as its creation.
  data::write_shard((d / "s.bin").string(), std::vector<uint16_t>(5000, 3));
  fs::last_write_time(d / "s.bin", fs::last_write_time(d / "s.bin") - std::chrono::hours(1));
  data::DataLoader same((d / "s.bin").string(), 2, 8, 0, 1, false, 0, 10);
  same.next();
  {
    std::fstream f(d / "s.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1024 + 200);
    f.write("\x04\x00\x04\x00", 4);
  }
  ASSERT_EQ(fs::file_size(d / "s.bin"), 1024u + 2 * 5000);
  EXPECT_TRUE(has(error_of([&] { same.next(); }), "s.bin was rewritten during the run (same size"));
  // a vocabulary or weights file that is a FIFO
  EXPECT_TRUE(has(error_of([&] { data::Vocab::load((d / "fifo.bin").string()); }), "not a regular file"));
  EXPECT_TRUE(
      has(error_of([&] { io::SafeTensorsReader s((d / "fifo.bin").string()); }), "not a regular file"));
}

// ---- the config and command line -------------------------------------------------------

TEST(Robust, ConfigThatIsADirectoryAndStrayArgumentsAreErrors) {
  fs::path d = make_data("cmdline");
  const std::string ini = (d / "gpt.ini").string();
  RunResult dir = run({"--config", d.string()});
  EXPECT_EQ(dir.rc, 2);
  EXPECT_TRUE(has(dir.err, "not a regular file")) << dir.err;
  RunResult stray = run({"--data.train", (d / "data" / "train_*.bin").string(), "base.ini"});
  EXPECT_EQ(stray.rc, 2);
  EXPECT_TRUE(has(stray.err, "unexpected argument 'base.ini'")) << stray.err;
  EXPECT_TRUE(has(stray.err, "did you mean --config base.ini")) << stray.err;
  RunResult abbrev = run({"--config", ini, "--optim.l", "0.5"});
  EXPECT_EQ(abbrev.rc, 2) << "prefixes must not match keys";
  EXPECT_EQ(lines(abbrev.err), 1) << abbrev.err;
}

TEST(Robust, HashInsideAQuotedOrEscapedValueIsKept) {
  fs::path d = ndt::testing::fresh_dir("robust_hash");
  std::ofstream(d / "a.ini") << "[data]\ntrain = x.bin   # a comment\n[sample]\nprompt = \"C# rocks\"  # c\n";
  std::ofstream(d / "b.ini") << "[data]\ntrain = x.bin\n[sample]\nprompt = C\\# rocks\\n\n";
  std::ofstream(d / "c.ini") << "[data]\ntrain = x.bin\n[sample]\nprompt = C# rocks\n";
  std::ofstream(d / "d.ini") << "[data]\ntrain = x.bin\n[sample]\nprompt = \"C# rocks\n";
  std::ofstream(d / "e.ini") << "[data]\ntrain = x.bin\njust words\n";
  auto prompt_of = [&](const char* file) {
    train::Config c;
    std::string help;
    const std::string p = (d / file).string();
    const char* argv[] = {"train_gpt", "--config", p.c_str()};
    train::parse_config(3, argv, c, help);
    EXPECT_EQ(c.data.train, "x.bin");
    return c.sample.prompt;
  };
  EXPECT_EQ(prompt_of("a.ini"), "C# rocks");
  EXPECT_EQ(prompt_of("b.ini"), "C# rocks\n");
  EXPECT_EQ(prompt_of("c.ini"), "C");  // unquoted: # starts a comment, as documented
  EXPECT_TRUE(has(error_of([&] { prompt_of("d.ini"); }), "never closes"));
  EXPECT_TRUE(has(error_of([&] { prompt_of("e.ini"); }), "e.ini:3: expected 'key = value'"));
}

TEST(Robust, PoorValuesAreRefused) {
  fs::path d = make_data("poor");
  const std::string ini = (d / "gpt.ini").string();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--optim.lr", "inf"}, "optim.lr must be a finite number"},
      {{"--optim.weight_decay", "inf"}, "optim.weight_decay must be a finite number"},
      {{"--optim.eps", "inf"}, "optim.eps must be a finite number"},
      {{"--optim.lr", "nan"}, "optim.lr must be a finite number"},
      {{"--train.seed", "-1"}, "train.seed = -1"},
      {{"--train.threads", "10000"}, "train.threads = 10000 but this machine has"},
      {{"--train.device", "cuda:abc"}, "train.device must be cpu, cuda or cuda:N"},
      {{"--sample.length", "100000"}, "sample.length = 100000"},
      {{"--sample.prompt", std::string(100000, 'a')}, "sample.prompt is 100000 bytes"},
  };
  for (auto& [args, expect] : cases) {
    std::vector<std::string> a = {"--config", ini};
    a.insert(a.end(), args.begin(), args.end());
    RunResult r = run(a);
    EXPECT_EQ(r.rc, 2) << expect << ": " << r.err;
    EXPECT_TRUE(has(r.err, expect)) << r.err;
  }
}

TEST(Robust, WarmupLongerThanTheRunIsAWarning) {
  fs::path d = make_data("warmup");
  RunResult r =
      run({"--config", (d / "gpt.ini").string(), "--optim.warmup_steps", "9", "--train.steps", "1"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(has(r.out, "warning: optim.warmup_steps (9) > train.steps (1)")) << r.out;
}

TEST(Robust, VocabWithNonStringTokensNamesTheFile) {
  fs::path d = ndt::testing::fresh_dir("robust_vocab");
  std::ofstream(d / "v.json") << R"({"type": "char", "tokens": ["a", {"x": 1}, "b"]})";
  const std::string e = error_of([&] { data::Vocab::load((d / "v.json").string()); });
  EXPECT_TRUE(has(e, "v.json: token 1 is {\"x\":1}")) << e;
  std::ofstream(d / "t.json") << R"({"type": 5})";
  EXPECT_TRUE(has(error_of([&] { data::Vocab::load((d / "t.json").string()); }), "t.json"));
}

TEST(Robust, SafetensorsWithDuplicateOrOverlappingTensorsAreRefused) {
  fs::path d = ndt::testing::fresh_dir("robust_st");
  auto write = [&](const std::string& name, const std::string& header, size_t data_bytes) {
    std::string h = header;
    while ((8 + h.size()) % 8) h += ' ';
    const uint64_t n = h.size();
    std::string bytes(reinterpret_cast<const char*>(&n), 8);
    bytes += h + std::string(data_bytes, '\0');
    std::ofstream(d / name, std::ios::binary) << bytes;
    return (d / name).string();
  };
  const std::string dup = write("dup.safetensors",
                                R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                16);
  EXPECT_TRUE(has(error_of([&] { io::SafeTensorsReader r(dup); }), "names 'a' twice"));
  const std::string over = write("over.safetensors",
                                 R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                 16);
  EXPECT_TRUE(has(error_of([&] { io::SafeTensorsReader r(over); }), "'a' and 'b' overlap"));
  const std::string huge =
      write("huge.safetensors",
            R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}})", 16);
  EXPECT_TRUE(has(error_of([&] { io::SafeTensorsReader r(huge); }), "impossibly large shape"));
}

TEST(Robust, Xxh64MatchesTheReferenceVectors) {
  EXPECT_EQ(io::xxh64("", 0), 0xEF46DB3751D8E999ull);
  EXPECT_EQ(io::xxh64("a", 1), 0xD24EC4F1A98C6E5Bull);
  EXPECT_EQ(io::xxh64("abc", 3), 0x44BC2CF5AD770999ull);
  EXPECT_EQ(io::xxh64("Nobody inspects the spammish repetition", 39), 0xFBCEA83C8A378BF1ull);
  // Digests the hand-written XXH64 gave before libxxhash replaced it: checkpoints hold them
  // (checkpoint.json, manifest_xxh64), so they must not change by a bit.
  std::string s;
  for (int i = 0; i < 1000; ++i) s += static_cast<char>(i * 7 + 3);
  EXPECT_EQ(io::xxh64(s.data(), s.size()), 0x5F235FA033F1A3FBull);
  // a file of several reads (1 MiB each) and a partial one
  std::string big;
  for (int64_t i = 0; i < (int64_t(3) << 20) + 12345; ++i) big += static_cast<char>((i * i + i / 3) & 0xFF);
  const std::string path = (ndt::testing::fresh_dir("robust_xxh64") / "big.bin").string();
  io::write_file_atomic(path, big);
  EXPECT_EQ(io::file_xxh64(path), 0xDF44E01ABB19C4C9ull);
  EXPECT_EQ(io::xxh64(big.data(), big.size()), 0xDF44E01ABB19C4C9ull);
}
