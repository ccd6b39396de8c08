// CPU elementwise kernels: add/mul/scale with row broadcast, in-place accumulate, GELU.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {
namespace {

// b is a's shape (period n) or a row vector over a's last dim (period = b.numel()).
template <typename T, typename F>
void binary(const Tensor& a, const Tensor& b, const Tensor& out, F&& f) {
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  T* po = static_cast<T*>(out.data_ptr());
  const int64_t n = a.numel(), nb = b.numel();
  if (nb == n) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) po[i] = st<T>(f(load(pa[i]), load(pb[i])));
  } else {
    const int64_t rows = nb ? n / nb : 0;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < nb; ++j) po[r * nb + j] = st<T>(f(load(pa[r * nb + j]), load(pb[j])));
  }
}

// The f32 loops of add, add_ and mul at the machine's vector width (NDT_VECTOR_CLONES):
// out = al a + be b (add_ is al = 1: 1 x is x exactly), or out = a b.
NDT_VECTOR_CLONES void axpby_f32(const float* a, const float* b, float* out, int64_t n, float al, float be) {
  for (int64_t i = 0; i < n; ++i) out[i] = al * a[i] + be * b[i];
}
NDT_VECTOR_CLONES void mul_f32(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

// One of them, on f32 arrays
struct F32Binary {
  bool mul;
  float al, be;
  void operator()(const float* a, const float* b, float* out, int64_t n) const {
    if (mul)
      mul_f32(a, b, out, n);
    else
      axpby_f32(a, b, out, n, al, be);
  }
};

// f on n elements of f32 arrays as they are, or of bf16 ones a block at a time: widened,
// computed, rounded once (the bits of the element-by-element formula)
void apply(const F32Binary& f, const float* a, const float* b, float* out, int64_t n) { f(a, b, out, n); }
void apply(const F32Binary& f, const bf16* a, const bf16* b, bf16* out, int64_t n) {
  float x[kBf16Block], y[kBf16Block], z[kBf16Block];
  for (int64_t lo = 0; lo < n; lo += kBf16Block) {
    const int64_t m = std::min(kBf16Block, n - lo);
    bf16_to_f32(a + lo, x, m);
    bf16_to_f32(b + lo, y, m);
    f(x, y, z, m);
    f32_to_bf16(z, out + lo, m);
  }
}

// binary() for f32 and bf16 through the vector loops; b as binary() takes it
template <typename T>
void binary_vec(const Tensor& a, const Tensor& b, const Tensor& out, const F32Binary& f) {
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  T* po = static_cast<T*>(out.data_ptr());
  const int64_t n = a.numel(), nb = b.numel();
  if (nb == n)
    return parallel_chunks(n, [&](int64_t lo, int64_t hi) { apply(f, pa + lo, pb + lo, po + lo, hi - lo); });
  const int64_t rows = nb ? n / nb : 0;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) apply(f, pa + r * nb, pb, po + r * nb, nb);
}

}  // namespace

void add(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta) {
  dispatch_float(a.dtype(), "add", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const A al = alpha, be = beta;
    if constexpr (std::is_same_v<T, double>)
      binary<T>(a, b, out, [=](A x, A y) { return al * x + be * y; });
    else
      binary_vec<T>(a, b, out, {false, al, be});
  });
}

void mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_float(a.dtype(), "mul", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    if constexpr (std::is_same_v<T, double>)
      binary<T>(a, b, out, [](A x, A y) { return x * y; });
    else
      binary_vec<T>(a, b, out, {true, 1, 1});
  });
}

void scale(const Tensor& a, double s, const Tensor& out) {
  dispatch_float(a.dtype(), "scale", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* pa = static_cast<const T*>(a.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const int64_t n = a.numel();
    const A sc = s;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) po[i] = st<T>(sc * load(pa[i]));
  });
}

void scale_by(const Tensor& t, const Tensor& s) {
  const double f = s.item();     // on the CPU reading it costs nothing
  if (f != 1.0) scale(t, f, t);  // x * 1 = x: the usual dloss of a loss needs no pass
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  dispatch_float(dst.dtype(), "add_", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    if constexpr (std::is_same_v<T, double>)
      binary<T>(dst, src, dst, [al = A(alpha)](A x, A y) { return x + al * y; });
    else
      binary_vec<T>(dst, src, dst, {false, 1, A(alpha)});
  });
}

namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)

