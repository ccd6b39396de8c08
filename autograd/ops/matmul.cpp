// matmul and linear. Legend: M, K, N matrix dims; Bt batch; C in, OC out channels.
#include "autograd/defer.h"
#include "autograd/ops/common.h"

namespace ndt {
using namespace ops_detail;

namespace {
Shape matmul_shape(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  NDT_CHECK((a.dim() == 2 && b.dim() == 2) || (a.dim() == 3 && (b.dim() == 2 || b.dim() == 3)),
            "matmul: expected 2-D @ 2-D, 3-D @ 3-D or 3-D @ 2-D, got ", a.shape_str(), " @ ", b.shape_str());
  const int64_t m = ta ? a.size(-1) : a.size(-2), k = ta ? a.size(-2) : a.size(-1);
  const int64_t kb = tb ? b.size(-1) : b.size(-2), n = tb ? b.size(-2) : b.size(-1);
  NDT_CHECK(k == kb, "matmul: inner dimensions differ: ", a.shape_str(), (ta ? "^T" : ""), " @ ",
            b.shape_str(), (tb ? "^T" : ""), " (", k, " vs ", kb, ")");
  NDT_CHECK(!(a.dim() == 3 && b.dim() == 2 && ta),
            "matmul: a transposed 3-D a with a 2-D b is not supported");
  if (a.dim() == 3 && b.dim() == 3)
    NDT_CHECK(a.size(0) == b.size(0), "matmul: batch sizes differ: ", a.shape_str(), " @ ", b.shape_str());
  return a.dim() == 3 ? Shape{a.size(0), m, n} : Shape{m, n};
}
}  // namespace

// a (M,K) @ b (K,N) -> (M,N), optionally batched, optionally transposed operands
Tensor matmul(const Tensor& a_in, const Tensor& b_in, bool ta, bool tb) {
  check_same("matmul", {&a_in, &b_in});
  Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor out = Tensor::empty(matmul_shape(a, b, ta, tb), a.dtype(), a.device());
  kernels::gemm(a, ta, b, tb, out);
  const bool na = a_in.requires_grad(), nb = b_in.requires_grad();
  // da needs b and db needs a: save only what the backward will use
  autograd::record(
      "matmul", {out}, {a_in, b_in},
      [a = nb ? a.detach() : Tensor(), b = na ? b.detach() : Tensor(), ashape = a.shape(), bshape = b.shape(),
       dt = a.dtype(), dev = a.device(), ta, tb, na, nb](const Grads& g) -> Grads {
        // forward: out = op(a) @ op(b); so d op(a) = dout @ op(b)^T and d op(b) = op(a)^T @ dout
        const Tensor dout = g[0].contiguous();
        Tensor da, db;
        if (na) {
          da = Tensor::empty(ashape, dt, dev);
          if (!ta)
            kernels::gemm(dout, false, b, !tb, da);  // da = dout @ op(b)^T
          else
            kernels::gemm(b, tb, dout, true, da);  // da = (dout @ op(b)^T)^T = op(b) @ dout^T
        }
        if (nb) {
          db = Tensor::empty(bshape, dt, dev);
          if (bshape.size() == 2 && ashape.size() == 3) {
            // b shared by every batch: sum the per-batch gradients, i.e. flatten (Bt*M) rows
            const Tensor a2 = a.view({-1, a.size(-1)}), d2 = dout.view({-1, dout.size(-1)});
            if (!tb)
              kernels::gemm(a2, true, d2, false, db);  // db = a^T @ dout
            else
              kernels::gemm(d2, true, a2, false, db);  // db = dout^T @ a
          } else {
            if (!tb)
              kernels::gemm(a, !ta, dout, false, db);  // db = op(a)^T @ dout
            else
              kernels::gemm(dout, true, a, ta, db);  // db = (op(a)^T @ dout)^T = dout^T @ op(a)
          }
        }
        return {da, db};
      });
  return out;
}

namespace {

void check_linear_shapes(const char* op, const Tensor& x, const Tensor& w, const Tensor& b) {
  NDT_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(0), op, ": input ", x.shape_str(),
            " does not match weight ", w.shape_str(), " (expected x (..., C) and w (C, OC))");
  NDT_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(1)), op, ": bias ", b.shape_str(),
            " does not match weight ", w.shape_str(), " (expected (OC))");
}

