#include "dist/pipeline_parallel/comm.h"

namespace ndt::dist {

void StageComm::exchange(const Tensor& out, int to, const std::string& what_out, Tensor& in, const Shape& shape,
                         DType dtype, int from, const std::string& what_in) {
  received_ = nullptr;
  if (from >= 0) in = Tensor::empty(shape, dtype, pp_.device());
  if (to >= 0 && from >= 0 && pp_.backend() == "nccl") {
    // one group (see the header); on one stream the receive completes with the send anyway
    pp_.note_unit(what_out + ", " + what_in);
    WorkPtr w = pp_.sendrecv(out, to, in, from);
    received_ = w;
    sent_.push_back({w, out});
  } else if (to >= 0 && from >= 0) {
    // MPI: the receive posted first, and waited for alone (the send completes when the
    // neighbour gets to its receive, which the next action need not wait for)
    pp_.note_unit(what_in);
    received_ = pp_.recv(in, from);
    pp_.note_unit(what_out);
    sent_.push_back({pp_.send(out, to), out});
  } else if (to >= 0) {
    pp_.note_unit(what_out);
    sent_.push_back({pp_.send(out, to), out});
  } else if (from >= 0) {
    pp_.note_unit(what_in);
    received_ = pp_.recv(in, from);
  }
  pp_.note_unit("");
}

void StageComm::wait_received() {
  if (received_) received_->wait();
  received_ = nullptr;
}

void StageComm::wait_sent() {
  for (auto& [w, t] : sent_) w->wait();
  sent_.clear();
}

}  // namespace ndt::dist
