#include "train/guard.h"

#include "dist/trace.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "dist/comm/communicator.h"
#include "tensor/checked.h"
#include "tensor/cuda/runtime.h"
#include "train/checkpoint/checkpoint.h"
#include "train/io/files.h"

namespace fs = std::filesystem;

namespace ndt::train {
namespace {

// Written by the signal handler, so process-wide by necessity (there is one set of
// handlers per process); read through stop_signal() and Watchdog.
volatile std::sig_atomic_t g_stop_signal = 0;
std::atomic<int64_t> g_stop_time_ns{0};  // CLOCK_MONOTONIC of the first signal

int64_t monotonic_ns() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {
    // the same request again (timeout and schedulers signal the process group too): ignore
    if (monotonic_ns() - g_stop_time_ns.load() < static_cast<int64_t>(kSignalRepeatWindowS * 1e9)) return;
    std::signal(sig, SIG_DFL);  // a second request: die now, as if we had no handler
    std::raise(sig);
    return;
  }
  g_stop_time_ns.store(monotonic_ns());
  g_stop_signal = sig;
}

std::string errno_str() { return std::strerror(errno); }

// Creates `dir` if needed and proves it is a writable directory by creating a file in it.
void check_writable_dir(const fs::path& dir, const std::string& key) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) throw ConfigError(key + ": cannot create directory " + dir.string() + " (" + ec.message() + ")");
  }
  if (!fs::is_directory(dir, ec))
    throw ConfigError(key + ": " + dir.string() + " exists and is not a directory");
  const fs::path probe = dir / (".write_probe_" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) throw ConfigError(key + ": cannot write in " + dir.string() + " (" + errno_str() + ")");
  ::close(fd);
  ::unlink(probe.c_str());
}

// Whether a process has `path`, a FIFO, open for reading (else opening it to write would wait).
bool fifo_has_reader(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}

// An output file: its directory must be writable and the path must not be a directory.
void check_output_file(const std::string& path, const std::string& key) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) throw ConfigError(key + ": " + path + " is a directory; give a file name");
  // written through a temporary file and a rename, which must never replace a FIFO, socket
  // or device; a character device (/dev/null) or a FIFO with a reader (a pipe) is written
  // through, and a symlink's target is written in the target's folder
  const fs::file_status st = fs::status(p, ec);
  const bool fifo_read = fs::is_fifo(st) && fifo_has_reader(path);
  if (fs::exists(st) && !fs::is_regular_file(st) && !fs::is_character_file(st) && !fifo_read)
    throw ConfigError(key + ": " + path + " is not a regular file (" +
                      (fs::is_fifo(st)     ? "a FIFO with no reader"
                       : fs::is_socket(st) ? "a socket"
                                           : "a block device or other") +
                      "); give a file name");
  const fs::path t = io::output_target(path);
  if (fs::is_regular_file(st) || !fs::exists(st))
    check_writable_dir(t.has_parent_path() ? t.parent_path() : fs::path("."), key);
  if (fs::exists(p, ec) && ::access(path.c_str(), W_OK) != 0)
    throw ConfigError(key + ": cannot write " + path + " (" + errno_str() + ")");
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

StopSignals::StopSignals() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a signal must not make a write fail half-way
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
}

bool stop_requested() { return g_stop_signal != 0; }
int stop_signal() { return g_stop_signal; }

struct Watchdog::State {
  double timeout_s;
  bool watch_launcher;
  int rank;
  pid_t parent;
  std::atomic<int64_t> last_beat_ns{0};
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::function<void(const std::string&)> last_words;
  dist::FlightRecorder* flight = nullptr;
  std::thread thread;
};

