// ndtrain: the two hooks FSDP builds on.
//
// (a) GradGroup: fires a callback once every parameter of a group has received its
//     gradient in the current backward (FSDP: reduce-scatter that unit's flat grads).
//
//       auto g = autograd::GradGroup::create({w1, b1, w2}, [&] { reduce_scatter(unit); });
//       ndt::backward(loss);      // callback runs right after the last of w1, b1, w2
//
//     A parameter that gets no gradient in a backward does not block the group: at the end
//     of the outermost backward, any group that got some but not all gradients fires then.
//     Gradients accumulated inside an activation-checkpoint recompute count too. The group
//     counts parameters, not gradient arrivals, and fires at most once per backward: a
//     parameter whose AccumulateGrad runs twice (used inside a checkpoint and outside it)
//     counts once. (If its second gradient comes after the group fired, the callback has
//     seen only the first: keep a group's parameters in one region.)
//
//     A parameter whose gradient a zero-bubble schedule defers (autograd/defer.h) holds the
//     group back: it fires only once every deferred gradient has been delivered, however
//     many backwards and deferred passes that takes.
//
// (b) on_backward(x, fn): an identity op whose backward first calls fn() -- put it on a
//     region's output, and fn runs just before the region's backward starts (FSDP:
//     re-gather this unit's parameters and prefetch the next).
#pragma once

#include <functional>
#include <memory>
#include <unordered_set>
#include <vector>

#include "tensor/tensor.h"

namespace ndt::autograd {

class GradGroup : public std::enable_shared_from_this<GradGroup> {
 public:
  // Every tensor must be a leaf requiring grad and in no other group.
  static std::shared_ptr<GradGroup> create(const std::vector<Tensor>& params, std::function<void()> on_ready);
  int size() const { return size_; }
  int received() const { return static_cast<int>(received_.size()); }  // in this backward
  int fired() const { return fired_; }                                 // times the callback ran

  // Called by AccumulateGrad and the engine.
  void note_gradient(const TensorImpl* param);
  void flush();  // end of the outermost backward: fire if partially received, then reset
  void reset();  // a backward failed: forget what it delivered, without firing
  // A gradient of this group was deferred (autograd/defer.h): the group waits for it.
  void defer();
  // A deferred gradient arrives (then note_gradient as usual).
  void deliver_deferred();

 private:
  GradGroup(int size, std::function<void()> on_ready) : size_(size), on_ready_(std::move(on_ready)) {}
  void fire();
  int size_;
  std::unordered_set<const TensorImpl*> received_;  // parameters with a gradient this backward
  bool done_ = false;                               // fired in this backward
  int outstanding_ = 0;                             // deferred gradients not yet delivered
  int fired_ = 0;
  std::function<void()> on_ready_;
};

Tensor on_backward(const Tensor& x, std::function<void()> fn);

}  // namespace ndt::autograd
