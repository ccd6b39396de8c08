// Causal self-attention on the CPU, straight from the packed (B,T,3C) output of c_attn:
// q, k and v are read where c_attn wrote them and the output is written in the (B,T,C)
// layout c_proj reads, so no head is ever copied out or back. Flash-style blocks: a block of
// BQ queries computes its scores against the keys it can see only (the causal half above the
// diagonal is skipped), so the largest score buffer is BQ x T per thread, not T x T per head;
// backward computes the probabilities again from q, k and the saved log-sum-exp.
//
// Legend: B batch, T sequence, C = NH * HS channels, NH heads, HS head size; a block holds
// queries [r0, r1), nr = r1 - r0 of them, and sees keys [0, r1). Row strides: qkv 3C, y C.
//
// Every (b, h, query block) of the forward, and every (b, h) of the backward, is one task of
// an OpenMP loop whose GEMMs run on one thread each (OpenBLAS runs single-threaded inside a
// parallel region). Tasks write disjoint outputs and each sums in a fixed order, so results
// do not depend on the number of threads or on the schedule.
#include <omp.h>

#include <cblas.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {
namespace {

constexpr int64_t kBlockQ = 64;  // queries per block

// C (m,n) = alpha op(A) op(B) + beta C, row-major with leading dimensions: the strided head
// views need nothing more than lda = 3C.
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha,
              a, lda, b, ldb, beta, c, ldc);
}
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
               const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha,
              a, lda, b, ldb, beta, c, ldc);
}

// The lanes' sum in their fixed order (kLanes, tensor/cpu/fastmath.h).
template <typename T>
T lanes_total(const T (&acc)[kLanes]) {
  T s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// One row of scaled scores s[0, nk), of which keys [0, nvis) are visible (nvis >= 1):
// p = exp(s - lse) there and 0 beyond, in place; returns lse = log sum_visible exp(s).
template <typename T>
T softmax_row(T* s, int64_t nvis, int64_t nk) {
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < nvis; ++j) mx = s[j] > mx ? s[j] : mx;
  T acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= nvis; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += fast_exp(s[j + l] - mx);
  for (int l = 0; j < nvis; ++j, ++l) acc[l] += fast_exp(s[j] - mx);
  const T lse = mx + std::log(lanes_total(acc));
  for (j = 0; j < nvis; ++j) s[j] = fast_exp(s[j] - lse);
  for (; j < nk; ++j) s[j] = T(0);
  return lse;
}
// The f32 rows, vectorized at the machine's width (NDT_VECTOR_CLONES).
NDT_VECTOR_CLONES float softmax_row_f32(float* s, int64_t nvis, int64_t nk) {
  return softmax_row(s, nvis, nk);
}
float softmax_row_of(float* s, int64_t nvis, int64_t nk) { return softmax_row_f32(s, nvis, nk); }
double softmax_row_of(double* s, int64_t nvis, int64_t nk) { return softmax_row(s, nvis, nk); }

// The probabilities of one row again, from the scaled scores and the saved lse.
template <typename T>
void probs_row(T* s, int64_t nvis, int64_t nk, T lse) {
  int64_t j = 0;
  for (; j < nvis; ++j) s[j] = fast_exp(s[j] - lse);
  for (; j < nk; ++j) s[j] = T(0);
}
NDT_VECTOR_CLONES void probs_row_f32(float* s, int64_t nvis, int64_t nk, float lse) {
  probs_row(s, nvis, nk, lse);
}
void probs_row_of(float* s, int64_t nvis, int64_t nk, float lse) { probs_row_f32(s, nvis, nk, lse); }
void probs_row_of(double* s, int64_t nvis, int64_t nk, double lse) { probs_row(s, nvis, nk, lse); }

// ds = scale * p * (dp - d) over one row (in place in dp), and d = sum over HS of dy * y.
template <typename T>
void softmax_grad_row(const T* p, T* dp, int64_t nk, T d, T scale) {
  for (int64_t j = 0; j < nk; ++j) dp[j] = scale * p[j] * (dp[j] - d);
}
NDT_VECTOR_CLONES void softmax_grad_row_f32(const float* p, float* dp, int64_t nk, float d, float scale) {
  softmax_grad_row(p, dp, nk, d, scale);
}
void softmax_grad_row_of(const float* p, float* dp, int64_t nk, float d, float scale) {
  softmax_grad_row_f32(p, dp, nk, d, scale);
}
void softmax_grad_row_of(const double* p, double* dp, int64_t nk, double d, double scale) {
  softmax_grad_row(p, dp, nk, d, scale);
}

