// CPU reductions: sum and sum_squares accumulated in double, sum_rows in the dtype's
// accumulator.
#include <omp.h>

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

// acc[j] += x[j]
NDT_VECTOR_CLONES void add_row_f32(const float* x, float* acc, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += x[j];
}

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

void sum(const Tensor& x, const Tensor& out) { write_scalar(out, reduce_all(x, "sum", false)); }

void sum_squares(const Tensor& x, const Tensor& out) {
  write_scalar(out, reduce_all(x, "sum_squares", true));
}

// x (rows, c) -> out (c): each thread sums a slice of columns (a multiple of kLanes, at most
// 512), every column's rows in order (deterministic, whatever the slices' width); f32 and
// bf16 at the machine's vector width, f64 plainly
void sum_rows(const Tensor& x, const Tensor& out) {
  dispatch_float(x.dtype(), "sum_rows", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t c = out.numel(), rows = c ? x.numel() / c : 0;
    const T* p = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const int64_t parts = rows * c > 65536 ? omp_get_max_threads() : 1;
    const int64_t width =
        std::clamp<int64_t>((c + parts * kLanes - 1) / (parts * kLanes) * kLanes, kLanes, 512);
#pragma omp parallel for schedule(static) if (parts > 1)
    for (int64_t j0 = 0; j0 < c; j0 += width) {
      const int64_t m = std::min(width, c - j0);
      A acc[512] = {};
      if constexpr (std::is_same_v<T, double>) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < m; ++j) acc[j] += p[r * c + j0 + j];
      } else {
        float wide[512];
        for (int64_t r = 0; r < rows; ++r) {
          const float* f;
          if constexpr (std::is_same_v<T, bf16>) {
            bf16_to_f32(p + r * c + j0, wide, m);
            f = wide;
          } else {
            f = p + r * c + j0;
          }
          add_row_f32(f, acc, m);
        }
      }
      for (int64_t j = 0; j < m; ++j) po[j0 + j] = st<T>(acc[j]);
    }
  });
}

}  // namespace ndt::cpu
