// ndtrain: the communication of context parallelism: passing a tensor one step around the
// ring of cp ranks, as an autograd op.
//
//   RingPass p = ring_pass(kv, cp);   // starts: send kv to rank+1, receive rank-1's
//   ... compute on the block held now ...
//   p.done->wait();                    // p.out is rank-1's kv
//
// Backward runs the ring the other way: the gradient of what this rank received goes back
// to the rank it came from, so dK and dV travel back to the rank that owns them and add up
// there (autograd sums the gradients of every pass).
#pragma once

#include "dist/comm/communicator.h"

namespace ndt::dist {

struct RingPass {
  Tensor out;    // the tensor of the previous rank; valid after done->wait()
  WorkPtr done;  // the send and the receive
};
RingPass ring_pass(const Tensor& x, Communicator& cp);

}  // namespace ndt::dist
