// ndtrain: Tensor, a strided view into a Storage.
//
// A Tensor is a cheap handle (shared_ptr) to a TensorImpl: shape, strides, offset, dtype
// and the storage it views. Views share storage; contiguous() copies only when needed.
//
//   Tensor buf = Tensor::empty({1024}, DType::f32);          // a flat buffer
//   Tensor w = buf.view_at(16, {4, 8});                       // a parameter inside it
//   Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
//   Tensor xt = x.transpose(0, 1).contiguous();               // (3,2), copied
//   std::vector<float> v = xt.to_vector<float>();
//
// The methods here are raw: they do not record autograd history. The differentiable
// versions (ndt::transpose, ndt::matmul, ...) live in autograd/ops.h.
// Autograd state (requires_grad, grad, grad_fn) is stored here but managed by autograd/.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/storage.h"

namespace ndt {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "(2, 3, 4)"
int64_t numel_of(const Shape& s);

namespace autograd {
class Node;
class GradGroup;
}  // namespace autograd

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;       // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;

  // Autograd state, owned by autograd/ (see autograd/node.h).
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;                // accumulated gradient (may view a flat buffer)
  std::shared_ptr<autograd::Node> grad_fn;         // the op that produced this tensor
  int output_nr = 0;                               // which output of grad_fn this is
  std::shared_ptr<autograd::GradGroup> group;      // fires a hook when the group's grads are done
  std::weak_ptr<autograd::Node> grad_accumulator;  // a leaf's AccumulateGrad node, shared by uses
  std::string name;                                // optional, for messages
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- creation -------------------------------------------------------------------
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::f32, Device device = Device::cpu());
  // Copies host values into a new tensor of the matching dtype (float->f32, double->f64,
  // int32_t->i32, uint16_t->u16), then moves it to `device`.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device = Device::cpu());

  // --- properties -----------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t offset() const { return impl().offset; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return numel_of(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  bool is_contiguous() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  std::string shape_str() const { return ndt::shape_str(shape()); }
  std::string desc() const;  // "f32(2, 3) on cpu", for error messages

  // Pointer to the first element (storage + offset). data<T>() checks T against dtype.
  void* data_ptr() const;
  template <typename T>
  T* data() const;

  // --- views (share storage, no autograd) ------------------------------------------
  Tensor view(const Shape& shape) const;     // contiguous only; one -1 allowed
  Tensor reshape(const Shape& shape) const;  // view if contiguous, else a copy
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;  // drops dim
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor unsqueeze(int64_t d) const;
  // A contiguous view of `shape` starting `offset` elements into this contiguous tensor;
  // how parameters become views of a flat buffer.
  Tensor view_at(int64_t offset, const Shape& shape) const;

  // A new handle on the same data with no autograd history (what backward closures save).
  Tensor detach() const;

  // --- copies --------------------------------------------------------------------
  Tensor contiguous() const;  // this if already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;         // bf16 rounds to nearest even
  void copy_(const Tensor& src) const;  // same shape; converts dtype and device
  template <typename T>
  std::vector<T> to_vector() const;  // host copy in T (converting from dtype)
  double item() const;               // a one-element tensor's value

  // --- autograd state (see autograd/) ---------------------------------------------
  bool requires_grad() const { return impl().requires_grad; }
  Tensor& set_requires_grad(bool r);  // leaves only
  Tensor grad() const { return Tensor(impl().grad); }
  void set_grad(const Tensor& g) const { impl().grad = g.impl_; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl().grad_fn; }
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  const std::string& name() const { return impl().name; }
  Tensor& set_name(const std::string& n) {
    impl().name = n;
    return *this;
  }

  TensorImpl& impl() const {
    NDT_CHECK(impl_ != nullptr, "use of an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }
  bool shares_storage(const Tensor& o) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);  // readable, elided when large

Shape contiguous_strides(const Shape& shape);

// Which C++ type stores each dtype.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<uint16_t>() {
  return DType::u16;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}

}  // namespace ndt
