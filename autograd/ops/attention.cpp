// Causal scaled-dot-product attention with global position offsets, returning the output
// and the per-query log-sum-exp. Legend: B batch, NH heads, Tq queries, Tk keys, HS head size,
// Bh = B*NH.
//
// Composed from batched GEMMs and two small kernels, the same on CPU and CUDA:
//   s = q @ k^T                         (Bh,Tq,Tk)
//   p, lse = masked_softmax(scale * s)  p in place of s; lse (Bh,Tq)
//   out = p @ v                         (Bh,Tq,HS)
// bf16 inputs are computed in f32 (scores and probabilities are never stored in bf16).
//
// merge_attention combines two such results of the same queries over disjoint key blocks
// (ring attention: one block per step) through their log-sum-exps.
#include <cmath>

#include "autograd/ops/common.h"

namespace ndt {
using namespace ops_detail;

AttentionOut attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, int64_t q_offset,
                       int64_t k_offset, double scale) {
  check_same("attention", {&q_in, &k_in, &v_in});
  NDT_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4,
            "attention: q, k, v must be (B, NH, T, HS), got ", q_in.shape_str(), ", ", k_in.shape_str(), ", ",
            v_in.shape_str());
  NDT_CHECK(k_in.shape() == v_in.shape(), "attention: k ", k_in.shape_str(), " and v ", v_in.shape_str(),
            " differ");
  NDT_CHECK(q_in.size(0) == k_in.size(0) && q_in.size(1) == k_in.size(1) && q_in.size(3) == k_in.size(3),
            "attention: q ", q_in.shape_str(), " and k ", k_in.shape_str(), " differ in B, NH or HS");
  const int64_t B = q_in.size(0), NH = q_in.size(1), Tq = q_in.size(2), Tk = k_in.size(2), HS = q_in.size(3);
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(HS));
  const DType io = q_in.dtype(), cd = io == DType::bf16 ? DType::f32 : io;  // compute dtype

  // (B,NH,T,HS) -> (Bh,T,HS) in the compute dtype
  auto flat = [&](const Tensor& t) { return t.contiguous().to(cd).view({B * NH, t.size(2), HS}); };
  Tensor q = flat(q_in), k = flat(k_in), v = flat(v_in);
  Tensor p = Tensor::empty({B * NH, Tq, Tk}, cd, q.device());
  Tensor lse = Tensor::empty({B * NH, Tq}, stat_dtype(cd), q.device());
  kernels::gemm(q, false, k, true, p);  // s = q @ k^T
  kernels::attention_softmax_forward(p, scale, q_offset, k_offset, lse);
  Tensor o = Tensor::empty({B * NH, Tq, HS}, cd, q.device());
  kernels::gemm(p, false, v, false, o);  // out = p @ v

  AttentionOut r;
  r.out = o.view({B, NH, Tq, HS}).to(io);
  r.lse = lse.view({B, NH, Tq});
  autograd::record("attention", {r.out, r.lse}, {q_in, k_in, v_in},
                   [q, k, v, p, o, scale, B, NH, Tq, Tk, HS, io, cd](const Grads& g) -> Grads {
                     // forward: p = exp(scale*q k^T - lse) (masked), out = p v, lse = log sum exp(scale*q
                     // k^T); so
                     //   dv = p^T dout,  dp = dout v^T,  ds = scale * p * (dp - rowsum(dout*out) + dlse),
                     //   dq = ds k,  dk = ds^T q
                     Tensor dout = g[0].defined() ? g[0].contiguous().to(cd).view({B * NH, Tq, HS})
                                                  : Tensor::zeros({B * NH, Tq, HS}, cd, q.device());
                     Tensor dlse = g[1].defined() ? g[1].contiguous().view({B * NH, Tq}) : Tensor();
                     Tensor dv = Tensor::empty({B * NH, Tk, HS}, cd, q.device());
                     kernels::gemm(p, true, dout, false, dv);
                     Tensor ds = Tensor::empty({B * NH, Tq, Tk}, cd, q.device());
                     kernels::gemm(dout, false, v, true, ds);  // dp, turned into ds in place below
                     Tensor d = Tensor::empty({B * NH, Tq}, stat_dtype(cd), q.device());
                     kernels::rowwise_dot(o, dout, d);
                     kernels::attention_softmax_backward(p, ds, d, dlse, scale);
                     Tensor dq = Tensor::empty({B * NH, Tq, HS}, cd, q.device());
                     Tensor dk = Tensor::empty({B * NH, Tk, HS}, cd, q.device());
                     kernels::gemm(ds, false, k, false, dq);
                     kernels::gemm(ds, true, q, false, dk);
                     auto back = [&](const Tensor& t, int64_t T) { return t.view({B, NH, T, HS}).to(io); };
                     return {back(dq, Tq), back(dk, Tk), back(dv, Tk)};
                   });
  return r;
}

