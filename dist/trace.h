// ndtrain: a timeline of one rank's step, as a Chrome trace (open it in Perfetto,
// ui.perfetto.dev, or chrome://tracing).
//
// Three tracks per rank: "compute" (each unit's forward and backward, the optimizer),
// "comm" (each collective from its start to its completion on the communication thread or
// stream, with its bytes) and "wait" (the time the compute thread spent blocked on a
// handle). A collective that overlaps compute shows on "comm" under a "compute" event and
// leaves no "wait" event: that is the FSDP prefetch working.
//
//   dist::Trace trace(rank);
//   { dist::Trace::Scope s(&trace, "forward h.3", dist::Trace::kCompute); ... }
//   io::write_file_atomic("out/trace.rank0.json", trace.to_json());   // train/io/files.h
//
// Times count from the trace's start; the file also gives that start on the host's steady
// clock (otherData.clock_origin_us), which lines up the ranks of one host.
// Thread-safe: the communication thread adds events while the compute thread does.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace ndt::dist {

class Trace {
 public:
  enum Track { kCompute = 0, kComm = 1, kWait = 2 };
  explicit Trace(int rank);

  int64_t now_us() const;  // since this trace was made
  void add(const std::string& name, Track track, int64_t begin_us, int64_t end_us, int64_t bytes = -1);
  // The events as Chrome trace JSON, one event a line; the caller writes the file (train
  // through io::write_file_atomic, which follows a symlink and never replaces a device).
  std::string to_json() const;
  size_t size() const;

  // Times a region on a track; a null trace makes it a no-op.
  class Scope {
   public:
    Scope(Trace* t, std::string name, Track track, int64_t bytes = -1);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Trace* t_;
    std::string name_;
    Track track_;
    int64_t bytes_, begin_ = 0;
  };

 private:
  struct Event {
    std::string name;
    Track track;
    int64_t begin, end, bytes;
  };
  int rank_;
  std::chrono::steady_clock::time_point start_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

// "out/trace.json" for rank 3 -> "out/trace.rank3.json"
std::string trace_path_for_rank(const std::string& path, int rank);

}  // namespace ndt::dist
