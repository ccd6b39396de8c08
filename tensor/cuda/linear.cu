// A linear layer's forward with its bias (and GELU) fused into the GEMM as a cuBLASLt
// epilogue, the twin of linear_forward in tensor/cpu/matmul.cpp. Legend: M rows (tokens),
// K in, N out channels.
//
//   out = x (M,K) @ w (K,N) + bias (N)              epilogue BIAS
//   out = GELU(x @ w + bias), pre = x @ w + bias    epilogue GELU_AUX_BIAS (GELU_AUX without
//                                                   bias; pre kept for the backward)
// cuBLASLt's GELU is its own fast tanh approximation: it is fused for bf16 outputs and TF32
// GEMMs only, where the output is rounded more coarsely than it differs; strict f32 writes
// the GEMM and bias into pre and applies gelu_forward (the CPU's numbers).
// The bias is added to the f32 accumulator before the one rounding to the output dtype.
// Row-major out (M,N) is column-major out^T (N,M) = w^T (N,K) @ x^T (K,M): w is cuBLASLt's A
// and x its B, untransposed, and the bias runs along out^T's rows, as cuBLASLt adds it.
// Where cuBLASLt offers no algorithm for the shapes, dtypes and pointer alignments, the
// launcher composes gemm, add and gelu_forward instead (the same arithmetic as the CPU).
#include <cublasLt.h>

#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
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
// alignments (told to the heuristic; log2 of each, packed), the device.
using AlgoKey = std::array<int64_t, 8>;

// The algorithm cuBLASLt chose for a key, asked once: the heuristic query costs more than a
// small GEMM. nullopt: none exists (the launcher composes instead).
struct AlgoCache {
  std::mutex mu;
  std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>> algos;
};
std::atomic<int64_t> g_fused_calls{0};  // diagnostics: fused_linear_calls()

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

// The largest power of two, up to cuBLASLt's default assumption of 256, that divides p's
// address: what the heuristic must be told (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, default
// 256) so that it never picks a kernel the pointers are too loosely aligned for.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}
int64_t log2_of(uint32_t al) {
  int64_t l = 0;
  while ((1u << l) < al) ++l;
  return l;
}

// The operation of a fused linear: out = x @ w, with the bias (and the GELU, writing the
// pre-activation to pre as the aux output) as cuBLASLt's epilogue. Returns the epilogue.
cublasLtEpilogue_t describe_linear(LtCall& c, cublasComputeType_t compute, const Tensor& bias, bool fuse_gelu,
                                   const Tensor& pre, int64_t N) {
  NDT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&c.op, compute, CUDA_R_32F));
  const cublasOperation_t no = CUBLAS_OP_N;
  NDT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, &no, sizeof(no)));
  NDT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSB, &no, sizeof(no)));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  if (fuse_gelu)
    epi = bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  else if (bias.defined())
    epi = CUBLASLT_EPILOGUE_BIAS;
  NDT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (bias.defined()) {
    const void* bp = bias.data_ptr();
    NDT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
  }
  if (fuse_gelu) {
    void* ap = pre.data_ptr();
    const int64_t ld = N;
    NDT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ap, sizeof(ap)));
    NDT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
  }
  return epi;
}

// The heuristic's preferences: the workspace, and the alignments of A, B and C = D (it
// sees the bias and aux pointers in the operation, but assumes 256-byte A, B, C, D)
void prefer(LtCall& c, uint32_t al_a, uint32_t al_b, uint32_t al_d) {
  NDT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&c.pref));
  const uint64_t ws = kWorkspaceBytes;
  NDT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                        sizeof(ws)));
  NDT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                        &al_a, sizeof(al_a)));
  NDT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                        &al_b, sizeof(al_b)));
  NDT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                        &al_d, sizeof(al_d)));
  NDT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(c.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                        &al_d, sizeof(al_d)));
}

// The algorithm for `key`, asked of the heuristic once per key (nullopt: it has none).
std::optional<cublasLtMatmulAlgo_t> algo_for(const AlgoKey& key, const LtCall& c, int device) {
  AlgoCache& cache = algo_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.algos.find(key);
  if (it == cache.algos.end()) {
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(cublaslt(device), c.op, c.a, c.b, c.d, c.d, c.pref, 1, &heur, &found);
    it = cache.algos
             .emplace(key, st == CUBLAS_STATUS_SUCCESS && found > 0 && heur.state == CUBLAS_STATUS_SUCCESS
                               ? std::optional<cublasLtMatmulAlgo_t>(heur.algo)
                               : std::nullopt)
             .first;
  }
  return it->second;
}

