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

void GradGroup::note_gradient() {
  if (received_ == 0) note_group_touched(shared_from_this());
  if (++received_ == size_) fire();
}

void GradGroup::flush() {
  if (received_ > 0) fire();
}

void GradGroup::fire() {
  received_ = 0;
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
