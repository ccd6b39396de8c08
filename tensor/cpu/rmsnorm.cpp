// CPU RMSNorm over the last dim (Llama, Qwen2, Mistral). Legend: N rows, C channels.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

// f32 rows at the machine's vector width, sums in kLanes fixed lanes (the same bits at every
// width). sum_c a[c] b[c] (kernels.h; LayerNorm's backward uses it too):
NDT_VECTOR_CLONES float dot_f32(const float* a, const float* b, int64_t n) {
  float lane[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += a[c + l] * b[c + l];
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  for (; c < n; ++c) s += a[c] * b[c];
  return s;
}

namespace {

// out[c] = (x[c] r) w[c]
NDT_VECTOR_CLONES void scale_rows_f32(const float* x, float r, const float* w, float* out, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] = x[c] * r * w[c];
}

// dx[c] = r (d[c] w[c] - x[c] r m)
NDT_VECTOR_CLONES void rms_dx_f32(const float* d, const float* x, const float* w, float r, float m, float* dx,
                                  int64_t n) {
  for (int64_t c = 0; c < n; ++c) dx[c] = r * (d[c] * w[c] - x[c] * r * m);
}

// x (N,C), w (C) -> out, rstd as rmsnorm_forward below, f32
void rmsnorm_forward_f32(const float* px, const float* pw, float eps, float* po, float* pr, int64_t N,
                         int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = px + n * C;
    const float r = 1.0f / std::sqrt(dot_f32(row, row, C) / C + eps);
    scale_rows_f32(row, r, pw, po + n * C, C);
    pr[n] = r;
  }
}

// dx as rmsnorm_backward below, f32: sum_c dxhat xhat = r sum_c (d w) x
void rmsnorm_dx_f32(const float* pd, const float* px, const float* pw, const float* pr, float* pdx, int64_t N,
                    int64_t C) {
#pragma omp parallel if (N * C > 16384)
  {
    std::vector<float> dw(C);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float *drow = pd + n * C, *xrow = px + n * C;
      for (int64_t c = 0; c < C; ++c) dw[c] = drow[c] * pw[c];
      const float mean_dot = dot_f32(dw.data(), xrow, C) * pr[n] / C;
      rms_dx_f32(drow, xrow, pw, pr[n], mean_dot, pdx + n * C, C);
    }
  }
}

}  // namespace

// x (N,C), w (C) -> out (N,C) = x * rstd * w, rstd (N) = 1 / sqrt(mean_c(x^2) + eps).
// As Hugging Face's LlamaRMSNorm: the statistics in f32 (f64 for f64 x), x * rstd rounded
// to x's dtype before the weight multiplies it.
void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& out, const Tensor& rstd) {
  if (x.dtype() == DType::f32) {
    const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
    return rmsnorm_forward_f32(x.data<float>(), w.data<float>(), static_cast<float>(eps), out.data<float>(),
                               rstd.data<float>(), N, C);
  }
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
void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw) {
  dispatch_float(x.dtype(), "rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
    const T *pd = static_cast<const T*>(dout.data_ptr()), *px = static_cast<const T*>(x.data_ptr()),
            *pw = static_cast<const T*>(w.data_ptr());
    const A* pr = static_cast<const A*>(rstd.data_ptr());
    T *pdx = static_cast<T*>(dx.data_ptr()), *pdw = static_cast<T*>(dw.data_ptr());
    // dx: rows are independent
    if constexpr (std::is_same_v<T, float>)
      rmsnorm_dx_f32(pd, px, pw, pr, pdx, N, C);
    else
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
