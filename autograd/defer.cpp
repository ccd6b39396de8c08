#include "autograd/defer.h"

#include "autograd/engine.h"
#include "autograd/hooks.h"
#include "autograd/node.h"

namespace ndt::autograd {
namespace {
thread_local DeferredWeightGrads* tl_deferring = nullptr;
}  // namespace

DeferredWeightGrads* deferring() { return tl_deferring; }

DeferredWeightGrads::Scope::Scope(DeferredWeightGrads& q) : prev_(tl_deferring) { tl_deferring = &q; }
DeferredWeightGrads::Scope::~Scope() { tl_deferring = prev_; }

DeferredWeightGrads::~DeferredWeightGrads() {
  for (const Item& it : queue_)
    if (it.leaf->group) it.leaf->group->reset();
}

void DeferredWeightGrads::push(std::shared_ptr<TensorImpl> leaf, std::function<Tensor()> compute) {
  if (leaf->group) leaf->group->defer();  // the group waits for this gradient
  queue_.push_back({std::move(leaf), std::move(compute)});
}

void DeferredWeightGrads::run() {
  std::vector<Item> items = std::move(queue_);
  queue_.clear();
  as_backward_pass([&] {
    for (Item& it : items) {
      Tensor g;
      {
        NoGradGuard no_grad;  // as in backward: nothing recorded
        g = it.compute();
      }
      it.compute = nullptr;  // its saved x and dy go now
      if (it.leaf->group) it.leaf->group->deliver_deferred();
      // added into .grad (unless the GEMM already did) and the group told, as backward does
      const Edge e = edge_of(Tensor(it.leaf));
      e.node->apply({g});
    }
  });
}

}  // namespace ndt::autograd
