// CPU LayerNorm over the last dim. Legend: N rows, C channels.
//
// f32 and bf16 run through f32 row loops at the machine's vector width (NDT_VECTOR_CLONES),
// with the row sums in kLanes fixed lanes (fastmath.h): the same bits at every width. bf16
// rows are widened to f32 once, computed, and rounded once on the way out. f64 (the
// gradient checks) keeps the plain loops.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

namespace {

// A dense tensor's elements as T (the dispatch picked T from its dtype)
template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// ---- f32 row loops -----------------------------------------------------------------------

// sum_c x[c]
NDT_VECTOR_CLONES float sum_f32(const float* x, int64_t n) {
  float lane[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += x[c + l];
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  for (; c < n; ++c) s += x[c];
  return s;
}

// sum_c (x[c] - m)^2
NDT_VECTOR_CLONES float sum_sq_dev_f32(const float* x, float m, int64_t n) {
  float lane[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float d = x[c + l] - m;
      lane[l] += d * d;
    }
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  for (; c < n; ++c) {
    const float d = x[c] - m;
    s += d * d;
  }
  return s;
}

// out[c] = (x[c] - m) r w[c] + b[c]
NDT_VECTOR_CLONES void normalize_f32(const float* x, float m, float r, const float* w, const float* b,
                                     float* out, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] = (x[c] - m) * r * w[c] + b[c];
}

// out[c] = a[c] + b[c]
NDT_VECTOR_CLONES void add_f32(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t c = 0; c < n; ++c) out[c] = a[c] + b[c];
}

// With xhat = (x - m) r and dxhat = d w: sum_c dxhat xhat (sum_c dxhat is dot_f32(d, w),
// kernels.h). Two loops of one lane array each: GCC turns one loop over two into shuffles.
NDT_VECTOR_CLONES float dxhat_xhat_sum_f32(const float* d, const float* x, const float* w, float m, float r,
                                           int64_t n) {
  float lane[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += (d[c + l] * w[c + l]) * ((x[c + l] - m) * r);
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  for (; c < n; ++c) s += (d[c] * w[c]) * ((x[c] - m) * r);
  return s;
}

// dx[c] = r (dxhat - mean_dxhat - xhat mean_dxhat_xhat) (+ res[c])
NDT_VECTOR_CLONES void layernorm_dx_f32(const float* d, const float* x, const float* w, const float* res,
                                        float m, float r, float mean_dxhat, float mean_dxhat_xhat, float* dx,
                                        int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    const float xhat = (x[c] - m) * r, dxhat = d[c] * w[c];
    const float g = r * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
    dx[c] = res ? g + res[c] : g;
  }
}

// One row's share of dw and db: aw[c] += d[c] xhat[c], ab[c] += d[c]
NDT_VECTOR_CLONES void dw_db_row_f32(const float* d, const float* x, float m, float r, float* aw, float* ab,
                                     int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    aw[c] += d[c] * (x[c] - m) * r;
    ab[c] += d[c];
  }
}

// x as f32: the row itself, or widened into buf (bf16)
const float* widened(const float* x, float*, int64_t) { return x; }
const float* widened(const bf16* x, float* buf, int64_t n) {
  bf16_to_f32(x, buf, n);
  return buf;
}
// where an f32 result for out goes: out itself, or buf to be rounded by narrow()
float* result_at(float* out, float*) { return out; }
float* result_at(bf16*, float* buf) { return buf; }
void narrow(const float*, float*, int64_t) {}
void narrow(const float* buf, bf16* out, int64_t n) { f32_to_bf16(buf, out, n); }

// One row: out = (x - mean) rstd w + b, rstd = 1 / sqrt(var + eps) (biased variance)
void layernorm_row_f32(const float* x, const float* w, const float* b, float eps, int64_t C, float* out,
                       float& mean, float& rstd) {
  const float m = sum_f32(x, C) / C;
  const float v = sum_sq_dev_f32(x, m, C) / C;
  const float r = 1.0f / std::sqrt(v + eps);
  normalize_f32(x, m, r, w, b, out, C);
  mean = m;
  rstd = r;
}

// ---- f64: the plain loops (forward) -------------------------------------------------------

