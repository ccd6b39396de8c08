#include "dist/tensor_parallel/comm.h"

#include <cmath>
#include <limits>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "nn/flat.h"
#include "tensor/kernels.h"

namespace ndt::dist {

// ---- f and g ---------------------------------------------------------------------------

Tensor copy_to_tp(const Tensor& x, Communicator& tp) {
  if (tp.size() == 1) return x;
  Tensor out = x.detach();  // forward: the identity
  autograd::record("copy_to_tp", {out}, {x}, [&tp](const autograd::Grads& g) -> autograd::Grads {
    // forward was y = x on every rank, and every rank's y feeds its own slice of the next
    // layer; so dx = sum over ranks of dy
    Tensor dx = g[0].contiguous().clone();
    tp.all_reduce(dx, ReduceOp::kSum)->wait();
    return {dx};
  });
  return out;
}

Tensor reduce_from_tp(const Tensor& x, Communicator& tp) {
  if (tp.size() == 1) return x;
  Tensor out = x.contiguous().clone();
  tp.all_reduce(out, ReduceOp::kSum)->wait();  // forward: y = sum over ranks of x
  autograd::record("reduce_from_tp", {out}, {x}, [](const autograd::Grads& g) -> autograd::Grads {
    return {g[0]};  // so dx = dy on every rank
  });
  return out;
}

// ---- sequence parallelism ----------------------------------------------------------------

// x (B, Ts, ...) on every rank -> (B, n Ts, ...), rank q's part at positions [q Ts, (q+1) Ts)
Pending start_all_gather_sequence(const Tensor& x, Communicator& tp) {
  const int64_t n = tp.size(), B = x.size(0), Ts = x.size(1);
  const Tensor in = x.contiguous();
  Shape whole = in.shape();
  whole[1] = n * Ts;
  Tensor all = Tensor::empty({n * in.numel()}, in.dtype(), in.device());
  WorkPtr w = tp.all_gather(all, in.view({in.numel()}));
  return [w, all, whole, n, B]() -> Tensor {
    w->wait();
    if (B == 1) return all.view(whole);  // (n, 1, Ts, ...) is already (1, n Ts, ...)
    // (n, B, Ts ...) -> (B, n, Ts ...)
    return all.view({n, B, all.numel() / (n * B)}).permute({1, 0, 2}).contiguous().view(whole);
  };
}

// y (B, T, ...) on every rank -> this rank's part of the sum over ranks, (B, T/n, ...)
Pending start_reduce_scatter_sequence_sum(const Tensor& y, Communicator& tp) {
  const int64_t n = tp.size(), B = y.size(0), T = y.size(1);
  NDT_CHECK(T % n == 0, "sequence parallelism: ", T, " positions do not split among ", n, " ranks");
  Shape part = y.shape();
  part[1] = T / n;
  // (B, n, Ts ...) -> (n, B, Ts ...): each rank's part in one piece
  const Tensor in = B == 1 ? y.contiguous()
                           : y.contiguous().view({B, n, y.numel() / (B * n)}).permute({1, 0, 2}).contiguous();
  Tensor out = Tensor::empty(part, y.dtype(), y.device());
  WorkPtr w = tp.reduce_scatter(out.view({out.numel()}), in.view({in.numel()}), ReduceOp::kSum);
  return [w, out]() -> Tensor {
    w->wait();
    return out;
  };
}

Pending start_all_reduce_sum_in_place(const Tensor& x, Communicator& tp) {
  NDT_CHECK(x.is_contiguous(), "start_all_reduce_sum_in_place: ", x.desc(), " must be contiguous");
  WorkPtr w = tp.all_reduce(x, ReduceOp::kSum);
  return [w, x]() -> Tensor {
    w->wait();
    return x;
  };
}

Tensor all_gather_sequence(const Tensor& x, Communicator& tp) { return start_all_gather_sequence(x, tp)(); }
Tensor reduce_scatter_sequence_sum(const Tensor& y, Communicator& tp) {
  return start_reduce_scatter_sequence_sum(y, tp)();
}

Tensor gather_sequence(const Tensor& x, Communicator& tp) {
  if (tp.size() == 1) return x;
  Tensor out = all_gather_sequence(x.detach(), tp);
  autograd::record("gather_sequence", {out}, {x}, [&tp](const autograd::Grads& g) -> autograd::Grads {
    // forward: every rank's y holds every rank's x; each rank's dy is its own (it feeds that
    // rank's slice of the next layer), so dx = this part of the sum over ranks of dy
    return {reduce_scatter_sequence_sum(g[0], tp)};
  });
  return out;
}

Tensor reduce_scatter_sequence(const Tensor& x, Communicator& tp) {
  if (tp.size() == 1) return x;
  Tensor out = reduce_scatter_sequence_sum(x.detach(), tp);
  autograd::record("reduce_scatter_sequence", {out}, {x}, [&tp](const autograd::Grads& g) -> autograd::Grads {
    // forward: rank q's y is part q of the sum of every rank's x; so dx, on every rank, is
    // the dy of every part: gathered
    return {all_gather_sequence(g[0], tp)};
  });
  return out;
}

// ---- the vocabulary-parallel embedding ---------------------------------------------------

Tensor vocab_parallel_embedding(const Tensor& ids, const Tensor& table, int64_t v_start, Communicator& tp) {
  if (tp.size() == 1) return embedding(ids, table);
  // the rank's rows for its ids, zero rows for the others' (their gradient adds nothing
  // here), all on the device; an id outside the whole vocabulary throws
  return reduce_from_tp(embedding(ids, table, v_start, tp.size() * table.size(0)), tp);
}

// ---- the vocabulary-parallel cross-entropy -------------------------------------------------

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t v_start,
                                    int64_t v_live, int64_t ignore_index, Communicator& tp) {
  NDT_CHECK(logits.dim() == 2 && targets.dim() == 1 && targets.size(0) == logits.size(0) &&
                targets.dtype() == DType::i32,
            "vocab_parallel_cross_entropy: logits (N, Vl) and targets (N) i32, got ", logits.desc(), " and ",
            targets.desc());
  const int64_t N = logits.size(0);
  const DType sd = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;  // statistics
  const Device dev = logits.device();
  Tensor x = logits.contiguous(), t = targets.contiguous().to(dev);
  // gmax: the row maximum over every rank's slice
  Tensor gmax = Tensor::empty({N}, sd, dev);
  kernels::rowmax(x, v_live, gmax);
  tp.all_reduce(gmax, ReduceOp::kMax)->wait();
  // sum of exp(logit - gmax) and the target's logit (held by one rank), summed over ranks
  Tensor sumexp = Tensor::empty({N}, sd, dev), target = Tensor::empty({N}, sd, dev);
  kernels::cross_entropy_partials(x, t, gmax, v_start, v_live, ignore_index, sumexp, target);
  dist::WorkPtr w1 = tp.all_reduce(sumexp, ReduceOp::kSum), w2 = tp.all_reduce(target, ReduceOp::kSum);
  w1->wait();
  w2->wait();
  // loss = mean over kept rows of log(sumexp) + gmax - target, all on the device
  Tensor losses = Tensor::empty({N}, sd, dev), kept = Tensor::empty({1}, DType::i32, dev);
  kernels::cross_entropy_parallel_losses(gmax, sumexp, target, t, ignore_index, losses);
  kernels::count_not_equal(t, ignore_index, kept);
  Tensor loss = Tensor::empty({}, sd, dev);  // f32 for bf16 logits, like cross_entropy
  kernels::mean_of_kept(losses, kept, loss);
  autograd::record("vocab_parallel_cross_entropy", {loss}, {logits},
                   [x, t, gmax, sumexp, kept, v_start, v_live, ignore_index,
                    sd](const autograd::Grads& g) -> autograd::Grads {
                     // forward: loss = mean_n (log sum_j exp(l_nj) - l_n,target); so
                     // dl_nj = dloss / kept * (softmax_nj - [j == target]), each rank on its slice
                     const Tensor dloss =
                         g[0].dtype() == sd ? g[0].contiguous().view({1}) : g[0].to(sd).view({1});
                     Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
                     kernels::cross_entropy_parallel_backward(x, t, gmax, sumexp, v_start, v_live,
                                                              ignore_index, kept, dloss, dx);
                     return {dx};
                   });
  return loss;
}

