#include "autograd/node.h"

#include <atomic>

#include "autograd/hooks.h"
#include "tensor/kernels.h"

namespace ndt::autograd {
namespace {
std::atomic<uint64_t> next_seq{0};
thread_local bool tl_grad_enabled = true;
}  // namespace

Node::Node(std::string name, int num_outputs, std::vector<Edge> next, BackwardFn fn)
    : name_(std::move(name)),
      seq_(next_seq.fetch_add(1)),
      num_outputs_(num_outputs),
      next_(std::move(next)),
      fn_(std::move(fn)) {}

Grads Node::apply(const Grads& grad_outputs) {
  NDT_CHECK(fn_, "backward through '", name_,
            "' a second time: its saved tensors were freed; "
            "pass retain_graph=true to the first backward");
  Grads g = fn_(grad_outputs);
  NDT_CHECK(g.size() == next_.size(), "internal: backward of '", name_, "' returned ", g.size(),
            " gradients for ", next_.size(), " inputs");
  return g;
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
    : Node("AccumulateGrad", 1, {}, [](const Grads&) { return Grads{}; }), leaf_(std::move(leaf)) {}

Grads AccumulateGrad::apply(const Grads& grad_outputs) {
  const Tensor& g = grad_outputs[0];
  if (g.defined() && !already_accumulated(this, g)) {
    Tensor leaf(leaf_);
    NDT_CHECK(g.shape() == leaf.shape(), "gradient ", g.shape_str(), " does not match parameter ",
              leaf.name(), leaf.shape_str());
    if (!leaf_->grad) {
      Tensor z = Tensor::zeros(leaf.shape(), leaf.dtype(), leaf.device());
      leaf_->grad = z.impl_ptr();
    }
    Tensor grad(leaf_->grad);
    NDT_CHECK(grad.is_contiguous() && grad.shape() == leaf.shape(), "the .grad of parameter '", leaf.name(),
              "' is ", grad.desc(), (grad.is_contiguous() ? "" : " (not contiguous)"),
              "; gradients accumulate into a contiguous tensor of the parameter's shape");
    kernels::add_(grad, g.dtype() == grad.dtype() ? g.contiguous() : g.to(grad.dtype()));  // grad += g
  }
  if (leaf_->group) leaf_->group->note_gradient(leaf_.get());
  return {};
}

std::shared_ptr<TensorImpl> accumulation_leaf(const Tensor& t) {
  if (!t.defined() || !t.requires_grad() || t.impl().grad_fn) return nullptr;
  return t.impl_ptr();
}

Tensor grad_to_accumulate_into(const std::shared_ptr<TensorImpl>& leaf, const Shape& shape, DType dtype,
                               Device device, double* beta) {
  if (!leaf || leaf->shape != shape || leaf->dtype != dtype || Tensor(leaf).device() != device)
    return Tensor();
  if (!leaf->grad) {  // the first gradient: written, not added (AccumulateGrad would start from zeros)
    Tensor fresh = Tensor::empty(shape, dtype, device);
    leaf->grad = fresh.impl_ptr();
    *beta = 0.0;
    return fresh;
  }
  Tensor grad(leaf->grad);
  if (!grad.is_contiguous() || grad.shape() != shape || grad.dtype() != dtype || grad.device() != device)
    return Tensor();
  *beta = 1.0;
  return grad;
}

bool already_accumulated(const Node* node, const Tensor& g) {
  const auto* acc = dynamic_cast<const AccumulateGrad*>(node);
  return acc && g.defined() && acc->leaf()->grad && g.impl_ptr() == acc->leaf()->grad;
}

bool grad_enabled() { return tl_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(tl_grad_enabled) { tl_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { tl_grad_enabled = prev_; }
EnableGradGuard::EnableGradGuard() : prev_(tl_grad_enabled) { tl_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { tl_grad_enabled = prev_; }

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!tl_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge edge_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  TensorImpl& impl = t.impl();
  if (impl.grad_fn) return {impl.grad_fn, impl.output_nr};
  std::shared_ptr<Node> acc = impl.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    impl.grad_accumulator = acc;
  }
  return {acc, 0};
}

void record(const char* name, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
            BackwardFn fn) {
  if (!needs_grad(inputs)) return;
  attach(name, outputs, inputs, std::move(fn));
}

void attach(const char* name, const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
            BackwardFn fn) {
  std::vector<Edge> next;
  next.reserve(inputs.size());
  for (const Tensor& t : inputs) next.push_back(edge_of(t));
  auto node = std::make_shared<Node>(name, static_cast<int>(outputs.size()), std::move(next), std::move(fn));
  for (size_t i = 0; i < outputs.size(); ++i) {
    TensorImpl& o = outputs[i].impl();
    o.requires_grad = true;
    o.grad_fn = node;
    o.output_nr = static_cast<int>(i);
    node->output_meta.push_back({o.shape, o.dtype, outputs[i].device()});
  }
}

}  // namespace ndt::autograd
