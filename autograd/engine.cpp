#include "autograd/engine.h"

#include <map>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "autograd/hooks.h"
#include "autograd/node.h"
#include "tensor/kernels.h"

namespace ndt {
namespace autograd {

// Groups that received gradients during the outermost backward on this thread; flushed
// when it ends (see GradGroup::flush). Nested backwards (checkpoint recompute) add to it.
thread_local std::vector<std::shared_ptr<GradGroup>>* tl_touched_groups = nullptr;

void note_group_touched(const std::shared_ptr<GradGroup>& g) {
  if (tl_touched_groups) tl_touched_groups->push_back(g);
}

}  // namespace autograd

using autograd::Grads;
using autograd::Node;

namespace {

// Sums gradients arriving at the same (node, slot); never modifies a tensor it was given.
Tensor sum_grads(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  NDT_CHECK(a.shape() == b.shape(), "internal: gradients ", a.shape_str(), " and ", b.shape_str(),
            " reach the same tensor");
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  kernels::add(a.contiguous(), b.dtype() == a.dtype() ? b.contiguous() : b.to(a.dtype()), out);
  return out;
}

struct BySeq {
  bool operator()(const Node* a, const Node* b) const { return a->seq() < b->seq(); }
};

void run_backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads, bool retain_graph) {
  NDT_CHECK(outputs.size() == grads.size(), "backward: ", outputs.size(), " outputs but ", grads.size(),
            " gradients");
  std::unordered_map<Node*, Grads> pending;  // gradient slots of nodes not yet run
  std::unordered_map<Node*, std::shared_ptr<Node>> keep;
  std::priority_queue<Node*, std::vector<Node*>, BySeq> ready;

  // g may be a leaf's .grad that already holds it (an op added it in place, see
  // autograd::grad_to_accumulate_into): nothing to sum, but the leaf still gets told
  auto deliver = [&](const autograd::Edge& e, const Tensor& g) {
    if (!e.node || !g.defined()) return;
    Node* n = e.node.get();
    auto it = pending.find(n);
    if (it == pending.end()) {
      it = pending.emplace(n, Grads(n->num_outputs())).first;
      keep[n] = e.node;
      ready.push(n);
    }
    Tensor& slot = it->second[e.input_nr];
    if (autograd::already_accumulated(n, g)) {
      if (!slot.defined()) slot = g;  // else slot's gradient is still to be added
    } else if (slot.defined() && autograd::already_accumulated(n, slot)) {
      slot = g;  // what was in place stays there; g is to be added
    } else {
      slot = sum_grads(slot, g);
    }
  };

  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    NDT_CHECK(out.requires_grad(), "backward: output ", i, " ", out.desc(),
              " does not require grad (no parameter or input requiring grad reaches it)");
    NDT_CHECK(grads[i].shape() == out.shape(), "backward: gradient ", grads[i].shape_str(),
              " does not match output ", out.shape_str());
    const autograd::Edge e = autograd::edge_of(out);
    // a caller's gradient is never "already added", even if it is that leaf's own .grad
    deliver(e, autograd::already_accumulated(e.node.get(), grads[i]) ? grads[i].detach().clone() : grads[i]);
  }

  // Highest seq first: every consumer of a node was created after it, so by the time a
  // node is popped, all gradients for it have arrived.
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    Grads in = std::move(pending[n]);
    pending.erase(n);
    Grads out;
    {
      autograd::NoGradGuard no_grad;  // backward closures do not record (no double backward)
      out = n->apply(in);
    }
    in.clear();
    if (!retain_graph) n->release();
    const auto& next = n->next();
    for (size_t i = 0; i < next.size(); ++i) deliver(next[i], out[i]);
    keep.erase(n);
  }
}

}  // namespace

namespace autograd {
void as_backward_pass(const std::function<void()>& fn) {
  const bool outermost = tl_touched_groups == nullptr;
  std::vector<std::shared_ptr<GradGroup>> touched;
  if (outermost) tl_touched_groups = &touched;
  try {
    fn();
  } catch (...) {
    if (outermost) {
      tl_touched_groups = nullptr;
      for (auto& g : touched) g->reset();  // no stale counts in the next backward
    }
    throw;
  }
  if (outermost) {
    tl_touched_groups = nullptr;
    std::unordered_set<GradGroup*> seen;
    for (auto& g : touched)
      if (seen.insert(g.get()).second) g->flush();
  }
}
}  // namespace autograd

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grads, bool retain_graph) {
  autograd::as_backward_pass([&] { run_backward(outputs, grads, retain_graph); });
}

void backward(const Tensor& loss, bool retain_graph) {
  NDT_CHECK(loss.defined() && loss.numel() == 1, "backward: the loss must have one element, got ",
            loss.desc(), "; pass output gradients for a non-scalar output");
  backward({loss}, {Tensor::full(loss.shape(), 1.0, loss.dtype(), loss.device())}, retain_graph);
}

}  // namespace ndt
