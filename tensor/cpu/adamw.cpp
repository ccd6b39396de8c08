// CPU AdamW: one pass over a flat buffer; the loop body is branch-free within each of the
// decayed and non-decayed ranges so the compiler vectorizes it (AVX-512 / AVX2 clones).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {
namespace {

// The update of elements [lo, hi) with one decay factor. Every operation is IEEE (sqrt and
// division correctly rounded, no contraction: -ffp-contract=off), so the vector clones give
// the scalar loop's bits; this file is built with -fno-math-errno, without which GCC keeps a
// libm call per sqrt (for errno) and does not vectorize.
template <typename T>
struct AdamWConsts {
  T b1, b2, gs, eps, step_size, bc2_sqrt, decay;
};

template <typename T>
inline void adamw_range(T* p, const T* g, T* mm, T* vv, int64_t lo, int64_t hi, const AdamWConsts<T>& c) {
  for (int64_t i = lo; i < hi; ++i) {
    const T gi = g[i] * c.gs;
    T pi = p[i] * c.decay;
    const T mi = c.b1 * mm[i] + (1 - c.b1) * gi;
    const T vi = c.b2 * vv[i] + (1 - c.b2) * gi * gi;
    pi -= c.step_size * mi / (std::sqrt(vi) / c.bc2_sqrt + c.eps);
    mm[i] = mi;
    vv[i] = vi;
    p[i] = pi;
  }
}

NDT_VECTOR_CLONES void adamw_range_f32(float* p, const float* g, float* mm, float* vv, int64_t lo, int64_t hi,
                                       const AdamWConsts<float>& c) {
  adamw_range(p, g, mm, vv, lo, hi, c);
}

}  // namespace

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const kernels::AdamWArgs& a) {
  auto run = [&](auto* p, const auto* g, auto* mm, auto* vv) {
    using T = std::remove_pointer_t<decltype(p)>;
    const int64_t n = param.numel();
    AdamWConsts<T> c{};
    c.b1 = a.beta1;
    c.b2 = a.beta2;
    c.gs = a.grad_scale;
    c.eps = a.eps;
    c.step_size = a.lr / static_cast<T>(1 - std::pow(a.beta1, static_cast<double>(a.step)));
    c.bc2_sqrt = static_cast<T>(std::sqrt(1 - std::pow(a.beta2, static_cast<double>(a.step))));
    const int64_t split = std::clamp<int64_t>(a.decay_end - a.index_offset, 0, n);
    auto body = [&](int64_t lo, int64_t hi, T decay) {
      c.decay = decay;
#pragma omp parallel if (hi - lo > 65536)
      {  // one contiguous chunk per thread
        const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t a0 = lo + (hi - lo) * t / nt, a1 = lo + (hi - lo) * (t + 1) / nt;
        if constexpr (std::is_same_v<T, float>)
          adamw_range_f32(p, g, mm, vv, a0, a1, c);
        else
          adamw_range(p, g, mm, vv, a0, a1, c);
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
