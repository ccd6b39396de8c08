// CUDA AdamW, the twin of tensor/cpu/adamw.cpp: one fused pass over a flat buffer.
#include <cmath>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

// ---- kernels ------------------------------------------------------------------------

// p, g, m, v (n) f32. Elements with index_offset + i < decay_end are decayed first:
//   p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= step_size * m / (sqrt(v)/bc2_sqrt + eps)
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, int64_t decay_local_end,
                             float decay, float b1, float b2, float eps, float grad_scale, float step_size,
                             float bc2_sqrt) {
  NDT_GRID_STRIDE(i, n) {
    const float gi = g[i] * grad_scale;
    float pi = i < decay_local_end ? p[i] * decay : p[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    pi -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
  }
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const kernels::AdamWArgs& a) {
  NDT_CHECK(param.dtype() == DType::f32 && grad.dtype() == DType::f32 && m.dtype() == DType::f32 &&
                v.dtype() == DType::f32,
            "adamw_step: CUDA parameters, gradients and moments must be float32, got ", param.desc(), " and ",
            grad.desc());
  const int64_t n = param.numel();
  if (n == 0) return;
  Launch L(param);
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(a.beta2, static_cast<double>(a.step)));
  const int64_t split = std::clamp<int64_t>(a.decay_end - a.index_offset, 0, n);
  adamw_kernel<<<grid_for(n), kThreads, 0, L.stream>>>(
      param.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(), n, split,
      static_cast<float>(1.0 - a.lr * a.weight_decay), static_cast<float>(a.beta1),
      static_cast<float>(a.beta2), static_cast<float>(a.eps), static_cast<float>(a.grad_scale),
      static_cast<float>(a.lr / bc1), static_cast<float>(bc2_sqrt));
  NDT_CUDA_CHECK_LAUNCH();
}

}  // namespace ndt::cuda
