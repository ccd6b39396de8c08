// CPU random fills with the counter-based generator of tensor/rng.h.
#include "tensor/rng.h"

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

void fill_uniform(const Tensor& t, uint64_t seed, uint64_t stream, uint64_t start, float lo, float hi) {
  NDT_CHECK(t.is_contiguous(), "fill_uniform: tensor must be contiguous");
  dispatch_float(t.dtype(), "fill_uniform", [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.data_ptr());
    const int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) p[i] = st<T>(Philox::uniform(seed, stream, start + i, lo, hi));
  });
}

void fill_normal(const Tensor& t, uint64_t seed, uint64_t stream, uint64_t start, float mean, float std) {
  NDT_CHECK(t.is_contiguous(), "fill_normal: tensor must be contiguous");
  dispatch_float(t.dtype(), "fill_normal", [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.data_ptr());
    const int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > 16384)
    for (int64_t i = 0; i < n; ++i) p[i] = st<T>(Philox::normal(seed, stream, start + i, mean, std));
  });
}

}  // namespace ndt::cpu
