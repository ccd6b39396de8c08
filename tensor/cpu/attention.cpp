// CPU pieces of causal attention: masked softmax with log-sum-exp, its backward, and the
// merge of partial results over key blocks (ring attention).
// Legend: Bh = batch*heads, Tq queries, Tk keys, HS head size.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

// s (Bh,Tq,Tk) scores -> p in place; lse (Bh,Tq); key_lo (B,Tq) i32 or undefined.
// Query i sees key j iff k_offset + j <= q_offset + i (and j >= key_lo[b, i], its document's
// first key); p = exp(scale*s - lse) there, 0 elsewhere.
void attention_softmax_forward(const Tensor& s, double scale, int64_t q_offset, int64_t k_offset,
                               const Tensor& lse, const Tensor& key_lo) {
  dispatch_float(s.dtype(), "attention_softmax_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t Tq = s.size(1), Tk = s.size(2), rows = s.size(0) * Tq;
    T* ps = static_cast<T*>(s.data_ptr());
    A* pl = static_cast<A*>(lse.data_ptr());
    const A sc = scale;
    const int32_t* lo_of = key_lo.defined() ? key_lo.data<int32_t>() : nullptr;
    const int64_t heads = key_lo.defined() ? s.size(0) / key_lo.size(0) : 1;  // rows (B, heads, Tq)
#pragma omp parallel for schedule(static) if (rows * Tk > 16384)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % Tq;
      // the visible keys [lo, nvis): j <= q_offset + i - k_offset, from the document's first
      const int64_t nvis = std::clamp<int64_t>(q_offset + i - k_offset + 1, 0, Tk);
      const int64_t lo = lo_of ? lo_of[r / (heads * Tq) * Tq + i] : 0;
      T* row = ps + r * Tk;
      if (nvis <= lo) {
        for (int64_t j = 0; j < Tk; ++j) row[j] = st<T>(A(0));
        pl[r] = -std::numeric_limits<A>::infinity();
        continue;
      }
      A mx = -std::numeric_limits<A>::infinity();
      for (int64_t j = lo; j < nvis; ++j) mx = std::max(mx, sc * load(row[j]));
      A sum = 0;
      for (int64_t j = lo; j < nvis; ++j) sum += fast_exp(sc * load(row[j]) - mx);
      const A l = mx + std::log(sum);
      for (int64_t j = 0; j < lo; ++j) row[j] = st<T>(A(0));
      for (int64_t j = lo; j < nvis; ++j) row[j] = st<T>(fast_exp(sc * load(row[j]) - l));
      for (int64_t j = nvis; j < Tk; ++j) row[j] = st<T>(A(0));
      pl[r] = l;
    }
  });
}

// In the forward p = exp(scale*s - lse), out = p v, and lse = log sum_j exp(scale*s_j); so
// ds = scale * p * (dp - d + dlse), with dp = dout v^T and d = rowsum(dout * out). In place in dp.
void attention_softmax_backward(const Tensor& p, const Tensor& dp, const Tensor& d, const Tensor& dlse,
                                double scale) {
  dispatch_float(p.dtype(), "attention_softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t Tk = p.size(2), rows = p.size(0) * p.size(1);
    const T* pp = static_cast<const T*>(p.data_ptr());
    T* pdp = static_cast<T*>(dp.data_ptr());
    const A* pd = static_cast<const A*>(d.data_ptr());
    const A* pdl = dlse.defined() ? static_cast<const A*>(dlse.data_ptr()) : nullptr;
    const A sc = scale;
#pragma omp parallel for schedule(static) if (rows * Tk > 16384)
    for (int64_t r = 0; r < rows; ++r) {
      const A extra = pdl ? pdl[r] : A(0);
      for (int64_t j = 0; j < Tk; ++j) {
        const int64_t k = r * Tk + j;
        pdp[k] = st<T>(sc * load(pp[k]) * (load(pdp[k]) - pd[r] + extra));
      }
    }
  });
}

// a, b (Bh,T,HS) -> out (Bh,T): out = sum_HS a*b (accumulator dtype: f32, f64 for f64)
void rowwise_dot(const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_float(a.dtype(), "rowwise_dot", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t HS = a.size(-1), rows = HS ? a.numel() / HS : 0;
    const T *pa = static_cast<const T*>(a.data_ptr()), *pb = static_cast<const T*>(b.data_ptr());
    A* po = static_cast<A*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (rows * HS > 16384)
    for (int64_t r = 0; r < rows; ++r) {
      A s = 0;
      for (int64_t h = 0; h < HS; ++h) s += load(pa[r * HS + h]) * load(pb[r * HS + h]);
      po[r] = s;
    }
  });
}

namespace {

// The weight of one partial result in the merge: exp(lse_part - lse), 0 for a part that saw
// no key (lse_part = -inf; also when both parts saw none and lse = -inf, where the
// subtraction would give NaN). Exact std::exp: fast_exp clamps and would not give 0.
template <typename A>
A merge_weight(A lse_part, A lse) {
  return lse_part == -std::numeric_limits<A>::infinity() ? A(0) : std::exp(lse_part - lse);
}

}  // namespace

