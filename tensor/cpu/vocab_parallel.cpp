// CPU pieces of vocabulary-parallel cross-entropy: each rank holds the logits of the global
// columns [v_start, v_start + Vl), of which the first v_live are vocabulary (the rest is
// padding). The caller all-reduces the row statistics between these kernels.
// Legend: N rows, Vl local columns.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

// logits (N,Vl) -> out (N): max over the live columns, -inf if there are none
void rowmax(const Tensor& logits, int64_t v_live, const Tensor& out) {
  dispatch_float(logits.dtype(), "rowmax", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t N = logits.size(0), Vl = logits.size(1);
    const T* pl = static_cast<const T*>(logits.data_ptr());
    A* po = static_cast<A*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (N * v_live > 16384)
    for (int64_t n = 0; n < N; ++n) {
      A mx = -std::numeric_limits<A>::infinity();
      for (int64_t j = 0; j < v_live; ++j) mx = std::max(mx, A(load(pl[n * Vl + j])));
      po[n] = mx;
    }
  });
}

// logits (N,Vl), targets (N), gmax (N) -> sumexp (N) = sum_{j < v_live} exp(logit_j - gmax),
// target_logit (N) = logit[target - v_start] if that column is live here, else 0
void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& gmax, int64_t v_start,
                            int64_t v_live, int64_t ignore_index, const Tensor& sumexp,
                            const Tensor& target_logit) {
  dispatch_float(logits.dtype(), "cross_entropy_partials", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t N = logits.size(0), Vl = logits.size(1);
    const T* pl = static_cast<const T*>(logits.data_ptr());
    const int32_t* tg = targets.data<int32_t>();
    const A* pm = static_cast<const A*>(gmax.data_ptr());
    A *ps = static_cast<A*>(sumexp.data_ptr()), *pt = static_cast<A*>(target_logit.data_ptr());
#pragma omp parallel for schedule(static) if (N * v_live > 16384)
    for (int64_t n = 0; n < N; ++n) {
      const T* row = pl + n * Vl;
      A s = 0;
      for (int64_t j = 0; j < v_live; ++j) s += fast_exp(load(row[j]) - pm[n]);
      ps[n] = s;
      const int64_t j = static_cast<int64_t>(tg[n]) - v_start;  // the target's local column
      pt[n] = tg[n] != ignore_index && j >= 0 && j < v_live ? A(load(row[j])) : A(0);
    }
  });
}

// In the forward loss_n = log(sumexp_n) + gmax_n - logit[n, t_n], where sumexp_n sums
// exp(logit - gmax_n) over every rank's live columns; so
// dlogits[n, j] = (exp(logit[n,j] - gmax_n) / sumexp_n - [v_start + j == t_n]) * dloss / kept,
// 0 on ignored rows and padded columns.
void cross_entropy_parallel_backward(const Tensor& logits, const Tensor& targets, const Tensor& gmax,
                                     const Tensor& sumexp_global, int64_t v_start, int64_t v_live,
                                     int64_t ignore_index, const Tensor& kept, const Tensor& dloss,
                                     const Tensor& dlogits) {
  dispatch_float(logits.dtype(), "cross_entropy_parallel_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t N = logits.size(0), Vl = logits.size(1);
    const T* pl = static_cast<const T*>(logits.data_ptr());
    const int32_t* tg = targets.data<int32_t>();
    const A *pm = static_cast<const A*>(gmax.data_ptr()),
            *ps = static_cast<const A*>(sumexp_global.data_ptr());
    T* pd = static_cast<T*>(dlogits.data_ptr());
    const int64_t k = kept.data<int32_t>()[0];
    const A gs = k ? static_cast<A>(dloss.item() / static_cast<double>(k)) : A(0);
#pragma omp parallel for schedule(static) if (N * Vl > 16384)
    for (int64_t n = 0; n < N; ++n) {
      const bool ignored = tg[n] == ignore_index;
      const int64_t t = static_cast<int64_t>(tg[n]) - v_start;  // the target's local column
      for (int64_t j = 0; j < Vl; ++j) {
        A g = 0;
        if (!ignored && j < v_live)
          g = (fast_exp(load(pl[n * Vl + j]) - pm[n]) / ps[n] - (j == t ? A(1) : A(0))) * gs;
        pd[n * Vl + j] = st<T>(g);
      }
    }
  });
}

// loss_n = log(sumexp_n) + gmax_n - logit[n, t_n] (the last summed over ranks), 0 if ignored
void cross_entropy_parallel_losses(const Tensor& gmax, const Tensor& sumexp_global,
                                   const Tensor& target_logit_global, const Tensor& targets,
                                   int64_t ignore_index, const Tensor& losses) {
  dispatch_float(losses.dtype(), "cross_entropy_parallel_losses", [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = losses.numel();
    const T *pm = static_cast<const T*>(gmax.data_ptr()),
            *ps = static_cast<const T*>(sumexp_global.data_ptr()),
            *pt = static_cast<const T*>(target_logit_global.data_ptr());
    const int32_t* tg = targets.data<int32_t>();
    T* pl = static_cast<T*>(losses.data_ptr());
    using A = acc_t<T>;
    for (int64_t n = 0; n < N; ++n)
      pl[n] = st<T>(tg[n] == ignore_index ? A(0) : std::log(load(ps[n])) + load(pm[n]) - load(pt[n]));
  });
}

}  // namespace ndt::cpu
