// CPU SwiGLU's gate: silu(gate) * up (the Llama MLP: down(silu(gate x) * up x)). Legend: N
// elements of the hidden activations. f32 and bf16 run one vectorized f32 loop (fast_exp,
// ~2 ulp; bf16 widened and rounded once per block), double keeps the library's exp.
#include <algorithm>
#include <cmath>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {
namespace {

// sigmoid(g) = 1 / (1 + exp(-g))
template <typename A>
inline A sigmoid(A g) {
  return A(1) / (A(1) + fast_exp(-g));
}

// g, u (n) -> o (n) = g sigmoid(g) u
NDT_VECTOR_CLONES void silu_mul_forward_f32(const float* g, const float* u, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = g[i] * sigmoid(g[i]) * u[i];
}

// In the forward, out = silu(g) * u with silu(g) = g s, s = sigmoid(g); so
//   dup = dout * silu(g),  dgate = dout * u * silu'(g),  silu'(g) = s (1 + g (1 - s))
NDT_VECTOR_CLONES void silu_mul_backward_f32(const float* g, const float* u, const float* d, float* dg,
                                             float* du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(g[i]);
    du[i] = d[i] * g[i] * s;
    dg[i] = d[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
  }
}

void silu_mul_forward_bf16(const bf16* g, const bf16* u, bf16* o, int64_t n) {
  float a[kBf16Block], b[kBf16Block], c[kBf16Block];
  for (int64_t lo = 0; lo < n; lo += kBf16Block) {
    const int64_t m = std::min(kBf16Block, n - lo);
    bf16_to_f32(g + lo, a, m);
    bf16_to_f32(u + lo, b, m);
    silu_mul_forward_f32(a, b, c, m);
    f32_to_bf16(c, o + lo, m);
  }
}

void silu_mul_backward_bf16(const bf16* g, const bf16* u, const bf16* d, bf16* dg, bf16* du, int64_t n) {
  float a[kBf16Block], b[kBf16Block], c[kBf16Block], x[kBf16Block], y[kBf16Block];
  for (int64_t lo = 0; lo < n; lo += kBf16Block) {
    const int64_t m = std::min(kBf16Block, n - lo);
    bf16_to_f32(g + lo, a, m);
    bf16_to_f32(u + lo, b, m);
    bf16_to_f32(d + lo, c, m);
    silu_mul_backward_f32(a, b, c, x, y, m);
    f32_to_bf16(x, dg + lo, m);
    f32_to_bf16(y, du + lo, m);
  }
}

}  // namespace

// gate, up (N) -> out (N) = silu(gate) * up, silu(g) = g * sigmoid(g)
void silu_mul_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const int64_t n = gate.numel();
  dispatch_float(gate.dtype(), "silu_mul_forward", [&](auto tag) {
    using T = decltype(tag);
    const T *pg = static_cast<const T*>(gate.data_ptr()), *pu = static_cast<const T*>(up.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    parallel_chunks(n, [&](int64_t lo, int64_t hi) {
      if constexpr (std::is_same_v<T, float>)
        silu_mul_forward_f32(pg + lo, pu + lo, po + lo, hi - lo);
      else if constexpr (std::is_same_v<T, bf16>)
        silu_mul_forward_bf16(pg + lo, pu + lo, po + lo, hi - lo);
      else
        for (int64_t i = lo; i < hi; ++i) po[i] = pg[i] / (1.0 + std::exp(-pg[i])) * pu[i];
    });
  });
}

void silu_mul_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                       const Tensor& dup) {
  const int64_t n = gate.numel();
  dispatch_float(gate.dtype(), "silu_mul_backward", [&](auto tag) {
    using T = decltype(tag);
    const T *pg = static_cast<const T*>(gate.data_ptr()), *pu = static_cast<const T*>(up.data_ptr()),
            *pd = static_cast<const T*>(dout.data_ptr());
    T *pdg = static_cast<T*>(dgate.data_ptr()), *pdu = static_cast<T*>(dup.data_ptr());
    parallel_chunks(n, [&](int64_t lo, int64_t hi) {
      if constexpr (std::is_same_v<T, float>) {
        silu_mul_backward_f32(pg + lo, pu + lo, pd + lo, pdg + lo, pdu + lo, hi - lo);
      } else if constexpr (std::is_same_v<T, bf16>) {
        silu_mul_backward_bf16(pg + lo, pu + lo, pd + lo, pdg + lo, pdu + lo, hi - lo);
      } else {
        for (int64_t i = lo; i < hi; ++i) {
          const double g = pg[i], d = pd[i], s = 1.0 / (1.0 + std::exp(-g));
          pdu[i] = d * g * s;
          pdg[i] = d * pu[i] * s * (1.0 + g * (1.0 - s));
        }
      }
    });
  });
}

}  // namespace ndt::cpu
