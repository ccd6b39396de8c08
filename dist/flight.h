// ndtrain: the flight recorder. Each rank keeps its last operations on every communicator
// (which group, its sequence number in that group, the collective, bytes, the training step,
// when it was queued, started and finished). When the job fails (a collective past its
// deadline, an error, a stop that cannot finish) every rank that still can writes its record,
// and scripts/flight_report.py compares them: the ranks that fell behind, and the collective
// the others wait in.
//
//   dist::FlightRecorder flight;
//   world->set_flight(&flight);                  // every group split from world records too
//   flight.set_step(step);                       // the loop says where it is,
//   flight.set_micro(0, 4);                      // which micro-step,
//   flight.set_unit("h.3");                      // and the strategy which unit it syncs
//   flight.set_hosts(hosts);                     // every rank's host, for the report
//   flight.dump("out/ckpt/flight/rank_0.json", rank, world_size, "fsdp.all_gather timed out");
//
// The first dump of a process wins (its reason is the first failure; a later one, say from
// the launcher's kill after an abort, would only blur it).
//
// Entries are kept per rank in a ring of `capacity`; recording is a mutex and a few stores,
// nothing is communicated. A point-to-point entry names its peer (a world rank). A thread that
// runs every fraction of a second (the trainer's watchdog) calls tick(): a gap of over a second
// between ticks is a time this process was not running (stopped, starved), and the record
// lists those gaps, one still open when the record is written included.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace ndt::dist {

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 4096) : capacity_(capacity) {}

  // A new operation of `group` (e.g. "fsdp@1": the communicator's name and which of its
  // groups), its sequence number in that group, and for a send or receive the world rank of
  // its peer (-1: a collective); returns its id for started/finished.
  int64_t queued(const std::string& group, int64_t seq, const std::string& what, int64_t bytes,
                 int peer = -1);
  void started(int64_t id);
  void finished(int64_t id, bool ok);
  void set_step(int64_t step);                // also clears the micro-step and unit
  void set_micro(int64_t micro, int64_t of);  // micro-step `micro` (from 0) of `of`; -1: after them
  void set_unit(const std::string& unit);     // the unit whose collective comes next ("" none)
  // "step 37, micro-step 2 of 4, unit h.3": where the job is, for messages ("" before step 1).
  std::string where() const;
  void set_hosts(std::vector<std::string> hosts);  // every world rank's host name
  // The job the records belong to (the same id on every rank of a job, see
  // train/agree.h). Until it is set dump() writes nothing: a job that never claimed its
  // outputs (refused at start, say by another job's lock) leaves no record among theirs.
  void set_job(const std::string& id);

  // The oldest operation not finished and when it was queued (microseconds since the epoch,
  // the clock of the record); queued_us 0 when none is pending.
  struct Pending {
    std::string what;
    int64_t queued_us = 0;
  };
  Pending oldest_pending() const;
  static int64_t now_us();
  // This process runs: a gap over kPauseUs since the previous tick is recorded as a pause.
  void tick();
  static constexpr int64_t kPauseUs = 1'000'000;

  // Writes the record as JSON (atomically: a temporary file, then rename) unless this
  // recorder has written one already or has no job yet; never throws.
  void dump(const std::string& path, int rank, int world, const std::string& reason) const;
  // Removes the record dump() wrote (a stop that looked stuck but finished cleanly).
  void retract();

 private:
  struct Entry {
    int64_t id = 0, seq = 0, bytes = 0, step = -1;
    int peer = -1;
    std::string group, what;
    int64_t queued_us = 0, started_us = 0, finished_us = 0;  // 0: not yet
    bool ok = true;
  };
  Entry* find(int64_t id);  // with mu_ held; null when it left the ring
  size_t capacity_;
  mutable std::mutex mu_;
  std::deque<Entry> entries_;
  int64_t next_id_ = 1, step_ = -1, micro_ = -2, micro_of_ = 0;
  std::string unit_;
  std::vector<std::string> hosts_;
  std::string job_;
  int64_t last_tick_us_ = 0;
  std::deque<std::pair<int64_t, int64_t>> pauses_;  // [from, to) in microseconds, the last 16
  mutable bool dumped_ = false;
  mutable std::string dumped_to_;
};

}  // namespace ndt::dist
