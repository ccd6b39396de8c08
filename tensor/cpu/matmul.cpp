// CPU GEMM. f32 -> OpenBLAS sgemm, or oneDNN's f32 matmul where it was measured faster on
// this kind of CPU (f32_gemm_on_onednn()); f64 -> dgemm; bf16 -> oneDNN's bf16 kernels where
// the CPU has bf16 instructions (tensor/cpu/onednn_gemm.cpp), otherwise converted to f32,
// sgemm, rounded back. Either way f32 accumulation and one rounding to bf16, as on the GPU.
#include <cblas.h>

#include <exception>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/onednn_gemm.h"
#include "tensor/threads.h"

namespace ndt::cpu {
namespace {

struct GemmDims {
  int64_t batch, m, n, k;
  bool b_shared;  // 2-D b used by every batch
};

GemmDims gemm_dims(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c) {
  GemmDims g{};
  const int64_t ad = a.dim();
  g.batch = ad == 3 ? a.size(0) : 1;
  g.m = ta ? a.size(-1) : a.size(-2);
  g.k = ta ? a.size(-2) : a.size(-1);
  g.n = tb ? b.size(-2) : b.size(-1);
  g.b_shared = b.dim() == 2 && ad == 3;
  return g;
}

Tensor to_f32(const Tensor& t) { return t.dtype() == DType::f32 ? t : t.to(DType::f32); }

// oneDNN for bf16 operands where bf16_gemm_on_onednn() says so (tensor/cpu/onednn_gemm.h)
bool bf16_on_onednn(const Tensor& a, const Tensor& b, const Tensor& c) {
  if (a.dtype() != DType::bf16 || b.dtype() != DType::bf16 || c.dtype() != DType::bf16) return false;
  return bf16_gemm_on_onednn();
}

// ... and for f32 operands where f32_gemm_on_onednn() says so
bool f32_on_onednn(const Tensor& a, const Tensor& b, const Tensor& c) {
  if (a.dtype() != DType::f32 || b.dtype() != DType::f32 || c.dtype() != DType::f32) return false;
  return f32_gemm_on_onednn();
}

}  // namespace

void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha, double beta) {
  const GemmDims g = gemm_dims(a, ta, b, tb, c);
  const int64_t sa = g.m * g.k, sb = g.b_shared ? 0 : g.k * g.n, sc = g.m * g.n;
  const CBLAS_TRANSPOSE opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  const int lda = ta ? g.m : g.k, ldb = tb ? g.k : g.n, ldc = g.n;
  if (g.m == 0 || g.n == 0) return;
  if (c.dtype() == DType::f64) {
    const double *pa = a.data<double>(), *pb = b.data<double>();
    double* pc = c.data<double>();
    if (g.b_shared && !ta) {  // one big GEMM: (batch*m, k) @ (k, n)
      cblas_dgemm(CblasRowMajor, opa, opb, g.batch * g.m, g.n, g.k, alpha, pa, lda, pb, ldb, beta, pc, ldc);
      return;
    }
    for (int64_t i = 0; i < g.batch; ++i)
      cblas_dgemm(CblasRowMajor, opa, opb, g.m, g.n, g.k, alpha, pa + i * sa, lda, pb + i * sb, ldb, beta,
                  pc + i * sc, ldc);
    return;
  }
  if (g.k > 0 && (bf16_on_onednn(a, b, c) || f32_on_onednn(a, b, c))) {
    onednn_gemm(a, ta, b, tb, c, static_cast<float>(alpha), static_cast<float>(beta));
    return;
  }
  // f32 (and bf16 through f32)
  const bool is_bf16 = c.dtype() == DType::bf16;
  Tensor a32 = to_f32(a), b32 = to_f32(b);
  Tensor c32 = is_bf16 ? (beta != 0.0f ? c.to(DType::f32) : Tensor::empty(c.shape(), DType::f32)) : c;
  const float *pa = a32.data<float>(), *pb = b32.data<float>();
  float* pc = c32.data<float>();
  if (g.b_shared && !ta) {
    cblas_sgemm(CblasRowMajor, opa, opb, g.batch * g.m, g.n, g.k, alpha, pa, lda, pb, ldb, beta, pc, ldc);
  } else {
    for (int64_t i = 0; i < g.batch; ++i)
      cblas_sgemm(CblasRowMajor, opa, opb, g.m, g.n, g.k, alpha, pa + i * sa, lda, pb + i * sb, ldb, beta,
                  pc + i * sc, ldc);
  }
  if (is_bf16) copy(c, c32);
}

