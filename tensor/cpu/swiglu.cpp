// CPU SwiGLU's gate: silu(gate) * up (the Llama MLP: down(silu(gate x) * up x)). Legend: N
// elements of the hidden activations.
#include <cmath>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

// gate, up (N) -> out (N) = silu(gate) * up, silu(g) = g * sigmoid(g)
void silu_mul_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  dispatch_float(gate.dtype(), "silu_mul_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t n = gate.numel();
    const T *pg = static_cast<const T*>(gate.data_ptr()), *pu = static_cast<const T*>(up.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const A g = load(pg[i]);
      po[i] = st<T>(g / (A(1) + std::exp(-g)) * load(pu[i]));
    }
  });
}

// In the forward, out = silu(g) * u with silu(g) = g s, s = sigmoid(g); so
//   dup = dout * silu(g),  dgate = dout * u * silu'(g),  silu'(g) = s (1 + g (1 - s))
void silu_mul_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                       const Tensor& dup) {
  dispatch_float(gate.dtype(), "silu_mul_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t n = gate.numel();
    const T *pg = static_cast<const T*>(gate.data_ptr()), *pu = static_cast<const T*>(up.data_ptr()),
            *pd = static_cast<const T*>(dout.data_ptr());
    T *pdg = static_cast<T*>(dgate.data_ptr()), *pdu = static_cast<T*>(dup.data_ptr());
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const A g = load(pg[i]), d = load(pd[i]);
      const A s = A(1) / (A(1) + std::exp(-g));
      pdu[i] = st<T>(d * g * s);
      pdg[i] = st<T>(d * load(pu[i]) * s * (A(1) + g * (A(1) - s)));
    }
  });
}

}  // namespace ndt::cpu