// out_a, out_b (B,NH,T,HS), lse_a, lse_b (B,NH,T) -> out (B,NH,T,HS), lse (B,NH,T)
AttentionOut merge_attention(const Tensor& out_a_in, const Tensor& lse_a_in, const Tensor& out_b_in,
                             const Tensor& lse_b_in) {
  check_same("merge_attention", {&out_a_in, &out_b_in});
  NDT_CHECK(out_a_in.dim() == 4 && out_a_in.shape() == out_b_in.shape(),
            "merge_attention: out_a and out_b must be (B, NH, T, HS) of one shape, got ",
            out_a_in.shape_str(), " and ", out_b_in.shape_str());
  const int64_t B = out_a_in.size(0), NH = out_a_in.size(1), T = out_a_in.size(2), HS = out_a_in.size(3);
  const DType io = out_a_in.dtype(), cd = io == DType::bf16 ? DType::f32 : io;  // compute dtype
  const DType sd = stat_dtype(cd);
  for (const Tensor* l : {&lse_a_in, &lse_b_in}) {
    NDT_CHECK(l->shape() == Shape({B, NH, T}), "merge_attention: lse must be (B, NH, T) = (", B, ", ", NH,
              ", ", T, "), got ", l->shape_str());
    NDT_CHECK(l->dtype() == sd && l->device() == out_a_in.device(), "merge_attention: lse must be ",
              dtype_name(sd), " on ", out_a_in.device().str(), " (as attention() returns it for ",
              dtype_name(io), " outputs), got ", l->desc());
  }

  // (B,NH,T,HS) -> (Bh,T,HS) in the compute dtype; (B,NH,T) -> (Bh,T)
  auto flat = [&](const Tensor& t) { return t.contiguous().to(cd).view({B * NH, T, HS}).detach(); };
  auto flat_lse = [&](const Tensor& t) { return t.contiguous().view({B * NH, T}).detach(); };
  Tensor oa = flat(out_a_in), ob = flat(out_b_in), la = flat_lse(lse_a_in), lb = flat_lse(lse_b_in);
  Tensor o = Tensor::empty({B * NH, T, HS}, cd, oa.device()),
         lse = Tensor::empty({B * NH, T}, sd, oa.device());
  kernels::attention_merge_forward(oa, la, ob, lb, o, lse);

  AttentionOut r;
  r.out = o.view({B, NH, T, HS}).to(io);
  r.lse = lse.view({B, NH, T});
  autograd::record(
      "merge_attention", {r.out, r.lse}, {out_a_in, lse_a_in, out_b_in, lse_b_in},
      [oa, la, ob, lb, o, lse, B, NH, T, HS, io, cd](const Grads& g) -> Grads {
        // forward: lse = logaddexp(lse_a, lse_b), out = w_a out_a + w_b out_b with
        // w_a = exp(lse_a - lse); so dout_a = w_a dout and
        // dlse_a = w_a (dlse + rowsum(dout * (out_a - out))), the same for b
        // (the kernel's comment derives it)
        Tensor dout = g[0].defined() ? g[0].contiguous().to(cd).view({B * NH, T, HS}) : Tensor();
        Tensor dlse = g[1].defined() ? g[1].contiguous().view({B * NH, T}) : Tensor();
        Tensor doa = empty_like(oa), dob = empty_like(ob), dla = empty_like(la), dlb = empty_like(lb);
        kernels::attention_merge_backward(oa, la, ob, lb, o, lse, dout, dlse, doa, dla, dob, dlb);
        auto back = [&](const Tensor& t) { return t.view({B, NH, T, HS}).to(io); };
        return {back(doa), dla.view({B, NH, T}), back(dob), dlb.view({B, NH, T})};
      });
  return r;
}

}  // namespace ndt