// gemm whose row count changes from call to call (a grouped GEMM's groups, whose sizes follow
// the router). gemm's oneDNN primitives are built per shape, and building one (picking and
// JIT-compiling a kernel) costs more than running it: a few hundred per MoE step. So f32 runs
// on one oneDNN primitive for every row count where f32 goes to oneDNN
// (onednn_gemm_any_rows), else on OpenBLAS's sgemm, which costs nothing per shape; other
// dtypes as gemm.
void gemm_any_rows(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha,
                   double beta) {
  const bool bf16 = a.dtype() == DType::bf16 && b.dtype() == DType::bf16 && c.dim() == 2 && a.dim() == 2 &&
                    b.dim() == 2 && bf16_on_onednn(a, b, c);
  if (bf16) {
    const GemmDims g = gemm_dims(a, ta, b, tb, c);
    if (g.m > 0 && g.n > 0 && g.k > 0)
      onednn_gemm_any_rows(a, ta, b, tb, c, static_cast<float>(alpha), static_cast<float>(beta));
    else if (g.m > 0 && g.n > 0)
      gemm(a, ta, b, tb, c, alpha, beta);
    return;
  }
  if (a.dtype() != DType::f32 || b.dtype() != DType::f32 || c.dtype() != DType::f32 || a.dim() != 2 ||
      b.dim() != 2) {
    gemm(a, ta, b, tb, c, alpha, beta);
    return;
  }
  const GemmDims g = gemm_dims(a, ta, b, tb, c);
  if (g.m == 0 || g.n == 0) return;
  if (g.k > 0 && f32_gemm_on_onednn()) {
    onednn_gemm_any_rows(a, ta, b, tb, c, static_cast<float>(alpha), static_cast<float>(beta));
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, g.m, g.n, g.k,
              static_cast<float>(alpha), a.data<float>(), ta ? g.m : g.k, b.data<float>(), tb ? g.k : g.n,
              static_cast<float>(beta), c.data<float>(), g.n);
}

namespace {

// f(g, lo, m) for every group g with rows (its m rows from row lo). An expert's GEMM is small (its
// share of the routed rows), and one split over the threads waits at each of its barriers, so
// where there are at least two such groups per thread each runs whole on one thread, the
// groups handed out to the threads in turn (gemm_any_rows then runs single-threaded: OpenBLAS
// inside a parallel region, oneDNN on a primitive built for one thread). Each group's result
// is then the same at any thread count. Fewer groups: one after the other, each GEMM on every
// thread. An exception in a group (out of memory) is rethrown after the loop.
template <typename F>
void for_each_group(const std::vector<int64_t>& counts, F&& f) {
  std::vector<int64_t> groups, first;  // the groups with rows, and their first rows
  int64_t lo = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] > 0) groups.push_back(static_cast<int64_t>(g)), first.push_back(lo);
    lo += counts[g];
  }
  const int64_t n = static_cast<int64_t>(groups.size());
  if (num_threads() < 2 || n < 2 * num_threads()) {
    for (int64_t i = 0; i < n; ++i) f(groups[i], first[i], counts[static_cast<size_t>(groups[i])]);
    return;
  }
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < n; ++i) {
    try {
      f(groups[i], first[i], counts[static_cast<size_t>(groups[i])]);
    } catch (...) {
#pragma omp critical(ndt_grouped_gemm)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

// group g: c's rows [lo, lo + m) = a's rows times b[g] (transposed where trans_b)
void grouped_gemm(const Tensor& a, const Tensor& b, bool trans_b, const Tensor& c,
                  const std::vector<int64_t>& counts) {
  for_each_group(counts, [&](int64_t g, int64_t lo, int64_t m) {
    gemm_any_rows(a.narrow(0, lo, m), false, b.select(0, g), trans_b, c.narrow(0, lo, m), 1.0, 0.0);
  });
}

// group g: dw[g] (+)= a's rows^T dc's rows (beta 1: added); groups without rows untouched
void grouped_gemm_dw(const Tensor& a, const Tensor& dc, const std::vector<int64_t>& counts, const Tensor& dw,
                     double beta) {
  for_each_group(counts, [&](int64_t g, int64_t lo, int64_t m) {
    gemm_any_rows(a.narrow(0, lo, m), true, dc.narrow(0, lo, m), false, dw.select(0, g), 1.0, beta);
  });
}

// x (M,K) @ w (K,N) (+ bias) (-> GELU, keeping pre): the composed ops' arithmetic. With a
// bias (f32, f64), y starts as the bias in every row and the GEMM adds x @ w to it (beta 1):
// one pass over y instead of two (OpenBLAS's zeroing for beta 0, then the bias add), and the
// same rounding, fl(x @ w + bias). On oneDNN (bf16, or f32 where it runs f32): the bias added
// in the f32 accumulator before the one rounding; bf16 through f32: gemm, then add.
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, bool gelu, const Tensor& out,
                    const Tensor& pre) {
  const Tensor& y = gelu ? pre : out;
  const bool on_onednn = x.size(-1) > 0 && (bf16_on_onednn(x, w, y) || f32_on_onednn(x, w, y));
  if (y.numel() > 0 && on_onednn && (!bias.defined() || bias.dtype() == y.dtype())) {
    onednn_gemm(x, false, w, false, y, 1.0f, 0.0f, bias);
  } else if (bias.defined() && y.dtype() != DType::bf16 && y.numel() > 0) {
    const int64_t n = y.size(-1), rows = y.numel() / n;
    const size_t row_bytes = static_cast<size_t>(n) * dtype_size(y.dtype());
    auto* py = static_cast<char*>(y.data_ptr());
    const auto* pb = static_cast<const char*>(bias.data_ptr());
#pragma omp parallel for schedule(static) if (rows * n > 65536)
    for (int64_t r = 0; r < rows; ++r) std::memcpy(py + r * row_bytes, pb, row_bytes);
    gemm(x, false, w, false, y, 1.0, 1.0);
  } else {
    gemm(x, false, w, false, y, 1.0, 0.0);
    if (bias.defined()) add(y, bias, y, 1.0, 1.0);
  }
  if (gelu) gelu_forward(pre, out);
}

}  // namespace ndt::cpu
