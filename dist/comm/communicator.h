// ndtrain: Communicator, the one interface every collective goes through.
//
// A communicator is a group of ranks (the world, or one dimension of the device mesh).
// Collectives work on contiguous flat tensors and are asynchronous: each returns a Work
// handle, and the result may be read only after wait(). Sizes need not divide the group:
// the caller pads (FSDP pads each flat buffer to a multiple of the shard count).
//
//   std::shared_ptr<dist::Communicator> world = dist::init_world();   // MPI, or local (1 rank)
//   dist::WorkPtr w = world->all_reduce(grad, dist::ReduceOp::kAvg);  // starts it
//   ... compute something else ...
//   w->wait();                                                        // grad is now the mean
//
// Two backends: MPI for CPU tensors (dist/comm/mpi.cpp: a progress thread owns the MPI
// calls, so collectives advance while the rank computes) and NCCL for CUDA tensors
// (dist/comm/nccl.cpp: its own stream, ordered against the compute stream by events).
// With a group of size 1 every collective is a copy or a no-op.
//
// Byte counters: each communicator counts, per kind, the bytes this rank sends under the
// ring algorithms that MPI and NCCL use for large messages, so that the figures are exact
// functions of the sizes (the tests and the step log read them):
//   all_reduce      2 (n-1)/n x bytes          all_gather      (n-1) x input bytes
//   reduce_scatter  (n-1)/n x input bytes      broadcast       bytes (on the root; 0 elsewhere)
//   send            bytes                      recv            0 (counted by the sender)
// in the dtype on the wire: NCCL reduces bf16 as bf16, MPI (which has no bf16 type) reduces
// it in an f32 copy, so there a bf16 all_reduce or reduce_scatter moves and counts twice
// the tensor's bytes (all_gather, broadcast and send move the raw 16-bit words); and, of
// those, the bytes that leave this rank's host: in a ring each rank sends to the next
// member of its group (the destination of a send), so they cross hosts when that member is on
// another host (set_remote_members; the mesh knows every rank's host).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace ndt::dist {

class FlightRecorder;

class Trace;

enum class ReduceOp { kSum, kAvg, kMax };

// A collective in flight. wait() blocks until it is done and rethrows its error, if any;
// waiting twice is fine. Handles may be waited on in any order.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool done() = 0;  // true once finished (never blocks)
};
using WorkPtr = std::shared_ptr<Work>;

enum class CommKind { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kSend, kRecv, kAllToAll, kCount };

struct CommStats {
  std::array<int64_t, static_cast<size_t>(CommKind::kCount)> bytes{};  // see the table above
  std::array<int64_t, static_cast<size_t>(CommKind::kCount)> calls{};
  int64_t across_hosts = 0;  // of all the bytes, those sent to a rank on another host
  int64_t total_bytes() const;
  int64_t operator[](CommKind k) const { return bytes[static_cast<size_t>(k)]; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }  // "world", "dp_shard", ...
  virtual std::string backend() const = 0;           // "mpi", "nccl", "local"

