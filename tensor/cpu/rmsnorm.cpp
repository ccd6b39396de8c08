// CPU RMSNorm over the last dim (Llama, Qwen2, Mistral). Legend: N rows, C channels.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

namespace {

// sum_c a[c] b[c] in kLanes fixed lanes (the same bits at every vector width)
[[gnu::always_inline]] inline float dot_lanes(const float* a, const float* b, int64_t n) {
  float lane[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += a[c + l] * b[c + l];
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  for (; c < n; ++c) s += a[c] * b[c];
  return s;
}

}  // namespace

// f32 rows at the machine's vector width (NDT_VECTOR_CLONES). sum_c a[c] b[c] (kernels.h;
// LayerNorm's backward uses it too):
NDT_VECTOR_CLONES float dot_f32(const float* a, const float* b, int64_t n) { return dot_lanes(a, b, n); }

namespace {

// Rows [n0, n1) of the forward: rstd r = 1 / sqrt(mean_c x^2 + eps), out[c] = (x[c] r) w[c].
// A whole range of rows per call: the q/k norms' rows are one head (32-128 channels), where a
// call per row cost as much as the row.
NDT_VECTOR_CLONES void rms_forward_rows_f32(const float* px, const float* pw, float eps, float* po, float* pr,
                                            int64_t n0, int64_t n1, int64_t C) {
  for (int64_t n = n0; n < n1; ++n) {
    const float* row = px + n * C;
    const float r = 1.0f / std::sqrt(dot_lanes(row, row, C) / C + eps);
    for (int64_t c = 0; c < C; ++c) po[n * C + c] = row[c] * r * pw[c];
    pr[n] = r;
  }
}

// Rows [n0, n1) of dx: dxhat = d w, m = r sum_c dxhat x / C (sum_c dxhat xhat / C), dx[c] =
// r (dxhat[c] - x[c] r m); dw (C) scratch
NDT_VECTOR_CLONES void rms_dx_rows_f32(const float* pd, const float* px, const float* pw, const float* pr,
                                       float* pdx, int64_t n0, int64_t n1, int64_t C, float* dw) {
  for (int64_t n = n0; n < n1; ++n) {
    const float *drow = pd + n * C, *xrow = px + n * C;
    for (int64_t c = 0; c < C; ++c) dw[c] = drow[c] * pw[c];
    const float r = pr[n], m = dot_lanes(dw, xrow, C) * r / C;
    for (int64_t c = 0; c < C; ++c) pdx[n * C + c] = r * (drow[c] * pw[c] - xrow[c] * r * m);
  }
}

// Columns [c0, c1) of dw (at most 64): dw[c] = sum over the rows in order of (d x) r
NDT_VECTOR_CLONES void rms_dw_columns_f32(const float* pd, const float* px, const float* pr, int64_t N,
                                          int64_t C, int64_t c0, int64_t c1, float* pdw) {
  float aw[64] = {};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = c0; c < c1; ++c) aw[c - c0] += pd[n * C + c] * px[n * C + c] * pr[n];
  for (int64_t c = c0; c < c1; ++c) pdw[c] = aw[c - c0];
}

// x (N,C), w (C) -> out, rstd as rmsnorm_forward below, f32
void rmsnorm_forward_f32(const float* px, const float* pw, float eps, float* po, float* pr, int64_t N,
                         int64_t C) {
  parallel_chunks(
      N, [&](int64_t n0, int64_t n1) { rms_forward_rows_f32(px, pw, eps, po, pr, n0, n1, C); }, C);
}

// dx as rmsnorm_backward below, f32: sum_c dxhat xhat = r sum_c (d w) x
void rmsnorm_dx_f32(const float* pd, const float* px, const float* pw, const float* pr, float* pdx, int64_t N,
                    int64_t C) {
  parallel_chunks(
      N,
      [&](int64_t n0, int64_t n1) {
        std::vector<float> dw(static_cast<size_t>(C));
        rms_dx_rows_f32(pd, px, pw, pr, pdx, n0, n1, C, dw.data());
      },
      C);
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
      if constexpr (std::is_same_v<T, float>) {
        rms_dw_columns_f32(pd, px, pr, N, C, c0, c1, pdw);
        continue;
      }
      A aw[64] = {};
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = c0; c < c1; ++c) aw[c - c0] += load(pd[n * C + c]) * load(px[n * C + c]) * pr[n];
      for (int64_t c = c0; c < c1; ++c) pdw[c] = st<T>(aw[c - c0]);
    }
  });
}

}  // namespace ndt::cpu
