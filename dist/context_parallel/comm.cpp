#include "dist/context_parallel/comm.h"

#include "autograd/node.h"

namespace ndt::dist {
namespace {

// Sends x to `to` and receives a tensor of x's shape from `from`.
RingPass exchange(const Tensor& x, int to, int from, Communicator& cp) {
  Tensor in = x.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  // the sent buffer must live until the send is done: the backends' handles keep it
  return {out, cp.sendrecv(in, to, out, from)};
}

}  // namespace

RingPass ring_pass(const Tensor& x, Communicator& cp) {
  const int n = cp.size(), r = cp.rank();
  RingPass p = exchange(x, (r + 1) % n, (r + n - 1) % n, cp);
  WorkPtr send_done = p.done;
  const Shape x_shape = x.shape();
  const DType x_dtype = x.dtype();
  const Device x_device = x.device();
  autograd::record(
      "ring_pass", {p.out}, {x},
      [&cp, n, r, send_done, x_shape, x_dtype, x_device](const autograd::Grads& g) -> autograd::Grads {
        // forward: out = x of rank r-1; so dx = dout of rank r+1, which it sends back to us
        send_done->wait();
        // (every rank must take part in the exchange, with zeros if nothing used the block)
        Tensor dout = g[0].defined() ? g[0] : Tensor::zeros(x_shape, x_dtype, x_device);
        RingPass back = exchange(dout, (r + n - 1) % n, (r + 1) % n, cp);
        back.done->wait();
        return {back.out};
      });
  return p;
}

}  // namespace ndt::dist