// Runs the fused GEMM; false when cuBLASLt has no algorithm for it (nothing was launched).
// With gelu, `gelu_done` says whether the GELU was fused too (else the caller applies
// gelu_forward(pre, out): the GEMM and bias went into pre).
bool lt_linear(const Tensor& x, const Tensor& w, const Tensor& bias, bool gelu, const Tensor& out,
               const Tensor& pre, int device, cudaStream_t stream, bool& gelu_done) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(1);
  const cudaDataType t = out.dtype() == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  const cublasComputeType_t compute =
      out.dtype() == DType::f32 && allow_tf32(device) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  // cuBLASLt's GELU epilogue is its own (fast) tanh approximation: fused only where the
  // output is rounded coarsely anyway (bf16, TF32); strict f32 keeps gelu_forward's numbers.
  const bool fuse_gelu = gelu && (out.dtype() == DType::bf16 || compute == CUBLAS_COMPUTE_32F_FAST_TF32) &&
                         N % 8 == 0;  // the aux leading dimension must be a multiple of 8
  gelu_done = fuse_gelu;
  const Tensor& d = gelu && !fuse_gelu ? pre : out;                        // where the GEMM (+ bias) lands
  if (bias.defined() && alignment_of(bias.data_ptr()) < 16) return false;  // no alignment pref for it
  if (fuse_gelu && alignment_of(pre.data_ptr()) < 16) return false;
  LtCall c;
  const cublasLtEpilogue_t epi = describe_linear(c, compute, bias, fuse_gelu, pre, N);
  // column-major: A = w^T (N,K) ld N, B = x^T (K,M) ld K, D = out^T (N,M) ld N
  NDT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.a, t, N, K, N));
  NDT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.b, t, K, M, K));
  NDT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c.d, t, N, M, N));
  const uint32_t al_a = alignment_of(w.data_ptr()), al_b = alignment_of(x.data_ptr()),
                 al_d = alignment_of(d.data_ptr());
  prefer(c, al_a, al_b, al_d);
  const AlgoKey key{device,
                    M,
                    N,
                    K,
                    static_cast<int64_t>(t),
                    static_cast<int64_t>(epi),
                    compute,
                    log2_of(al_a) | log2_of(al_b) << 4 | log2_of(al_d) << 8 |
                        (bias.defined() ? log2_of(alignment_of(bias.data_ptr())) : 0) << 12 |
                        (fuse_gelu ? log2_of(alignment_of(pre.data_ptr())) : 0) << 16};
  const std::optional<cublasLtMatmulAlgo_t> algo = algo_for(key, c, device);
  if (!algo) return false;
  Tensor workspace = Tensor::empty({static_cast<int64_t>(kWorkspaceBytes / 2)}, DType::u16, out.device());
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t st =
      cublasLtMatmul(cublaslt(device), c.op, &one, w.data_ptr(), c.a, x.data_ptr(), c.b, &zero, d.data_ptr(),
                     c.d, d.data_ptr(), c.d, &*algo, workspace.data_ptr(), kWorkspaceBytes, stream);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {  // nothing launched: remember, and compose instead
    AlgoCache& cache = algo_cache();
    std::lock_guard<std::mutex> lock(cache.mu);
    cache.algos.erase(key);
    cache.algos.emplace(key, std::optional<cublasLtMatmulAlgo_t>());
    return false;
  }
  NDT_CUBLAS_CHECK(st);
  g_fused_calls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

int64_t fused_linear_calls() { return g_fused_calls.load(std::memory_order_relaxed); }

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, bool gelu, const Tensor& out,
                    const Tensor& pre) {
  NDT_CHECK(x.dtype() == w.dtype() && out.dtype() == x.dtype() &&
                (!bias.defined() || bias.dtype() == x.dtype()) && (!gelu || pre.dtype() == x.dtype()),
            "linear_forward: dtypes differ: ", x.desc(), ", ", w.desc(), ", ", out.desc());
  NDT_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::bf16, "linear_forward: ", dtype_name(x.dtype()),
            " is not supported on CUDA (float32 or bfloat16)");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(1);
  if (M == 0 || N == 0) return;
  Launch L(out);
  bool gelu_done = false;
  if (K > 0 && M <= INT_MAX && N <= INT_MAX && K <= INT_MAX &&
      lt_linear(x, w, bias, gelu, out, pre, L.device, L.stream, gelu_done)) {
    if (gelu && !gelu_done) gelu_forward(pre, out);
    return;
  }
  // composed: what the CPU does
  const Tensor& y = gelu ? pre : out;
  gemm(x, false, w, false, y, 1.0, 0.0);
  if (bias.defined()) add(y, bias, y, 1.0, 1.0);
  if (gelu) gelu_forward(pre, out);
}

}  // namespace ndt::cuda
