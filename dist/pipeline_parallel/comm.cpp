#include "dist/pipeline_parallel/comm.h"

namespace ndt::dist {

StageComm::Incoming StageComm::post_recv(const Layout& layout, int from, const std::string& what) {
  if (from < 0) return {};
  Incoming in;
  pp_.note_unit(what);
  for (const auto& [shape, dtype] : layout) {
    in.t.push_back(Tensor::empty(shape, dtype, pp_.device()));
    in.work.push_back(pp_.recv(in.t.back(), from));
  }
  pp_.note_unit("");
  return in;
}

void StageComm::send(const Message& out, int to, const std::string& what) {
  if (to < 0) return;
  pp_.note_unit(what);
  for (const Tensor& t : out) sent_.push_back({pp_.send(t, to), t});
  pp_.note_unit("");
}

StageComm::Incoming StageComm::exchange(const Message& out, int to, const std::string& what_out,
                                        const Layout& layout, int from, const std::string& what_in) {
  if (to < 0) return post_recv(layout, from, what_in);
  if (from < 0) {
    send(out, to, what_out);
    return {};
  }
  NDT_CHECK(out.size() == layout.size(), "StageComm: a message of ", out.size(), " parts sent, of ",
            layout.size(), " received");
  Incoming in;
  pp_.note_unit(what_out + ", " + what_in);
  for (size_t i = 0; i < out.size(); ++i) {
    in.t.push_back(Tensor::empty(layout[i].first, layout[i].second, pp_.device()));
    in.work.push_back(pp_.sendrecv(out[i], to, in.t.back(), from));  // one group: see the header
    sent_.push_back({in.work.back(), out[i]});
  }
  pp_.note_unit("");
  return in;
}

StageComm::Message StageComm::wait(Incoming& in) {
  for (WorkPtr& w : in.work) w->wait();
  in.work.clear();
  return in.t;
}

void StageComm::wait_sent() {
  for (auto& [w, t] : sent_) w->wait();
  sent_.clear();
}

}  // namespace ndt::dist
