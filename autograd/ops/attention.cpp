// Causal scaled-dot-product attention with global position offsets, returning the output
// and the per-query log-sum-exp. Legend: B batch, NH query heads, NKV key/value heads (NKV
// divides NH), G = NH/NKV query heads per kv head, Tq queries, Tk keys, HS head size,
// Bh = B*NH, Bkv = B*NKV.
//
// Grouped-query attention (GQA; NKV = NH is multi-head, NKV = 1 multi-query): query head h
// attends with kv head h/G, Hugging Face's repeat_kv order (kv head g serves query heads
// g G .. g G + G-1). No path copies K or V per query head.
//
// Three paths compute the same thing:
// - composed (attention_composed), the same on CPU and CUDA and the reference. The G query
//   heads of kv head g lie next to each other in q (B,NH,Tq,HS) = (B,NKV,G,Tq,HS), so as
//   one (G*Tq, HS) matrix per kv head they meet its K and V in ordinary batched GEMMs:
//     s = q @ k^T                         (Bkv,G*Tq,Tk), = (Bh,Tq,Tk) for the softmax
//     p, lse = masked_softmax(scale * s)  p in place of s; lse (Bh,Tq)
//     out = p @ v                         (Bkv,G*Tq,HS) = (B,NH,Tq,HS)
//   and backward's dk = ds^T q, dv = p^T dout sum over the G heads inside the GEMM.
//   bf16 inputs are computed in f32 (scores and probabilities are never stored in bf16).
// - fused on the CPU (tensor/cpu/self_attention.cpp): blocks of queries against the keys
//   they see, q, k, v read in place; backward makes the probabilities again from q, k and
//   lse, so nothing of (Tq,Tk) is kept; the lse's gradient enters ds directly.
// - fused, on CUDA for bf16 when cuda::sdpa_supported() says so: cuDNN's flash attention
//   (tensor/cuda/sdpa.h), which never stores the (Tq,Tk) scores; its backward needs only
//   q, k, v, out and lse. attention() picks the path; NDT_SDPA=0 forces the composed one.
//
// Packed rows: docs (B, Td) i32 gives the document of every global position, in runs (each
// row non-decreasing); query i then sees key j also only if both lie in one document. The
// kernels take that mask as key_lo (B, Tq), the first key of each query's document
// (document_key_starts): the composed softmax zeroes the keys before it, the CPU's fused
// kernel computes no score against keys before its block's first. On CUDA, packed rows take
// the composed path (cuDNN's kernel is given no such mask).
//
// merge_attention combines two such results of the same queries over disjoint key blocks
// (ring attention: one block per step) through their log-sum-exps.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/ops/common.h"
#include "tensor/cuda/sdpa.h"

namespace ndt {
using namespace ops_detail;

namespace {

// docs (B, Td) i32, each row non-decreasing -> the first index of each position's document,
// (B*Td) on the host. who: the caller, for the error.
std::vector<int32_t> run_starts(const Tensor& docs, const char* who) {
  NDT_CHECK(docs.dim() == 2 && docs.dtype() == DType::i32, who,
            ": docs (the document of every position of a packed row) must be (B, T) int32, got ",
            docs.desc());
  const int64_t B = docs.size(0), Td = docs.size(1);
  const std::vector<int32_t> d = docs.to(Device::cpu()).contiguous().to_vector<int32_t>();
  std::vector<int32_t> start(d.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Td; ++t) {
      const int64_t x = b * Td + t;
      NDT_CHECK(t == 0 || d[x] >= d[x - 1], who,
                ": docs must not decrease along a row (a document is one run "
                "of positions), but row ",
                b, " goes from ", d[x - 1], " to ", d[x], " at position ", t);
      start[x] = t > 0 && d[x] == d[x - 1] ? start[x - 1] : static_cast<int32_t>(t);
    }
  return start;
}

void check_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  check_same("attention", {&q, &k, &v});
  NDT_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
            "attention: q must be (B, NH, Tq, HS), k and v (B, NKV, Tk, HS), got ", q.shape_str(), ", ",
            k.shape_str(), ", ", v.shape_str());
  NDT_CHECK(k.shape() == v.shape(), "attention: k ", k.shape_str(), " and v ", v.shape_str(), " differ");
  NDT_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3), "attention: q ", q.shape_str(), " and k ",
            k.shape_str(), " differ in B or HS");
  NDT_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "attention: q has ", q.size(1), " heads and k, v ",
            k.size(1), ": the kv heads must divide the query heads (grouped-query attention), q ",
            q.shape_str(), ", k ", k.shape_str());
}

