// train_gpt's entry: the config read (errors before MPI starts), then --plan, or the training
// job of this process's rank (train/trainer.cpp), whose failure on any rank ends the job.
#include <algorithm>
#include <memory>
#include <ostream>
#include <string>

#include "dist/comm/mpi.h"
#include "dist/flight.h"
#include "train/agree.h"
#include "train/config.h"
#include "train/guard.h"
#include "train/planner/plan_main.h"
#include "train/trainer.h"

namespace ndt::train {
namespace {
// start_error: this rank's config error, or "" (see train_main)
int run_training(const Config& c, const std::string& start_error, std::ostream& out, std::ostream& err);
}  // namespace

int train_main(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  Config c;
  // Config errors come before MPI starts. Under a launcher every rank has its own (the same,
  // unless a node's files differ): the ranks agree on them once MPI is up, and rank 0 says
  // each (agree_on_start); --plan starts no MPI, so each rank says its own.
  const bool quiet = dist::launcher_rank() != 0;
  std::string start_error;
  try {
    std::string help;
    if (!parse_config(argc, argv, c, help)) {
      if (!quiet) out << help;
      return 0;
    }
  } catch (const ConfigError& e) {
    const bool planning =
        c.plan || std::any_of(argv, argv + argc, [](const char* a) { return std::string(a) == "--plan"; });
    if (!dist::launched_with_several_ranks() || (planning && !quiet)) {
      err << "train_gpt: config error: " << e.what() << "\n";
      return 2;
    }
    if (planning) {
      err << ("train_gpt: rank " + std::to_string(dist::launcher_rank()) + ": config error: " + e.what() +
              "\n");
      return 2;
    }
    start_error = e.what();
  }
  if (c.plan && start_error.empty()) return plan_main(c, quiet, out, err);  // train/planner/plan_main.h
  return run_training(c, start_error, out, err);
}

namespace {

// The training job of this process's rank; a failure on any rank ends the whole job.
int run_training(const Config& c, const std::string& start_error, std::ostream& out, std::ostream& err) {
  std::shared_ptr<dist::Communicator> world;
  int code = 0;
  std::string message;
  // Each rank's last operations (dist/flight.h), written beside the checkpoints (or the
  // metrics, or here) when a job of several ranks fails; scripts/flight_report.py reads them.
  dist::FlightRecorder flight;
  auto dump_flight = [&](const std::string& why) {
    if (!world || world->size() == 1) return;
    flight.dump(flight_record_path(c, world->rank()), world->rank(), world->size(), why);
  };
  try {
    world = dist::init_world();  // MPI under a launcher with several ranks, else a group of one
    // every collective's deadline (and the mesh's groups'): a config that failed, the default
    world->set_timeout(start_error.empty() ? c.parallel.timeout_s : ParallelSection{}.timeout_s);
    world->set_flight(&flight);           // and their record, dumped when the job fails
    agree_on_start(start_error, *world);  // a rank's config error ends every rank; rank 0 says it
    StopSignals signals;                  // SIGINT/SIGTERM: finish the step, checkpoint, exit kExitPreempted
    // a stop that cannot finish (a peer stuck) or a dead launcher ends this process
    Watchdog watchdog(
        c.parallel.timeout_s, dist::launched_with_several_ranks(), world->rank(),
        [&](const std::string& why) { dump_flight(why); }, &flight);
    return run_trainer(c, world, out, watchdog, flight);
  } catch (const AgreedConfigError& e) {  // every rank found it together: one line, no abort
    if (world->rank() == 0) err << "train_gpt: config error: " << e.what() << "\n";
    return 2;
  } catch (const ConfigError& e) {
    code = 2;
    message = std::string("config error: ") + e.what();
  } catch (const dist::CollectiveTimeout& e) {
    code = kExitCollectiveTimeout;
    message = std::string("error: ") + e.what() +
              "; ending the job (exit code 6): the last complete checkpoint resumes";
  } catch (const std::exception& e) {
    code = 1;
    message = std::string("error: ") + e.what();
  }
  if (!world || world->size() == 1) {
    err << "train_gpt: " << message << "\n";
    return code;
  }
  // One rank failed (or all did): say which, then bring the whole job down, so that no
  // rank waits forever in a collective for this one.
  // one write: the ranks' stderr meet in the launcher, and pieces would interleave
  err << ("train_gpt: rank " + std::to_string(world->rank()) + ": " + message + "\n") << std::flush;
  dump_flight(message);
  world->abort(code);
  return code;  // not reached
}

}  // namespace

}  // namespace ndt::train
