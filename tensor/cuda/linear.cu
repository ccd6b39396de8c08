// A linear layer's forward with its bias (and GELU) fused into the GEMM as a cuBLASLt
// epilogue, the twin of linear_forward in tensor/cpu/matmul.cpp. Legend: M rows (tokens),
// K in, N out channels.
//
//   out = x (M,K) @ w (K,N) + bias (N)              epilogue BIAS
//   out = GELU(x @ w + bias), pre = x @ w + bias    epilogue GELU_AUX_BIAS (pre kept for the
//                                                   backward; tanh GELU, as gelu_forward)
// The bias is added to the f32 accumulator before the one rounding to the output dtype.
// Row-major out (M,N) is column-major out^T (N,M) = w^T (N,K) @ x^T (K,M): w is cuBLASLt's A
// and x its B, untransposed, and the bias runs along out^T's rows, as cuBLASLt adds it.
// Where cuBLASLt offers no algorithm for the shapes, dtypes and pointer alignments, the
// launcher composes gemm, add and gelu_forward instead (the same arithmetic as the CPU).
#include <cublasLt.h>

#include <climits>
#include <mutex>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"

#define NDT_CUBLASLT_CHECK(expr)                                                                           \
  do {                                                                                                     \
    const cublasStatus_t ndt_st_ = (expr);                                                                 \
    if (ndt_st_ != CUBLAS_STATUS_SUCCESS)                                                                  \
      ::ndt::detail::throw_error(__FILE__, __LINE__,                                                       \
                                 ::ndt::detail::cat("cuBLASLt error ", cublasGetStatusName(ndt_st_), " (", \
                                                    cublasGetStatusString(ndt_st_), ") in ", #expr));      \
  } while (0)

namespace ndt::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // what cuBLAS asks for on Hopper

// One cuBLASLt handle per device, created on first use and kept (as the cuBLAS handles).
cublasLtHandle_t lt_handle(int device) {
  static std::mutex mu;
  static cublasLtHandle_t handles[16] = {};
  NDT_CHECK(device >= 0 && device < 16, "cuBLASLt: device ", device, " out of range");
  std::lock_guard<std::mutex> lock(mu);
  if (!handles[device]) NDT_CUBLASLT_CHECK(cublasLtCreate(&handles[device]));
  return handles[device];
}

// The descriptors of one call, destroyed on every path out.
struct LtCall {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtCall() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Runs the fused GEMM; false when cuBLASLt has no algorithm for it (nothing was launched).
bool lt_linear(const Tensor& x, const Tensor& w, const Tensor& bias, bool gelu, const Tensor& out,
               const Tensor& pre, int device, cudaStream_t stream) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(1);
  const cudaDataType t = out.dtype() == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  const cublasComputeType_t compute =
      out.dtype() == DType::f32 && allow_tf32(device) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LtCall c;
  NDT_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&c.op, compute, CUDA_R_32F));
  const cublasOperation_t no = CUBLAS_OP_N;
  NDT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, &no, sizeof(no)));
  NDT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof(no)));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (bias.defined()) epi = gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
  NDT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (bias.defined()) {
    const void* bp = bias.data_ptr();
    NDT_CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
  }
  if (gelu) {
    if (N % 8 != 0) return false;  // the aux leading dimension must be a multiple of 8
    void* ap = pre.data_ptr();
    const int64_t ld = N;
    NDT_CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ap, sizeof(ap)));
    NDT_CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
  }
  // column-major: A = w^T (N,K) ld N, B = x^T (K,M) ld K, D = out^T (N,M) ld N
  NDT_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&c.a, t, N, K, N));
  NDT_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&c.b, t, K, M, K));
  NDT_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&c.d, t, N, M, N));
  NDT_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&c.pref));
  NDT_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &kWorkspaceBytes, sizeof(kWorkspaceBytes)));
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_handle(device), c.op, c.a, c.b, c.d, c.d, c.pref, 1, &heur, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  Tensor workspace = Tensor::empty({static_cast<int64_t>(kWorkspaceBytes / 2)}, DType::u16, out.device());
  const float one = 1.0f, zero = 0.0f;
  NDT_CUBLASLT_CHECK(cublasLtMatmul(lt_handle(device), c.op, &one, w.data_ptr(), c.a, x.data_ptr(), c.b,
                                    &zero, out.data_ptr(), c.d, out.data_ptr(), c.d, &heur.algo,
                                    workspace.data_ptr(), kWorkspaceBytes, stream));
  return true;
}

}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, bool gelu, const Tensor& out,
                    const Tensor& pre) {
  NDT_CHECK(
      x.dtype() == w.dtype() && out.dtype() == x.dtype() && (!bias.defined() || bias.dtype() == x.dtype()),
      "linear_forward: dtypes differ: ", x.desc(), ", ", w.desc(), ", ", out.desc());
  NDT_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, "linear_forward: ", dtype_name(x.dtype()),
            " is not supported on CUDA (float32 or bfloat16)");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(1);
  if (M == 0 || N == 0) return;
  Launch L(out);
  if (K > 0 && M <= INT_MAX && N <= INT_MAX && K <= INT_MAX &&
      lt_linear(x, w, bias, gelu, out, pre, L.device, L.stream))
    return;
  // composed: what the CPU does
  const Tensor& y = gelu ? pre : out;
  gemm(x, false, w, false, y, 1.0, 0.0);
  if (bias.defined()) add(y, bias, y, 1.0, 1.0);
  if (gelu) gelu_forward(pre, out);
}

}  // namespace ndt::cuda
