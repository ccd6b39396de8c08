#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/ops.h"

using namespace ndt;

TEST(Smoke, MatmulBackward) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2});
  a.set_requires_grad(true);
  Tensor c = matmul(a, b);
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{4, 5, 10, 11}));
  backward(sum(c));
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{1, 1, 2, 1, 1, 2}));
}