// forward: y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
template <typename T>
inline T gelu_value(T v, T k) {
  return T(0.5) * v * (T(1) + fast_tanh(k * (v + T(0.044715) * v * v * v)));
}
// so dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3*0.044715 x^2)
template <typename T>
inline T gelu_grad(T v, T k) {
  const T t = fast_tanh(k * (v + T(0.044715) * v * v * v));
  return T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * k * (T(1) + T(3 * 0.044715) * v * v);
}

// The f32 loops, one vectorized function each (NDT_VECTOR_CLONES), on one thread's chunk.
NDT_VECTOR_CLONES void gelu_forward_f32(const float* x, float* y, int64_t n, float k = kGeluK) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_value(x[i], k);
}
NDT_VECTOR_CLONES void gelu_backward_f32(const float* x, const float* dy, float* dx, int64_t n,
                                         float k = kGeluK) {
  for (int64_t i = 0; i < n; ++i) dx[i] = gelu_grad(x[i], k) * dy[i];
}

// bf16 through the f32 loops, a block at a time: widened, computed, rounded once (the same
// bits as the element-by-element formula). Its sqrt(2/pi) is the one bf16 has always used,
// computed in float (1 ulp below kGeluK), so that recorded bf16 runs keep their bits.
const float kGeluKBf16 = std::sqrt(2.0f / static_cast<float>(M_PI));

void gelu_forward_bf16(const bf16* x, bf16* y, int64_t n) {
  float a[kBf16Block], b[kBf16Block];
  for (int64_t lo = 0; lo < n; lo += kBf16Block) {
    const int64_t m = std::min(kBf16Block, n - lo);
    bf16_to_f32(x + lo, a, m);
    gelu_forward_f32(a, b, m, kGeluKBf16);
    f32_to_bf16(b, y + lo, m);
  }
}
void gelu_backward_bf16(const bf16* x, const bf16* dy, bf16* dx, int64_t n) {
  float a[kBf16Block], d[kBf16Block], g[kBf16Block];
  for (int64_t lo = 0; lo < n; lo += kBf16Block) {
    const int64_t m = std::min(kBf16Block, n - lo);
    bf16_to_f32(x + lo, a, m);
    bf16_to_f32(dy + lo, d, m);
    gelu_backward_f32(a, d, g, m, kGeluKBf16);
    f32_to_bf16(g, dx + lo, m);
  }
}

}  // namespace

void gelu_forward(const Tensor& x, const Tensor& out) {
  const int64_t n = x.numel();
  if (x.dtype() == DType::f32) {
    const float* px = x.data<float>();
    float* po = out.data<float>();
    return parallel_chunks(n, [&](int64_t lo, int64_t hi) { gelu_forward_f32(px + lo, po + lo, hi - lo); });
  }
  if (x.dtype() == DType::bf16) {
    const bf16* px = x.data<bf16>();
    bf16* po = out.data<bf16>();
    return parallel_chunks(n, [&](int64_t lo, int64_t hi) { gelu_forward_bf16(px + lo, po + lo, hi - lo); });
  }
  dispatch_float(x.dtype(), "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) po[i] = st<T>(gelu_value<A>(load(px[i]), std::sqrt(A(2) / A(M_PI))));
  });
}

void gelu_backward(const Tensor& x, const Tensor& dout, const Tensor& dx) {
  const int64_t n = x.numel();
  if (x.dtype() == DType::f32) {
    const float *px = x.data<float>(), *pd = dout.data<float>();
    float* pdx = dx.data<float>();
    return parallel_chunks(
        n, [&](int64_t lo, int64_t hi) { gelu_backward_f32(px + lo, pd + lo, pdx + lo, hi - lo); });
  }
  if (x.dtype() == DType::bf16) {
    const bf16 *px = x.data<bf16>(), *pd = dout.data<bf16>();
    bf16* pdx = dx.data<bf16>();
    return parallel_chunks(
        n, [&](int64_t lo, int64_t hi) { gelu_backward_bf16(px + lo, pd + lo, pdx + lo, hi - lo); });
  }
  dispatch_float(x.dtype(), "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pd = static_cast<const T*>(dout.data_ptr());
    T* pdx = static_cast<T*>(dx.data_ptr());
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i)
      pdx[i] = st<T>(gelu_grad<A>(load(px[i]), std::sqrt(A(2) / A(M_PI))) * load(pd[i]));
  });
}

}  // namespace ndt::cpu