template <typename T>
T dot_row(const T* a, const T* b, int64_t n) {
  T acc[kLanes] = {};
  int64_t h = 0;
  for (; h + kLanes <= n; h += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[h + l] * b[h + l];
  for (int l = 0; h < n; ++h, ++l) acc[l] += a[h] * b[h];
  return lanes_total(acc);
}

struct Dims {
  int64_t B, T, C, NH, HS;
  int64_t blocks() const { return (T + kBlockQ - 1) / kBlockQ; }
};

Dims dims_of(const Tensor& qkv, int64_t n_head) {
  const int64_t C = qkv.size(2) / 3;
  return {qkv.size(0), qkv.size(1), C, n_head, C / n_head};
}

template <typename T>
void forward_impl(const Dims& d, const T* qkv, T* y, T* lse, T scale) {
  const int64_t C3 = 3 * d.C, nb = d.blocks(), tasks = d.B * d.NH * nb;
  // later blocks see more keys: hand them out first (dynamic), so the last tasks are short
#pragma omp parallel if (tasks > 1 && d.T * d.T * d.HS > 16384)
  {
    std::vector<T> s(static_cast<size_t>(kBlockQ * d.T));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t blk = nb - 1 - task % nb, bh = task / nb, b = bh / d.NH, h = bh % d.NH;
      const int64_t r0 = blk * kBlockQ, r1 = std::min(d.T, r0 + kBlockQ), nr = r1 - r0, nk = r1;
      const T* q = qkv + (b * d.T + r0) * C3 + h * d.HS;  // (nr, HS), row stride 3C
      const T* k = qkv + b * d.T * C3 + d.C + h * d.HS;   // (nk, HS)
      const T* v = k + d.C;                               // (nk, HS)
      blas_gemm(false, true, nr, nk, d.HS, scale, q, C3, k, C3, T(0), s.data(), nk);  // s = scale q k^T
      for (int64_t i = 0; i < nr; ++i)
        lse[bh * d.T + r0 + i] = softmax_row_of(s.data() + i * nk, r0 + i + 1, nk);
      blas_gemm(false, false, nr, d.HS, nk, T(1), s.data(), nk, v, C3, T(0),
                y + (b * d.T + r0) * d.C + h * d.HS,
                d.C);  // y = p v
    }
  }
}

template <typename T>
void backward_impl(const Dims& d, const T* qkv, const T* y, const T* lse, const T* dy, T* dqkv, T scale) {
  const int64_t C3 = 3 * d.C, nb = d.blocks(), tasks = d.B * d.NH;
#pragma omp parallel if (tasks > 1 && d.T * d.T * d.HS > 16384)
  {
    std::vector<T> p(static_cast<size_t>(kBlockQ * d.T)), dp(p.size()), dd(kBlockQ);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < tasks; ++bh) {
      const int64_t b = bh / d.NH, h = bh % d.NH, row0 = b * d.T;
      const T* k = qkv + row0 * C3 + d.C + h * d.HS;
      const T* v = k + d.C;
      T* dk = dqkv + row0 * C3 + d.C + h * d.HS;
      T* dv = dk + d.C;
      // the last block sees every key: it writes dk and dv (beta 0), the earlier ones add
      for (int64_t blk = nb - 1; blk >= 0; --blk) {
        const int64_t r0 = blk * kBlockQ, r1 = std::min(d.T, r0 + kBlockQ), nr = r1 - r0, nk = r1;
        const T beta = blk == nb - 1 ? T(0) : T(1);
        const T* q = qkv + (row0 + r0) * C3 + h * d.HS;
        const T* yb = y + (row0 + r0) * d.C + h * d.HS;
        const T* dyb = dy + (row0 + r0) * d.C + h * d.HS;
        T* dq = dqkv + (row0 + r0) * C3 + h * d.HS;
        // forward: s = scale q k^T, p = exp(s - lse) (masked), y = p v; so
        //   dv = p^T dy,  dp = dy v^T,  ds = scale p (dp - rowsum(dy * y)),  dq = ds k,  dk = ds^T q
        // (the scale of s is in ds; the GEMM for s is the forward's again)
        blas_gemm(false, true, nr, nk, d.HS, scale, q, C3, k, C3, T(0), p.data(), nk);
        for (int64_t i = 0; i < nr; ++i) {
          probs_row_of(p.data() + i * nk, r0 + i + 1, nk, lse[bh * d.T + r0 + i]);
          dd[i] = dot_row(dyb + i * d.C, yb + i * d.C, d.HS);
        }
        blas_gemm(true, false, nk, d.HS, nr, T(1), p.data(), nk, dyb, d.C, beta, dv, C3);
        blas_gemm(false, true, nr, nk, d.HS, T(1), dyb, d.C, v, C3, T(0), dp.data(), nk);
        for (int64_t i = 0; i < nr; ++i)
          softmax_grad_row_of(p.data() + i * nk, dp.data() + i * nk, nk, dd[i], scale);
        blas_gemm(false, false, nr, d.HS, nk, T(1), dp.data(), nk, k, C3, T(0), dq, C3);
        blas_gemm(true, false, nk, d.HS, nr, T(1), dp.data(), nk, q, C3, beta, dk, C3);
      }
    }
  }
}

template <typename F>
void dispatch_f32_f64(DType dt, const char* op, F&& f) {
  if (dt == DType::f32) return f(float{});
  if (dt == DType::f64) return f(double{});
  NDT_FAIL(op, ": dtype ", dtype_name(dt), " is not supported (float32 or float64; bf16 is computed in f32)");
}

}  // namespace

void self_attention_forward(const Tensor& qkv, int64_t n_head, double scale, const Tensor& y,
                            const Tensor& lse) {
  const Dims d = dims_of(qkv, n_head);
  if (d.B * d.T == 0) return;
  dispatch_f32_f64(qkv.dtype(), "self_attention_forward", [&](auto tag) {
    using T = decltype(tag);
    forward_impl<T>(d, qkv.data<T>(), y.data<T>(), lse.data<T>(), static_cast<T>(scale));
  });
}

void self_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& lse, const Tensor& dy,
                             int64_t n_head, double scale, const Tensor& dqkv) {
  const Dims d = dims_of(qkv, n_head);
  if (d.B * d.T == 0) return;
  dispatch_f32_f64(qkv.dtype(), "self_attention_backward", [&](auto tag) {
    using T = decltype(tag);
    backward_impl<T>(d, qkv.data<T>(), y.data<T>(), lse.data<T>(), dy.data<T>(), dqkv.data<T>(),
                     static_cast<T>(scale));
  });
}

}  // namespace ndt::cpu
