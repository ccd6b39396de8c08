// randn and max_diff of tests/dist/dist_testing.h (world() is in tests/dist/dist_main.cpp).
#include "dist_testing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/kernels.h"

namespace ndt::testing {

Tensor randn(const Shape& s, uint64_t stream, bool grad) {
  Tensor t = Tensor::empty(s, DType::f64);
  kernels::fill_normal(t, 17, stream, 0, 0.0f, 1.0f);
  if (grad) t.set_requires_grad(true);
  return t;
}

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  std::vector<double> x = a.contiguous().to_vector<double>(), y = b.contiguous().to_vector<double>();
  double m = 0, scale = 1e-300;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    m = std::max(m, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(x[i]));
  }
  return m / scale;
}

Tensor packed_docs(const std::vector<int64_t> (&lengths)[2], int64_t T) {
  std::vector<int32_t> d;
  for (const auto& row : lengths) {
    int32_t id = 0;
    for (int64_t t = 0; t < T; ++id)
      for (int64_t i = 0; i < row[static_cast<size_t>(id) % row.size()] && t < T; ++i, ++t) d.push_back(id);
  }
  return Tensor::from_vector(d, {2, T});
}

}  // namespace ndt::testing
