// Helpers shared by the op files: argument checks with messages that name the op.
#pragma once

#include <initializer_list>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace ndt::ops_detail {

using autograd::Grads;

// All defined tensors share the first one's dtype and device, and it is floating point.
inline void check_same(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first) {
      first = t;
      NDT_CHECK(is_floating(t->dtype()), op, ": expected a floating-point tensor, got ", t->desc());
      continue;
    }
    NDT_CHECK(t->dtype() == first->dtype(), op, ": dtype mismatch, ", first->desc(), " vs ", t->desc());
    NDT_CHECK(t->device() == first->device(), op, ": device mismatch, ", first->desc(), " vs ", t->desc());
  }
}

inline Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }

// The dtype of per-row statistics (mean, rstd, lse): f64 for f64 data, else f32.
inline DType stat_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace ndt::ops_detail
