// ndtrain: finite-difference gradient checks in float64.
//
//   std::vector<Tensor> in = {random(...,f64).set_requires_grad(true), ...};
//   auto r = autograd::gradcheck([](const std::vector<Tensor>& x) {
//     return std::vector<Tensor>{ndt::matmul(x[0], x[1])};
//   }, in);
//   EXPECT_TRUE(r.ok) << r.message;
//
// The outputs are reduced to L = sum_k sum(out_k * R_k) with fixed random R_k, so every
// output element matters. For every element of every input that requires grad, the
// central difference (L(x+eps) - L(x-eps)) / 2eps is compared with autograd's dL/dx:
// |num - ana| <= atol + rtol * max(|num|, |ana|).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace ndt::autograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-7;
  double rtol = 1e-6;
  uint64_t seed = 1234;  // for the projection R
};

struct GradcheckResult {
  bool ok = true;
  double max_abs_err = 0;
  double max_rel_err = 0;  // over elements whose gradient is >= 1e-4 in magnitude
  int64_t checked = 0;     // elements compared
  std::string message;     // the worst element, when !ok
};

using GradcheckFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
// Inputs must be CPU f64; those with requires_grad are checked, the others held fixed.
GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& opt = {});

}  // namespace ndt::autograd
