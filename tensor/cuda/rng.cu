// CUDA random fills with the counter-based generator of tensor/rng.h, the twins of
// tensor/cpu/rng.cpp: element i gets Philox::uniform/normal(seed, stream, start + i), so
// the values match the CPU's.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/rng.h"

namespace ndt::cuda {
namespace {

// ---- kernels ------------------------------------------------------------------------

// t (n) contiguous: t[i] = uniform in (lo, hi) for element start + i
template <typename T>
__global__ void fill_uniform_kernel(T* t, int64_t n, uint64_t seed, uint64_t stream, uint64_t start, float lo,
                                    float hi) {
  NDT_GRID_STRIDE(i, n) t[i] = store<T>(Philox::uniform(seed, stream, start + i, lo, hi));
}

// t (n) contiguous: t[i] = normal(mean, std) for element start + i
template <typename T>
__global__ void fill_normal_kernel(T* t, int64_t n, uint64_t seed, uint64_t stream, uint64_t start,
                                   float mean, float std) {
  NDT_GRID_STRIDE(i, n) t[i] = store<T>(Philox::normal(seed, stream, start + i, mean, std));
}

// x (N, C) -> out (N, C): kept elements x / (1 - p), the others 0 (tensor/kernels.h)
template <typename T>
__global__ void dropout_kernel(const T* x, T* out, int64_t n, int64_t C, kernels::DropoutKey k) {
  const float inv = static_cast<float>(1.0 / (1.0 - k.p));
  NDT_GRID_STRIDE(i, n) {
    const int64_t r = i / C, c = i % C;
    const uint64_t e = static_cast<uint64_t>(kernels::dropout_row(k, r) * k.row_stride + k.col_start + c);
    out[i] = Philox::keep(k.seed, k.stream, e, k.p) ? store<T>(load(x[i]) * inv) : store<T>(0.0f);
  }
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void fill_uniform(const Tensor& t, uint64_t seed, uint64_t stream, uint64_t start, float lo, float hi) {
  NDT_CHECK(t.is_contiguous(), "fill_uniform: tensor must be contiguous");
  const int64_t n = t.numel();
  if (n == 0) return;
  Launch L(t);
  dispatch_float(t.dtype(), "fill_uniform", [&](auto tag) {
    using T = decltype(tag);
    fill_uniform_kernel<T><<<grid_for(n), kThreads, 0, L.stream>>>(static_cast<T*>(t.data_ptr()), n, seed,
                                                                   stream, start, lo, hi);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void fill_normal(const Tensor& t, uint64_t seed, uint64_t stream, uint64_t start, float mean, float std) {
  NDT_CHECK(t.is_contiguous(), "fill_normal: tensor must be contiguous");
  const int64_t n = t.numel();
  if (n == 0) return;
  Launch L(t);
  dispatch_float(t.dtype(), "fill_normal", [&](auto tag) {
    using T = decltype(tag);
    fill_normal_kernel<T><<<grid_for(n), kThreads, 0, L.stream>>>(static_cast<T*>(t.data_ptr()), n, seed,
                                                                  stream, start, mean, std);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void dropout(const Tensor& x, const kernels::DropoutKey& k, const Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  Launch L(x);
  dispatch_float(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<T><<<grid_for(n), kThreads, 0, L.stream>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), n, x.size(1), k);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ndt::cuda
