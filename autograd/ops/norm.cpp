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

// x (..., C), w (C) -> (..., C)
Tensor rms_norm(const Tensor& x_in, const Tensor& w_in, double eps) {
  check_same("rms_norm", {&x_in, &w_in});
  NDT_CHECK(x_in.dim() >= 1 && w_in.dim() == 1 && w_in.size(0) == x_in.size(-1), "rms_norm: input ",
            x_in.shape_str(), " needs a weight of shape (", x_in.dim() ? x_in.size(-1) : 0, "), got ",
            w_in.shape_str());
  Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  Tensor out = empty_like(x);
  Tensor rstd = Tensor::empty({N}, stat_dtype(x.dtype()), x.device());
  kernels::rmsnorm_forward(x, w, eps, out, rstd);
  autograd::record("rms_norm", {out}, {x_in, w_in},
                   [x = x.detach(), w = w.detach(), rstd](const Grads& g) -> Grads {
                     // forward: out = x * rstd * w; the kernel's comment derives dx and dw
                     Tensor dx = empty_like(x), dw = empty_like(w);
                     kernels::rmsnorm_backward(g[0].contiguous(), x, w, rstd, dx, dw);
                     return {dx, dw};
                   });
  return out;
}

// a, b (..., C), w, bias (C) -> sum (..., C), out (..., C)
AddNormOut add_layernorm(const Tensor& a_in, const Tensor& b_in, const Tensor& w_in, const Tensor& bias_in,
                         double eps) {
  check_same("add_layernorm", {&a_in, &b_in, &w_in, &bias_in});
  NDT_CHECK(a_in.shape() == b_in.shape(), "add_layernorm: a ", a_in.shape_str(), " and b ", b_in.shape_str(),
            " differ");
  NDT_CHECK(a_in.dim() >= 1 && w_in.dim() == 1 && bias_in.dim() == 1 && w_in.size(0) == a_in.size(-1) &&
                bias_in.size(0) == a_in.size(-1),
            "add_layernorm: input ", a_in.shape_str(), " needs weight and bias of shape (",
            a_in.dim() ? a_in.size(-1) : 0, "), got ", w_in.shape_str(), " and ", bias_in.shape_str());
  Tensor a = a_in.contiguous(), b = b_in.contiguous(), w = w_in.contiguous(), bias = bias_in.contiguous();
  const int64_t C = a.size(-1), N = C ? a.numel() / C : 0;
  AddNormOut r{empty_like(a), empty_like(a)};
  Tensor mean = Tensor::empty({N}, stat_dtype(a.dtype()), a.device());
  Tensor rstd = Tensor::empty({N}, stat_dtype(a.dtype()), a.device());
  kernels::add_layernorm_forward(a, b, w, bias, eps, r.sum, r.out, mean, rstd);
  autograd::record("add_layernorm", {r.sum, r.out}, {a_in, b_in, w_in, bias_in},
                   [sum = r.sum.detach(), w = w.detach(), mean, rstd](const Grads& g) -> Grads {
                     // forward: sum = a + b, out = layernorm(sum); so da = db = dsum + (the LayerNorm's
                     // dx of dout), the second added inside the LayerNorm's backward
                     const Tensor dsum = g[0].defined() ? g[0].contiguous() : Tensor();
                     if (!g[1].defined()) return {dsum, dsum, Tensor(), Tensor()};
                     Tensor dx = empty_like(sum), dw = empty_like(w), db = empty_like(w);
                     kernels::layernorm_backward(g[1].contiguous(), sum, w, mean, rstd, dx, dw, db, dsum);
                     return {dx, dx, dw, db};
                   });
  return r;
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
namespace {

// The checks both cross-entropy ops share; returns v_limit resolved (-1: every column).
int64_t check_cross_entropy(const char* op, const Tensor& logits, const Tensor& targets, int64_t v_limit) {
  check_same(op, {&logits});
  NDT_CHECK(logits.dim() == 2, op, ": logits must be (N, V), got ", logits.shape_str());
  NDT_CHECK(targets.dtype() == DType::i32 && targets.dim() == 1 && targets.size(0) == logits.size(0), op,
            ": targets must be int32 (N) with N = ", logits.size(0), ", got ", targets.desc());
  NDT_CHECK(targets.device() == logits.device(), op, ": targets on ", targets.device().str(),
            " but logits on ", logits.device().str());
  const int64_t V = logits.size(1);
  if (v_limit < 0) v_limit = V;
  NDT_CHECK(v_limit >= 1 && v_limit <= V, op, ": v_limit ", v_limit, " outside [1, ", V, "]");
  return v_limit;
}

// dloss as the kernels take it: one element in the statistics dtype, on the device
Tensor dloss_of(const Grads& g, DType sd) {
  return g[0].dtype() == sd ? g[0].contiguous().view({1}) : g[0].to(sd).view({1});
}

}  // namespace

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets_in, int64_t ignore_index,
                     int64_t v_limit) {
  v_limit = check_cross_entropy("cross_entropy", logits_in, targets_in, v_limit);
  const int64_t N = logits_in.size(0);
  Tensor logits = logits_in.contiguous(), targets = targets_in.contiguous();
  const DType sd = stat_dtype(logits.dtype());
  Tensor losses = Tensor::empty({N}, sd, logits.device()), lse = Tensor::empty({N}, sd, logits.device());
  Tensor kept = Tensor::empty({1}, DType::i32, logits.device());  // rows that count, on the device
  kernels::count_not_equal(targets, ignore_index, kept);
  kernels::cross_entropy_forward(logits, targets, kept, v_limit, ignore_index, losses, lse, Tensor());
  // the mean in the statistics dtype, which is also the loss's dtype: f32 for bf16 logits,
  // so that a bf16 run reports (and scales, and seeds backward with) an f32 loss
  Tensor out = Tensor::empty({}, sd, logits.device());
  kernels::mean_of_kept(losses, kept, out);
  autograd::record(
      "cross_entropy", {out}, {logits_in},
      [logits = logits.detach(), targets, lse, kept, v_limit, ignore_index, sd](const Grads& g) -> Grads {
        // forward: loss = mean over kept rows of (lse - logit[target]); so
        // dlogits = (softmax - onehot) * dloss / kept
        Tensor dlogits = empty_like(logits);
        kernels::cross_entropy_backward(logits, targets, lse, kept, dloss_of(g, sd), v_limit, ignore_index,
                                        dlogits);
        return {dlogits};
      });
  return out;
}

