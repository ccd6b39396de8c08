// CPU RMSNorm over the last dim (Llama, Qwen2, Mistral). Legend: N rows, C channels.
#include <algorithm>
#include <cmath>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

// x (N,C), w (C) -> out (N,C) = x * rstd * w, rstd (N) = 1 / sqrt(mean_c(x^2) + eps).
// As Hugging Face's LlamaRMSNorm: the statistics in f32 (f64 for f64 x), x * rstd rounded
// to x's dtype before the weight multiplies it.
void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& out, const Tensor& rstd) {
  dispatch_float(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
    const T *px = static_cast<const T*>(x.data_ptr()), *pw = static_cast<const T*>(w.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    A* pr = static_cast<A*>(rstd.data_ptr());
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t n = 0; n < N; ++n) {
      const T* row = px + n * C;
      A ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += load(row[c]) * load(row[c]);
      const A r = A(1) / std::sqrt(ss / C + A(eps));
      for (int64_t c = 0; c < C; ++c) po[n * C + c] = st<T>(load(st<T>(load(row[c]) * r)) * load(pw[c]));
      pr[n] = r;
    }
  });
}

// In the forward, xhat = x * rstd and out = xhat * w; so
//   dw = sum_n dout * xhat,  dx = rstd * (dxhat - xhat * mean_c(dxhat * xhat)),  dxhat = dout * w
// (rstd depends on x through mean_c(x^2): d rstd / dx_c = -rstd^3 x_c / C)
void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dw) {
  dispatch_float(x.dtype(), "rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
    const T *pd = static_cast<const T*>(dout.data_ptr()), *px = static_cast<const T*>(x.data_ptr()),
            *pw = static_cast<const T*>(w.data_ptr());
    const A* pr = static_cast<const A*>(rstd.data_ptr());
    T *pdx = static_cast<T*>(dx.data_ptr()), *pdw = static_cast<T*>(dw.data_ptr());
    // dx: rows are independent
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t n = 0; n < N; ++n) {
      const T *drow = pd + n * C, *xrow = px + n * C;
      A dot = 0;  // sum_c dxhat * xhat
      for (int64_t c = 0; c < C; ++c) dot += load(drow[c]) * load(pw[c]) * load(xrow[c]) * pr[n];
      const A mean_dot = dot / C;
      for (int64_t c = 0; c < C; ++c) {
        const A xhat = load(xrow[c]) * pr[n], dxhat = load(drow[c]) * load(pw[c]);
        pdx[n * C + c] = st<T>(pr[n] * (dxhat - xhat * mean_dot));
      }
    }
    // dw: columns are independent; rows summed in order (deterministic)
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
      const int64_t c1 = std::min(C, c0 + 64);
      A aw[64] = {};
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = c0; c < c1; ++c) aw[c - c0] += load(pd[n * C + c]) * load(px[n * C + c]) * pr[n];
      for (int64_t c = c0; c < c1; ++c) pdw[c] = st<T>(aw[c - c0]);
    }
  });
}

}  // namespace ndt::cpu