namespace {
// One line on stderr from the watchdog thread, then the end of this process. write(2), not
// a stream: the main thread may hold the streams' locks, stuck where it is.
[[noreturn]] void end_process(int rank, const std::string& what, int code,
                              const std::function<void(const std::string&)>& last_words) {
  const std::string line = "train_gpt: rank " + std::to_string(rank) + ": " + what + "\n";
  [[maybe_unused]] ssize_t n = ::write(2, line.data(), line.size());
  if (last_words) last_words(what);
  ::_exit(code);
}

// The live watchdog, for the exit() hook below: process-wide, as exit() is.
std::atomic<Watchdog::State*> g_watchdog{nullptr};

// exit() called while a watchdog lives: not train_gpt's own return (which ends the
// watchdog first) but a library ending the process, Open MPI when a peer disconnected.
// Waiting in a collective, the cause is the collective's (a peer gone): the process ends
// with kExitCollectiveTimeout and says so, rather than with the library's own code.
extern "C" void on_library_exit() {
  Watchdog::State* s = g_watchdog.exchange(nullptr);
  if (!s) return;
  const std::string in = s->flight ? s->flight->oldest_pending().what : "";
  const std::string why =
      "ended by a library call to exit()" + (in.empty() ? std::string() : " while waiting in " + in) +
      " (Open MPI does so when a peer process dies or disconnects: its message above names the host)";
  if (s->last_words) s->last_words(why);
  if (!in.empty())
    end_process(s->rank,
                "error: " + why + "; ending the job (exit code 6): the last complete checkpoint resumes",
                kExitCollectiveTimeout, nullptr);
}

// A stop signal that finds this rank stuck: the collective pending at the signal is still
// pending 0.3 s later. The launcher of a failed job sends SIGTERM, then SIGKILL a second
// later: the record must be written now.
bool stuck_since_signal(const Watchdog::State& s, int64_t asked_ns) {
  if (!s.flight || monotonic_ns() - asked_ns < 300'000'000) return false;
  const dist::FlightRecorder::Pending p = s.flight->oldest_pending();
  const int64_t signal_us = dist::FlightRecorder::now_us() - (monotonic_ns() - asked_ns) / 1000;
  return p.queued_us > 0 && p.queued_us < signal_us;
}
}  // namespace

Watchdog::Watchdog(double timeout_s, bool watch_launcher, int rank,
                   std::function<void(const std::string&)> last_words, dist::FlightRecorder* flight)
    : s_(std::make_unique<State>()) {
  s_->last_words = std::move(last_words);
  s_->flight = flight;
  static const bool hooked = std::atexit(on_library_exit) == 0;  // once per process
  (void)hooked;
  g_watchdog.store(s_.get());
  s_->timeout_s = timeout_s;
  s_->watch_launcher = watch_launcher;
  s_->rank = rank;
  s_->parent = ::getppid();
  s_->last_beat_ns = monotonic_ns();
  s_->thread = std::thread([s = s_.get()] {
    std::unique_lock<std::mutex> lock(s->mu);
    bool recorded = false;  // the record written for a stop signal that found this rank stuck
    if (s->flight) s->flight->tick();
    while (!s->cv.wait_for(lock, std::chrono::milliseconds(100), [s] { return s->done; })) {
      if (s->flight) s->flight->tick();  // a gap since the last: this process was not running
      if (s->watch_launcher && ::getppid() != s->parent)
        end_process(s->rank,
                    "the launcher (parent pid " + std::to_string(s->parent) +
                        ") is gone: stopping now, without a new checkpoint (exit code 5)",
                    kExitOrphaned, s->last_words);
      const int64_t asked = g_stop_time_ns.load();
      if (g_stop_signal == 0 || asked == 0) continue;
      if (!recorded && s->last_words && stuck_since_signal(*s, asked)) {
        recorded = true;
        s->last_words("asked to stop by signal " + std::to_string(static_cast<int>(g_stop_signal)) +
                      " while waiting in " + s->flight->oldest_pending().what);
      }
      // waiting in a collective, this rank is ended by that collective's own deadline (exit
      // kExitCollectiveTimeout), whether or not a stop was asked: one code for one cause
      if (s->flight && s->flight->oldest_pending().queued_us > 0) continue;
      const int64_t since = monotonic_ns() - std::max(asked, s->last_beat_ns.load());
      if (static_cast<double>(since) > s->timeout_s * 1e9) {
        char secs[32];
        std::snprintf(secs, sizeof(secs), "%.0f", s->timeout_s);
        end_process(s->rank,
                    "asked to stop by signal " + std::to_string(static_cast<int>(g_stop_signal)) +
                        ", but the step has not finished in parallel.timeout_s = " + secs +
                        " s, and it waits in no collective (stuck in computation, I/O or a device); ending "
                        "the job without a new checkpoint (exit code 4): the last complete one resumes",
                    kExitStuck, s->last_words);
      }
    }
  });
}

Watchdog::~Watchdog() {
  g_watchdog.store(nullptr);
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->done = true;
  }
  s_->cv.notify_all();
  s_->thread.join();
}

void Watchdog::beat() { s_->last_beat_ns = monotonic_ns(); }

void Watchdog::last_words(const std::string& why) const {
  if (s_->last_words) s_->last_words(why);
}

