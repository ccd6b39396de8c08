// CPU reductions, accumulated in double.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {
namespace {

// sum_i x[i] (or x[i]^2) in double, in kLanes fixed lanes (fastmath.h): the same bits at every
// vector width. Always inlined into each vector clone below (else GCC may keep one baseline
// copy that every clone calls).
template <bool Square, typename T>
[[gnu::always_inline]] inline double lane_sum(const T* x, int64_t n) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const double v = x[i + l];
      lane[l] += Square ? v * v : v;
    }
  double s = 0;
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  for (; i < n; ++i) {
    const double v = x[i];
    s += Square ? v * v : v;
  }
  return s;
}
NDT_VECTOR_CLONES double sum_f32(const float* x, int64_t n) { return lane_sum<false>(x, n); }
NDT_VECTOR_CLONES double sum_squares_f32(const float* x, int64_t n) { return lane_sum<true>(x, n); }
NDT_VECTOR_CLONES double sum_f64(const double* x, int64_t n) { return lane_sum<false>(x, n); }
NDT_VECTOR_CLONES double sum_squares_f64(const double* x, int64_t n) { return lane_sum<true>(x, n); }

// Blocks of a reduction: each summed on its own (by any thread), then the block sums added in
// order. The result does not depend on the number of threads.
constexpr int64_t kReduceBlock = 8192;

// sum_i x[i], or sum_i x[i]^2, accumulated in double
double reduce_all(const Tensor& x, const char* op, bool square) {
  double total = 0;
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x.data_ptr());
    const int64_t n = x.numel(), nb = (n + kReduceBlock - 1) / kReduceBlock;
    std::vector<double> part(nb);
#pragma omp parallel if (n > 65536)
    {
      std::vector<float> wide(std::is_same_v<T, bf16> ? kReduceBlock : 0);  // bf16 widened to f32
#pragma omp for schedule(static)
      for (int64_t k = 0; k < nb; ++k) {
        const int64_t lo = k * kReduceBlock, m = std::min(kReduceBlock, n - lo);
        if constexpr (std::is_same_v<T, double>) {
          part[k] = square ? sum_squares_f64(p + lo, m) : sum_f64(p + lo, m);
        } else {
          const float* f;
          if constexpr (std::is_same_v<T, bf16>) {
            bf16_to_f32(p + lo, wide.data(), m);
            f = wide.data();
          } else {
            f = p + lo;
          }
          part[k] = square ? sum_squares_f32(f, m) : sum_f32(f, m);
        }
      }
    }
    for (const double v : part) total += v;
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
  write_scalar(out, reduce_all(x, "sum", false));
}

void sum_squares(const Tensor& x, const Tensor& out) {
  write_scalar(out, reduce_all(x, "sum_squares", true));
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