// x (..., C) @ w (C, OC) + b (OC) -> (..., OC), then GELU if gelu: one node, the bias (and
// GELU) fused into the GEMM where the backend can (kernels::linear_forward). With shared,
// the input's collectives (linear_shared_input); with its gather, x_in is a part of the
// input: x = gather(x_in), made again in backward.
Tensor linear_impl(const char* op, const Tensor& part_in, const Tensor& w_in, const Tensor& b_in, bool gelu,
                   const SharedInput* shared = nullptr) {
  check_same(op, {&part_in, &w_in, &b_in});
  const StartFn gather = shared ? shared->gather : StartFn(),
                reduce_grad = shared ? shared->reduce_grad : StartFn();
  const Tensor x_in = gather ? gather(part_in.detach())() : part_in;
  check_linear_shapes(op, x_in, w_in, b_in);
  const int64_t C = w_in.size(0), OC = w_in.size(1);
  Shape out_shape = x_in.shape();
  out_shape.back() = OC;
  const Tensor x = x_in.contiguous().view({-1, C}), w = w_in.contiguous();
  const Tensor b = b_in.defined() ? b_in.contiguous() : Tensor();
  const int64_t N = x.size(0);
  Tensor out = Tensor::empty({N, OC}, x.dtype(), x.device());
  Tensor pre = gelu ? Tensor::empty({N, OC}, x.dtype(), x.device()) : Tensor();
  kernels::linear_forward(x, w, b, gelu, out, pre);
  Tensor y = out.view(out_shape);

  const bool nx = part_in.requires_grad(), nw = w_in.requires_grad(),
             nb = b.defined() && b_in.requires_grad();
  std::vector<Tensor> inputs{part_in, w_in};
  if (b.defined()) inputs.push_back(b_in);
  // dx needs w and dw needs x: save only what the backward will use (gathered: the part)
  const Tensor x_saved = !nw ? Tensor() : gather ? part_in.contiguous().detach() : x.detach();
  // a leaf weight's gradient is added straight into its .grad (see grad_to_accumulate_into)
  std::shared_ptr<TensorImpl> w_leaf = nw ? autograd::accumulation_leaf(w_in) : nullptr;
  autograd::record(
      op, {y}, inputs,
      [x_saved, w = nx ? w.detach() : Tensor(), w_leaf, pre, xshape = x_in.shape(), C, OC, N, nx, nw, nb,
       has_b = b.defined(), gather, reduce_grad](const Grads& g) -> Grads {
        // forward: pre = x @ w + b, out = GELU(pre) (or out = pre); so
        //   dpre = GELU'(pre) * dout,  dx = dpre @ w^T,  dw = x^T @ dpre,  db = sum_rows(dpre)
        // (dw added onto w.grad by the GEMM, beta 1, where w is a leaf)
        // shared input: dx's sum over the ranks runs while dw's GEMM does; gathered, the
        // whole x is gathered again while dx's GEMM runs. Under a zero-bubble schedule's
        // input-gradient pass (autograd/defer.h) dw waits in the queue for the weight pass.
        autograd::DeferredWeightGrads* later = nw && w_leaf ? autograd::deferring() : nullptr;
        const Pending x_whole = nw && gather && !later ? gather(x_saved) : Pending();
        Tensor dpre = g[0].contiguous().view({N, OC});
        if (pre.defined()) {
          Tensor d = empty_like(dpre);
          kernels::gelu_backward(pre, dpre, d);
          dpre = d;
        }
        Grads r(has_b ? 3 : 2);
        Pending dx_sum;
        if (nx) {
          Tensor dx = Tensor::empty({N, C}, dpre.dtype(), dpre.device());
          kernels::gemm(dpre, false, w, true, dx);
          if (reduce_grad)
            dx_sum = reduce_grad(dx.view(xshape));
          else
            r[0] = dx.view(xshape);
        }
        // dw = x^T @ dpre, added onto w.grad in place where it can be
        auto weight_grad = [x_saved, gather, w_leaf, C, OC, N](const Tensor& dpre, const Pending& x_whole) {
          const Tensor x = x_whole  ? x_whole().contiguous().view({N, C})
                           : gather ? gather(x_saved)().contiguous().view({N, C})
                                    : x_saved;
          double beta = 0.0;
          Tensor dw = autograd::grad_to_accumulate_into(w_leaf, {C, OC}, dpre.dtype(), dpre.device(), &beta);
          if (!dw.defined()) dw = Tensor::empty({C, OC}, dpre.dtype(), dpre.device());
          kernels::gemm(x, true, dpre, false, dw, 1.0, beta);  // dw (+)= x^T @ dpre
          return dw;
        };
        if (later)
          later->push(w_leaf, [weight_grad, dpre] { return weight_grad(dpre, Pending()); });
        else if (nw)
          r[1] = weight_grad(dpre, x_whole);
        if (nb) {
          r[2] = Tensor::empty({OC}, dpre.dtype(), dpre.device());
          kernels::sum_rows(dpre, r[2]);
        }
        if (dx_sum) r[0] = dx_sum();
        return r;
      });
  return y;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  return linear_impl("linear", x, w, b, false);
}

Tensor linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b) {
  return linear_impl("linear_gelu", x, w, b, true);
}

Tensor linear_shared_input(const Tensor& x, const Tensor& w, const Tensor& b, bool gelu,
                           const SharedInput& comm) {
  return linear_impl(gelu ? "linear_gelu_shared_input" : "linear_shared_input", x, w, b, gelu, &comm);
}

}  // namespace ndt
