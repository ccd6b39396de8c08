// ndtrain: checks that every rank of a job makes together at start, before any work, so that
// a difference between nodes (a stale config file, a checkpoint directory that is not shared)
// is one clear refusal instead of a wrong result, a hang or a run that saves nothing.
//
//   check_same_config(cfg, world);                  // throws AgreedConfigError on every rank
//   check_checkpoint_dir_shared(cfg, writer, world); // likewise
//
// Both are collective over `world` (every rank calls them, in the same order) and cost a
// few small collectives once per run.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dist/comm/communicator.h"
#include "train/config.h"

namespace ndt::train {

// A config error found by every rank at once (after an agreement): rank 0 reports it, and
// the job ends with exit code 2 without aborting anyone.
class AgreedConfigError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

// The first agreement of a job: `error` is this rank's config error ("" when its config
// parsed), found before MPI started. When any rank has one, throws AgreedConfigError on
// every rank naming each failing rank, its host and its error (once, without ranks, when
// every rank has the same one), so that an error seen on one node only still reaches the
// user through rank 0. Also for the errors every rank finds alike later, before anything is
// allocated (the model and its layout: Trainer::describe).
void agree_on_start(const std::string& error, dist::Communicator& world);

// What every rank learns at the end of a step, in one small collective: a stop signal on any
// rank (train/guard.h), and whether any rank failed to read the next step's data.
struct StepAgreement {
  int signal = 0;
  bool data_failed = false;
};
StepAgreement agree_at_step_end(bool data_failed, dist::Communicator& world);

// Work between steps that may fail on one rank (reading data, printing a sample): `local_fn`,
// rank-local (no collective inside), then one small collective so that every rank learns
// whether it failed on any rank. error: this rank's (failed_here).
struct LocalWork {
  bool failed_anywhere = false, failed_here = false;
  std::string error;
};
LocalWork agree_on_local_work(const std::function<void()>& local_fn, dist::Communicator& world);

// This job's id, the same on every rank (collective): rank 0's start time in UTC, host and
// pid, "20261204T083300Z-node1-4242", so that ids sort by start time.
std::string agree_on_job_id(dist::Communicator& world);

// The keys and values that must be equal on every rank: every [section] key as parsed
// (cfg.values) and, as `data.train files` / `data.val files`, the names and sizes of the data
// files each pattern matches here.
std::vector<std::pair<std::string, std::string>> rank_identity(const Config& cfg);

// Compares rank_identity(cfg) with rank 0's. On a difference, throws AgreedConfigError on
// every rank naming each key that differs, rank 0's value and the ranks that have another.
void check_same_config(const Config& cfg, dist::Communicator& world);

// With checkpoint.dir set and several ranks: rank 0 writes a marker file there, and every
// rank that will read the directory (all of them, except with checkpoint.format = full and
// no resume) must see it, and every `writer` must be able to write there. Otherwise throws
// AgreedConfigError on every rank naming the ranks (and their hosts) that do not.
void check_checkpoint_dir_shared(const Config& cfg, bool writer, dist::Communicator& world);

}  // namespace ndt::train
