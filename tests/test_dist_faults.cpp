// train_gpt under mpirun when something goes wrong on one rank or around the job: ranks
// started with different configs or data files, a checkpoint.dir the ranks do not share, a
// data file that fails on one rank mid-run (evaluation and training), a SIGSTOPped rank, a
// killed launcher, and the doubled signal of `timeout`. Each must end every rank with one
// clear line, save what can be saved and leave no process behind.
//
// On the simulated cluster (scripts/cluster.sh: two hosts as network namespaces, TCP between
// them): a cut link, a host whose ranks are killed (and its checkpoint resumed on the host
// that is left, on the same loss curve), and a rank that throws. Each must end the job
// within parallel.timeout_s + 15 s, and the flight report must name the cause.
//
// "One node sees other files" is made with a mount namespace per rank (`unshare -m`, then a
// bind mount over a shared path): the ranks run the same command line on the same paths, as
// on a cluster, but rank 1 sees its own copy. Those tests need root and skip without it.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "support/cluster.h"
#include "support/corpus.h"
#include "support/launch.h"
#include "support/testing.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

using namespace ndt;
namespace fs = std::filesystem;
using ndt::testing::mpirun;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string read_all(const fs::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
size_t count_of(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The steps in a metrics file that have a training loss.
size_t steps_logged(const fs::path& metrics) {
  std::ifstream f(metrics);
  size_t n = 0;
  for (std::string line; std::getline(f, line);)
    if (nlohmann::json::parse(line, nullptr, false).contains("loss")) ++n;
  return n;
}

// Step -> loss of a metrics file.
std::map<int64_t, double> losses_by_step(const fs::path& metrics) {
  std::map<int64_t, double> l;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("loss")) l[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return l;
}

// A process alive and not a zombie.
bool running(pid_t p) {
  std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

// The train_gpt processes whose command line holds `marker`.
std::vector<pid_t> train_gpt_ranks(const std::string& marker) {
  std::vector<pid_t> pids;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string comm = read_all(e.path() / "comm");
    if (comm != "train_gpt\n") continue;
    std::string cmdline = read_all(e.path() / "cmdline");
    for (char& c : cmdline)
      if (c == '\0') c = ' ';
    if (has(cmdline, marker)) pids.push_back(std::stoi(name));
  }
  return pids;
}

// A command (mpirun and its ranks) running in the background in its own process group,
// its output in a file. Whatever happens to the test, the destructor ends the group and
// every rank it started (also ranks that a killed mpirun left behind).
class Job {
 public:
  Job(const std::string& cmd, const fs::path& out, std::string marker)
      : out_(out), marker_(std::move(marker)) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      const std::string line = "exec " + cmd + " > " + out.string() + " 2>&1";
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Job() {
    if (pid_ > 0 && status_ < 0) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (pid_t p : train_gpt_ranks(marker_)) ::kill(p, SIGKILL);
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  pid_t pid() const { return pid_; }
  std::vector<pid_t> ranks() const { return train_gpt_ranks(marker_); }
  std::string output() const { return read_all(out_); }
  // Waits up to `s` seconds for the command to end: its exit code (128 + signal when
  // killed), or -1 when it still runs.
  int wait(double s) {
    const auto t0 = Clock::now();
    while (status_ < 0 && seconds_since(t0) < s) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_)
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status_;
  }
  // Waits up to `s` seconds until `done` holds; false if it never did.
  template <class F>
  static bool until(double s, F done) {
    const auto t0 = Clock::now();
    while (!done()) {
      if (seconds_since(t0) > s) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

 private:
  pid_t pid_ = -1;
  int status_ = -1;
  fs::path out_;
  std::string marker_;
};

// True where this process can make mount namespaces (root, a kernel that allows them).
bool can_unshare_mounts() { return ndt::testing::run_shell("unshare -m true").rc == 0; }

// The command after it runs in a mount namespace of its own, where rank R (from the
// launcher's OMPI_COMM_WORLD_RANK) first runs `script` (which may bind-mount its own copy
// of a directory over the shared path). The mounts end with the rank's processes.
std::string own_mounts(const std::string& script) {
  return "unshare -m sh -c 'R=$OMPI_COMM_WORLD_RANK; " + script + " && exec \"$0\" \"$@\"' ";
}

class DistFaults : public ::testing::Test {
 public:  // the helpers below are used by free functions too
  static void SetUpTestSuite() {
    dir_ = ndt::testing::fresh_dir("dist_faults");
    const int64_t V = ndt::testing::write_word_corpus(dir_ / "data", 8000, 7, 0.2);
    std::ofstream(dir_ / "gpt.ini")
        << "[model]\nn_layer = 2\nn_head = 2\nn_embd = 16\nvocab_size = " << V
        << "\nblock_size = 16\n[data]\ntrain = " << (dir_ / "data" / "train_*.bin").string()
        << "\nval = " << (dir_ / "data" / "val_*.bin").string()
        << "\n[train]\nmicro_batch_size = 2\nseq_len = 16\nsteps = 100000\n"
           "eval_every = 0\neval_steps = 2\nthreads = 1\n"
           "[parallel]\ndp_shard_size = 2\n"
           "[optim]\nlr = 0.01\nwarmup_steps = 1\n[sample]\nevery = -1\n[log]\nevery = 1\n";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  void SetUp() override {
    name_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(here());
  }

  fs::path here() const { return dir_ / name_; }
  // train_gpt's arguments for this test: its own metrics file (which also marks its
  // processes) and checkpoint directory.
  std::string args(const std::string& extra = "") const { return args_of("", extra); }
  // The same for another run of this test: its metrics in <run>.jsonl, checkpoints in <run>_ck.
  std::string args_of(const std::string& run, const std::string& extra) const {
    const fs::path metrics = here() / (run.empty() ? "metrics.jsonl" : run + ".jsonl"),
                   ck = here() / (run.empty() ? "ck" : run + "_ck");
    return std::string(NDT_TRAIN_GPT_BIN) + " --config " + (dir_ / "gpt.ini").string() + " --log.metrics " +
           metrics.string() + " --checkpoint.dir " + ck.string() + " " + extra;
  }
  std::string marker() const { return (here() / "metrics.jsonl").string(); }
  size_t steps() const { return steps_logged(here() / "metrics.jsonl"); }
  // The step `latest` names, or -1.
  int64_t latest() const {
    const std::string l = read_all(here() / "ck" / "latest");
    return l.rfind("step_", 0) == 0 ? std::stoll(l.substr(5)) : -1;
  }
  void expect_no_temporaries() const {
    if (!fs::exists(here() / "ck")) return;
    for (const auto& e : fs::directory_iterator(here() / "ck")) {
      const std::string n = e.path().filename().string();
      EXPECT_TRUE(n.rfind(".tmp", 0) != 0 && n.rfind(".old_", 0) != 0 && n != "latest.tmp") << e.path();
    }
  }
  // A copy of the data directory for rank R at here()/data_rankR.
  fs::path copy_data(int rank) const {
    const fs::path to = here() / ("data_rank" + std::to_string(rank));
    fs::copy(dir_ / "data", to, fs::copy_options::recursive);
    return to;
  }

  static fs::path dir_;
  std::string name_;
};
fs::path DistFaults::dir_;

// ---- at start ------------------------------------------------------------------------

TEST_F(DistFaults, RanksStartedWithDifferentConfigsRefuseInOneLine) {
  // a stale gpt.ini on one node: rank 1 has another seed and learning rate (each would
  // train silently to another result) and another eval_every (which would hang)
  const auto t0 = Clock::now();
  ndt::testing::ShellResult r = ndt::testing::run_shell(
      mpirun(1) + args() + " : -np 1 " + args("--train.seed 7 --optim.lr 0.02 --train.eval_every 3"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_LT(seconds_since(t0), 30.0);
  EXPECT_EQ(count_of(r.out, "the ranks were not started with the same config"), 1u) << r.out;
  EXPECT_TRUE(has(r.out, "optim.lr on rank 1 (rank 0: '0.01')")) << r.out;
  EXPECT_TRUE(has(r.out, "train.seed on rank 1 (rank 0: '")) << r.out;
  EXPECT_TRUE(has(r.out, "train.eval_every on rank 1 (rank 0: '0')")) << r.out;
  EXPECT_FALSE(has(r.out, "MPI_ABORT")) << "every rank knows: no abort";
  EXPECT_EQ(steps(), 0u) << "nothing trained";
  EXPECT_EQ(latest(), -1);
}

// A config error that only one rank finds (a stale key in its node's gpt.ini, a file missing
// there) used to end the job with exit code 2 and no word: every rank's error now reaches the
// user through rank 0, naming the rank and its host; one that every rank finds is said once.
TEST_F(DistFaults, AConfigErrorOnAnotherRankIsSaidByRankZero) {
  ndt::testing::ShellResult r =
      ndt::testing::run_shell(mpirun(1) + args() + " : -np 1 " + args("--train.no_such_key 3"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_EQ(count_of(r.out, "config error"), 1u) << r.out;
  EXPECT_TRUE(has(r.out, "train_gpt: config error: rank 1 (on ")) << r.out;
  EXPECT_TRUE(has(r.out, "no_such_key")) << r.out;
  EXPECT_FALSE(has(r.out, "MPI_ABORT")) << "every rank knows: no abort";
  EXPECT_EQ(steps(), 0u) << "nothing trained";
  r = ndt::testing::run_shell(mpirun(2) + args("--train.no_such_key 3"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_EQ(count_of(r.out, "config error"), 1u) << "the same error on every rank, said once: " << r.out;
  EXPECT_FALSE(has(r.out, "rank 1")) << r.out;
}

// Under DP only rank 0 used to sample: a sample longer than parallel.timeout_s left rank 1
// waiting in the next collective past its deadline, and a healthy job ended with exit 6.
// Every rank samples the same tokens now, so no rank waits for another's sample (each sample
// takes several times the deadline here; the ranks finish theirs within it of each other).
TEST_F(DistFaults, ASampleLongerThanTheTimeoutDoesNotEndAHealthyJob) {
  const auto t0 = Clock::now();
  ndt::testing::ShellResult r = ndt::testing::run_shell(
      mpirun(2) +
      args("--parallel.dp_shard_size 1 --parallel.dp_replicate_size 2 --parallel.timeout_s 2 "
           "--train.steps 3 --sample.every 2 --sample.length 60000 --model.n_embd 32 --model.n_layer 3"));
  const std::string end = r.out.substr(r.out.size() > 3000 ? r.out.size() - 3000 : 0);  // not the samples
  EXPECT_EQ(r.rc, 0) << end;
  EXPECT_TRUE(has(r.out, "sample at step 2:")) << end;
  EXPECT_FALSE(has(r.out, "has not completed")) << end;
  EXPECT_GT(seconds_since(t0), 4.0) << "the samples took less than the deadline: they test nothing";
}

TEST_F(DistFaults, ADataFileOfAnotherSizeOnOneNodeIsRefused) {
  if (!can_unshare_mounts()) GTEST_SKIP() << "needs mount namespaces (root and unshare -m)";
  // rank 1's node has an older copy of the training shard (another size), same name and path
  const fs::path mine = copy_data(1);
  ndt::testing::write_word_corpus(mine, 7000, 7, 0.2);
  const std::string bind =
      "if [ $R = 1 ]; then mount --bind " + mine.string() + " " + (dir_ / "data").string() + "; fi";
  ndt::testing::ShellResult r = ndt::testing::run_shell(mpirun(2) + own_mounts(bind) + args());
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_EQ(count_of(r.out, "the ranks were not started with the same config"), 1u) << r.out;
  EXPECT_TRUE(has(r.out, "data.train files on rank 1 (rank 0: 'train_000000.bin:" +
                             std::to_string(fs::file_size(dir_ / "data" / "train_000000.bin")) + "')"))
      << r.out;
  EXPECT_TRUE(has(r.out, "data.val files on rank 1")) << r.out;
  EXPECT_EQ(steps(), 0u);
}

TEST_F(DistFaults, ACheckpointDirTheRanksDoNotShareIsRefusedBeforeTraining) {
  if (!can_unshare_mounts()) GTEST_SKIP() << "needs mount namespaces (root and unshare -m)";
  // the same path on every rank, but each node's own local disk (sharded checkpoints: every
  // rank writes its shards there, so the first save would fail after the whole run)
  fs::create_directories(here() / "ck");
  fs::create_directories(here() / "ck_rank0");
  fs::create_directories(here() / "ck_rank1");
  const std::string bind = "mount --bind " + (here() / "ck_rank").string() + "$R " + (here() / "ck").string();
  const auto t0 = Clock::now();
  ndt::testing::ShellResult r = ndt::testing::run_shell(mpirun(2) + own_mounts(bind) + args());
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_LT(seconds_since(t0), 30.0);
  EXPECT_EQ(count_of(r.out, "is not the same directory on every rank: rank 1 do"), 1u) << r.out;
  EXPECT_TRUE(has(r.out, "checkpoint.dir " + (here() / "ck").string())) << r.out;
  EXPECT_EQ(steps(), 0u) << "refused before training";
  EXPECT_TRUE(fs::is_empty(here() / "ck_rank1")) << "no probe left behind";
  // the same layout with full checkpoints (rank 0 alone writes them) trains
  r = ndt::testing::run_shell(mpirun(2) + own_mounts(bind) +
                              args("--checkpoint.format full --train.steps 3"));
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(fs::exists(here() / "ck_rank0" / "latest")) << r.out;
}

TEST_F(DistFaults, AnUnsealedManifestWarnsOnceNotOncePerRank) {
  // a checkpoint written before manifests were sealed resumes with one warning
  ndt::testing::ShellResult r = ndt::testing::run_shell(mpirun(2) + args("--train.steps 2"));
  ASSERT_EQ(r.rc, 0) << r.out;
  const fs::path manifest = here() / "ck" / "step_00000002" / "checkpoint.json";
  nlohmann::json m = nlohmann::json::parse(read_all(manifest));
  ASSERT_TRUE(m.contains("manifest_xxh64"));
  m.erase("manifest_xxh64");
  std::ofstream(manifest, std::ios::trunc) << m.dump(1) << "\n";
  r = ndt::testing::run_shell(mpirun(2) + args("--train.steps 3 --checkpoint.resume true"));
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(count_of(r.out, "has no checksum"), 1u) << r.out;
  EXPECT_EQ(steps(), 3u);
}

// ---- a data file that fails on one rank mid-run -----------------------------------------

// Every rank reads its own copy of the data; after a few steps rank 1's copy of `file` is
// truncated. Every rank must end (no deadlock), the steps done saved first, one message
// naming the file.
void truncate_on_one_rank(const fs::path& here, const std::function<std::string(const std::string&)>& args,
                          const std::string& mpirun, const std::string& marker, const std::string& file,
                          const std::string& what, const fs::path& data) {
  fs::path copies[2];
  for (int r = 0; r < 2; ++r) {
    copies[r] = here / ("data_rank" + std::to_string(r));
    fs::copy(data, copies[r], fs::copy_options::recursive);
  }
  const std::string bind = "mount --bind " + (here / "data_rank").string() + "$R " + data.string();
  Job job(mpirun + own_mounts(bind) + args(""), here / "out.txt", marker);
  ASSERT_TRUE(Job::until(60, [&] { return steps_logged(here / "metrics.jsonl") >= 3 || job.wait(0) >= 0; }))
      << job.output();
  ASSERT_LT(job.wait(0), 0) << job.output();
  fs::resize_file(copies[1] / file, fs::file_size(copies[1] / file) / 2);
  const auto t0 = Clock::now();
  const int rc = job.wait(60);
  EXPECT_LT(seconds_since(t0), 30.0) << "every rank ends, none waits in a collective";
  const std::string out = job.output();
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(has(out, what + " failed at step ")) << out;
  EXPECT_TRUE(has(out, "(checkpoint saved)")) << out;
  EXPECT_TRUE(has(out, (data / file).string() + " changed size during the run")) << out;
  EXPECT_TRUE(has(out, "it failed on another rank")) << "rank 0 says why it stops too: " << out;
  // the checkpoint holds every step that was logged
  const std::string l = read_all(here / "ck" / "latest");
  ASSERT_EQ(l.rfind("step_", 0), 0u) << out;
  EXPECT_EQ(static_cast<size_t>(std::stoll(l.substr(5))), steps_logged(here / "metrics.jsonl")) << out;
  EXPECT_TRUE(job.ranks().empty());
}

TEST_F(DistFaults, AnEvaluationThatFailsOnOneRankSavesAndEndsEveryRank) {
  if (!can_unshare_mounts()) GTEST_SKIP() << "needs mount namespaces (root and unshare -m)";
  truncate_on_one_rank(
      here(), [&](const std::string& a) { return args("--train.eval_every 1 " + a); }, mpirun(2), marker(),
      "val_000000.bin", "evaluation", dir_ / "data");
  expect_no_temporaries();
}

TEST_F(DistFaults, TrainingDataThatFailsOnOneRankSavesAndEndsEveryRank) {
  if (!can_unshare_mounts()) GTEST_SKIP() << "needs mount namespaces (root and unshare -m)";
  truncate_on_one_rank(
      here(), [&](const std::string& a) { return args(a); }, mpirun(2), marker(), "train_000000.bin",
      "reading the training data", dir_ / "data");
  expect_no_temporaries();
}

// ---- stopped ranks, dead launchers, doubled signals -------------------------------------

// Starts the job with parallel.timeout_s 3, waits for 2 steps, SIGSTOPs rank 1 (as a hung
// node) and, with `then_sigterm`, sends SIGTERM to rank 0. The job must end within
// timeout_s + 15 s, non-zero, naming why; returns its output.
std::string stop_rank_one(DistFaults& t, bool then_sigterm, int& rc, const std::string& layout = "") {
  Job job(ndt::testing::mpirun(2) + t.args("--parallel.timeout_s 3 " + layout), t.here() / "out.txt",
          t.marker());
  EXPECT_TRUE(Job::until(60, [&] { return t.steps() >= 2 || job.wait(0) >= 0; })) << job.output();
  std::vector<pid_t> ranks = job.ranks();
  EXPECT_EQ(ranks.size(), 2u) << job.output();
  if (ranks.size() != 2) return job.output();
  // which is rank 1: the one whose environment says so
  pid_t stopped = -1, healthy = -1;
  for (pid_t p : ranks) {
    std::string env = read_all("/proc/" + std::to_string(p) + "/environ");
    (has(env, std::string("OMPI_COMM_WORLD_RANK=1") + '\0') ? stopped : healthy) = p;
  }
  ::kill(stopped, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  if (then_sigterm) ::kill(healthy, SIGTERM);
  const auto t0 = Clock::now();
  rc = job.wait(3 + 15);
  EXPECT_GE(rc, 0) << "the job still runs 18 s later: " << job.output();
  EXPECT_NE(rc, 0) << job.output();
  EXPECT_LT(seconds_since(t0), 3.0 + 15.0);
  ::kill(stopped, SIGCONT);
  EXPECT_TRUE(Job::until(10, [&] { return job.ranks().empty(); })) << "no rank left behind";
  return job.output();
}

TEST_F(DistFaults, AStoppedRankEndsTheJobAfterTheTimeoutNamingTheCollective) {
  // no signal: the healthy rank's collective times out, it says which, and the job ends
  int rc = 0;
  const std::string out = stop_rank_one(*this, false, rc);
  EXPECT_EQ(rc, 6) << out;
  EXPECT_TRUE(has(out, "train_gpt: rank 0: error: ")) << out;
  EXPECT_TRUE(has(out,
                  " on world rank 0 has not completed after 3 s (parallel.timeout_s): a rank of the group "
                  "is dead, stopped or cut off; ending the job (exit code 6)"))
      << out;
  expect_no_temporaries();
  // the flight record of rank 0, and the report names the collective rank 0 waits in and
  // rank 1 as the one missing from it
  const fs::path flight = here() / "ck" / "flight";
  ASSERT_TRUE(fs::exists(flight / "rank_0.json")) << out;
  const nlohmann::json rec = nlohmann::json::parse(read_all(flight / "rank_0.json"));
  EXPECT_EQ(rec["rank"], 0);
  EXPECT_EQ(rec["world"], 2);
  EXPECT_GE(rec["step"].get<int64_t>(), 2);
  ASSERT_FALSE(rec["entries"].empty());
  // the collective rank 0's error names is in its record (by the time rank 0 writes, rank 1
  // may have been woken by mpirun's SIGCONT and the collective have completed)
  const size_t at = out.find("train_gpt: rank 0: error: ");
  ASSERT_NE(at, std::string::npos) << out;
  const size_t from = at + std::strlen("train_gpt: rank 0: error: ");
  const std::string timed_out = out.substr(from, out.find(" (", from) - from);  // "fsdp.all_gather"
  bool recorded = false, pending = false;
  for (const nlohmann::json& e : rec["entries"])
    if (e["what"] == timed_out) {
      recorded = true;
      pending = e["state"] != "done";
    }
  EXPECT_TRUE(recorded) << timed_out << " is not in " << rec.dump(1);
  const ndt::testing::ShellResult r = ndt::testing::run_shell("python3 " + std::string(NDT_SOURCE_DIR) +
                                                              "/scripts/flight_report.py " + flight.string());
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r.out, "  rank 0 (")) << r.out;  // "  rank 0 (<host>): at step 5: error: ..."
  // rank 1 may write one too, when it wakes before mpirun kills it: then the report gives
  // its own reason
  EXPECT_TRUE(has(r.out, "no record from rank 1: dead, stopped, cut off") ||
              (has(r.out, "2 of 2 ranks wrote a record") && has(r.out, "\n  rank 1 (")))
      << r.out;
  if (has(r.out, "no record from rank 1"))
    EXPECT_TRUE(has(r.out, "verdict:\n  rank 1 fell behind or wrote nothing"));
  if (pending) EXPECT_TRUE(has(r.out, "rank 0 waits in " + timed_out)) << r.out;
}

TEST_F(DistFaults, AStoppedPipelineStageEndsTheJobNamingTheSendOrReceive) {
  // pipeline parallelism: stage 1 stops; stage 0 waits for one of its messages (an activation
  // sent, a gradient received) or for the step's loss, and ends the job after the timeout
  int rc = 0;
  const std::string out = stop_rank_one(
      *this, false, rc, "--parallel.pp_size 2 --parallel.dp_shard_size 1 --train.grad_accum_steps 4");
  EXPECT_EQ(rc, 6) << out;
  const size_t at = out.find("train_gpt: rank 0: error: ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  // the group in words: the pipeline's, or (stage 1 stopped after its last message of the
  // step) the world's agreement at the step's end, which stage 1 never joins
  EXPECT_TRUE(has(line, "the pipeline") || has(line, "bytes; the world; step")) << line;
  if (has(line, "pp.send") || has(line, "pp.recv"))  // which message, from or to which stage
    EXPECT_TRUE(has(line, "from stage 1") || has(line, "to stage 1")) << line;
  // rank 0's record: its sends and receives name their peer, the stopped stage
  const fs::path flight = here() / "ck" / "flight";
  ASSERT_TRUE(fs::exists(flight / "rank_0.json")) << out;
  const nlohmann::json rec = nlohmann::json::parse(read_all(flight / "rank_0.json"));
  size_t to_stage_1 = 0;
  for (const nlohmann::json& e : rec["entries"])
    if (e["what"] == "pp.send" || e["what"] == "pp.recv") {
      EXPECT_EQ(e.value("peer", -1), 1) << e.dump();
      ++to_stage_1;
    }
  EXPECT_GT(to_stage_1, 0u);
  // rank 1 wrote nothing (killed while stopped) or, woken by the launcher's SIGCONT, a late
  // record that shows the time it was not running: either way the verdict names it
  const ndt::testing::ShellResult r = ndt::testing::run_shell("python3 " + std::string(NDT_SOURCE_DIR) +
                                                              "/scripts/flight_report.py " + flight.string());
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r.out, "verdict:\n  rank 1 fell behind")) << r.out;
  if (fs::exists(flight / "rank_1.json"))
    EXPECT_FALSE(nlohmann::json::parse(read_all(flight / "rank_1.json"))["paused"].empty()) << r.out;
}

TEST_F(DistFaults, ASigtermToAHealthyRankEndsAJobWithAStoppedRank) {
  // SIGTERM to rank 0 asks the job to stop, but its step can never finish: it waits in a
  // collective, whose deadline ends the job with exit 6 (the stop signal's watch, exit 4,
  // is for a rank stuck outside any collective)
  int rc = 0;
  const std::string out = stop_rank_one(*this, true, rc);
  EXPECT_EQ(rc, 6) << out;
  EXPECT_TRUE(has(out, "on world rank 0 has not completed after 3 s (parallel.timeout_s)")) << out;
  EXPECT_FALSE(has(out, "exit code 4")) << out;
  expect_no_temporaries();
}

TEST_F(DistFaults, RanksWhoseLauncherIsKilledStopWithinSeconds) {
  // each rank writes its output to a file of its own, not to mpirun's pipes (where a write
  // after mpirun's death would end it anyway): only the rank's own watch can stop it
  const std::string to_file =
      "sh -c 'exec \"$0\" \"$@\" > " + (here() / "rank").string() + "$OMPI_COMM_WORLD_RANK.txt 2>&1' ";
  Job job(mpirun(2) + to_file + args("--checkpoint.every 5"), here() / "out.txt", marker());
  ASSERT_TRUE(Job::until(60, [&] { return steps() >= 2 || job.wait(0) >= 0; })) << job.output();
  const std::vector<pid_t> ranks = job.ranks();
  ASSERT_EQ(ranks.size(), 2u) << job.output();
  ::kill(job.pid(), SIGKILL);  // mpirun (the job's shell exec'd it)
  EXPECT_EQ(job.wait(10), 128 + SIGKILL);
  const auto t0 = Clock::now();
  EXPECT_TRUE(Job::until(10, [&] {
    for (pid_t p : ranks)
      if (running(p)) return false;
    return true;
  })) << "orphaned ranks still train";
  EXPECT_LT(seconds_since(t0), 10.0);
  for (int r = 0; r < 2; ++r) {
    const std::string out = read_all(here() / ("rank" + std::to_string(r) + ".txt"));
    EXPECT_TRUE(has(out, "train_gpt: rank " + std::to_string(r) + ": the launcher (parent pid ")) << out;
    EXPECT_TRUE(has(out, "is gone: stopping now, without a new checkpoint (exit code 5)")) << out;
  }
  // and they stopped: no step logged, no checkpoint published after that
  const size_t done = steps();
  const int64_t last = latest();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(steps(), done);
  EXPECT_EQ(latest(), last);
  // a rank that stopped in the middle of a save leaves a .tmp_* directory, as a kill would
  // (the next start removes it); `latest` still names a complete checkpoint
  if (last >= 0) {
    char name[32];
    std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(last));
    EXPECT_TRUE(fs::exists(here() / "ck" / name / "checkpoint.json")) << name;
  }
}

TEST_F(DistFaults, TwoSignalsAtOnceAreOneRequestUnderMpirun) {
  // a scheduler signals a task and its process group: one rank gets SIGTERM twice,
  // microseconds apart; that is one request to stop, and the job saves
  Job job(mpirun(2) + args(), here() / "out.txt", marker());
  ASSERT_TRUE(Job::until(60, [&] { return steps() >= 2 || job.wait(0) >= 0; })) << job.output();
  std::vector<pid_t> ranks = job.ranks();
  ASSERT_EQ(ranks.size(), 2u) << job.output();
  ::kill(ranks[0], SIGTERM);
  ::kill(ranks[0], SIGTERM);
  const int rc = job.wait(30);
  const std::string out = job.output();
  EXPECT_EQ(rc, 3) << out;
  EXPECT_TRUE(has(out, "stopped by signal 15 after step")) << out;
  EXPECT_EQ(static_cast<size_t>(latest()), steps()) << out;
  expect_no_temporaries();
}

TEST_F(DistFaults, TimeoutOfOneProcessSavesEveryTime) {
  // coreutils' timeout sends SIGTERM to the child and then to its process group: the same
  // request twice. Every run must save (it failed a third of the time when the second
  // signal killed).
  for (int run = 0; run < 4; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    fs::remove_all(here() / "ck");
    fs::remove(here() / "metrics.jsonl");
    ndt::testing::ShellResult r =
        ndt::testing::run_shell("timeout --preserve-status -s TERM 2 " + args("--parallel.dp_shard_size 1"));
    EXPECT_EQ(r.rc, 3) << r.out;
    EXPECT_TRUE(has(r.out, "stopped by signal 15 after step")) << r.out;
    ASSERT_GT(steps(), 0u) << r.out;
    EXPECT_EQ(static_cast<size_t>(latest()), steps()) << r.out;
    expect_no_temporaries();
  }
}

// ---- across hosts: the simulated cluster ----------------------------------------------

// The train_gpt ranks of a job whose world rank is in `which` (from their environment).
std::vector<pid_t> ranks_numbered(const std::vector<pid_t>& ranks, const std::vector<int>& which) {
  std::vector<pid_t> out;
  for (pid_t p : ranks) {
    const std::string env = read_all("/proc/" + std::to_string(p) + "/environ");
    for (int r : which)
      if (has(env, "OMPI_COMM_WORLD_RANK=" + std::to_string(r) + '\0')) out.push_back(p);
  }
  return out;
}

// scripts/flight_report.py on this test's flight records.
ndt::testing::ShellResult flight_report(const DistFaults& t) {
  return ndt::testing::run_shell("python3 " + std::string(NDT_SOURCE_DIR) + "/scripts/flight_report.py " +
                                 (t.here() / "ck" / "flight").string());
}

// HSDP 2 x 2 on two hosts (each shard group inside a host, the replicas' all-reduce across).
const char* kHsdpOnTwoHosts =
    "--parallel.dp_replicate_size 2 --parallel.dp_shard_size 2 --train.micro_batch_size 1 "
    "--parallel.timeout_s 3 ";

TEST_F(DistFaults, ACutLinkEndsTheJobAndTheReportNamesTheNetwork) {
  ndt::testing::Cluster two(2);
  if (!two.ok()) GTEST_SKIP() << two.why_not();
  Job job("env " + two.mpirun(4) + args(std::string(kHsdpOnTwoHosts) + "--checkpoint.every 2"),
          here() / "out.txt", marker());
  ASSERT_TRUE(Job::until(90, [&] { return steps() >= 3 || job.wait(0) >= 0; })) << job.output();
  ASSERT_EQ(job.wait(0), -1) << job.output();
  two.cut(1);
  const auto t0 = Clock::now();
  const int rc = job.wait(3 + 15);
  const std::string out = job.output();
  EXPECT_EQ(rc, 6) << "within timeout_s + 15 s: " << out;
  EXPECT_LT(seconds_since(t0), 3.0 + 15.0);
  // Open MPI's default keepalive (480 s) is past the deadline: the start said so
  EXPECT_TRUE(has(out, "note: a host cut off would hold mpirun past parallel.timeout_s = 3 s")) << out;
  // the line of host 0's ranks (host 1's cannot reach mpirun): the collective, its group in
  // words, where the step was, the bytes and the wait
  // (which collective the cut catches depends on the moment: mostly the replicas' all-reduce)
  const size_t at = out.find("train_gpt: rank 0: error: ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  // "(25408 bytes; the replicate group of shard 0; step 5, ...", "(the world; step 6, ..." (a barrier)
  EXPECT_TRUE(has(line, " bytes; the ") || has(line, " (the ")) << line;
  EXPECT_TRUE(has(line, "; step ")) << line;
  EXPECT_TRUE(has(line, ") on world rank 0 has not completed after 3 s (parallel.timeout_s)")) << line;
  // a complete checkpoint from before the cut (one being written when the link went is left
  // as .tmp_*, which the next start removes)
  ASSERT_GE(latest(), 2);
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(latest()));
  EXPECT_TRUE(fs::exists(here() / "ck" / name / "checkpoint.json")) << name;
  const ndt::testing::ShellResult r = flight_report(*this);
  EXPECT_EQ(r.rc, 0) << r.out;
  // each host's ranks wrote (the file system is shared) and timed out: either nobody fell
  // behind (the collective that spans the hosts never completed anywhere) or host 1's ranks
  // did (it completed on host 0 first); either way the verdict is the network. When the
  // launcher ended a rank before it wrote, the report cannot tell and names the network first
  // Rank 0 writes its record, unless the launcher ended it first (rank 1's abort, on the same
  // host, can reach mpirun before rank 0's own deadline has passed): the report then says it
  // has no record from rank 0, and its verdict names the network first (below)
  EXPECT_TRUE(has(r.out, "  rank 0 (h0): at step ") || has(r.out, "no record from rank 0: ")) << r.out;
  EXPECT_TRUE(has(r.out, "  rank 3 (h1): at step ")) << r.out;
  const std::string verdict = r.out.substr(r.out.find("verdict:"));
  EXPECT_TRUE(has(verdict, "it spans hosts h0, h1: the network between them") ||
              has(verdict, "so what they sent never arrived: the network between h") ||
              has(verdict, "look at the network between them first"))  // a rank the launcher ended first
      << r.out;
  two.heal(1);
}

// Hosts with Linux's default TCP retries (about 15 minutes before a connection with unsent
// data fails): after the ranks' deadline mpirun would wait that long for the cut host's
// daemon. Open MPI's keepalive on its daemons' connections, shorter than
// parallel.timeout_s, has mpirun find the lost host while those connections are idle and
// end the job itself, naming the host, within seconds (exit 205, Open MPI's own code).
const char* kLauncherKeepalive =
    "--mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3 ";

TEST_F(DistFaults, ACutLinkEndsTheJobOnTimeThroughTheLaunchersKeepalive) {
  ndt::testing::Cluster two(2, /*tcp_retries2=*/15);
  if (!two.ok()) GTEST_SKIP() << two.why_not();
  const double timeout_s = 10;
  Job job("env " + two.mpirun(4) + kLauncherKeepalive +
              args("--parallel.dp_replicate_size 2 --parallel.dp_shard_size 2 --train.micro_batch_size 1 "
                   "--parallel.timeout_s 10 --checkpoint.every 2"),
          here() / "out.txt", marker());
  ASSERT_TRUE(Job::until(90, [&] { return steps() >= 3 || job.wait(0) >= 0; })) << job.output();
  ASSERT_EQ(job.wait(0), -1) << job.output();
  two.cut(1);
  const auto t0 = Clock::now();
  const int rc = job.wait(static_cast<int>(timeout_s) + 15);
  const std::string out = job.output();
  EXPECT_EQ(rc, 205) << "within timeout_s + 15 s: " << out;
  EXPECT_LT(seconds_since(t0), timeout_s);  // the keepalive (1 + 3 x 1 s), not the deadline
  EXPECT_TRUE(has(out, "ORTE has lost communication with a remote daemon")) << out;
  EXPECT_FALSE(has(out, "would hold mpirun")) << out;  // no note: the keepalive is shorter
  EXPECT_TRUE(has(out, "on node h1")) << out;
  // the launcher's SIGTERM found host 0's ranks waiting in a collective across the hosts:
  // their records say so, and the report names the network
  const ndt::testing::ShellResult r = flight_report(*this);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r.out, "  rank 0 (h0): at step ")) << r.out;
  const std::string verdict = r.out.substr(r.out.find("verdict:"));
  EXPECT_TRUE(has(verdict, "the network between") || has(verdict, "look at h1 and its network link first"))
      << r.out;
  two.heal(1);
}

TEST_F(DistFaults, AStoppedRankOnAnotherHostEndsTheJobAndTheReportNamesIt) {
  ndt::testing::Cluster two(2);
  if (!two.ok()) GTEST_SKIP() << two.why_not();
  Job job("env " + two.mpirun(4) + args(kHsdpOnTwoHosts), here() / "out.txt", marker());
  ASSERT_TRUE(Job::until(90, [&] { return steps() >= 3 || job.wait(0) >= 0; })) << job.output();
  ASSERT_EQ(job.wait(0), -1) << job.output();
  const std::vector<pid_t> rank3 = ranks_numbered(job.ranks(), {3});
  ASSERT_EQ(rank3.size(), 1u) << job.output();
  ::kill(rank3[0], SIGSTOP);  // a hung process on host 1
  const auto t0 = Clock::now();
  const int rc = job.wait(3 + 15);
  const std::string out = job.output();
  ::kill(rank3[0], SIGCONT);
  EXPECT_EQ(rc, 6) << "within timeout_s + 15 s: " << out;
  EXPECT_LT(seconds_since(t0), 3.0 + 15.0);
  EXPECT_TRUE(has(out, "has not completed after 3 s (parallel.timeout_s)")) << out;
  const ndt::testing::ShellResult r = flight_report(*this);
  EXPECT_EQ(r.rc, 0) << r.out;
  // rank 3 wrote nothing, or (woken by the launcher's SIGCONT before its SIGTERM) a late
  // record that shows the time it was not running, wherever the stop caught it (inside a
  // collective the others wait in too): the verdict names it
  EXPECT_TRUE(has(r.out, "verdict:\n  rank 3 fell behind")) << r.out;
}

TEST_F(DistFaults, AHostWhoseRanksAreKilledEndsTheJobAndTheHostLeftContinuesTheCurve) {
  ndt::testing::Cluster two(2);
  if (!two.ok()) GTEST_SKIP() << two.why_not();
  // the curve to continue: one process on the same global batch (8 sequences a step)
  const std::string run = " --train.steps 30 --optim.warmup_steps 2 ";
  {
    const ndt::testing::ShellResult ref = ndt::testing::run_shell(args_of(
        "ref", run + "--train.grad_accum_steps 2 --parallel.dp_shard_size 1 --train.micro_batch_size 4"));
    ASSERT_EQ(ref.rc, 0) << ref.out;
  }
  // the job: HSDP over two hosts, host 1's link slowed so that it is caught mid-run
  two.rate(1, "1mbit");
  Job job("env " + two.mpirun(4) +
              args(std::string(kHsdpOnTwoHosts) + run + "--train.grad_accum_steps 2 --checkpoint.every 3"),
          here() / "out.txt", marker());
  ASSERT_TRUE(Job::until(120, [&] { return steps() >= 4 || job.wait(0) >= 0; })) << job.output();
  ASSERT_EQ(job.wait(0), -1) << job.output();
  const std::vector<pid_t> host1 = ranks_numbered(job.ranks(), {2, 3});
  ASSERT_EQ(host1.size(), 2u) << job.output();
  for (pid_t p : host1) ::kill(p, SIGKILL);
  const auto t0 = Clock::now();
  const int rc = job.wait(3 + 15);
  EXPECT_GT(rc, 0) << "within timeout_s + 15 s: " << job.output();
  EXPECT_LT(seconds_since(t0), 3.0 + 15.0);
  const int64_t saved = latest();
  ASSERT_GE(saved, 3) << job.output();
  expect_no_temporaries();
  const ndt::testing::ShellResult r = flight_report(*this);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r.out, "no record from ranks 2, 3")) << r.out;
  EXPECT_TRUE(has(r.out, "every rank of host h1 (ranks 2, 3) wrote nothing: look at h1")) << r.out;

  // the host that is left resumes with its 2 ranks, accumulating twice as many micro-steps:
  // the same 8 sequences a step, the same data, the same curve
  fs::rename(here() / "metrics.jsonl", here() / "before.jsonl");
  two.rate(1, "none");
  const ndt::testing::ShellResult resumed = ndt::testing::run_shell(
      two.mpirun(2, /*on_hosts=*/1) +
      args(run + "--parallel.dp_shard_size 2 --train.micro_batch_size 1 --train.grad_accum_steps 4 "
                 "--checkpoint.resume true --checkpoint.every 3"));
  ASSERT_EQ(resumed.rc, 0) << resumed.out;
  EXPECT_TRUE(has(resumed.out, "resumed from")) << resumed.out;
  EXPECT_TRUE(has(resumed.out, "  rank 1: replicate 0, shard 1, cp 0, tp 0 on h0")) << resumed.out;
  const std::map<int64_t, double> want = losses_by_step(here() / "ref.jsonl"),
                                  before = losses_by_step(here() / "before.jsonl"),
                                  after = losses_by_step(here() / "metrics.jsonl");
  ASSERT_EQ(want.size(), 30u);
  ASSERT_EQ(after.size(), static_cast<size_t>(30 - saved)) << resumed.out;
  for (const auto& [step, loss] : want) {
    const auto& from = step <= saved ? before : after;
    ASSERT_TRUE(from.count(step)) << "step " << step;
    EXPECT_NEAR(from.at(step), loss, 2e-5 * loss)
        << "step " << step << (step <= saved ? " before" : " after");
  }
  std::printf(
      "killed host 1 after %zu logged steps; resumed from step %lld on host 0: 30 losses within 2e-5\n",
      before.size(), static_cast<long long>(saved));
}

TEST_F(DistFaults, ARankThatThrowsMidStepEndsTheJobAndTheReportNamesIt) {
  ndt::testing::Cluster two(2);
  if (!two.ok()) GTEST_SKIP() << two.why_not();
  // an earlier job's record in the folder (of 8 ranks, it failed on its own): this job
  // removes it at start
  const fs::path old_record = here() / "ck" / "flight" / "rank_5.json";
  fs::create_directories(old_record.parent_path());
  std::ofstream(old_record)
      << "{\"job\": \"20200101T000000Z-h0-1\", \"rank\": 5, \"world\": 8, \"reason\": "
         "\"error: an earlier job's failure\", \"step\": 9, \"written_us\": 1, \"entries\": []}\n";
  Job job("env " + two.mpirun(4) +
              args(std::string(kHsdpOnTwoHosts) + "--parallel.fail_at_step 4 --parallel.fail_rank 3"),
          here() / "out.txt", marker());
  const auto t0 = Clock::now();
  const int rc = job.wait(90);
  const std::string out = job.output();
  EXPECT_EQ(rc, 1) << out;
  EXPECT_LT(seconds_since(t0), 60.0);
  EXPECT_TRUE(has(out,
                  "train_gpt: rank 3: error: parallel.fail_at_step = 4: failing on purpose in the middle of "
                  "the step"))
      << out;
  EXPECT_EQ(steps(), 3u) << out;
  const ndt::testing::ShellResult r = flight_report(*this);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(has(r.out, "  rank 3 (h1): at step 4: error: parallel.fail_at_step = 4")) << r.out;
  EXPECT_TRUE(has(r.out, "verdict:\n  rank 3 on h1 failed on its own")) << r.out;
  // one job's records, named; the earlier job's record is gone, not mixed in
  const nlohmann::json rec = nlohmann::json::parse(read_all(here() / "ck" / "flight" / "rank_3.json"));
  const std::string job_id = rec["job"].get<std::string>();
  EXPECT_EQ(job_id.size() > 17 && job_id[8] == 'T' && job_id[15] == 'Z', true) << job_id;
  EXPECT_EQ(r.out.rfind("job " + job_id + "\n", 0), 0u) << r.out;
  EXPECT_FALSE(has(r.out, "an earlier job's failure")) << r.out;
  EXPECT_FALSE(has(r.out, "left out")) << r.out;
  EXPECT_FALSE(fs::exists(old_record));
}

}  // namespace