// The grouped layout of the composed path: q-shaped (B,NH,T,HS) -> (Bkv,G*T,HS), k-shaped
// (B,NKV,T,HS) -> (Bkv,T,HS), contiguous in dtype cd (a view where t already is).
Tensor grouped(const Tensor& t, int64_t NKV, DType cd) {
  const int64_t B = t.size(0), T = t.size(2), HS = t.size(3), G = t.size(1) / NKV;
  return t.contiguous().to(cd).view({B * NKV, G * T, HS});
}

// In the grouped layout: q (Bkv,G*Tq,HS), k (Bkv,Tk,HS) -> p (Bkv,G*Tq,Tk) = masked
// softmax(scale * q @ k^T), lse (Bh,Tq); key_lo (B,Tq) the documents' mask, or undefined
void attention_probs(const Tensor& q, const Tensor& k, double scale, int64_t q_offset, int64_t k_offset,
                     const Tensor& p, const Tensor& lse, const Tensor& key_lo = {}) {
  kernels::gemm(q, false, k, true, p);  // s = q @ k^T
  // the mask depends on the query's position i: rows of p as (Bh,Tq,Tk), i = row % Tq
  const int64_t Tq = lse.size(1), Tk = p.size(2);
  kernels::attention_softmax_forward(p.view({lse.size(0), Tq, Tk}), scale, q_offset, k_offset, lse, key_lo);
}

// The composed backward, in the grouped layout: q (Bkv,G*Tq,HS), k, v (Bkv,Tk,HS),
// p (Bkv,G*Tq,Tk), o (Bkv,G*Tq,HS) in the compute dtype, the gradients of out (B,NH,Tq,HS)
// and lse (B,NH,Tq), either undefined
//   -> dq (B,NH,Tq,HS), dk, dv (B,NKV,Tk,HS) in io
Grads composed_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& p, const Tensor& o,
                        const Tensor& dout_in, const Tensor& dlse_in, double scale, int64_t B, int64_t NH,
                        DType io) {
  // forward: p = exp(scale*q k^T - lse) (masked), out = p v, lse = log sum exp(scale*q k^T); so
  //   dv = p^T dout,  dp = dout v^T,  ds = scale * p * (dp - rowsum(dout*out) + dlse),
  //   dq = ds k,  dk = ds^T q
  // k and v served the G query heads of their group (the G*Tq rows of q): the GEMMs for dk
  // and dv run over those rows, so they are the sums over the group.
  const int64_t Bkv = k.size(0), NKV = Bkv / B, GTq = q.size(1), Tq = GTq / (NH / NKV), Tk = k.size(1),
                HS = q.size(2);
  const DType cd = q.dtype();
  Tensor dout = dout_in.defined() ? dout_in.contiguous().to(cd).view({Bkv, GTq, HS})
                                  : Tensor::zeros({Bkv, GTq, HS}, cd, q.device());
  Tensor dlse = dlse_in.defined() ? dlse_in.contiguous().view({Bkv, GTq}) : Tensor();
  Tensor dv = Tensor::empty({Bkv, Tk, HS}, cd, q.device());
  kernels::gemm(p, true, dout, false, dv);
  Tensor ds = Tensor::empty({Bkv, GTq, Tk}, cd, q.device());
  kernels::gemm(dout, false, v, true, ds);  // dp, turned into ds in place below
  Tensor d = Tensor::empty({Bkv, GTq}, stat_dtype(cd), q.device());
  kernels::rowwise_dot(o, dout, d);
  kernels::attention_softmax_backward(p, ds, d, dlse, scale);  // row by row: any grouping
  Tensor dq = Tensor::empty({Bkv, GTq, HS}, cd, q.device());
  Tensor dk = Tensor::empty({Bkv, Tk, HS}, cd, q.device());
  kernels::gemm(ds, false, k, false, dq);
  kernels::gemm(ds, true, q, false, dk);
  return {dq.view({B, NH, Tq, HS}).to(io), dk.view({B, NKV, Tk, HS}).to(io),
          dv.view({B, NKV, Tk, HS}).to(io)};
}

