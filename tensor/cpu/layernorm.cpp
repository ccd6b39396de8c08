// CPU LayerNorm over the last dim. Legend: N rows, C channels.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

namespace {

// One row: out = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps) (biased variance)
template <typename T, typename A>
void layernorm_row(const T* row, const T* pw, const T* pb, A eps, int64_t C, T* out, A& mean, A& rstd) {
  A m = 0;
  for (int64_t c = 0; c < C; ++c) m += load(row[c]);
  m /= C;
  A v = 0;
  for (int64_t c = 0; c < C; ++c) {
    const A d = load(row[c]) - m;
    v += d * d;
  }
  v /= C;
  const A r = A(1) / std::sqrt(v + eps);
  for (int64_t c = 0; c < C; ++c) out[c] = st<T>((load(row[c]) - m) * r * load(pw[c]) + load(pb[c]));
  mean = m;
  rstd = r;
}

}  // namespace

// x (N,C), w (C), b (C) -> out (N,C), mean (N), rstd (N)
void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& out,
                       const Tensor& mean, const Tensor& rstd) {
  dispatch_float(x.dtype(), "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
    const T *px = static_cast<const T*>(x.data_ptr()), *pw = static_cast<const T*>(w.data_ptr()),
            *pb = static_cast<const T*>(b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    A* pm = static_cast<A*>(mean.data_ptr());
    A* pr = static_cast<A*>(rstd.data_ptr());
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t n = 0; n < N; ++n)
      layernorm_row<T, A>(px + n * C, pw, pb, A(eps), C, po + n * C, pm[n], pr[n]);
  });
}

// a, b (N,C) -> sum = a + b (N,C), then the LayerNorm of each sum row while it is hot
void add_layernorm_forward(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& bias, double eps,
                           const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  dispatch_float(a.dtype(), "add_layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t C = a.size(-1), N = C ? a.numel() / C : 0;
    const T *pa = static_cast<const T*>(a.data_ptr()), *pb = static_cast<const T*>(b.data_ptr()),
            *pw = static_cast<const T*>(w.data_ptr()), *pbias = static_cast<const T*>(bias.data_ptr());
    T *ps = static_cast<T*>(sum.data_ptr()), *po = static_cast<T*>(out.data_ptr());
    A* pm = static_cast<A*>(mean.data_ptr());
    A* pr = static_cast<A*>(rstd.data_ptr());
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t n = 0; n < N; ++n) {
      T* srow = ps + n * C;
      for (int64_t c = 0; c < C; ++c) srow[c] = st<T>(load(pa[n * C + c]) + load(pb[n * C + c]));  // as add
      layernorm_row<T, A>(srow, pw, pbias, A(eps), C, po + n * C, pm[n], pr[n]);
    }
  });
}

// In the forward, xhat = (x - mean) * rstd and out = xhat * w + b; so
//   db = sum_n dout,  dw = sum_n dout * xhat,
//   dx = rstd * (dxhat - mean_c(dxhat) - xhat * mean_c(dxhat * xhat)),  dxhat = dout * w
// With dresidual: dx += dresidual, in the same pass.
void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db,
                        const Tensor& dresidual) {
  dispatch_float(x.dtype(), "layernorm_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
    const T *pd = static_cast<const T*>(dout.data_ptr()), *px = static_cast<const T*>(x.data_ptr()),
            *pw = static_cast<const T*>(w.data_ptr());
    const A* pm = static_cast<const A*>(mean.data_ptr());
    const A* pr = static_cast<const A*>(rstd.data_ptr());
    T* pdx = static_cast<T*>(dx.data_ptr());
    const T* pres = dresidual.defined() ? static_cast<const T*>(dresidual.data_ptr()) : nullptr;
    // dx: rows are independent
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t n = 0; n < N; ++n) {
      const T *drow = pd + n * C, *xrow = px + n * C;
      A mean_dxhat = 0, mean_dxhat_xhat = 0;
      for (int64_t c = 0; c < C; ++c) {
        const A xhat = (load(xrow[c]) - pm[n]) * pr[n];
        const A dxhat = load(drow[c]) * load(pw[c]);
        mean_dxhat += dxhat;
        mean_dxhat_xhat += dxhat * xhat;
      }
      mean_dxhat /= C;
      mean_dxhat_xhat /= C;
      for (int64_t c = 0; c < C; ++c) {
        const A xhat = (load(xrow[c]) - pm[n]) * pr[n];
        const A dxhat = load(drow[c]) * load(pw[c]);
        const A g = pr[n] * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
        pdx[n * C + c] = st<T>(pres ? g + load(pres[n * C + c]) : g);
      }
    }
    // dw, db: columns are independent; rows summed in order (deterministic)
    T *pdw = static_cast<T*>(dw.data_ptr()), *pdb = static_cast<T*>(db.data_ptr());
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t c0 = 0; c0 < C; c0 += 64) {
      const int64_t c1 = std::min(C, c0 + 64);
      A aw[64] = {}, ab[64] = {};
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = c0; c < c1; ++c) {
          const A d = load(pd[n * C + c]);
          aw[c - c0] += d * (load(px[n * C + c]) - pm[n]) * pr[n];
          ab[c - c0] += d;
        }
      for (int64_t c = c0; c < c1; ++c) {
        pdw[c] = st<T>(aw[c - c0]);
        pdb[c] = st<T>(ab[c - c0]);
      }
    }
  });
}

}  // namespace ndt::cpu
