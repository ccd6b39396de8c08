// CUDA GEMM through cuBLAS, the twin of tensor/cpu/matmul.cpp. f32 and bf16 operands,
// accumulated in f32: bf16 on tensor cores; f32 in strict f32 (CUBLAS_COMPUTE_32F), or on
// TF32 tensor cores when the device allows it (cuda::set_allow_tf32, train.tf32).
// Legend: Bt batch, M, N, K.
//
// cuBLAS is column-major. A row-major (M,N) matrix is the column-major (N,M) matrix C^T,
// and C = op(A) op(B) is C^T = op(B)^T op(A)^T: so we hand cuBLAS b as the left operand
// and a as the right one, with the same transpose flags and m and n swapped.
#include <climits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"

namespace ndt::cuda {

// a (M,K) or (K,M) if ta, b (K,N) or (N,K) if tb -> c (M,N); batched over a leading Bt,
// with a 2-D b shared by every batch (stride 0, or one tall GEMM when a is not transposed)
void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, double alpha, double beta) {
  NDT_CHECK(a.dtype() == c.dtype() && b.dtype() == c.dtype(), "gemm: dtypes differ: ", a.desc(), ", ",
            b.desc(), ", ", c.desc());
  NDT_CHECK(c.dtype() == DType::f32 || c.dtype() == DType::bf16, "gemm: ", dtype_name(c.dtype()),
            c.dtype() == DType::f64 ? " is CPU only" : " is not supported",
            " on CUDA (float32 or bfloat16); got ", c.desc());
  NDT_CHECK(a.is_contiguous() && b.is_contiguous() && c.is_contiguous(), "gemm: operands must be contiguous");
  const int64_t batch = a.dim() == 3 ? a.size(0) : 1;
  const int64_t m = ta ? a.size(-1) : a.size(-2), k = ta ? a.size(-2) : a.size(-1);
  const int64_t n = tb ? b.size(-2) : b.size(-1);
  const bool b_shared = a.dim() == 3 && b.dim() == 2;
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0) {  // empty sum: c = beta * c
    if (beta == 0.0)
      fill(c, 0.0);
    else
      scale(c, beta, c);
    return;
  }
  const bool tall = b_shared && !ta;  // (Bt*M, K) @ (K, N) as one GEMM
  NDT_CHECK(k <= INT_MAX && n <= INT_MAX && (tall ? batch * m : m) <= INT_MAX && batch <= INT_MAX,
            "gemm: dimensions too large for cuBLAS int sizes: ", a.shape_str(), " @ ", b.shape_str());

  Launch L(c);
  cublasHandle_t h = cublas(L.device);
  const cudaDataType t = c.dtype() == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  const cublasComputeType_t compute =
      c.dtype() == DType::f32 && allow_tf32(L.device) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int lda = static_cast<int>(ta ? m : k), ldb = static_cast<int>(tb ? k : n), ldc = static_cast<int>(n);
  if (tall) {
    NDT_CUBLAS_CHECK(cublasGemmEx(h, opb, opa, static_cast<int>(n), static_cast<int>(batch * m),
                                  static_cast<int>(k), &al, b.data_ptr(), t, ldb, a.data_ptr(), t, lda, &be,
                                  c.data_ptr(), t, ldc, compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  const long long sa = m * k, sb = b_shared ? 0 : k * n, sc = m * n;
  NDT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, opb, opa, static_cast<int>(n), static_cast<int>(m),
                                              static_cast<int>(k), &al, b.data_ptr(), t, ldb, sb,
                                              a.data_ptr(), t, lda, sa, &be, c.data_ptr(), t, ldc, sc,
                                              static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace ndt::cuda