// The fused path (cuDNN SDPA): q (B,NH,Tq,HS), k, v (B,NKV,Tk,HS) bf16, as they come (no
// copies; cuDNN reads kv head h/G for query head h) -> out (B,NH,Tq,HS) bf16 contiguous,
// lse (B,NH,Tq) f32. sdpa_supported() has checked that the mask is causal from the top-left
// corner or empty.
AttentionOut attention_fused(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, int64_t q_offset,
                             int64_t k_offset, double scale) {
  const int64_t B = q_in.size(0), NH = q_in.size(1), NKV = k_in.size(1), Tq = q_in.size(2), Tk = k_in.size(2),
                HS = q_in.size(3);
  const bool causal = k_offset + Tk - 1 > q_offset;  // else every key is visible to every query
  const Device dev = q_in.device();
  Tensor q = q_in.detach(), k = k_in.detach(), v = v_in.detach();
  Tensor out = Tensor::empty({B, NH, Tq, HS}, DType::bf16, dev),
         lse = Tensor::empty({B, NH, Tq}, DType::f32, dev);
  cuda::sdpa_forward(q, k, v, causal, scale, out, lse);

  AttentionOut r{out, lse};
  autograd::record("attention", {r.out, r.lse}, {q_in, k_in, v_in},
                   [q, k, v, o = out.detach(), lse = lse.detach(), causal, scale, q_offset, k_offset, B, NH,
                    NKV, Tq, Tk, HS](const Grads& g) -> Grads {
                     // forward: out = softmax(scale * q k^T + mask) v, lse its rows' log-sum-exp (as in
                     // composed_backward). cuDNN differentiates out only: its backward computes
                     // rowsum(dout*out) itself and has no input for dlse. A dlse (ring attention merges
                     // through lse) adds scale * p * dlse to ds, so with one this node recomputes p from
                     // q, k and differentiates through the composed kernels: exact, at the composed cost.
                     if (g[1].defined()) {
                       Tensor qf = grouped(q, NKV, DType::f32), kf = grouped(k, NKV, DType::f32),
                              vf = grouped(v, NKV, DType::f32), of = grouped(o, NKV, DType::f32);
                       Tensor p = Tensor::empty({B * NKV, qf.size(1), Tk}, DType::f32, q.device());
                       Tensor lse_again = Tensor::empty({B * NH, Tq}, DType::f32, q.device());
                       attention_probs(qf, kf, scale, q_offset, k_offset, p, lse_again);
                       return composed_backward(qf, kf, vf, p, of, g[0], g[1], scale, B, NH, DType::bf16);
                     }
                     // dout (B,NH,Tq,HS) -> dq (B,NH,Tq,HS), dk, dv (B,NKV,Tk,HS), all bf16 (cuDNN
                     // sums each kv head's gradients over its G query heads)
                     Tensor dout = g[0].contiguous().to(DType::bf16);
                     Tensor dq = Tensor::empty({B, NH, Tq, HS}, DType::bf16, q.device());
                     Tensor dk = Tensor::empty({B, NKV, Tk, HS}, DType::bf16, q.device());
                     Tensor dv = Tensor::empty({B, NKV, Tk, HS}, DType::bf16, q.device());
                     cuda::sdpa_backward(q, k, v, o, lse, dout, causal, scale, dq, dk, dv);
                     return {dq, dk, dv};
                   });
  return r;
}

