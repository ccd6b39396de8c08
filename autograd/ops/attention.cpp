// Causal scaled-dot-product attention with global position offsets, returning the output
// and the per-query log-sum-exp. Legend: B batch, NH heads, Tq queries, Tk keys, HS head size,
// Bh = B*NH.
//
// Composed from batched GEMMs and two small kernels, the same on CPU and CUDA:
//   s = q @ k^T                         (Bh,Tq,Tk)
//   p, lse = masked_softmax(scale * s)  p in place of s; lse (Bh,Tq)
//   out = p @ v                         (Bh,Tq,HS)
// bf16 inputs are computed in f32 (scores and probabilities are never stored in bf16).
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

}  // namespace ndt
