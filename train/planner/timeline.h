// ndtrain: the clock of the planner's replay (train/planner/replay.h) and the links its
// collectives run on, for one rank.
//
//   const Links links = links_of(plan.dims, cluster);
//   Timeline timeline(links);
//   timeline.run(Piece{0.010, 0.008}, false);                        // 10 ms of compute
//   Ticket t = timeline.start("fsdp", gather_s(bytes, plan.dims.fsdp(), links.fsdp));
//   timeline.run(Piece{0.005, 0.004}, false);                        // ... under it
//   timeline.wait("fsdp", t);                                        // exposed: what is left
//   timeline.now();  timeline.exposed();                             // the step so far
//
// A collective's time alone is its ring time on the link of its dimension:
//   all-reduce of S bytes on n ranks       2 (n-1) (latency + S / n / bandwidth)
//   all-gather, reduce-scatter (S whole)     (n-1) (latency + S / n / bandwidth)
//   ring attention's exchange of b bytes              latency + b / bandwidth
//   Ulysses' all-to-all of S bytes on n ranks (n-1) (latency + S / n / bandwidth)
// where the bandwidth is the slowest edge of the ring: inside a host the intra-host link,
// between hosts a host's share of its links (devices_per_host x inter_gbps) among the ring
// edges that leave it at once. Ranks sit on hosts in order (rank / devices_per_host), as
// mpirun places them by default; the mesh puts tp innermost, then sp, cp, dp_shard,
// dp_replicate (dist/mesh.h), so the outer dimensions are the ones that cross hosts.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "dist/mesh.h"
#include "train/planner/cluster.h"

namespace ndt::train {

// The host's links to other hosts, which every transfer in flight between hosts shares: k
// transfers at once each move at 1/k of the rate they would have alone (processor sharing,
// as concurrent TCP streams and Open MPI's progress of several non-blocking collectives do).
// A short transfer that starts during a long one (a ring-attention step during an FSDP
// all-gather) so ends after about twice its own time, not after the long one. predict_time's
// replay issues transfers in time order from the compute thread, so an end is only found
// when it is waited for: the link then runs forward until that transfer ends, and nothing
// can start before then, since the thread that would start it is the one waiting.
//
//   SharedLink l;
//   int a = l.add(0, 10), b = l.add(1, 1);   // b shares the link with a from t = 1
//   l.end(b);  // 3: 1 s of work at half the rate
//   l.end(a);  // 11: the link moved 11 s of work in all
class SharedLink {
 public:
  int add(double t, double alone);  // a transfer issued at t that alone would take `alone` s
  double end(int id);               // when transfer `id` ends

 private:
  struct Flow {
    int id;
    double left;  // seconds it would still take alone
  };
  void advance_to(double t);
  void step(double until);  // to the next end of a transfer, or to `until` if sooner
  double clock_ = 0;
  std::vector<Flow> active_;
  std::vector<double> ends_;  // by transfer; -1 while it runs
};

// The link the rings of one dimension run on.
struct Link {
  double bps = std::numeric_limits<double>::infinity(), latency = 0;
  double cpu_share = 0;    // of a transfer's time, what it takes from the computation under it
  bool crosses = false;    // some ring of this dimension leaves a host
  double cross_share = 0;  // of a host's ranks, the share whose ring successor is on another host
};

// The links of the mesh's dimensions: dp_replicate, the FSDP group (dp_shard x cp x sp), cp,
// sp (Ulysses' all-to-alls: each step's pieces that leave a host sharing its links), tp,
// dp (dp_replicate x dp_shard: the loss's all-reduce) and pp (a rank to the same rank of the
// next stage: pipeline parallelism is outermost, so its boundaries are what crosses hosts
// when a stage fills a host).
struct Links {
  Link replicate, fsdp, cp, sp, tp, dp, pp;
  Link ep;  // expert parallelism's all-to-alls: ep consecutive data ranks
  // The link of a dimension as the plan names it (PlanComm::dim, StepTime::exposed_by_dim):
  // "tp", "cp", "sp", "fsdp", "pp", "ep", "scalars" (the loss's, on dp), else dp_replicate's.
  const Link& of(const std::string& dim) const;
};

Links links_of(const dist::ParallelDims& dims, const Cluster& cluster);

double all_reduce_s(double bytes, int64_t ranks, const Link& link);
double gather_s(double whole_bytes, int64_t ranks, const Link& link);  // all-gather or reduce-scatter
double exchange_s(double bytes, const Link& link);                     // one ring-attention step
double all_to_all_s(double bytes, int64_t ranks, const Link& link);    // S: the bytes a rank holds
// The link between ranks a and b: inside a host, or between hosts, where the host's links
// (devices_per_host x inter_gbps) are shared by the `leaving` transfers that leave a's host
// at once (a pipeline boundary: the ranks of a's stage on that host that send across).
Link link_between(int64_t a, int64_t b, const Cluster& cluster, int64_t leaving = 1);

// Seconds of compute, and of them the matrix products'.
struct Piece {
  double s = 0, gemm_s = 0;
};

// A collective in flight: its end on a queue inside the host, or its flow between hosts;
// its time alone, and how long the compute thread had run when it was issued.
struct Ticket {
  double done = 0;
  int flow = -1;
  double alone = 0, busy_at_start = 0;
};

// One rank's step: the compute thread's clock and where collectives run. Inside a host each
// communicator is a queue (a collective starts when the thread has issued it and the one
// before it on that communicator is done); between hosts every dimension that crosses them
// shares the host's links (SharedLink). On CPU ranks a collective also takes its link's
// cpu_share of its time from the computation that runs under it (the cores that compute
// copy its bytes): charged when it is waited for, on the compute that ran since it was
// issued, up to its time alone. Dimensions: "tp", "cp", "sp", "fsdp", "replicate", "scalars" (a
// few bytes: latency, on no queue and no shared link).
class Timeline {
 public:
  explicit Timeline(const Links& links);
  Ticket start(const std::string& dim, double seconds);  // issue a collective
  void wait(const std::string& dim, const Ticket& ticket);
  void sync(const std::string& dim, double seconds);  // issue one and wait for it at once
  void run(const Piece& piece, bool again);           // compute (again: recomputation)

  double now() const { return now_; }
  double compute() const { return compute_; }
  double recompute() const { return recompute_; }
  double gemm() const { return gemm_; }
  const std::map<std::string, double>& exposed() const { return exposed_; }  // waited, by dimension

 private:
  double now_ = 0, compute_ = 0, recompute_ = 0, gemm_ = 0;
  double busy_ = 0;  // the compute thread's time running: pieces and what transfers took of it
  std::map<std::string, double> queue_free_, exposed_;
  std::map<std::string, bool> crosses_;      // the dimensions whose rings leave the host
  std::map<std::string, double> cpu_share_;  // their links' (Link::cpu_share)
  SharedLink between_hosts_;
};

}  // namespace ndt::train