// The CPU's fused kernel: q (B,NH,Tq,HS), k, v (B,NKV,Tk,HS) as they lie when f32/f64 with
// contiguous rows (bf16: converted to f32 copies, as the composed path computes) ->
// out (B,NH,Tq,HS) contiguous in q's dtype, lse (B,NH,Tq) in the compute dtype. Query head
// h reads kv head h/G in place; backward writes dk, dv (B,NKV,Tk,HS) as sums over groups.
AttentionOut attention_fused_cpu(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, int64_t q_offset,
                                 int64_t k_offset, double scale, const Tensor& key_lo) {
  const int64_t B = q_in.size(0), NH = q_in.size(1), Tq = q_in.size(2), HS = q_in.size(3);
  const DType io = q_in.dtype(), cd = io == DType::bf16 ? DType::f32 : io;  // compute dtype
  auto in_cd = [cd, HS](const Tensor& t) {  // rows contiguous, in the compute dtype
    const Tensor c = t.dtype() == cd && (t.strides()[3] == 1 || HS == 1) ? t : t.contiguous().to(cd);
    return c.detach();
  };
  const Tensor q = in_cd(q_in), k = in_cd(k_in), v = in_cd(v_in);
  Tensor o = Tensor::empty({B, NH, Tq, HS}, cd, q.device()), lse = Tensor::empty({B, NH, Tq}, cd, q.device());
  kernels::attention_fused_forward(q, k, v, q_offset, k_offset, scale, o, lse, key_lo);

  AttentionOut r{o.to(io), lse.detach()};
  // saved: q, k, v as they came (bf16 stays bf16, converted again in backward), o in the
  // compute dtype (f32/f64: the output itself) and lse, as handles without autograd history
  autograd::record("attention", {r.out, r.lse}, {q_in, k_in, v_in},
                   [qs = q_in.detach(), ks = k_in.detach(), vs = v_in.detach(), o = o.detach(), lse, q_offset,
                    k_offset, scale, cd, io, in_cd, key_lo](const Grads& g) -> Grads {
                     const Tensor q = in_cd(qs), k = in_cd(ks), v = in_cd(vs);
                     const Tensor dout =
                         g[0].defined() ? g[0].contiguous().to(cd) : Tensor::zeros(o.shape(), cd);
                     const Tensor dlse = g[1].defined() ? g[1].contiguous() : Tensor();
                     Tensor dq = Tensor::empty(q.shape(), cd), dk = Tensor::empty(k.shape(), cd),
                            dv = Tensor::empty(v.shape(), cd);
                     kernels::attention_fused_backward(q, k, v, o, lse, dout, dlse, q_offset, k_offset, scale,
                                                       dq, dk, dv, key_lo);
                     return {dq.to(io), dk.to(io), dv.to(io)};
                   });
  return r;
}

}  // namespace

Tensor document_key_starts(const Tensor& docs, int64_t B, int64_t Tq, int64_t Tk, int64_t q_offset,
                           int64_t k_offset) {
  const std::vector<int32_t> start = run_starts(docs, "attention");
  const int64_t Td = docs.size(1);
  NDT_CHECK(docs.size(0) == B && Td >= q_offset + Tq && Td >= k_offset + Tk && q_offset >= 0 && k_offset >= 0,
            "attention: docs ", docs.shape_str(), " must have a row for each of the ", B,
            " sequences and cover their query positions ", q_offset, "..", q_offset + Tq - 1,
            " and key positions ", k_offset, "..", k_offset + Tk - 1);
  std::vector<int32_t> lo(static_cast<size_t>(B * Tq));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tq; ++i)
      lo[b * Tq + i] =
          static_cast<int32_t>(std::clamp<int64_t>(start[b * Td + q_offset + i] - k_offset, 0, Tk));
  return Tensor::from_vector(lo, {B, Tq});
}

