// CPU elementwise kernels: add/mul/scale with row broadcast, in-place accumulate, GELU.
#include <cmath>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {
namespace {

constexpr int64_t kParallelMin = 32768;  // below this, threads cost more than they save

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

}  // namespace

void add(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta) {
  dispatch_float(a.dtype(), "add", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const A al = alpha, be = beta;
    binary<T>(a, b, out, [=](A x, A y) { return al * x + be * y; });
  });
}

void mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_float(a.dtype(), "mul", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    binary<T>(a, b, out, [](A x, A y) { return x * y; });
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

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  dispatch_float(dst.dtype(), "add_", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    binary<T>(dst, src, dst, [al = A(alpha)](A x, A y) { return x + al * y; });
  });
}

// forward: y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
void gelu_forward(const Tensor& x, const Tensor& out) {
  dispatch_float(x.dtype(), "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const int64_t n = x.numel();
    const A k = std::sqrt(A(2) / A(M_PI));
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const A v = load(px[i]);
      po[i] = st<T>(A(0.5) * v * (A(1) + fast_tanh(k * (v + A(0.044715) * v * v * v))));
    }
  });
}

// so dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3*0.044715 x^2)
void gelu_backward(const Tensor& x, const Tensor& dout, const Tensor& dx) {
  dispatch_float(x.dtype(), "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(x.data_ptr());
    const T* pd = static_cast<const T*>(dout.data_ptr());
    T* pdx = static_cast<T*>(dx.data_ptr());
    const int64_t n = x.numel();
    const A k = std::sqrt(A(2) / A(M_PI));
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const A v = load(px[i]);
      const A t = fast_tanh(k * (v + A(0.044715) * v * v * v));
      const A grad = A(0.5) * (A(1) + t) + A(0.5) * v * (A(1) - t * t) * k * (A(1) + A(3 * 0.044715) * v * v);
      pdx[i] = st<T>(grad * load(pd[i]));
    }
  });
}

}  // namespace ndt::cpu
