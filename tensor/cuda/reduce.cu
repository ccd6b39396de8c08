// CUDA reductions, the twins of tensor/cpu/reduce.cpp, accumulated in f32.
// Deterministic: two passes with a launch shape that depends only on the input's shape
// (per-block partial sums, then one block sums them in order); no atomics.
#include <algorithm>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

constexpr int kMaxPartials = 1024;  // blocks of the first pass of sum / sum_squares
constexpr int64_t kRowChunk = 64;   // rows per partial sum in sum_rows

// ---- kernels ------------------------------------------------------------------------

// x (n) -> partial (gridDim.x): each block's share of sum x (or sum x^2)
template <typename T, bool kSquare>
__global__ void partial_sum_kernel(const T* x, int64_t n, float* partial) {
  float s = 0.0f;
  NDT_GRID_STRIDE(i, n) {
    const float v = load(x[i]);
    s += kSquare ? v * v : v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// partial (np) -> out (1) in out's dtype; one block
template <typename O>
__global__ void final_sum_kernel(const float* partial, int np, O* out) {
  float s = 0.0f;
  for (int i = threadIdx.x; i < np; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = store<O>(s);
}

// x (R,C) -> partial (chunks,C): partial[ch][c] = sum of rows [ch*kRowChunk, ...) in order
template <typename T>
__global__ void column_partial_kernel(const T* x, int64_t R, int64_t C, int64_t chunks, float* partial) {
  NDT_GRID_STRIDE(i, chunks * C) {
    const int64_t c = i % C, r0 = (i / C) * kRowChunk, r1 = min(R, r0 + kRowChunk);
    float s = 0.0f;
    for (int64_t r = r0; r < r1; ++r) s += load(x[r * C + c]);
    partial[i] = s;
  }
}

// partial (chunks,C) -> out (C): chunks summed in order
template <typename T>
__global__ void column_final_kernel(const float* partial, int64_t chunks, int64_t C, T* out) {
  NDT_GRID_STRIDE(c, C) {
    float s = 0.0f;
    for (int64_t ch = 0; ch < chunks; ++ch) s += partial[ch * C + c];
    out[c] = store<T>(s);
  }
}

template <bool kSquare>
void reduce_all(const Tensor& x, const Tensor& out, const char* op) {
  NDT_CHECK(out.numel() == 1, op, ": out must have one element, got ", out.desc());
  const int64_t n = x.numel();
  Launch L(x);
  const int np = static_cast<int>(std::min<int64_t>(grid_for(n), kMaxPartials));
  Tensor partial = Tensor::empty({np}, DType::f32, x.device());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    partial_sum_kernel<T, kSquare>
        <<<np, kThreads, 0, L.stream>>>(static_cast<const T*>(x.data_ptr()), n, partial.data<float>());
    NDT_CUDA_CHECK_LAUNCH();
  });
  dispatch_float(out.dtype(), op, [&](auto tag) {
    using O = decltype(tag);
    final_sum_kernel<O>
        <<<1, kThreads, 0, L.stream>>>(partial.data<float>(), np, static_cast<O*>(out.data_ptr()));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------

// x (any shape) -> out (1) = sum x
void sum(const Tensor& x, const Tensor& out) { reduce_all<false>(x, out, "sum"); }

// x (any shape) -> out (1) = sum x^2
void sum_squares(const Tensor& x, const Tensor& out) { reduce_all<true>(x, out, "sum_squares"); }

// x (R,C) -> out (C): out[c] = sum_r x[r,c]
void sum_rows(const Tensor& x, const Tensor& out) {
  const int64_t C = out.numel(), R = C ? x.numel() / C : 0;
  if (C == 0) return;
  NDT_CHECK(x.dtype() == out.dtype(), "sum_rows: dtypes differ: ", x.desc(), " and ", out.desc());
  Launch L(x);
  const int64_t chunks = std::max<int64_t>(1, (R + kRowChunk - 1) / kRowChunk);
  Tensor partial = Tensor::empty({chunks, C}, DType::f32, x.device());
  dispatch_float(x.dtype(), "sum_rows", [&](auto tag) {
    using T = decltype(tag);
    column_partial_kernel<T><<<grid_for(chunks * C), kThreads, 0, L.stream>>>(
        static_cast<const T*>(x.data_ptr()), R, C, chunks, partial.data<float>());
    NDT_CUDA_CHECK_LAUNCH();
    column_final_kernel<T><<<grid_for(C), kThreads, 0, L.stream>>>(partial.data<float>(), chunks, C,
                                                                   static_cast<T*>(out.data_ptr()));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ndt::cuda
