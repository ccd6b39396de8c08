// ndtrain: the flight recorder. Each rank keeps its last operations on every communicator
// (which group, its sequence number in that group, the collective, bytes, the training step,
// when it was queued, started and finished). When the job fails (a collective past its
// deadline, an error, a stop that cannot finish) every rank that still can writes its record,
// and scripts/flight_report.py compares them: the ranks that fell behind, and the collective
// the others wait in.
//
//   dist::FlightRecorder flight;
//   world->set_flight(&flight);                  // every group split from world records too
//   flight.set_step(step);                       // the loop says where it is
//   flight.dump("out/ckpt/flight/rank_0.json", rank, world_size, "fsdp.all_gather timed out");
//
// Entries are kept per rank in a ring of `capacity`; recording is a mutex and a few stores,
// nothing is communicated.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

namespace ndt::dist {

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 4096) : capacity_(capacity) {}

  // A new operation of `group` (e.g. "fsdp@1": the communicator's name and which of its
  // groups), its sequence number in that group; returns its id for started/finished.
  int64_t queued(const std::string& group, int64_t seq, const std::string& what, int64_t bytes);
  void started(int64_t id);
  void finished(int64_t id, bool ok);
  void set_step(int64_t step);
  // Writes the record as JSON (atomically: a temporary file, then rename); never throws.
  void dump(const std::string& path, int rank, int world, const std::string& reason) const;

 private:
  struct Entry {
    int64_t id = 0, seq = 0, bytes = 0, step = -1;
    std::string group, what;
    int64_t queued_us = 0, started_us = 0, finished_us = 0;  // 0: not yet
    bool ok = true;
  };
  Entry* find(int64_t id);  // with mu_ held; null when it left the ring
  size_t capacity_;
  mutable std::mutex mu_;
  std::deque<Entry> entries_;
  int64_t next_id_ = 1, step_ = -1;
};

}  // namespace ndt::dist
