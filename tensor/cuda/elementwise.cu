// CUDA elementwise kernels, the twins of tensor/cpu/elementwise.cpp: add/mul/scale with a
// row broadcast, in-place accumulate, GELU. One thread per element (grid-stride), f32 math.
#include <cmath>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

// ---- kernels ------------------------------------------------------------------------

// a (n), b (n) or a row (nb) repeated over a's rows -> out (n) = alpha*a + beta*b
template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t n, int64_t nb, float alpha, float beta) {
  NDT_GRID_STRIDE(i, n) {
    const int64_t j = nb == n ? i : i % nb;
    out[i] = store<T>(alpha * load(a[i]) + beta * load(b[j]));
  }
}

// out = a * b, b broadcast as in add_kernel
template <typename T>
__global__ void mul_kernel(const T* a, const T* b, T* out, int64_t n, int64_t nb) {
  NDT_GRID_STRIDE(i, n) {
    const int64_t j = nb == n ? i : i % nb;
    out[i] = store<T>(load(a[i]) * load(b[j]));
  }
}

// out = s * a
template <typename T>
__global__ void scale_kernel(const T* a, T* out, int64_t n, float s) {
  NDT_GRID_STRIDE(i, n) out[i] = store<T>(s * load(a[i]));
}

// Constants rounded as the CPU rounds them: k = sqrt(2/pi) computed in float (passed in
// by the launchers), 3*0.044715 rounded once.
constexpr float kGeluC3 = static_cast<float>(3 * 0.044715);
float gelu_k() { return std::sqrt(2.0f / static_cast<float>(M_PI)); }

// forward: y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
template <typename T>
__global__ void gelu_forward_kernel(const T* x, T* out, int64_t n, float k) {
  NDT_GRID_STRIDE(i, n) {
    const float v = load(x[i]);
    out[i] = store<T>(0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v))));
  }
}

// so dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3*0.044715 x^2)
template <typename T>
__global__ void gelu_backward_kernel(const T* x, const T* dout, T* dx, int64_t n, float k) {
  NDT_GRID_STRIDE(i, n) {
    const float v = load(x[i]);
    const float t = tanhf(k * (v + 0.044715f * v * v * v));
    const float grad = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * k * (1.0f + kGeluC3 * v * v);
    dx[i] = store<T>(grad * load(dout[i]));
  }
}

void check_broadcast(const char* op, const Tensor& a, const Tensor& b) {
  const int64_t n = a.numel(), nb = b.numel();
  NDT_CHECK(nb == n || (nb > 0 && a.dim() >= 1 && a.size(-1) == nb), op, ": b ", b.shape_str(),
            " is neither a's shape ", a.shape_str(), " nor a row of its last dim");
  NDT_CHECK(a.dtype() == b.dtype(), op, ": dtypes differ: ", a.desc(), " and ", b.desc());
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void add(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta) {
  const int64_t n = a.numel();
  if (n == 0) return;
  check_broadcast("add", a, b);
  Launch L(a);
  dispatch_float(a.dtype(), "add", [&](auto tag) {
    using T = decltype(tag);
    add_kernel<T><<<grid_for(n), kThreads, 0, L.stream>>>(
        static_cast<const T*>(a.data_ptr()), static_cast<const T*>(b.data_ptr()),
        static_cast<T*>(out.data_ptr()), n, b.numel(), static_cast<float>(alpha), static_cast<float>(beta));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t n = a.numel();
  if (n == 0) return;
  check_broadcast("mul", a, b);
  Launch L(a);
  dispatch_float(a.dtype(), "mul", [&](auto tag) {
    using T = decltype(tag);
    mul_kernel<T><<<grid_for(n), kThreads, 0, L.stream>>>(static_cast<const T*>(a.data_ptr()),
                                                          static_cast<const T*>(b.data_ptr()),
                                                          static_cast<T*>(out.data_ptr()), n, b.numel());
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void scale(const Tensor& a, double s, const Tensor& out) {
  const int64_t n = a.numel();
  if (n == 0) return;
  Launch L(a);
  dispatch_float(a.dtype(), "scale", [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<grid_for(n), kThreads, 0, L.stream>>>(
        static_cast<const T*>(a.data_ptr()), static_cast<T*>(out.data_ptr()), n, static_cast<float>(s));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

// dst += alpha * src  (src has dst's shape or is a row broadcast over it)
void add_(const Tensor& dst, const Tensor& src, double alpha) { add(dst, src, dst, 1.0, alpha); }

void gelu_forward(const Tensor& x, const Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  Launch L(x);
  dispatch_float(x.dtype(), "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    gelu_forward_kernel<T><<<grid_for(n), kThreads, 0, L.stream>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), n, gelu_k());
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void gelu_backward(const Tensor& x, const Tensor& dout, const Tensor& dx) {
  const int64_t n = x.numel();
  if (n == 0) return;
  Launch L(x);
  dispatch_float(x.dtype(), "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    gelu_backward_kernel<T><<<grid_for(n), kThreads, 0, L.stream>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(dout.data_ptr()),
        static_cast<T*>(dx.data_ptr()), n, gelu_k());
    NDT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ndt::cuda