Tensor document_positions(const Tensor& docs, int64_t pos_offset) {
  const std::vector<int32_t> start = run_starts(docs, "document_positions");
  const int64_t Td = docs.size(1);
  std::vector<int32_t> pos(start.size());
  for (size_t x = 0; x < pos.size(); ++x)
    pos[x] = static_cast<int32_t>(pos_offset + static_cast<int64_t>(x) % Td - start[x]);
  return Tensor::from_vector(pos, docs.shape(), docs.device());
}

AttentionOut attention_composed(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, int64_t q_offset,
                                int64_t k_offset, double scale, const Tensor& docs) {
  check_attention(q_in, k_in, v_in);
  const int64_t B = q_in.size(0), NH = q_in.size(1), NKV = k_in.size(1), Tq = q_in.size(2), Tk = k_in.size(2),
                HS = q_in.size(3), G = NH / NKV;
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(HS));
  const DType io = q_in.dtype(), cd = io == DType::bf16 ? DType::f32 : io;  // compute dtype

  // q (B,NH,Tq,HS) -> (Bkv,G*Tq,HS), k, v (B,NKV,Tk,HS) -> (Bkv,Tk,HS), in the compute dtype
  Tensor q = grouped(q_in, NKV, cd), k = grouped(k_in, NKV, cd), v = grouped(v_in, NKV, cd);
  Tensor p = Tensor::empty({B * NKV, G * Tq, Tk}, cd, q.device());
  Tensor lse = Tensor::empty({B * NH, Tq}, stat_dtype(cd), q.device());
  const Tensor key_lo =
      docs.defined() ? document_key_starts(docs, B, Tq, Tk, q_offset, k_offset).to(q.device()) : Tensor();
  attention_probs(q, k, scale, q_offset, k_offset, p, lse, key_lo);
  Tensor o = Tensor::empty({B * NKV, G * Tq, HS}, cd, q.device());
  kernels::gemm(p, false, v, false, o);  // out = p @ v

  AttentionOut r;
  r.out = o.view({B, NH, Tq, HS}).to(io);
  r.lse = lse.view({B, NH, Tq});
  autograd::record("attention", {r.out, r.lse}, {q_in, k_in, v_in},
                   [q, k, v, p, o, scale, B, NH, io](const Grads& g) -> Grads {
                     return composed_backward(q, k, v, p, o, g[0], g[1], scale, B, NH, io);
                   });
  return r;
}

bool attention_fused_on_cpu(Device device) {
  const char* sdpa = std::getenv("NDT_SDPA");  // NDT_SDPA=0: no fused attention, either backend
  return device.is_cpu() && !(sdpa && std::string(sdpa) == "0");
}

AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset, int64_t k_offset,
                       double scale, const Tensor& docs) {
  check_attention(q, k, v);
  if (attention_fused_on_cpu(q.device())) {
    const Tensor key_lo = docs.defined()
                              ? document_key_starts(docs, q.size(0), q.size(2), k.size(2), q_offset, k_offset)
                              : Tensor();
    return attention_fused_cpu(q, k, v, q_offset, k_offset,
                               scale == 0.0 ? 1.0 / std::sqrt(static_cast<double>(q.size(3))) : scale,
                               key_lo);
  }
  if (docs.defined()) return attention_composed(q, k, v, q_offset, k_offset, scale, docs);
  if (!cuda::sdpa_supported(q, k, v, q_offset, k_offset))
    return attention_composed(q, k, v, q_offset, k_offset, scale);
  const double s = scale == 0.0 ? 1.0 / std::sqrt(static_cast<double>(q.size(3))) : scale;
  // cuDNN may still refuse to build this shape (or its backward, which is built now so that a
  // refusal cannot surface in the middle of backward()): then the composed path
  const bool causal = k_offset + k.size(2) - 1 > q_offset;
  if (!cuda::sdpa_prepare(q, k, v, causal, s, autograd::needs_grad({q, k, v})))
    return attention_composed(q, k, v, q_offset, k_offset, scale);
  return attention_fused(q, k, v, q_offset, k_offset, s);
}

