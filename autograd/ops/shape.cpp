// Shape ops: view/reshape, permute, transpose, split and concat along the last dim.
#include <numeric>

#include "autograd/ops/common.h"

namespace ndt {
using namespace ops_detail;

Tensor view(const Tensor& x, const Shape& shape) {
  Tensor out = x.contiguous().view(shape);  // always a fresh handle, so history can attach
  autograd::record("view", {out}, {x}, [xs = x.shape()](const Grads& g) -> Grads {
    // forward: same elements, new shape; so dx = dout in x's shape
    return {g[0].contiguous().view(xs)};
  });
  return out;
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor out = x.permute(dims).clone();
  std::vector<int64_t> inv(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inv[dims[i] < 0 ? dims[i] + dims.size() : dims[i]] = static_cast<int64_t>(i);
  autograd::record("permute", {out}, {x}, [inv](const Grads& g) -> Grads {
    // forward: out = x.permute(dims); so dx = dout.permute(inverse of dims)
    return {g[0].permute(inv).clone()};
  });
  return out;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  std::vector<int64_t> dims(x.dim());
  std::iota(dims.begin(), dims.end(), 0);
  d0 = d0 < 0 ? d0 + x.dim() : d0;
  d1 = d1 < 0 ? d1 + x.dim() : d1;
  NDT_CHECK(d0 >= 0 && d0 < x.dim() && d1 >= 0 && d1 < x.dim(), "transpose: dims out of range for ",
            x.shape_str());
  std::swap(dims[d0], dims[d1]);
  return permute(x, dims);
}

namespace {

// split and concat along `dim` (in range), recorded under `op`
std::vector<Tensor> split_impl(const char* op, const Tensor& x, int64_t dim,
                               const std::vector<int64_t>& sizes) {
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  NDT_CHECK(total == x.size(dim), op, ": sizes add up to ", total, " but dim ", dim, " of ", x.shape_str(),
            " is ", x.size(dim));
  std::vector<Tensor> outs;
  int64_t start = 0;
  for (int64_t s : sizes) {
    outs.push_back(x.narrow(dim, start, s).clone());
    start += s;
  }
  autograd::record(op, outs, {x},
                   [xs = x.shape(), dt = x.dtype(), dev = x.device(), dim, sizes](const Grads& g) -> Grads {
                     // forward: piece i = x[start_i : start_i + size_i] along dim; so dx is the
                     // pieces' gradients side by side, zero where a piece got none
                     Tensor dx = Tensor::empty(xs, dt, dev);
                     int64_t start = 0;
                     for (size_t i = 0; i < sizes.size(); ++i) {
                       Tensor slot = dx.narrow(dim, start, sizes[i]);
                       if (g[i].defined())
                         kernels::copy(slot, g[i]);
                       else
                         kernels::fill(slot, 0.0);
                       start += sizes[i];
                     }
                     return {dx};
                   });
  return outs;
}

Tensor concat_impl(const char* op, const std::vector<Tensor>& xs, int64_t dim) {
  Shape shape = xs[0].shape();
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (const Tensor& t : xs) {
    check_same(op, {&xs[0], &t});
    Shape a = t.shape(), b = shape;
    NDT_CHECK(a.size() == b.size(), op, ": ", t.shape_str(), " and ", xs[0].shape_str(), " differ in rank");
    a[static_cast<size_t>(dim)] = b[static_cast<size_t>(dim)] = 0;
    NDT_CHECK(a == b, op, ": ", t.shape_str(), " and ", xs[0].shape_str(), " differ outside dim ", dim);
    sizes.push_back(t.size(dim));
    total += t.size(dim);
  }
  shape[static_cast<size_t>(dim)] = total;
  Tensor out = Tensor::empty(shape, xs[0].dtype(), xs[0].device());
  int64_t start = 0;
  for (const Tensor& t : xs) {
    kernels::copy(out.narrow(dim, start, t.size(dim)), t);
    start += t.size(dim);
  }
  autograd::record(op, {out}, xs, [sizes, dim](const Grads& g) -> Grads {
    // forward: out = [x_0, x_1, ...] along dim; so dx_i is dout's slice i
    Grads dxs;
    int64_t start = 0;
    for (int64_t s : sizes) {
      dxs.push_back(g[0].narrow(dim, start, s).clone());
      start += s;
    }
    return dxs;
  });
  return out;
}

int64_t dim_of(const char* op, const Tensor& x, int64_t dim) {
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  NDT_CHECK(x.dim() >= 1 && d >= 0 && d < x.dim(), op, ": dim ", dim, " is out of range for ", x.desc());
  return d;
}

}  // namespace

std::vector<Tensor> split_last(const Tensor& x, const std::vector<int64_t>& sizes) {
  NDT_CHECK(x.dim() >= 1, "split_last: expected at least 1-D input, got ", x.desc());
  return split_impl("split_last", x, x.dim() - 1, sizes);
}

std::vector<Tensor> split(const Tensor& x, int64_t dim, const std::vector<int64_t>& sizes) {
  const int64_t d = dim_of("split", x, dim);
  return split_impl(d == x.dim() - 1 ? "split_last" : "split", x, d, sizes);
}

Tensor concat_last(const std::vector<Tensor>& xs) {
  NDT_CHECK(!xs.empty(), "concat_last: no tensors");
  NDT_CHECK(xs[0].dim() >= 1, "concat_last: expected at least 1-D inputs");
  return concat_impl("concat_last", xs, xs[0].dim() - 1);
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  NDT_CHECK(!xs.empty(), "concat: no tensors");
  const int64_t d = dim_of("concat", xs[0], dim);
  return concat_impl(d == xs[0].dim() - 1 ? "concat_last" : "concat", xs, d);
}

// (B, T, NH, HS) -> (B, NH, T, HS)
Tensor heads_to_front(const Tensor& x) {
  NDT_CHECK(x.dim() == 4, "heads_to_front: expected (B, T, NH, HS), got ", x.shape_str());
  return permute(x, {0, 2, 1, 3});
}

// (B, NH, T, HS) -> (B, T, NH, HS)
Tensor heads_to_back(const Tensor& x) {
  NDT_CHECK(x.dim() == 4, "heads_to_back: expected (B, NH, T, HS), got ", x.shape_str());
  return permute(x, {0, 2, 1, 3});
}

}  // namespace ndt
