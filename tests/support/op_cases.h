// ndtrain tests: one registry of op cases, run by every harness on every backend
// (ggml test-backend-ops style). Add an op by adding one OpCase in op_cases.cpp; the
// float64 gradient check, the f32-vs-f64 and bf16-vs-f32 consistency tests (and the
// CPU-vs-CUDA comparison, where a GPU exists) pick it up.
//
//   for (const OpCase& c : op_cases()) {
//     std::vector<Tensor> in = case_inputs(c, DType::f64, Device::cpu());
//     auto r = autograd::gradcheck(c.fn, in, c.gradcheck);
//     EXPECT_TRUE(r.ok) << c.name << ": " << r.message;
//   }
//
// Inputs are random (counter-based RNG, one stream per input, never zeros); int32 ids and
// targets are drawn the same way. Shapes are small and odd (T=7, C=12, NH=3, V=11) so the
// finite-difference loops stay fast and no power-of-two assumption hides a bug.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "tensor/tensor.h"

namespace ndt::testing {

using CaseFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct OpCase {
  std::string name;  // [A-Za-z0-9_], used as the test name
  // Fresh random inputs of the given floating dtype (int inputs stay i32) on `device`.
  std::function<std::vector<Tensor>(DType, Device)> make_inputs;
  CaseFn fn;                        // the op(s) under test; may return several outputs
  std::vector<bool> requires_grad;  // per input
  // float64 finite differences. The defaults (eps 1e-6, atol 1e-7, rtol 1e-6) stand: the
  // largest error measured over all cases is 1.4e-8 absolute (transformer_block; central
  // differences of an O(10) projection lose ~1e-16 * 10 / 1e-6 to rounding), a 7x margin,
  // while a wrong gradient errs by O(|grad|) ~ 1e-1. Relative errors above 1e-6 occur only
  // on entries below ~1e-3, where atol governs.
  autograd::GradcheckOptions gradcheck{};
  double f32_tol = 1e-5;   // relative error of f32 vs f64 (outputs and gradients)
  double bf16_tol = 2e-2;  // relative error of bf16 vs f32
};

// Every case; names are unique.
const std::vector<OpCase>& op_cases();
const OpCase& op_case(const std::string& name);  // throws ndt::Error if unknown
std::vector<std::string> op_case_names();

// Inputs for case c with its requires_grad flags set (fresh leaves every call).
std::vector<Tensor> case_inputs(const OpCase& c, DType dtype, Device device);
// The same values converted to `dtype` / `device` as fresh leaves with c's flags
// (int inputs keep their dtype).
std::vector<Tensor> convert_inputs(const OpCase& c, const std::vector<Tensor>& inputs, DType dtype,
                                   Device device);

// One forward and one backward of L = sum_k <out_k, R_k> with fixed random R_k (values
// exactly representable in bf16, so every dtype sees the same projection). Outputs and
// input gradients come back as contiguous f64 CPU tensors; grads[i] is undefined for an
// input that does not require grad.
struct CaseRun {
  std::vector<Tensor> outputs;
  std::vector<Tensor> grads;
};
CaseRun run_case(const OpCase& c, const std::vector<Tensor>& inputs);

// ||a - b|| / ||b|| over all elements (0 when both are zero; inf when only b is zero).
double rel_error(const Tensor& a, const Tensor& b);

// Random helpers (seed fixed): normal / uniform floats and int32 ids in [0, hi).
Tensor randn(const Shape& shape, DType dtype, Device device, uint64_t stream, float mean = 0.0f,
             float std = 1.0f);
Tensor randu(const Shape& shape, DType dtype, Device device, uint64_t stream, float lo, float hi);
Tensor random_ids(const Shape& shape, int32_t hi, Device device, uint64_t stream);

}  // namespace ndt::testing
