// CPU reductions, accumulated in double.
#include <algorithm>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {
namespace {

template <typename F>
double reduce_all(const Tensor& x, const char* op, F&& f) {
  double total = 0;
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x.data_ptr());
    const int64_t n = x.numel();
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) s += f(static_cast<double>(load(p[i])));
    total = s;
  });
  return total;
}

void write_scalar(const Tensor& out, double v) {
  dispatch_float(out.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    *static_cast<T*>(out.data_ptr()) = store<T>(v);
  });
}

}  // namespace

void sum(const Tensor& x, const Tensor& out) {
  write_scalar(out, reduce_all(x, "sum", [](double v) { return v; }));
}

void sum_squares(const Tensor& x, const Tensor& out) {
  write_scalar(out, reduce_all(x, "sum_squares", [](double v) { return v * v; }));
}

void sum_rows(const Tensor& x, const Tensor& out) {
  dispatch_float(x.dtype(), "sum_rows", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t c = out.numel(), rows = c ? x.numel() / c : 0;
    const T* p = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    // each thread owns a slice of columns; rows summed in order (deterministic)
#pragma omp parallel for schedule(static) if (rows * c > 65536)
    for (int64_t j0 = 0; j0 < c; j0 += 64) {
      const int64_t j1 = std::min(c, j0 + 64);
      A acc[64] = {};
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = j0; j < j1; ++j) acc[j - j0] += load(p[r * c + j]);
      for (int64_t j = j0; j < j1; ++j) po[j] = st<T>(acc[j - j0]);
    }
  });
}

}  // namespace ndt::cpu
