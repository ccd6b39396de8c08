#include "dist/pipeline_parallel/comm.h"

namespace ndt::dist {

StageComm::Incoming StageComm::post_recv(const Shape& shape, DType dtype, int from, const std::string& what) {
  if (from < 0) return {};
  Incoming in{Tensor::empty(shape, dtype, pp_.device()), nullptr};
  pp_.note_unit(what);
  in.work = pp_.recv(in.t, from);
  pp_.note_unit("");
  return in;
}

void StageComm::send(const Tensor& out, int to, const std::string& what) {
  if (to < 0) return;
  pp_.note_unit(what);
  sent_.push_back({pp_.send(out, to), out});
  pp_.note_unit("");
}

StageComm::Incoming StageComm::exchange(const Tensor& out, int to, const std::string& what_out,
                                        const Shape& shape, DType dtype, int from,
                                        const std::string& what_in) {
  if (to < 0) return post_recv(shape, dtype, from, what_in);
  if (from < 0) {
    send(out, to, what_out);
    return {};
  }
  Incoming in{Tensor::empty(shape, dtype, pp_.device()), nullptr};
  pp_.note_unit(what_out + ", " + what_in);
  in.work = pp_.sendrecv(out, to, in.t, from);  // one group: see the header
  sent_.push_back({in.work, out});
  pp_.note_unit("");
  return in;
}

Tensor StageComm::wait(Incoming& in) {
  if (in.work) in.work->wait();
  in.work = nullptr;
  return in.t;
}

void StageComm::wait_sent() {
  for (auto& [w, t] : sent_) w->wait();
  sent_.clear();
}

}  // namespace ndt::dist
