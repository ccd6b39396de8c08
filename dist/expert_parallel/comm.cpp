// The all-to-alls of expert parallelism (see comm.h). Legend: M rows sent, R rows received, C
// channels, E experts, n members.
#include "dist/expert_parallel/comm.h"

#include "autograd/node.h"

namespace ndt::dist {

std::vector<int64_t> gather_counts(const std::vector<int64_t>& counts, Communicator& ep) {
  const int64_t E = static_cast<int64_t>(counts.size()), n = ep.size();
  std::vector<int32_t> mine(counts.begin(), counts.end());
  const Tensor in = Tensor::from_vector(mine, {E}).to(ep.device());
  Tensor all = Tensor::empty({n * E}, DType::i32, ep.device());
  ep.note_unit("expert counts");
  ep.all_gather(all, in)->wait();
  std::vector<int64_t> out;
  for (int32_t v : all.to(Device::cpu()).to_vector<int32_t>()) out.push_back(v);
  return out;
}

namespace {

// x (rows, C): send[j] rows to member j -> (sum recv, C), recv[j] rows from member j
Tensor exchange_rows(const Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                     Communicator& ep) {
  const int64_t C = x.size(1);
  int64_t rows = 0;
  for (int64_t r : recv) rows += r;
  std::vector<int64_t> send_el, recv_el;  // in elements
  for (int64_t s : send) send_el.push_back(s * C);
  for (int64_t r : recv) recv_el.push_back(r * C);
  Tensor out = Tensor::empty({rows, C}, x.dtype(), x.device());
  ep.all_to_all_v(out, recv_el, x.contiguous(), send_el)->wait();
  return out;
}

// One exchange as an autograd op: forward send -> recv, backward recv -> send.
Tensor exchange_op(const char* name, const Tensor& x, const std::vector<int64_t>& send,
                   const std::vector<int64_t>& recv, Communicator& ep) {
  NDT_CHECK(x.dim() == 2, name, ": expected rows (M, C), got ", x.desc());
  ep.note_unit(name);
  Tensor out = exchange_rows(x, send, recv, ep);
  Communicator* c = &ep;
  autograd::record(name, {out}, {x},
                   [c, name, send, recv, shape = out.shape(), dt = x.dtype(),
                    dev = x.device()](const autograd::Grads& g) -> autograd::Grads {
                     // forward moved row blocks send -> recv; so each dx row is its dout row, sent back.
                     // Every member takes part, with zeros if nothing used the output.
                     const Tensor dout = g[0].defined() ? g[0] : Tensor::zeros(shape, dt, dev);
                     c->note_unit(std::string(name) + " backward");
                     return {exchange_rows(dout, recv, send, *c)};
                   });
  return out;
}

}  // namespace

Tensor dispatch_to_experts(const Tensor& x, const std::vector<int64_t>& send,
                           const std::vector<int64_t>& recv, Communicator& ep) {
  return exchange_op("dispatch_to_experts", x, send, recv, ep);
}

Tensor combine_from_experts(const Tensor& y, const std::vector<int64_t>& send,
                            const std::vector<int64_t>& recv, Communicator& ep) {
  return exchange_op("combine_from_experts", y, recv, send, ep);
}

}  // namespace ndt::dist
