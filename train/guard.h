// ndtrain: what keeps a training run from being lost: the lock on a checkpoint directory,
// the stop-on-signal flag for graceful preemption, the finiteness check of a step, and
// the output-path checks done before any work starts.
//
//   StopSignals signals;                      // SIGINT/SIGTERM set a flag; a second one kills
//   check_output_paths(cfg);                  // every file and directory we will write, now
//   RunLock lock(cfg.ckpt_dir);               // throws naming the pid that holds the directory
//   clean_temporaries(cfg.ckpt_dir);          // leftovers of a crashed checkpoint write
//   ...
//   check_step_finite(step, loss, grad_norm); // throws NonFiniteError before the update
//   if (stop_requested()) { save(); return kExitPreempted; }
//
// In a multi-rank run, stop_requested() and check_step_finite() are the two decisions every
// rank must take together.
#pragma once

#include <csignal>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "dist/comm/communicator.h"
#include "dist/flight.h"
#include "nn/flat.h"
#include "tensor/error.h"
#include "train/config.h"

namespace ndt::train {

// Exit code of train_gpt when SIGINT or SIGTERM stopped it after the current step (and a
// checkpoint, when checkpoint.dir is set). Distinct from 0 (done), 1 (error), 2 (config).
constexpr int kExitPreempted = 3;
// Exit code when a stop was asked but the rank made no progress for parallel.timeout_s
// outside any collective (stuck in computation, I/O or a device; a collective that never
// completes is kExitCollectiveTimeout): the job is ended without a new checkpoint; the last
// complete one resumes.
constexpr int kExitStuck = 4;
// Exit code of a rank whose launcher (mpirun, its daemon, srun's step) has died: it stops
// at once instead of training on, unseen, and publishing checkpoints.
constexpr int kExitOrphaned = 5;
// A collective did not complete within parallel.timeout_s (a rank dead, stopped or cut off
// while no stop was asked): this rank says which, then ends the job.
constexpr int kExitCollectiveTimeout = 6;

// Stop signals that arrive within this many seconds of the first are the same request:
// coreutils' `timeout` and job schedulers signal the process and its process group, so
// one request often arrives twice within microseconds.
constexpr double kSignalRepeatWindowS = 2.0;

// While alive, the first SIGINT or SIGTERM only sets a flag (stop_requested()); a second
// one, more than kSignalRepeatWindowS after the first, restores the default action and
// re-raises, so the process dies at once. The destructor restores the previous handlers.
// One at a time per process.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

// True once a stop signal arrived (the training loop stops after the current step).
bool stop_requested();
// The signal that asked to stop (SIGINT, SIGTERM), 0 if none.
int stop_signal();

// A thread that ends this process when waiting any longer would only hold the allocation:
// - a stop signal arrived and the run made no progress (beat()) for `timeout_s` since the
//   later of the signal and the last beat, while this rank waits in no collective (stuck in
//   computation, I/O or a device): one line on stderr, exit kExitStuck (under a launcher
//   the others are then ended by it: mpirun ends a job one of whose ranks exits without
//   finalizing). Waiting in a collective, that collective's own deadline ends the rank
//   with kExitCollectiveTimeout, signal or not;
// - with `watch_launcher`, this process's parent (the launcher or its daemon) has gone
//   (the parent pid changed): one line, exit kExitOrphaned, within about a second.
// The trainer beats at every step and around checkpoint writes.
//
// With a flight recorder and last_words (its dump), it also writes the record while the
// process can still write: when a stop signal finds this rank waiting in a collective that
// was queued before the signal and is still not done 0.3 s later (a launcher ending a failed
// job sends SIGTERM, then SIGKILL a second later), and when the process is ended by a call
// to exit() from inside a library while the watchdog lives (Open MPI does so when a peer
// process disconnects). One Watchdog per process.
class Watchdog {
 public:
  // last_words (may be empty) runs on the watchdog's thread just before it ends the
  // process, with the line it printed (the flight recorder's dump). The watchdog ticks
  // `flight` 10 times a second: its record shows when this process was not running.
  Watchdog(double timeout_s, bool watch_launcher, int rank,
           std::function<void(const std::string&)> last_words = {}, dist::FlightRecorder* flight = nullptr);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  void beat();
  // Runs last_words now (the flight record), for a failure found off the main thread.
  void last_words(const std::string& why) const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

// What NCCL's watch thread calls when a collective misses its deadline: the same line,
// flight record and exit code (kExitCollectiveTimeout) as a deadline missed on the main
// thread, the job ended through `world`.
std::function<void(const std::string& why)> end_job_on_missed_deadline(dist::Communicator& world,
                                                                       const Watchdog& watchdog);

// An exclusive flock on <dir>/.lock, which holds the holder's pid. Throws ndt::Error
// naming that pid when another process holds it. Released when destroyed (or the process
// dies). The file stays (removing it would race with the next run taking it).
class RunLock {
 public:
  explicit RunLock(const std::string& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

// Removes what a crashed or killed checkpoint write left in `dir` (.tmp_* directories,
// latest.tmp) and puts back a .old_step_* directory whose replacement never arrived.
// Call only while holding the RunLock.
void clean_temporaries(const std::string& dir);

// A run never silently replaces another's results: throws ConfigError, naming what is there
// and the two ways on, when the outputs hold an earlier run's (a checkpoint in checkpoint.dir,
// a non-empty log.metrics, log.report, TensorBoard events in log.tensorboard) and this run does
// not resume from that checkpoint (checkpoint.resume with a checkpoint to resume). Rank 0,
// holding the RunLock.
void check_no_earlier_run(const Config& c);

// Throws ConfigError (one line naming the key) if any output of this rank cannot be
// written: rank 0's checkpoint.dir, log.metrics, log.report, log.tensorboard, log.grads, and every rank's
// own log.trace file. Creates missing directories, writes nothing else.
void check_output_paths(const Config& c, int rank = 0);

// This rank's device (train.device: cpu, cuda = the GPU of the rank's place on its node, or
// cuda:N), checked as a run of `world_size` ranks needs it (a visible GPU, one per rank,
// NCCL between GPUs): a GPU is made current and its TF32 setting (train.tf32) applied.
// Throws ConfigError naming the key and what to set.
Device open_device(const Config& c, int world_size);

// Where this rank writes its flight record (dist/flight.h) when a job of several ranks
// fails: <dir>/flight/rank_<rank>.json beside the checkpoints (checkpoint.dir), else beside
// the metrics (log.metrics), else in the working directory.
std::string flight_record_path(const Config& c, int rank);
// Removes the flight records of earlier jobs from that folder (rank 0, which holds the
// checkpoint directory's lock, before this job's ranks can write theirs).
void remove_flight_records(const Config& c);

// Under Open MPI's mpirun, a host cut off holds the launcher until its keepalive on the
// daemons' connections gives up (oob_tcp_keepalive_time + _intvl x _probes, 480 s by
// default) or, once the ranks' deadline has made it send to that host, until TCP stops
// retransmitting (about 15 minutes on Linux): a note saying so, and the flags that end such
// a job within seconds, when the keepalive the ranks were given (OMPI_MCA_ variables, as
// mpirun's --mca passes them) does not give up before parallel.timeout_s. Empty otherwise,
// and outside Open MPI.
std::string launcher_keepalive_note(double timeout_s);

// Throws ConfigError when `param_count` f32 parameters with their gradients and AdamW
// moments (16 bytes each) cannot fit in the memory of `device` (CPU: physical memory).
void check_fits_in_memory(int64_t param_count, Device device);

// A step whose loss or gradient norm is not finite must not be applied or saved.
class NonFiniteError : public Error {
 public:
  using Error::Error;
};
// Throws NonFiniteError naming the step and what was not finite.
void check_step_finite(int64_t step, double loss, double grad_norm);
// The first parameter holding NaN or Inf, as "name (NaN)"; empty when all are finite.
std::string first_nonfinite_param(const nn::FlatParams& params);

}  // namespace ndt::train