Tensor gather_vocab(const Tensor& logits, Communicator& tp) {
  if (tp.size() == 1) return logits;
  const int64_t N = logits.size(0), Vl = logits.size(1), n = tp.size();
  Tensor all = Tensor::empty({n * N * Vl}, logits.dtype(), logits.device());
  tp.all_gather(all, logits.contiguous().view({N * Vl}))->wait();
  // (n, N, Vl) -> (N, n, Vl) = (N, Vp)
  return all.view({n, N, Vl}).permute({1, 0, 2}).contiguous().view({N, n * Vl});
}

// ---- parameters for checkpoints ----------------------------------------------------------

namespace {
// Calls fn(local_index, global_index, length) for every run of the rank `rank`'s slice.
void for_each_run(nn::ParamSpec s, int64_t rank, const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  s.tp.rank = rank;
  nn::for_each_tp_run(s, 0, numel_of(s.shape), fn);
}
}  // namespace

Tensor gather_param(const nn::ParamSpec& spec, const Tensor& local, Communicator& tp) {
  if (!spec.tp.split()) return local;
  const int64_t n = tp.size(), L = local.numel();
  NDT_CHECK(n == spec.tp.parts, "gather_param: ", spec.name, " is cut in ", spec.tp.parts,
            " parts, the group has ", n);
  Tensor all = Tensor::empty({n * L}, local.dtype(), local.device());
  tp.all_gather(all, local.contiguous().view({L}))->wait();
  Tensor whole = Tensor::empty({numel_of(spec.tp.global)}, local.dtype(), local.device());
  for (int64_t q = 0; q < n; ++q)
    for_each_run(spec, q, [&](int64_t i, int64_t g, int64_t len) {
      whole.narrow(0, g, len).copy_(all.narrow(0, q * L + i, len));
    });
  return whole.view(spec.tp.global);
}

Tensor slice_param(const nn::ParamSpec& spec, const Tensor& whole) {
  if (!spec.tp.split()) return whole;
  NDT_CHECK(whole.shape() == spec.tp.global, "slice_param: ", spec.name, " is ", whole.shape_str(),
            ", expected ", shape_str(spec.tp.global));
  Tensor flat = whole.contiguous().view({whole.numel()});
  Tensor local = Tensor::empty({numel_of(spec.shape)}, whole.dtype(), whole.device());
  for_each_run(spec, spec.tp.rank, [&](int64_t i, int64_t g, int64_t len) {
    local.narrow(0, i, len).copy_(flat.narrow(0, g, len));
  });
  return local.view(spec.shape);
}

}  // namespace ndt::dist
