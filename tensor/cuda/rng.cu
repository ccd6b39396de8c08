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

}  // namespace ndt::cuda
