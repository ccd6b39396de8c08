// LayerNorm, softmax and fused softmax + cross-entropy. Legend: N rows, C channels, V vocab.
#include "autograd/ops/common.h"

namespace ndt {
using namespace ops_detail;

// x (..., C), w (C), b (C) -> (..., C)
Tensor layernorm(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, double eps) {
  check_same("layernorm", {&x_in, &w_in, &b_in});
  NDT_CHECK(x_in.dim() >= 1 && w_in.dim() == 1 && b_in.dim() == 1 && w_in.size(0) == x_in.size(-1) &&
                b_in.size(0) == x_in.size(-1),
            "layernorm: input ", x_in.shape_str(), " needs weight and bias of shape (",
            x_in.dim() ? x_in.size(-1) : 0, "), got ", w_in.shape_str(), " and ", b_in.shape_str());
  Tensor x = x_in.contiguous(), w = w_in.contiguous(), b = b_in.contiguous();
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  Tensor out = empty_like(x);
  Tensor mean = Tensor::empty({N}, stat_dtype(x.dtype()), x.device());
  Tensor rstd = Tensor::empty({N}, stat_dtype(x.dtype()), x.device());
  kernels::layernorm_forward(x, w, b, eps, out, mean, rstd);
  autograd::record("layernorm", {out}, {x_in, w_in, b_in},
                   [x = x.detach(), w = w.detach(), mean, rstd](const Grads& g) -> Grads {
                     // forward: out = (x - mean) * rstd * w + b; the kernel's comment derives dx, dw, db
                     Tensor dx = empty_like(x), dw = empty_like(w), db = empty_like(w);
                     kernels::layernorm_backward(g[0].contiguous(), x, w, mean, rstd, dx, dw, db);
                     return {dx, dw, db};
                   });
  return out;
}

// softmax over the last dim
Tensor softmax(const Tensor& x_in) {
  check_same("softmax", {&x_in});
  NDT_CHECK(x_in.dim() >= 1, "softmax: expected at least 1-D input, got ", x_in.desc());
  Tensor x = x_in.contiguous();
  Tensor out = empty_like(x);
  kernels::softmax_forward(x, out);
  autograd::record("softmax", {out}, {x_in}, [y = out.detach()](const Grads& g) -> Grads {
    // forward: y = softmax(x); so dx = y * (dy - sum(dy * y))
    Tensor dx = empty_like(y);
    kernels::softmax_backward(y, g[0].contiguous(), dx);
    return {dx};
  });
  return out;
}

// logits (N, V), targets (N) -> scalar mean loss over kept rows
Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets_in, int64_t ignore_index,
                     int64_t v_limit) {
  check_same("cross_entropy", {&logits_in});
  NDT_CHECK(logits_in.dim() == 2, "cross_entropy: logits must be (N, V), got ", logits_in.shape_str());
  NDT_CHECK(
      targets_in.dtype() == DType::i32 && targets_in.dim() == 1 && targets_in.size(0) == logits_in.size(0),
      "cross_entropy: targets must be int32 (N) with N = ", logits_in.size(0), ", got ", targets_in.desc());
  NDT_CHECK(targets_in.device() == logits_in.device(), "cross_entropy: targets on ",
            targets_in.device().str(), " but logits on ", logits_in.device().str());
  const int64_t V = logits_in.size(1), N = logits_in.size(0);
  if (v_limit < 0) v_limit = V;
  NDT_CHECK(v_limit >= 1 && v_limit <= V, "cross_entropy: v_limit ", v_limit, " outside [1, ", V, "]");
  Tensor logits = logits_in.contiguous(), targets = targets_in.contiguous();
  const DType sd = stat_dtype(logits.dtype());
  Tensor losses = Tensor::empty({N}, sd, logits.device()), lse = Tensor::empty({N}, sd, logits.device());
  kernels::cross_entropy_forward(logits, targets, v_limit, ignore_index, losses, lse);
  const int64_t kept = kernels::count_not_equal(targets, ignore_index);
  Tensor total = Tensor::empty({}, sd, logits.device());
  kernels::sum(losses, total);
  // the mean in the statistics dtype (f32 even for bf16 logits), rounded once to the logits' dtype
  Tensor mean_loss = Tensor::empty({}, sd, logits.device());
  kernels::scale(total, kept ? 1.0 / kept : 0.0, mean_loss);
  Tensor out = mean_loss.to(logits.dtype());
  autograd::record(
      "cross_entropy", {out}, {logits_in},
      [logits = logits.detach(), targets, lse, v_limit, ignore_index, kept](const Grads& g) -> Grads {
        // forward: loss = mean over kept rows of (lse - logit[target]); so
        // dlogits = (softmax - onehot) * dloss / kept
        Tensor dlogits = empty_like(logits);
        const double gs = kept ? g[0].item() / kept : 0.0;
        kernels::cross_entropy_backward(logits, targets, lse, v_limit, ignore_index, gs, dlogits);
        return {dlogits};
      });
  return out;
}

}  // namespace ndt