void layernorm_row_f64(const double* row, const double* pw, const double* pb, double eps, int64_t C,
                       double* out, double& mean, double& rstd) {
  double m = 0;
  for (int64_t c = 0; c < C; ++c) m += row[c];
  m /= C;
  double v = 0;
  for (int64_t c = 0; c < C; ++c) v += (row[c] - m) * (row[c] - m);
  v /= C;
  const double r = 1.0 / std::sqrt(v + eps);
  for (int64_t c = 0; c < C; ++c) out[c] = (row[c] - m) * r * pw[c] + pb[c];
  mean = m;
  rstd = r;
}

// ---- f32 and bf16 through the f32 row loops ------------------------------------------------

// Rows of x, or of sum = a + b (rounded to T and stored first, then normalized) -> out,
// mean, rstd.
template <typename T>
void layernorm_rows(const T* pa, const T* pb, T* psum, const T* pw, const T* pbias, float eps, T* po,
                    float* pm, float* pr, int64_t N, int64_t C) {
  std::vector<float> wb(2 * C);  // bf16 only: w and bias widened
  const float *w = widened(pw, wb.data(), C), *bias = widened(pbias, wb.data() + C, C);
#pragma omp parallel if (N * C > 16384)
  {
    std::vector<float> buf(3 * C);  // bf16 only: the row, and two more
    float *b0 = buf.data(), *b1 = b0 + C, *b2 = b1 + C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* row = pa + n * C;
      if (pb) {  // as add, then LayerNorm of the stored sum while it is hot
        T* srow = psum + n * C;
        float* s = result_at(srow, b0);
        add_f32(widened(row, b1, C), widened(pb + n * C, b2, C), s, C);
        narrow(s, srow, C);
        row = srow;
      }
      float* out = result_at(po + n * C, b1);
      layernorm_row_f32(widened(row, b0, C), w, bias, eps, C, out, pm[n], pr[n]);
      narrow(out, po + n * C, C);
    }
  }
}

// In the forward, xhat = (x - mean) rstd and out = xhat w + b; so
//   db = sum_n dout,  dw = sum_n dout xhat,
//   dx = rstd (dxhat - mean_c(dxhat) - xhat mean_c(dxhat xhat)),  dxhat = dout w
// With dresidual (pres): dx += dresidual, in the same pass.
template <typename T>
void layernorm_backward_rows(const T* pd, const T* px, const T* pw, const float* pm, const float* pr,
                             const T* pres, T* pdx, T* pdw, T* pdb, int64_t N, int64_t C) {
  std::vector<float> wb(C);  // bf16 only: w widened
  const float* w = widened(pw, wb.data(), C);
  // dx: rows are independent
#pragma omp parallel if (N * C > 16384)
  {
    std::vector<float> buf(4 * C);  // bf16 only: dout, x, dresidual and dx rows
    float *bd = buf.data(), *bx = bd + C, *br = bx + C, *bo = br + C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float *d = widened(pd + n * C, bd, C), *x = widened(px + n * C, bx, C);
      const float* res = pres ? widened(pres + n * C, br, C) : nullptr;
      const float mean_dxhat = dot_f32(d, w, C) / C;
      const float mean_dxhat_xhat = dxhat_xhat_sum_f32(d, x, w, pm[n], pr[n], C) / C;
      float* dx = result_at(pdx + n * C, bo);
      layernorm_dx_f32(d, x, w, res, pm[n], pr[n], mean_dxhat, mean_dxhat_xhat, dx, C);
      narrow(dx, pdx + n * C, C);
    }
  }
  // dw, db: columns are independent, each thread a slice of them (a multiple of kLanes, at
  // most 512); every column's rows summed in order, so the slices' width does not matter
  const int64_t parts = N * C > 16384 ? omp_get_max_threads() : 1;
  const int64_t width =
      std::clamp<int64_t>((C + parts * kLanes - 1) / (parts * kLanes) * kLanes, kLanes, 512);
#pragma omp parallel for schedule(static) if (parts > 1)
  for (int64_t c0 = 0; c0 < C; c0 += width) {
    const int64_t m = std::min(width, C - c0);
    float aw[512] = {}, ab[512] = {}, bd[512], bx[512];
    for (int64_t n = 0; n < N; ++n)
      dw_db_row_f32(widened(pd + n * C + c0, bd, m), widened(px + n * C + c0, bx, m), pm[n], pr[n], aw, ab,
                    m);
    for (int64_t c = 0; c < m; ++c) {
      pdw[c0 + c] = st<T>(aw[c]);
      pdb[c0 + c] = st<T>(ab[c]);
    }
  }
}

