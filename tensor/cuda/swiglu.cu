// CUDA SwiGLU's gate, the twin of tensor/cpu/swiglu.cpp: out = silu(gate) * up, element-wise.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

// ---- kernels ------------------------------------------------------------------------

template <typename T>
__global__ void silu_mul_forward_kernel(const T* gate, const T* up, T* out, int64_t n) {
  NDT_GRID_STRIDE(i, n) {
    const float g = load(gate[i]);
    out[i] = store<T>(g / (1.0f + expf(-g)) * load(up[i]));
  }
}

// forward: out = g s u, s = sigmoid(g); so dup = dout g s, dgate = dout u s (1 + g (1 - s))
template <typename T>
__global__ void silu_mul_backward_kernel(const T* gate, const T* up, const T* dout, T* dgate, T* dup,
                                         int64_t n) {
  NDT_GRID_STRIDE(i, n) {
    const float g = load(gate[i]), d = load(dout[i]);
    const float s = 1.0f / (1.0f + expf(-g));
    dup[i] = store<T>(d * g * s);
    dgate[i] = store<T>(d * load(up[i]) * s * (1.0f + g * (1.0f - s)));
  }
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void silu_mul_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  Launch L(gate);
  dispatch_float(gate.dtype(), "silu_mul_forward", [&](auto tag) {
    using T = decltype(tag);
    silu_mul_forward_kernel<T><<<grid_for(n), kThreads, 0, L.stream>>>(static_cast<const T*>(gate.data_ptr()),
                                                                       static_cast<const T*>(up.data_ptr()),
                                                                       static_cast<T*>(out.data_ptr()), n);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void silu_mul_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                       const Tensor& dup) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  Launch L(gate);
  dispatch_float(gate.dtype(), "silu_mul_backward", [&](auto tag) {
    using T = decltype(tag);
    silu_mul_backward_kernel<T><<<grid_for(n), kThreads, 0, L.stream>>>(
        static_cast<const T*>(gate.data_ptr()), static_cast<const T*>(up.data_ptr()),
        static_cast<const T*>(dout.data_ptr()), static_cast<T*>(dgate.data_ptr()),
        static_cast<T*>(dup.data_ptr()), n);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ndt::cuda