Tensor cross_entropy_fused(const Tensor& logits_in, const Tensor& targets_in, int64_t ignore_index,
                           int64_t v_limit) {
  v_limit = check_cross_entropy("cross_entropy_fused", logits_in, targets_in, v_limit);
  if (!autograd::needs_grad({logits_in})) return cross_entropy(logits_in, targets_in, ignore_index, v_limit);
  NDT_CHECK(!logits_in.is_leaf(),
            "cross_entropy_fused: writes the gradient over its input, which must be an "
            "intermediate result (the lm_head's output), not a leaf such as a parameter; use cross_entropy");
  const int64_t N = logits_in.size(0);
  Tensor logits = logits_in.contiguous().detach(), targets = targets_in.contiguous();
  const DType sd = stat_dtype(logits.dtype());
  Tensor losses = Tensor::empty({N}, sd, logits.device()), lse = Tensor::empty({N}, sd, logits.device());
  Tensor kept = Tensor::empty({1}, DType::i32, logits.device());
  kernels::count_not_equal(targets, ignore_index, kept);
  // logits become (softmax - onehot) / kept: the gradient for dloss = 1, in their own memory
  kernels::cross_entropy_forward(logits, targets, kept, v_limit, ignore_index, losses, lse, logits);
  Tensor out = Tensor::empty({}, sd, logits.device());  // the loss in the statistics dtype, as above
  kernels::mean_of_kept(losses, kept, out);
  autograd::record("cross_entropy_fused", {out}, {logits_in},
                   [dlogits = logits, sd](const Grads& g) -> Grads {
                     // forward wrote dlogits = (softmax - onehot) / kept; the chain rule scales it by dloss
                     kernels::scale_by(dlogits, dloss_of(g, sd));
                     return {dlogits};
                   });
  return out;
}

}  // namespace ndt