// ---- f64: the plain loops (backward) ------------------------------------------------------

void layernorm_backward_f64(const double* pd, const double* px, const double* pw, const double* pm,
                            const double* pr, const double* pres, double* pdx, double* pdw, double* pdb,
                            int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (int64_t n = 0; n < N; ++n) {
    const double *drow = pd + n * C, *xrow = px + n * C;
    double mean_dxhat = 0, mean_dxhat_xhat = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (xrow[c] - pm[n]) * pr[n], dxhat = drow[c] * pw[c];
      mean_dxhat += dxhat;
      mean_dxhat_xhat += dxhat * xhat;
    }
    mean_dxhat /= C;
    mean_dxhat_xhat /= C;
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (xrow[c] - pm[n]) * pr[n], dxhat = drow[c] * pw[c];
      const double g = pr[n] * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
      pdx[n * C + c] = pres ? g + pres[n * C + c] : g;
    }
  }
#pragma omp parallel for schedule(static) if (N * C > 16384)
  for (int64_t c = 0; c < C; ++c) {
    double aw = 0, ab = 0;
    for (int64_t n = 0; n < N; ++n) {
      aw += pd[n * C + c] * (px[n * C + c] - pm[n]) * pr[n];
      ab += pd[n * C + c];
    }
    pdw[c] = aw;
    pdb[c] = ab;
  }
}

}  // namespace

// x (N,C), w (C), b (C) -> out (N,C), mean (N), rstd (N)
void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& out,
                       const Tensor& mean, const Tensor& rstd) {
  add_layernorm_forward(x, Tensor(), w, b, eps, Tensor(), out, mean, rstd);
}

// a, b (N,C) -> sum = a + b (N,C), then the LayerNorm of each sum row while it is hot;
// b undefined: the LayerNorm of a (sum unused)
void add_layernorm_forward(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& bias, double eps,
                           const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  const char* op = b.defined() ? "add_layernorm_forward" : "layernorm_forward";
  dispatch_float(a.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const int64_t C = a.size(-1), N = C ? a.numel() / C : 0;
    const T* pb = b.defined() ? ptr<T>(b) : nullptr;
    T* ps = b.defined() ? ptr<T>(sum) : nullptr;
    if constexpr (std::is_same_v<T, double>) {
      double *pm = ptr<double>(mean), *pr = ptr<double>(rstd);
#pragma omp parallel for schedule(static) if (N * C > 16384)
      for (int64_t n = 0; n < N; ++n) {
        const double* row = ptr<double>(a) + n * C;
        if (pb) {
          for (int64_t c = 0; c < C; ++c) ps[n * C + c] = row[c] + pb[n * C + c];
          row = ps + n * C;
        }
        layernorm_row_f64(row, ptr<double>(w), ptr<double>(bias), eps, C, ptr<double>(out) + n * C, pm[n],
                          pr[n]);
      }
    } else {
      layernorm_rows<T>(ptr<T>(a), pb, ps, ptr<T>(w), ptr<T>(bias), static_cast<float>(eps), ptr<T>(out),
                        ptr<float>(mean), ptr<float>(rstd), N, C);
    }
  });
}

// dout, x (N,C), w (C), mean, rstd (N) -> dx (N,C), dw, db (C); with dresidual (N,C):
// dx += dresidual, in the same pass
void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db,
                        const Tensor& dresidual) {
  dispatch_float(x.dtype(), "layernorm_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
    const T* pres = dresidual.defined() ? ptr<T>(dresidual) : nullptr;
    if constexpr (std::is_same_v<T, double>)
      layernorm_backward_f64(ptr<double>(dout), ptr<double>(x), ptr<double>(w), ptr<double>(mean),
                             ptr<double>(rstd), pres, ptr<double>(dx), ptr<double>(dw), ptr<double>(db), N,
                             C);
    else
      layernorm_backward_rows<T>(ptr<T>(dout), ptr<T>(x), ptr<T>(w), ptr<float>(mean), ptr<float>(rstd), pres,
                                 ptr<T>(dx), ptr<T>(dw), ptr<T>(db), N, C);
  });
}

}  // namespace ndt::cpu
