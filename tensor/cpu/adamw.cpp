// CPU AdamW: one pass over a flat buffer; the loop body is branch-free within each of the
// decayed and non-decayed ranges so the compiler vectorizes it.
#include <algorithm>
#include <cmath>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const kernels::AdamWArgs& a) {
  auto run = [&](auto* p, const auto* g, auto* mm, auto* vv) {
    using T = std::remove_pointer_t<decltype(p)>;
    const int64_t n = param.numel();
    const T b1 = a.beta1, b2 = a.beta2, gs = a.grad_scale, eps = a.eps;
    const T bc1 = 1 - std::pow(a.beta1, static_cast<double>(a.step));
    const T bc2_sqrt = std::sqrt(1 - std::pow(a.beta2, static_cast<double>(a.step)));
    const T step_size = a.lr / bc1;
    const int64_t split = std::clamp<int64_t>(a.decay_end - a.index_offset, 0, n);
    auto body = [&](int64_t lo, int64_t hi, T decay) {
#pragma omp parallel for simd schedule(static) if (hi - lo > 65536)
      for (int64_t i = lo; i < hi; ++i) {
        const T gi = g[i] * gs;
        T pi = p[i] * decay;
        const T mi = b1 * mm[i] + (1 - b1) * gi;
        const T vi = b2 * vv[i] + (1 - b2) * gi * gi;
        pi -= step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
        mm[i] = mi;
        vv[i] = vi;
        p[i] = pi;
      }
    };
    body(0, split, static_cast<T>(1 - a.lr * a.weight_decay));
    body(split, n, T(1));
  };
  switch (param.dtype()) {
    case DType::f32:
      run(param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>());
      break;
    case DType::f64:
      run(param.data<double>(), grad.data<double>(), m.data<double>(), v.data<double>());
      break;
    default:
      NDT_FAIL("adamw_step: parameters must be float32 or float64, got ", param.desc());
  }
}

}  // namespace ndt::cpu