  // t (n) in place: the sum, mean or max over the group.
  virtual WorkPtr all_reduce(const Tensor& t, ReduceOp op) = 0;
  // in (n) from every rank -> out (size * n), rank r's input at [r*n, (r+1)*n).
  virtual WorkPtr all_gather(const Tensor& out, const Tensor& in) = 0;
  // in (size * n) on every rank -> out (n): chunk `rank` of the reduction (sum or mean).
  virtual WorkPtr reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) = 0;
  // t from rank `root` to every rank.
  virtual WorkPtr broadcast(const Tensor& t, int root) = 0;
  // Point to point (ring attention); a send must meet a recv of the same size on the peer.
  virtual WorkPtr send(const Tensor& t, int peer) = 0;
  virtual WorkPtr recv(const Tensor& t, int peer) = 0;
  // Sends `out_t` to `to` and receives `in_t` from `from` as one operation, the step of a
  // ring that every rank takes at once. The default posts the receive and the send (the MPI
  // backend's are non-blocking); NCCL groups them, since two separate calls on one stream
  // would make each rank's receive wait for a send queued behind the peer's receive.
  virtual WorkPtr sendrecv(const Tensor& out_t, int to, const Tensor& in_t, int from);
  // in's first send_counts[0] elements to member 0, the next send_counts[1] to member 1, ...;
  // out gets recv_counts[j] elements from member j, in member order (MPI_Alltoallv; NCCL: one
  // group of sends and receives). The counts (size() each) must match the peers' (expert
  // parallelism exchanges them first). Counted as kAllToAll: the bytes sent to other members.
  virtual WorkPtr all_to_all_v(const Tensor& out, const std::vector<int64_t>& recv_counts, const Tensor& in,
                               const std::vector<int64_t>& send_counts) = 0;
  virtual void barrier() = 0;

  // Ranks that pass the same color form a new communicator, ordered by key. Collective
  // over this communicator: every rank calls it.
  virtual std::shared_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // Brings the whole job down (every rank) with this exit code; used when one rank fails,
  // so that the others do not wait forever in a collective.
  [[noreturn]] virtual void abort(int code) = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  // Optional timeline: each collective becomes an event on the "comm" track.
  void set_trace(Trace* t) { trace_ = t; }
  // A deadline for every operation of this communicator and of those split from it later:
  // a Work not complete `seconds` after its wait() began throws CollectiveTimeout (a peer
  // dead, stopped or cut off). 0: wait for ever.
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }
  // The flight recorder (dist/flight.h) of this communicator and of those split from it
  // later: every operation is recorded under group() with its sequence number.
  void set_flight(FlightRecorder* f) { flight_ = f; }
  FlightRecorder* flight() const { return flight_; }
  // Names the unit (e.g. "h.3") the next operations sync, in the flight record and timeout
  // messages; a no-op without a recorder.
  void note_unit(const std::string& unit) const;
  // Which group this is, the same string on every member: the name, and for a split one the
  // color that chose it ("fsdp@1"); operations with one seq number in one group match.
  const std::string& group() const { return group_; }
  // The group in words, for messages ("the shard group of replica 1"); the name by default.
  void set_description(std::string d) { description_ = std::move(d); }
  const std::string& description() const { return description_.empty() ? name_ : description_; }
  // remote[i]: member i of this group is on another host than this rank (size() entries).
  // Unset: every member counts as on this host.
  void set_remote_members(std::vector<bool> remote) { remote_ = std::move(remote); }
  bool spans_hosts() const;

  // Where this backend's tensors live: the CPU for MPI, the communicator's GPU for NCCL.
  virtual Device device() const { return Device::cpu(); }

  // Blocking conveniences for small host values (metrics, norms, flags); the value travels
  // in a tensor on device().
  double all_reduce_scalar(double v, ReduceOp op);

 protected:
  Communicator(int rank, int size, std::string name)
      : rank_(rank), size_(size), name_(std::move(name)), group_(name_) {}
  // Checks a collective's arguments (contiguous, dtype, sizes); throws naming the call.
  void check_same(const char* call, const Tensor& a, const Tensor& b, int64_t b_factor_num,
                  int64_t b_factor_den) const;
  void check_one(const char* call, const Tensor& t) const;
  // all_to_all_v's arguments: size() counts each, summing to in's and out's elements;
  // returns the bytes sent to other members
  int64_t check_all_to_all_v(const Tensor& out, const std::vector<int64_t>& recv_counts, const Tensor& in,
                             const std::vector<int64_t>& send_counts) const;
  // Adds `bytes` sent to group member `to` (-1: the next member, a ring's destination).
  void count(CommKind k, int64_t bytes, int to = -1);
  // The context of an operation queued now, for its timeout message: the group in words and
  // where the job is (the flight recorder's step, micro-step and unit).
  std::string context() const;

  int rank_, size_;
  std::string name_;
  CommStats stats_;
  Trace* trace_ = nullptr;
  double timeout_s_ = 0;
  FlightRecorder* flight_ = nullptr;
  std::string group_, description_;
  std::vector<bool> remote_;
  int64_t seq_ = 0;  // operations recorded so far
};

// An operation that did not complete within its communicator's timeout. The job cannot go
// on (a peer will never arrive, or arrives in another collective): the caller ends it.
class CollectiveTimeout : public Error {
 public:
  using Error::Error;
};

// A finished Work (size-1 groups, or errors found before starting).
WorkPtr done_work();

// The group of one: every collective is a local copy (or nothing).
std::shared_ptr<Communicator> local_communicator(const std::string& name = "local");

// True when this process was started by a launcher (mpirun, srun) with more than one
// rank, read from the environment (OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS).
bool launched_with_several_ranks();
// This process's rank as the launcher numbers it (OMPI_COMM_WORLD_RANK, PMI_RANK,
// SLURM_PROCID), before MPI starts; 0 when not launched.
int launcher_rank();
// This process's index among the ranks on its node (OMPI_COMM_WORLD_LOCAL_RANK,
// SLURM_LOCALID, LOCAL_RANK), and how many ranks share the node; 0 and 1 when unknown.
int local_rank();
int local_size();

}  // namespace ndt::dist
