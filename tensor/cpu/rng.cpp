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

// x (N, C) -> out (N, C): kept elements x / (1 - p), the others 0 (tensor/kernels.h)
void dropout(const Tensor& x, const kernels::DropoutKey& k, const Tensor& out) {
  dispatch_float(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const int64_t N = x.size(0), C = x.size(1);
    const double inv = 1.0 / (1.0 - k.p);
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t n = 0; n < N; ++n) {
      const uint64_t row = static_cast<uint64_t>(kernels::dropout_row(k, n) * k.row_stride + k.col_start);
      for (int64_t c = 0; c < C; ++c)
        po[n * C + c] = Philox::keep(k.seed, k.stream, row + static_cast<uint64_t>(c), k.p)
                            ? st<T>(static_cast<double>(load(px[n * C + c])) * inv)
                            : st<T>(0.0);
    }
  });
}

}  // namespace ndt::cpu
