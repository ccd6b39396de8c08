#include "autograd/hooks.h"

#include "autograd/node.h"

namespace ndt::autograd {

void note_group_touched(const std::shared_ptr<GradGroup>& g);  // engine.cpp

std::shared_ptr<GradGroup> GradGroup::create(const std::vector<Tensor>& params,
                                             std::function<void()> on_ready) {
  std::shared_ptr<GradGroup> g(new GradGroup(static_cast<int>(params.size()), std::move(on_ready)));
  for (const Tensor& p : params) {
    NDT_CHECK(p.is_leaf() && p.requires_grad(), "GradGroup: '", p.name(), "' ", p.desc(),
              " is not a leaf that requires grad");
    NDT_CHECK(!p.impl().group, "GradGroup: '", p.name(), "' is already in a group");
    p.impl().group = g;
  }
  return g;
}

void GradGroup::note_gradient(const TensorImpl* param) {
  if (received_.empty()) note_group_touched(shared_from_this());  // flush() at the end
  if (!received_.insert(param).second || done_) return;           // counted, or fired already
  if (static_cast<int>(received_.size()) == size_ && outstanding_ == 0) fire();
}

void GradGroup::flush() {
  if (outstanding_ > 0) return;  // deferred gradients to come: the group stays as it is
  if (!received_.empty() && !done_) fire();
  reset();
}

void GradGroup::reset() {
  received_.clear();
  done_ = false;
  outstanding_ = 0;
}

void GradGroup::defer() {
  if (received_.empty() && outstanding_ == 0) note_group_touched(shared_from_this());
  ++outstanding_;
}

void GradGroup::deliver_deferred() {
  NDT_CHECK(outstanding_ > 0, "GradGroup: a deferred gradient delivered that was never deferred");
  if (--outstanding_ == 0) note_group_touched(shared_from_this());  // this pass's end flushes it
}

void GradGroup::fire() {
  done_ = true;
  ++fired_;
  if (on_ready_) on_ready_();
}

Tensor on_backward(const Tensor& x, std::function<void()> fn) {
  Tensor out = x.detach();
  record("on_backward", {out}, {x}, [fn = std::move(fn)](const Grads& g) -> Grads {
    fn();  // forward was the identity, so dx = dout
    return {g[0]};
  });
  return out;
}

}  // namespace ndt::autograd
