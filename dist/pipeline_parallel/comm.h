// ndtrain: the pipeline's messages. Between neighbouring stages only two kinds of tensor
// travel: a stage's output activations forward (B, T, C) and their gradients backward, one
// of each per micro-batch and stage boundary, point to point over the pipeline's
// communicator (dist/comm: MPI between CPU ranks, NCCL between GPUs).
//
// A rank runs its schedule's actions in order (dist/pipeline_parallel/schedule.h). After
// each action it sends what the action produced and posts the receive of what the next
// action needs, as one operation: NCCL runs point-to-point calls in order on one stream, and
// two neighbours that each send before receiving would wait for each other for ever (the
// steady state of 1F1B: one sends an activation while the other sends a gradient back), so
// the pair is grouped, as Megatron-LM's send_forward_recv_backward is. Sends are not waited
// for until the step ends: a rank moves on as soon as its message is queued.
//
//   StageComm comm(mesh.pp());
//   Tensor in;                                     // filled once the receive completes
//   comm.exchange(y, /*to=*/1, "activation of micro-batch 3 to stage 2", in, shape, dtype, /*from=*/-1, "");
//   comm.wait_received();                          // before the next action reads `in`
//   comm.wait_sent();                              // at the end of the step
//
// Each send and receive names itself (the micro-batch and the stage) in the flight record and
// in a timeout's message, so a stage that died or stalled is named by its neighbours.
#pragma once

#include <string>
#include <vector>

#include "dist/comm/communicator.h"

namespace ndt::dist {

class StageComm {
 public:
  explicit StageComm(Communicator& pp) : pp_(pp) {}

  // Sends `out` to pipeline rank `to` (nothing when to < 0) and receives into `in`, a new
  // tensor of `shape` and `dtype`, from rank `from` (nothing when from < 0).
  void exchange(const Tensor& out, int to, const std::string& what_out, Tensor& in, const Shape& shape, DType dtype,
                int from, const std::string& what_in);
  void wait_received();  // the receive of the last exchange
  void wait_sent();      // every send so far
  Communicator& group() const { return pp_; }

 private:
  Communicator& pp_;
  WorkPtr received_;
  std::vector<std::pair<WorkPtr, Tensor>> sent_;  // each send keeps its tensor alive until done
};

}  // namespace ndt::dist