namespace {

void check_self_attention(const Tensor& qkv, int64_t n_head) {
  check_same("self_attention", {&qkv});
  NDT_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0, "self_attention: qkv must be (B, T, 3C), got ",
            qkv.shape_str());
  NDT_CHECK(n_head > 0 && qkv.size(2) / 3 % n_head == 0, "self_attention: the ", qkv.size(2) / 3,
            " channels of q, k and v do not split into ", n_head, " heads");
}

}  // namespace

namespace {

// qkv (B,T,3C) -> q, k, v (B,NH,T,HS) (copies) -> attention() or attention_composed() -> (B,T,C)
Tensor self_attention_split(const Tensor& qkv, int64_t n_head, bool composed, const Tensor& docs) {
  check_self_attention(qkv, n_head);
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, NH = n_head, HS = C / NH;
  // qkv (B,T,3C) -> q, k, v (B,T,C) each -> (B,NH,T,HS)
  std::vector<Tensor> parts = split_last(qkv, {C, C, C});
  auto heads = [&](const Tensor& t) { return heads_to_front(view(t, {B, T, NH, HS})); };
  const Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  Tensor y = (composed ? attention_composed(q, k, v, 0, 0, 0.0, docs) : attention(q, k, v, 0, 0, 0.0, docs))
                 .out;  // (B,NH,T,HS)
  // (B,NH,T,HS) -> (B,T,NH,HS) -> (B,T,C)
  return view(heads_to_back(y), {B, T, C});
}

}  // namespace

Tensor self_attention_composed(const Tensor& qkv, int64_t n_head, const Tensor& docs) {
  return self_attention_split(qkv, n_head, true, docs);
}

Tensor self_attention(const Tensor& qkv, int64_t n_head, const Tensor& docs) {
  check_self_attention(qkv, n_head);
  // elsewhere attention() picks (cuDNN's flash attention for bf16 on CUDA, else composed)
  if (!attention_fused_on_cpu(qkv.device())) return self_attention_split(qkv, n_head, false, docs);
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  const Tensor key_lo = docs.defined() ? document_key_starts(docs, B, T, T, 0, 0) : Tensor();
  const double scale = 1.0 / std::sqrt(static_cast<double>(C / n_head));
  const DType io = qkv.dtype(), cd = io == DType::bf16 ? DType::f32 : io;  // compute dtype
  // bf16 is computed in f32 (as the composed path does): qkv converted in, y rounded out
  const Tensor q32 = qkv.contiguous().to(cd).detach();
  Tensor y = Tensor::empty({B, T, C}, cd, qkv.device()),
         lse = Tensor::empty({B, n_head, T}, cd, qkv.device());
  kernels::self_attention_forward(q32, n_head, scale, y, lse, key_lo);

  Tensor out = y.to(io);
  // saved: qkv as it came (bf16 stays bf16; converted again in backward), y in the compute
  // dtype (f32: the output itself) and lse
  autograd::record("self_attention", {out}, {qkv},
                   [qkv_saved = qkv.contiguous().detach(), y = y.detach(), lse, n_head, scale, cd, io,
                    key_lo](const Grads& g) -> Grads {
                     const Tensor q = qkv_saved.to(cd);
                     Tensor dqkv = Tensor::empty(q.shape(), cd, q.device());
                     if (!g[0].defined()) {
                       kernels::fill(dqkv, 0.0);
                       return {dqkv.to(io)};
                     }
                     kernels::self_attention_backward(q, y, lse, g[0].contiguous().to(cd), n_head, scale,
                                                      dqkv, key_lo);
                     return {dqkv.to(io)};
                   });
  return out;
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
