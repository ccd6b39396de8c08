// CPU pieces of causal attention: masked softmax with log-sum-exp, and its backward.
// Legend: Bh = batch*heads, Tq queries, Tk keys, HS head size.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

// s (Bh,Tq,Tk) scores -> p in place; lse (Bh,Tq).
// Query i sees key j iff k_offset + j <= q_offset + i; p = exp(scale*s - lse) there, 0 elsewhere.
void attention_softmax_forward(const Tensor& s, double scale, int64_t q_offset, int64_t k_offset,
                               const Tensor& lse) {
  dispatch_float(s.dtype(), "attention_softmax_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t Tq = s.size(1), Tk = s.size(2), rows = s.size(0) * Tq;
    T* ps = static_cast<T*>(s.data_ptr());
    A* pl = static_cast<A*>(lse.data_ptr());
    const A sc = scale;
#pragma omp parallel for schedule(static) if (rows * Tk > 16384)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % Tq;
      // number of visible keys: j <= q_offset + i - k_offset
      const int64_t nvis = std::clamp<int64_t>(q_offset + i - k_offset + 1, 0, Tk);
      T* row = ps + r * Tk;
      if (nvis == 0) {
        for (int64_t j = 0; j < Tk; ++j) row[j] = st<T>(A(0));
        pl[r] = -std::numeric_limits<A>::infinity();
        continue;
      }
      A mx = -std::numeric_limits<A>::infinity();
      for (int64_t j = 0; j < nvis; ++j) mx = std::max(mx, sc * load(row[j]));
      A sum = 0;
      for (int64_t j = 0; j < nvis; ++j) sum += fast_exp(sc * load(row[j]) - mx);
      const A l = mx + std::log(sum);
      for (int64_t j = 0; j < nvis; ++j) row[j] = st<T>(fast_exp(sc * load(row[j]) - l));
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

}  // namespace ndt::cpu
