// Reductions to a scalar: sum, mean, sum of squares.
#include "autograd/ops/common.h"

namespace ndt {
using namespace ops_detail;

namespace {
// What a reduction's backward needs of its input: not the data, only its shape and kind.
struct Like {
  Shape shape;
  DType dtype;
  Device device;
  explicit Like(const Tensor& x) : shape(x.shape()), dtype(x.dtype()), device(x.device()) {}
};
// A tensor shaped like x filled with factor times the value of the one-element tensor g.
Tensor broadcast_scalar(const Tensor& g, const Like& x, double factor) {
  Tensor out = Tensor::empty(x.shape, x.dtype, x.device);
  kernels::fill(out, g.item() * factor);
  return out;
}
}  // namespace

Tensor sum(const Tensor& x_in) {
  check_same("sum", {&x_in});
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  kernels::sum(x, out);
  autograd::record("sum", {out}, {x_in}, [x = Like(x)](const Grads& g) -> Grads {
    // forward: out = sum x; so dx = dout everywhere
    return {broadcast_scalar(g[0], x, 1.0)};
  });
  return out;
}

Tensor mean(const Tensor& x_in) {
  check_same("mean", {&x_in});
  NDT_CHECK(x_in.numel() > 0, "mean: empty tensor ", x_in.desc());
  Tensor x = x_in.contiguous();
  Tensor s = Tensor::empty({}, x.dtype(), x.device());
  kernels::sum(x, s);
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  kernels::scale(s, 1.0 / x.numel(), out);
  autograd::record("mean", {out}, {x_in}, [x = Like(x), n = x.numel()](const Grads& g) -> Grads {
    // forward: out = sum x / n; so dx = dout / n everywhere
    return {broadcast_scalar(g[0], x, 1.0 / n)};
  });
  return out;
}

Tensor sum_squares(const Tensor& x_in) {
  check_same("sum_squares", {&x_in});
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  kernels::sum_squares(x, out);
  autograd::record("sum_squares", {out}, {x_in}, [x = x.detach()](const Grads& g) -> Grads {
    // forward: out = sum x^2; so dx = 2 x dout
    Tensor dx = empty_like(x);
    kernels::scale(x, 2.0 * g[0].item(), dx);
    return {dx};
  });
  return out;
}

}  // namespace ndt
