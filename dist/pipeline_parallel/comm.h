// ndtrain: the pipeline's messages. Between neighbouring stages only two kinds of tensor
// travel: a stage's output activations forward (B, T, C) and their gradients backward, one
// of each per micro-batch and stage boundary, point to point over the pipeline's
// communicator (dist/comm: MPI between CPU ranks, NCCL between GPUs).
//
// A rank runs its schedule's actions in order (dist/pipeline_parallel/schedule.h): each
// action may need a tensor from a neighbour and may produce one for a neighbour. Receives
// are posted in the order of the actions and sends in the order they are produced; the
// schedule's validate() checks that both ends of every link agree on that order, which is
// all MPI and NCCL need to match them (no tags).
//
// When the receive of the next action's input is posted depends on the transport:
//   MPI   ahead: before the current action computes, so the transfer runs under it (a
//         progress thread moves MPI's messages while the rank computes); a send is queued
//         when its tensor is ready and waited for only at the end of the step.
//   NCCL  with the send of the current action's output, as one group: NCCL runs
//         point-to-point calls in order on one stream, and two neighbours that each queue a
//         receive (or a send) before the other's matching call would wait for each other
//         for ever (the steady state of 1F1B: one sends an activation while the other sends
//         a gradient back); grouped, they proceed together, as Megatron-LM's
//         send_forward_recv_backward does.
//
//   StageComm comm(mesh.pp());
//   StageComm::Incoming in = comm.post_recv({{shape, dtype}}, /*from=*/0, "receive the activation ...");
//   Tensor x = comm.wait(in)[0];                     // before the action that reads it
//   comm.send({y}, /*to=*/1, "send the activation of micro-batch 3 to stage 2");
//   comm.wait_sent();                                // at the end of the step
//
// A message is one tensor, or more: with a mixture-of-experts model's load-balancing loss the
// router statistics travel beside the activation and its gradient (nn::RouterLoss::totals),
// each part its own send and receive in the same order at both ends (grouped pairwise on NCCL).
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

  // A message's parts: their shapes and dtypes, or the tensors.
  using Layout = std::vector<std::pair<Shape, DType>>;
  using Message = std::vector<Tensor>;
  // A receive in flight (nothing when `work` is empty).
  struct Incoming {
    Message t;
    std::vector<WorkPtr> work;
  };
  // Whether receives are posted ahead of the action before theirs (MPI), or grouped with that
  // action's send (NCCL: exchange).
  bool posts_ahead() const { return !grouped_ && pp_.backend() != "nccl"; }
  // Tests: group sends and receives as NCCL needs on any transport (the MPI one included).
  void set_grouped(bool on) { grouped_ = on; }
  // New tensors of `layout` received from pipeline rank `from` (none when from < 0).
  Incoming post_recv(const Layout& layout, int from, const std::string& what);
  // `out` to pipeline rank `to` (nothing when to < 0); the tensors are kept until the send is done.
  void send(const Message& out, int to, const std::string& what);
  // Both as one group (NCCL): the send of `out` and the receive of the next input, part by part
  // (both have as many parts: the same kind of message goes each way).
  Incoming exchange(const Message& out, int to, const std::string& what_out, const Layout& layout, int from,
                    const std::string& what_in);
  Message wait(Incoming& in);  // the received tensors, once they are complete
  void wait_sent();            // every send so far
  Communicator& group() const { return pp_; }

 private:
  Communicator& pp_;
  bool grouped_ = false;
  std::vector<std::pair<WorkPtr, Tensor>> sent_;
};

}  // namespace ndt::dist
