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

// t *= *s
template <typename T>
__global__ void scale_by_kernel(T* t, int64_t n, const float* s) {
  const float v = *s;
  NDT_GRID_STRIDE(i, n) t[i] = store<T>(v * load(t[i]));
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

// ---- the elementwise maps, one element or one 128-bit pack at a time -----------------
// The same arithmetic per element either way, so the two paths give equal bits.

struct AddF {  // alpha*a + beta*b
  float alpha, beta;
  __device__ float operator()(float a, float b) const { return alpha * a + beta * b; }
};
struct ScaleF {  // s*a (b unused)
  float s;
  __device__ float operator()(float a, float) const { return s * a; }
};
struct GeluF {  // GELU(a) (b unused)
  float k;
  __device__ float operator()(float v, float) const {
    return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
  }
};
struct GeluGradF {  // dGELU/dx (x = a) * dout (= b)
  float k;
  __device__ float operator()(float v, float d) const {
    const float t = tanhf(k * (v + 0.044715f * v * v * v));
    return (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * k * (1.0f + kGeluC3 * v * v)) * d;
  }
};

// out (n) = f(a, b) over packs of 16 bytes, then the tail; a, b, out 16-byte aligned. b may
// be null (f ignores it).
template <typename T, typename F>
__global__ void map_packed_kernel(const T* a, const T* b, T* out, int64_t n, F f) {
  constexpr int P = Pack<T>::kN;
  const int64_t packs = n / P;
  NDT_GRID_STRIDE(i, packs) {
    const Pack<T> pa = reinterpret_cast<const Pack<T>*>(a)[i];
    Pack<T> pb;
    if (b) pb = reinterpret_cast<const Pack<T>*>(b)[i];
    Pack<T> po;
#pragma unroll
    for (int j = 0; j < P; ++j) po.v[j] = store<T>(f(load(pa.v[j]), b ? load(pb.v[j]) : 0.0f));
    reinterpret_cast<Pack<T>*>(out)[i] = po;
  }
  NDT_GRID_STRIDE(j, n - packs * P) {
    const int64_t i = packs * P + j;
    out[i] = store<T>(f(load(a[i]), b ? load(b[i]) : 0.0f));
  }
}

// out = f(a, b) with the packed kernel when the pointers allow; false otherwise
template <typename T, typename F>
bool map_packed(const Tensor& a, const Tensor* b, const Tensor& out, F f, cudaStream_t stream) {
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = b ? static_cast<const T*>(b->data_ptr()) : nullptr;
  T* po = static_cast<T*>(out.data_ptr());
  if (!aligned16(pa) || (pb && !aligned16(pb)) || !aligned16(po)) return false;
  const int64_t n = a.numel();
  map_packed_kernel<T, F>
      <<<grid_for(std::max<int64_t>(1, n / Pack<T>::kN)), kThreads, 0, stream>>>(pa, pb, po, n, f);
  NDT_CUDA_CHECK_LAUNCH();
  return true;
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
    const AddF f{static_cast<float>(alpha), static_cast<float>(beta)};
    if (b.numel() == n && map_packed<T>(a, &b, out, f, L.stream)) return;
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

void scale_by(const Tensor& t, const Tensor& s) {
  const int64_t n = t.numel();
  NDT_CHECK(s.numel() == 1 && s.dtype() == DType::f32, "scale_by: the factor must be one float32, got ",
            s.desc());
  if (n == 0) return;
  Launch L(t);
  dispatch_float(t.dtype(), "scale_by", [&](auto tag) {
    using T = decltype(tag);
    scale_by_kernel<T>
        <<<grid_for(n), kThreads, 0, L.stream>>>(static_cast<T*>(t.data_ptr()), n, s.data<float>());
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void scale(const Tensor& a, double s, const Tensor& out) {
  const int64_t n = a.numel();
  if (n == 0) return;
  Launch L(a);
  dispatch_float(a.dtype(), "scale", [&](auto tag) {
    using T = decltype(tag);
    if (map_packed<T>(a, nullptr, out, ScaleF{static_cast<float>(s)}, L.stream)) return;
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
    if (map_packed<T>(x, nullptr, out, GeluF{gelu_k()}, L.stream)) return;
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
    if (map_packed<T>(x, &dout, dx, GeluGradF{gelu_k()}, L.stream)) return;
    gelu_backward_kernel<T><<<grid_for(n), kThreads, 0, L.stream>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(dout.data_ptr()),
        static_cast<T*>(dx.data_ptr()), n, gelu_k());
    NDT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ndt::cuda
