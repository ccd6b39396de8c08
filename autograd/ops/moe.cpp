// Mixture-of-experts ops (Qwen3-MoE, Mixtral as transformers computes them): the router's
// top k, the sort of the tokens' choices by expert, dispatch to sorted rows, one GEMM per
// expert, and the weighted combine back to tokens.
// Legend: N tokens, E experts, k choices per token, M = N*k rows sorted by expert, C channels,
// G groups (experts), in / out a grouped GEMM's input and output channels.
#include <string>

#include "autograd/ops/common.h"

namespace ndt {
using namespace ops_detail;

namespace {

// The routing r fits a tensor of N = r.tokens rows on `device`.
void check_routing(const char* op, const MoeRouting& r, int64_t rows, Device device) {
  NDT_CHECK(r.order.defined() && r.order.dtype() == DType::i32 && r.order.numel() == r.tokens * r.k, op,
            ": the routing is not one moe_sort made (order ",
            r.order.defined() ? r.order.desc() : "undefined", " for ", r.tokens, " tokens x k ", r.k,
            "); pass moe_sort's result");
  NDT_CHECK(rows == r.tokens, op, ": the routing is for ", r.tokens, " tokens but the input has ", rows,
            " rows");
  NDT_CHECK(r.order.device() == device, op, ": the routing's order is on ", r.order.device().str(),
            " but the input on ", device.str(), "; call moe_sort on the experts of this device");
}

// order (M) -> slots (M), its inverse
Tensor slots_of(const Tensor& order) {
  Tensor slots = Tensor::empty(order.shape(), DType::i32, order.device());
  kernels::moe_slots(order, slots);
  return slots;
}

}  // namespace

// probs (N,E) -> values (N,k), experts (N,k) i32
TopK moe_topk(const Tensor& probs_in, int64_t k, bool normalize) {
  check_same("moe_topk", {&probs_in});
  NDT_CHECK(probs_in.dim() == 2, "moe_topk: probs must be (N, E), got ", probs_in.desc());
  const int64_t N = probs_in.size(0), E = probs_in.size(1);
  NDT_CHECK(k >= 1 && k <= E, "moe_topk: k = ", k, " must be in [1, E] for the ", E, " experts of probs ",
            probs_in.desc(), "; lower num_experts_per_tok");
  Tensor probs = probs_in.contiguous();
  TopK t{Tensor::empty({N, k}, probs.dtype(), probs.device()),
         Tensor::empty({N, k}, DType::i32, probs.device())};
  kernels::moe_topk_forward(probs, k, normalize, t.values, t.experts);
  autograd::record("moe_topk", {t.values}, {probs_in},
                   [p = probs.detach(), ex = t.experts, normalize](const Grads& g) -> Grads {
                     // forward: v_j = p[e_j] (/ S, S = sum_j p[e_j], when normalize); so dp[e_j] = dv_j,
                     // normalized (dv_j - sum_i dv_i v_i) / S, and 0 for the experts not chosen
                     Tensor dp = empty_like(p);
                     kernels::moe_topk_backward(p, ex, g[0].contiguous(), normalize, dp);
                     return {dp};
                   });
  return t;
}

// experts (N,k) i32 -> the choices n*k + j sorted by expert (a stable counting sort on the host)
MoeRouting moe_sort(const Tensor& experts, int64_t E) {
  NDT_CHECK(experts.defined() && experts.dtype() == DType::i32 && experts.dim() == 2,
            "moe_sort: experts must be (N, k) int32 (moe_topk's experts), got ",
            experts.defined() ? experts.desc() : "undefined");
  NDT_CHECK(E >= 1, "moe_sort: the number of experts must be at least 1, got ", E);
  MoeRouting r;
  r.tokens = experts.size(0);
  r.k = experts.size(1);
  const std::vector<int32_t> ex = experts.to_vector<int32_t>();  // (N*k), choice c = n*k + j
  r.counts.assign(static_cast<size_t>(E), 0);
  for (size_t c = 0; c < ex.size(); ++c) {
    NDT_CHECK(ex[c] >= 0 && ex[c] < E, "moe_sort: experts[", static_cast<int64_t>(c) / r.k, ", ",
              static_cast<int64_t>(c) % r.k, "] = ", ex[c], " is outside [0, ", E, ")");
    ++r.counts[static_cast<size_t>(ex[c])];
  }
  std::vector<int64_t> next(static_cast<size_t>(E), 0);  // the next free sorted row of each expert
  for (int64_t e = 1; e < E; ++e) next[e] = next[e - 1] + r.counts[e - 1];
  std::vector<int32_t> order(ex.size());
  for (size_t c = 0; c < ex.size(); ++c) order[static_cast<size_t>(next[ex[c]]++)] = static_cast<int32_t>(c);
  r.order = Tensor::from_vector<int32_t>(order, {static_cast<int64_t>(order.size())}, experts.device());
  return r;
}

// x (N,C) -> (M,C): sorted row r is x[order[r] / k]
Tensor moe_dispatch(const Tensor& x_in, const MoeRouting& r) {
  check_same("moe_dispatch", {&x_in});
  NDT_CHECK(x_in.dim() == 2, "moe_dispatch: x must be (N, C), got ", x_in.desc());
  check_routing("moe_dispatch", r, x_in.size(0), x_in.device());
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty({r.order.numel(), x.size(1)}, x.dtype(), x.device());
  kernels::moe_dispatch_forward(x, r.order, r.k, out);
  autograd::record("moe_dispatch", {out}, {x_in},
                   [order = r.order, k = r.k, xshape = x.shape(), dt = x.dtype(),
                    dev = x.device()](const Grads& g) -> Grads {
                     // forward: each token copied to its k sorted rows; so dx[n] = the sum of its rows'
                     // gradients, dx[n] = sum_j dout[slots[n*k+j]]
                     Tensor dx = Tensor::empty(xshape, dt, dev);
                     kernels::moe_dispatch_backward(g[0].contiguous(), slots_of(order), k, dx);
                     return {dx};
                   });
  return out;
}

// x (M,in), w (G,in,out) -> (M,out): rows of group g times w[g]
Tensor grouped_matmul(const Tensor& x_in, const Tensor& w_in, const std::vector<int64_t>& counts) {
  check_same("grouped_matmul", {&x_in, &w_in});
  NDT_CHECK(x_in.dim() == 2 && w_in.dim() == 3 && x_in.size(1) == w_in.size(1),
            "grouped_matmul: expected x (M, in) and w (G, in, out), got x ", x_in.desc(), " and w ",
            w_in.desc());
  NDT_CHECK(static_cast<int64_t>(counts.size()) == w_in.size(0), "grouped_matmul: ", counts.size(),
            " group counts for the ", w_in.size(0), " groups of w ", w_in.desc());
  int64_t m = 0;
  for (int64_t c : counts) {
    NDT_CHECK(c >= 0, "grouped_matmul: a group count is negative (", c, ")");
    m += c;
  }
  NDT_CHECK(m == x_in.size(0), "grouped_matmul: the group counts sum to ", m, " but x ", x_in.desc(), " has ",
            x_in.size(0), " rows; pass moe_sort's counts for the rows moe_dispatch made");
  Tensor x = x_in.contiguous(), w = w_in.contiguous();
  Tensor out = Tensor::empty({m, w.size(2)}, x.dtype(), x.device());
  kernels::grouped_gemm(x, w, /*trans_b=*/false, out, counts);
  const bool nx = x_in.requires_grad(), nw = w_in.requires_grad();
  // a leaf weight's gradient is added straight into its .grad (see grad_to_accumulate_into)
  std::shared_ptr<TensorImpl> w_leaf = nw ? autograd::accumulation_leaf(w_in) : nullptr;
  // dx needs w and dw needs x: save only what the backward will use
  autograd::record(
      "grouped_matmul", {out}, {x_in, w_in},
      [x = nw ? x.detach() : Tensor(), w = nx ? w.detach() : Tensor(), w_leaf, xshape = x.shape(),
       wshape = w.shape(), dt = x.dtype(), dev = x.device(), counts, nx, nw](const Grads& g) -> Grads {
        // forward: out_g = x_g @ w[g]; so dx_g = dout_g @ w[g]^T and dw[g] = x_g^T @ dout_g
        // (zero for a group without rows; added onto w.grad, beta 1, where w is a leaf)
        const Tensor dout = g[0].contiguous();
        Tensor dx, dw;
        if (nx) {
          dx = Tensor::empty(xshape, dt, dev);
          kernels::grouped_gemm(dout, w, /*trans_b=*/true, dx, counts);
        }
        if (nw) {
          double beta = 0.0;
          dw = autograd::grad_to_accumulate_into(w_leaf, wshape, dt, dev, &beta);
          if (!dw.defined()) dw = Tensor::empty(wshape, dt, dev);
          kernels::grouped_gemm_dw(x, dout, counts, dw, beta);  // dw (+)= x_g^T @ dout_g
        }
        return {dx, dw};
      });
  return out;
}

// y (M,C), weights (N,k) -> (N,C): out[n] = sum_j weights[n,j] y[slots[n*k+j]]
Tensor moe_combine(const Tensor& y_in, const Tensor& weights_in, const MoeRouting& r) {
  check_same("moe_combine", {&y_in, &weights_in});
  NDT_CHECK(weights_in.dim() == 2 && weights_in.size(1) == r.k,
            "moe_combine: weights must be (N, k) with k = ", r.k, ", got ", weights_in.desc());
  check_routing("moe_combine", r, weights_in.size(0), weights_in.device());
  NDT_CHECK(y_in.dim() == 2 && y_in.size(0) == r.tokens * r.k, "moe_combine: y must be (N*k, C) = (",
            r.tokens * r.k, ", C) sorted rows, got ", y_in.desc());
  Tensor y = y_in.contiguous(), w = weights_in.contiguous();
  Tensor slots = slots_of(r.order);
  Tensor out = Tensor::empty({r.tokens, y.size(1)}, y.dtype(), y.device());
  kernels::moe_combine_forward(y, w, slots, out);
  autograd::record("moe_combine", {out}, {y_in, weights_in},
                   [y = y.detach(), w = w.detach(), order = r.order, slots](const Grads& g) -> Grads {
                     // forward: out[n] = sum_j w[n,j] y[slots[n*k+j]]; so the row r of choice c = order[r]
                     // gets dy[r] = w[c] dout[c/k], and dw[n,j] = <dout[n], y[slots[n*k+j]]>
                     Tensor dy = empty_like(y), dw = empty_like(w);
                     kernels::moe_combine_backward(y, w, g[0].contiguous(), order, slots, dy, dw);
                     return {dy, dw};
                   });
  return out;
}

}  // namespace ndt