RunLock::RunLock(const std::string& dir) {
  const std::string path = (fs::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  NDT_CHECK(fd_ >= 0, "checkpoint.dir ", dir, ": cannot open the lock file ", path, " (", errno_str(), ")");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("?");
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      NDT_FAIL("checkpoint.dir ", dir, " is in use by another train_gpt (pid ", holder,
               "); wait for it to finish or use another checkpoint.dir");
    NDT_FAIL("checkpoint.dir ", dir, ": cannot lock ", path, " (", std::strerror(err), ")");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const std::string why = errno_str();
    ::close(fd_);
    fd_ = -1;
    NDT_FAIL("checkpoint.dir ", dir, ": cannot write the lock file ", path, " (", why, ")");
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

std::string launcher_keepalive_note(double timeout_s) {
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) return "";
  auto param = [](const char* name, double fallback) {  // Open MPI 4's defaults
    const char* v = std::getenv(name);
    char* end = nullptr;
    const double x = v ? std::strtod(v, &end) : fallback;
    return v && (end == v || *end != '\0') ? fallback : x;
  };
  const double time = param("OMPI_MCA_oob_tcp_keepalive_time", 300),
               intvl = param("OMPI_MCA_oob_tcp_keepalive_intvl", 20),
               probes = param("OMPI_MCA_oob_tcp_keepalive_probes", 9);
  const double gives_up = time + intvl * probes;
  if (time > 0 && gives_up < timeout_s) return "";
  char line[512];
  std::snprintf(
      line, sizeof(line),
      "a host cut off would hold mpirun past parallel.timeout_s = %.0f s: Open MPI's keepalive gives up "
      "after %.0f s, and then only TCP's retries (about 15 minutes) end the job; launch with --mca "
      "oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 5 to end it "
      "within about 15 s (docs/parallel/multi-node.md)",
      timeout_s, time > 0 ? gives_up : INFINITY);
  return line;
}

void clean_temporaries(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  std::vector<fs::path> tmp, old;
  for (auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (starts_with(n, ".tmp_") || n == "latest.tmp" || starts_with(n, ".write_probe_"))
      tmp.push_back(e.path());
    if (starts_with(n, ".old_")) old.push_back(e.path());
  }
  for (const fs::path& p : tmp) fs::remove_all(p);
  // save_checkpoint renames step_N to .old_step_N before moving the new step_N in; a crash
  // between the two renames leaves only the old one, which is complete: put it back.
  for (const fs::path& p : old) {
    const fs::path back = fs::path(dir) / p.filename().string().substr(5);
    if (fs::exists(back))
      fs::remove_all(p);
    else
      fs::rename(p, back);
  }
}

void check_no_earlier_run(const Config& c) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::optional<std::string> latest =
      c.checkpoint.dir.empty() ? std::nullopt : ckpt::latest_checkpoint(c.checkpoint.dir);
  if (latest && c.checkpoint.resume) return;  // resumed: the run goes on, its outputs with it
  std::vector<std::string> found;
  if (latest) found.push_back("a checkpoint (" + *latest + ")");
  for (const std::string& f : {c.log.metrics, c.log.report})
    if (!f.empty() && fs::is_regular_file(f, ec) && fs::file_size(f, ec) > 0) found.push_back(f);
  if (!c.log.tensorboard.empty())
    for (fs::directory_iterator it(c.log.tensorboard, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
        found.push_back("TensorBoard events in " + c.log.tensorboard);
        break;
      }
  if (found.empty()) return;
  std::string what;
  for (const std::string& f : found) what += (what.empty() ? "" : ", ") + f;
  const std::string where = c.out.empty() ? "the outputs hold" : "the run folder " + c.out + " holds";
  const std::string resume =
      latest ? "resume that run with --checkpoint.resume true (the same model), or " : "";
  throw ConfigError(where + " an earlier run's results (" + what + "), which this run would replace: " +
                    resume + "give this run its own folder with --out DIR (or remove those files)");
}

void check_output_paths(const Config& c, int rank) {
  if (rank == 0) {  // the files rank 0 writes
    if (!c.checkpoint.dir.empty()) check_writable_dir(c.checkpoint.dir, "checkpoint.dir");
    if (!c.log.metrics.empty()) check_output_file(c.log.metrics, "log.metrics");
    if (!c.log.report.empty()) check_output_file(c.log.report, "log.report");
    if (!c.log.tensorboard.empty()) check_writable_dir(c.log.tensorboard, "log.tensorboard");
    if (!c.log.grads.empty()) check_output_file(c.log.grads, "log.grads");
  }
  if (!c.log.trace.empty())
    check_output_file(dist::trace_path_for_rank(c.log.trace, rank), "log.trace");  // every rank's own
}

void check_fits_in_memory(int64_t param_count, Device device) {
  const int64_t need = checked_mul(param_count, 16, "parameter memory");
  if (!device.is_cpu()) return;  // a CUDA allocation that does not fit fails at once, with its size
  const int64_t have = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  if (have > 0 && need > have)
    throw ConfigError(
        "the model has " + std::to_string(param_count) + " parameters: " + std::to_string(need >> 30) +
        " GiB for weights, gradients and AdamW moments, more than the " + std::to_string(have >> 30) +
        " GiB of memory of this machine; lower model.n_layer, model.n_embd or model.vocab_size");
}

void check_step_finite(int64_t step, double loss, double grad_norm) {
  if (std::isfinite(loss) && std::isfinite(grad_norm)) return;
  auto str = [](double v) { return std::string(std::isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf"); };
  std::string what;
  if (!std::isfinite(loss)) what = "the loss is " + str(loss);
  if (!std::isfinite(grad_norm))
    what += (what.empty() ? "" : " and ") + std::string("the gradient norm is ") + str(grad_norm);
  throw NonFiniteError("step " + std::to_string(step) + ": " + what +
                       "; the update was not applied and nothing was saved; lower optim.lr (or set "
                       "optim.grad_clip) or check the data, and resume from the last checkpoint");
}

std::string first_nonfinite_param(const nn::FlatParams& params) {
  for (const nn::FlatUnit& u : params.units)
    for (const nn::FlatParam& p : u.params) {
      const std::vector<float> v = p.value.to(Device::cpu()).contiguous().to_vector<float>();
      for (float x : v)
        if (!std::isfinite(x)) return p.spec.name + (std::isnan(x) ? " (NaN)" : " (Inf)");
    }
  return "";
}

Device open_device(const Config& c, int world_size) {
  const Device device = Device::parse(c.train.device);
  if (device.is_cpu()) return device;
  // GPUs on several ranks: NCCL between them (MPI moves CPU tensors only), one GPU per rank
  if (world_size > 1 && c.parallel.backend == "mpi")
    throw ConfigError("parallel.backend = mpi moves CPU tensors, but train.device = " + c.train.device +
                      " on " + std::to_string(world_size) + " ranks; use parallel.backend = nccl or auto");
  if (c.train.device != "cuda" && dist::local_size() > 1)
    throw ConfigError(
        "train.device = " + c.train.device + " puts all " + std::to_string(dist::local_size()) +
        " ranks of this node on one GPU; use train.device = cuda (each rank takes cuda:<local rank>)");
  if (!cuda::available())
    throw ConfigError("train.device = " + c.train.device + " but no CUDA device is visible (" +
                      cuda::unavailable_reason() + ")" + "; use train.device = cpu");
  if (c.train.device == "cuda" && dist::local_size() > cuda::device_count())
    throw ConfigError(std::to_string(dist::local_size()) + " ranks on this node but " +
                      std::to_string(cuda::device_count()) +
                      " visible GPU(s): one rank per GPU (mpirun -np, or CUDA_VISIBLE_DEVICES)");
  // "cuda": the GPU of this rank's place on its node
  const Device gpu = c.train.device == "cuda" ? Device::cuda(dist::local_rank()) : device;
  cuda::set_device(gpu.index);
  cuda::set_allow_tf32(gpu.index, c.train.tf32);
  return gpu;
}

std::string flight_record_path(const Config& c, int rank) {
  namespace fs = std::filesystem;
  const fs::path dir = !c.checkpoint.dir.empty() ? fs::path(c.checkpoint.dir)
                       : !c.log.metrics.empty()  ? fs::path(c.log.metrics).parent_path()
                                                 : fs::path(".");
  return (dir / "flight" / ("rank_" + std::to_string(rank) + ".json")).string();
}

std::function<void(const std::string& why)> end_job_on_missed_deadline(dist::Communicator& world,
                                                                       const Watchdog& watchdog) {
  return [&world, &watchdog](const std::string& why) {
    const std::string line = "train_gpt: rank " + std::to_string(world.rank()) + ": error: " + why +
                             "; ending the job (exit code 6): the last complete checkpoint resumes\n";
    [[maybe_unused]] ssize_t n = ::write(2, line.data(), line.size());
    watchdog.last_words("error: " + why);
    world.abort(kExitCollectiveTimeout);
  };
}

void remove_flight_records(const Config& c) {
  std::error_code ec;
  const fs::path dir = fs::path(flight_record_path(c, 0)).parent_path();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename().string().rfind("rank_", 0) == 0) fs::remove(it->path(), ec);
}

}  // namespace ndt::train
