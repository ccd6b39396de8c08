#include "autograd/recompute.h"

#include "autograd/engine.h"
#include "autograd/node.h"

namespace ndt::autograd {

std::vector<Tensor> recompute(const RecomputeFn& fn, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;  // forward: no graph, so fn's intermediates die here
    outputs = fn(inputs);
  }
  if (!grad_enabled()) return outputs;
  for (Tensor& o : outputs)  // an output that is an input (or aliases its handle) gets its own
    for (const Tensor& t : inputs)
      if (o.same(t)) o = o.detach();
  // fn may use parameters that require grad even when no input does: always record.
  std::vector<Tensor> saved;
  for (const Tensor& t : inputs) saved.push_back(t.detach());
  std::vector<bool> input_requires;
  for (const Tensor& t : inputs) input_requires.push_back(t.requires_grad());
  // Mark outputs as produced by the recompute node.
  auto node_fn = [fn, saved, input_requires](const Grads& g) -> Grads {
    // backward: re-run fn with grad on fresh leaves standing in for the inputs
    std::vector<Tensor> leaves;
    for (size_t i = 0; i < saved.size(); ++i) {
      Tensor l = saved[i].detach();
      if (input_requires[i]) l.set_requires_grad(true);
      leaves.push_back(l);
    }
    std::vector<Tensor> outs, outs_used, grads_used;
    {
      EnableGradGuard grad_on;
      outs = fn(leaves);
    }
    for (size_t k = 0; k < outs.size(); ++k) {
      if (g[k].defined() && outs[k].requires_grad()) {
        outs_used.push_back(outs[k]);
        grads_used.push_back(g[k]);
      }
    }
    if (!outs_used.empty()) ndt::backward(outs_used, grads_used);
    Grads dx;
    for (const Tensor& l : leaves) dx.push_back(l.requires_grad() ? l.grad() : Tensor());
    return dx;
  };
  // Attach the node even if no input requires grad (parameters inside fn might).
  attach("recompute", outputs, inputs, node_fn);
  return outputs;
}

}  // namespace ndt::autograd
