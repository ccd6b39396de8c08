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

#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <optional>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"

namespace ndt::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // what cuBLAS asks for on Hopper

// What the heuristic's choice depends on: shapes, dtype, epilogue, TF32, the pointers'
// 16-byte alignment (cuBLASLt reads their values for that), the device.
using AlgoKey = std::array<int64_t, 8>;

// The algorithm cuBLASLt chose for a key, asked once: the heuristic query costs more than a
// small GEMM. nullopt: none exists (the launcher composes instead).
struct AlgoCache {
  std::mutex mu;
  std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>> algos;
};
AlgoCache& algo_cache() {
  static auto* c = new AlgoCache();  // never destroyed, as the handles
  return *c;
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
  NDT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&c.op, compute, CUDA_R_32F));
  const cublasOperation_t no = CUBLAS_OP_N;
  NDT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, &no, sizeof(no)));
  NDT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof(no)));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (bias.defined()) epi = gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
  NDT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (bias.defined()) {
    const void* bp = bias.data_ptr();
    NDT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
  }
  if (gelu) {
    if (N % 8 != 0) return false;  // the aux leading dimension must be a multiple of 8
    void* ap = pre.data_ptr();
    const int64_t ld = N;
    NDT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ap, sizeof(ap)));
    NDT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
  }
  // column-major: A = w^T (N,K) ld N, B = x^T (K,M) ld K, D = out^T (N,M) ld N
  NDT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.a, t, N, K, N));
  NDT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.b, t, K, M, K));
  NDT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.d, t, N, M, N));
  NDT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&c.pref));
  NDT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                        &kWorkspaceBytes, sizeof(kWorkspaceBytes)));
  const AlgoKey key{device,
                    M,
                    N,
                    K,
                    static_cast<int64_t>(t),
                    static_cast<int64_t>(epi),
                    compute,
                    (aligned16(x.data_ptr()) ? 1 : 0) | (aligned16(w.data_ptr()) ? 2 : 0) |
                        (aligned16(out.data_ptr()) ? 4 : 0) |
                        (!bias.defined() || aligned16(bias.data_ptr()) ? 8 : 0) |
                        (!gelu || aligned16(pre.data_ptr()) ? 16 : 0)};
  std::optional<cublasLtMatmulAlgo_t> algo;
  {
    AlgoCache& cache = algo_cache();
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.algos.find(key);
    if (it == cache.algos.end()) {
      cublasLtMatmulHeuristicResult_t heur{};
      int found = 0;
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cublaslt(device), c.op, c.a, c.b, c.d, c.d,
                                                               c.pref, 1, &heur, &found);
      it = cache.algos
               .emplace(key, st == CUBLAS_STATUS_SUCCESS && found > 0
                                 ? std::optional<cublasLtMatmulAlgo_t>(heur.algo)
                                 : std::nullopt)
               .first;
    }
    algo = it->second;
  }
  if (!algo) return false;
  Tensor workspace = Tensor::empty({static_cast<int64_t>(kWorkspaceBytes / 2)}, DType::u16, out.device());
  const float one = 1.0f, zero = 0.0f;
  NDT_CUBLAS_CHECK(cublasLtMatmul(cublaslt(device), c.op, &one, w.data_ptr(), c.a, x.data_ptr(), c.b, &zero,
                                  out.data_ptr(), c.d, out.data_ptr(), c.d, &*algo, workspace.data_ptr(),
                                  kWorkspaceBytes, stream));
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