// out_a, out_b (Bh,T,HS), lse_a, lse_b (Bh,T) -> out (Bh,T,HS), lse (Bh,T):
// lse = logaddexp(lse_a, lse_b), out = w_a out_a + w_b out_b with w = exp(lse_part - lse)
void attention_merge_forward(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                             const Tensor& lse_b, const Tensor& out, const Tensor& lse) {
  dispatch_float(out_a.dtype(), "attention_merge_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t HS = out_a.size(-1), rows = lse_a.numel();
    const T *pa = static_cast<const T*>(out_a.data_ptr()), *pb = static_cast<const T*>(out_b.data_ptr());
    const A *pla = static_cast<const A*>(lse_a.data_ptr()), *plb = static_cast<const A*>(lse_b.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    A* pl = static_cast<A*>(lse.data_ptr());
    constexpr A kNegInf = -std::numeric_limits<A>::infinity();
#pragma omp parallel for schedule(static) if (rows * HS > 16384)
    for (int64_t r = 0; r < rows; ++r) {
      const A la = pla[r], lb = plb[r], mx = std::max(la, lb);
      // logaddexp, shifted by the larger so that nothing overflows; -inf if both are
      const A l = mx == kNegInf ? kNegInf : mx + std::log1p(std::exp(std::min(la, lb) - mx));
      const A wa = merge_weight(la, l), wb = merge_weight(lb, l);
      pl[r] = l;
      for (int64_t h = 0; h < HS; ++h) {
        const int64_t k = r * HS + h;
        // a part with weight 0 is not read, so whatever it holds cannot turn into NaN
        const A va = wa != A(0) ? wa * load(pa[k]) : A(0), vb = wb != A(0) ? wb * load(pb[k]) : A(0);
        po[k] = st<T>(va + vb);
      }
    }
  });
}

// In the forward pass this was lse = log(exp(lse_a) + exp(lse_b)) and
// out = w_a out_a + w_b out_b with w_a = exp(lse_a - lse), w_b = exp(lse_b - lse); so
//   d lse / d lse_a = exp(lse_a - lse) = w_a,   d out / d out_a = w_a,
//   d w_a / d lse_a = w_a (1 - w_a),   d w_b / d lse_a = -w_b w_a,
//   d out / d lse_a = w_a (1 - w_a) out_a - w_a w_b out_b = w_a (out_a - out);
// so dout_a = w_a dout and dlse_a = w_a (dlse + sum over HS of dout * (out_a - out)),
// and the same for b. A part with w = 0 (it saw no key) gets zero gradients.
void attention_merge_backward(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                              const Tensor& lse_b, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              const Tensor& dlse, const Tensor& dout_a, const Tensor& dlse_a,
                              const Tensor& dout_b, const Tensor& dlse_b) {
  dispatch_float(out_a.dtype(), "attention_merge_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t HS = out_a.size(-1), rows = lse_a.numel();
    const T *pa = static_cast<const T*>(out_a.data_ptr()), *pb = static_cast<const T*>(out_b.data_ptr());
    const T* po = static_cast<const T*>(out.data_ptr());
    const A *pla = static_cast<const A*>(lse_a.data_ptr()), *plb = static_cast<const A*>(lse_b.data_ptr());
    const A* pl = static_cast<const A*>(lse.data_ptr());
    const T* pdo = dout.defined() ? static_cast<const T*>(dout.data_ptr()) : nullptr;
    const A* pdl = dlse.defined() ? static_cast<const A*>(dlse.data_ptr()) : nullptr;
    T *pda = static_cast<T*>(dout_a.data_ptr()), *pdb = static_cast<T*>(dout_b.data_ptr());
    A *pdla = static_cast<A*>(dlse_a.data_ptr()), *pdlb = static_cast<A*>(dlse_b.data_ptr());
#pragma omp parallel for schedule(static) if (rows * HS > 16384)
    for (int64_t r = 0; r < rows; ++r) {
      const A wa = merge_weight(pla[r], pl[r]), wb = merge_weight(plb[r], pl[r]);
      A dot_a = 0, dot_b = 0;  // sum over HS of dout * (out_part - out)
      for (int64_t h = 0; h < HS; ++h) {
        const int64_t k = r * HS + h;
        const A g = pdo ? load(pdo[k]) : A(0);
        pda[k] = st<T>(wa * g);
        pdb[k] = st<T>(wb * g);
        if (wa != A(0)) dot_a += g * (load(pa[k]) - load(po[k]));
        if (wb != A(0)) dot_b += g * (load(pb[k]) - load(po[k]));
      }
      const A gl = pdl ? pdl[r] : A(0);
      pdla[r] = wa * (gl + dot_a);
      pdlb[r] = wb * (gl + dot_b);
    }
  });
}

}  // namespace ndt::cpu
