// CPU softmax and fused softmax + cross-entropy over rows. Legend: N rows, C/V columns.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

// x (N,C) -> out (N,C): out = exp(x - max) / sum exp(x - max)
void softmax_forward(const Tensor& x, const Tensor& out) {
  dispatch_float(x.dtype(), "softmax_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
    const T* px = static_cast<const T*>(x.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t n = 0; n < N; ++n) {
      A mx = -std::numeric_limits<A>::infinity();
      for (int64_t c = 0; c < C; ++c) mx = std::max(mx, load(px[n * C + c]));
      A s = 0;
      for (int64_t c = 0; c < C; ++c) s += fast_exp(load(px[n * C + c]) - mx);
      for (int64_t c = 0; c < C; ++c) po[n * C + c] = st<T>(fast_exp(load(px[n * C + c]) - mx) / s);
    }
  });
}

// In the forward y = softmax(x); so dx = y * (dy - sum_c(dy * y))
void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  dispatch_float(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t C = y.size(-1), N = C ? y.numel() / C : 0;
    const T *py = static_cast<const T*>(y.data_ptr()), *pdy = static_cast<const T*>(dy.data_ptr());
    T* pdx = static_cast<T*>(dx.data_ptr());
#pragma omp parallel for schedule(static) if (N * C > 16384)
    for (int64_t n = 0; n < N; ++n) {
      A dot = 0;
      for (int64_t c = 0; c < C; ++c) dot += load(pdy[n * C + c]) * load(py[n * C + c]);
      for (int64_t c = 0; c < C; ++c)
        pdx[n * C + c] = st<T>(load(py[n * C + c]) * (load(pdy[n * C + c]) - dot));
    }
  });
}

namespace {
int64_t kept_rows(const Tensor& kept) { return kept.data<int32_t>()[0]; }
}  // namespace

// logits (N,V), targets (N), kept (1) -> losses (N) = lse - logit[target], lse (N); ignored
// rows: 0. With dlogits (N,V) defined (may be logits itself): the gradient of the mean loss,
// (softmax - onehot) / kept, written after the row's loss is taken.
namespace {

// The f32 row loops of cross_entropy_forward, vectorized (NDT_VECTOR_CLONES), with the
// results of the plain loops bit for bit: a max is exact in any order (16 lanes, NaNs never
// win, as with std::max), and each exp is the same function of its own element; only the
// sum of the exps stays one sequential loop (its order is part of the recorded figures).

NDT_VECTOR_CLONES float row_max_f32(const float* x, int64_t n) {
  float lane[kLanes];
  for (int l = 0; l < kLanes; ++l) lane[l] = -std::numeric_limits<float>::infinity();
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] = lane[l] < x[c + l] ? x[c + l] : lane[l];
  float mx = -std::numeric_limits<float>::infinity();
  for (int l = 0; l < kLanes; ++l) mx = mx < lane[l] ? lane[l] : mx;
  for (; c < n; ++c) mx = mx < x[c] ? x[c] : mx;
  return mx;
}

// e[c] = exp(x[c] - shift) * scale
NDT_VECTOR_CLONES void exp_shifted_f32(const float* x, float shift, float scale, float* e, int64_t n) {
  for (int64_t c = 0; c < n; ++c) e[c] = fast_exp(x[c] - shift) * scale;
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& kept, int64_t v_limit,
                           int64_t ignore_index, const Tensor& losses, const Tensor& lse,
                           const Tensor& dlogits) {
  const int64_t V = logits.size(-1), N = logits.size(0);
  const int32_t* tg = targets.data<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    NDT_CHECK(tg[n] == ignore_index || (tg[n] >= 0 && tg[n] < v_limit), "cross_entropy: target ", tg[n],
              " at row ", n, " is outside the vocabulary [0, ", v_limit, ")");
  const int64_t k = kept_rows(kept);
  dispatch_float(logits.dtype(), "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* pl = static_cast<const T*>(logits.data_ptr());
    T* pd = dlogits.defined() ? static_cast<T*>(dlogits.data_ptr()) : nullptr;
    A* ploss = static_cast<A*>(losses.data_ptr());
    A* plse = static_cast<A*>(lse.data_ptr());
    const A inv_kept = k ? A(1) / A(k) : A(0);
    if constexpr (std::is_same_v<A, float>) {
      // f32 and bf16: the row in f32 (bf16 widened into a buffer), then the vector loops
#pragma omp parallel if (N * V > 16384)
      {
        std::vector<float> wide(std::is_same_v<T, bf16> ? V : 0), e(V);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; ++n) {
          const float* row;
          if constexpr (std::is_same_v<T, bf16>) {
            bf16_to_f32(pl + n * V, wide.data(), V);
            row = wide.data();
          } else {
            row = pl + n * V;
          }
          const float mx = row_max_f32(row, v_limit);
          exp_shifted_f32(row, mx, 1.0f, e.data(), v_limit);
          float s = 0;
          for (int64_t c = 0; c < v_limit; ++c) s += e[c];
          const float l = mx + std::log(s);
          const bool ignored = tg[n] == ignore_index;
          plse[n] = l;
          ploss[n] = ignored ? 0.0f : l - row[tg[n]];
          if (!pd) continue;
          // after the loss: drow may be row. g = (exp(x - lse) - [c == target]) / kept
          float* g = e.data();
          if constexpr (std::is_same_v<T, float>) g = pd + n * V;
          if (ignored) {
            std::fill(g, g + v_limit, 0.0f);
          } else {
            const float target_g = (fast_exp(row[tg[n]] - l) - 1.0f) * inv_kept;
            exp_shifted_f32(row, l, inv_kept, g, v_limit);
            g[tg[n]] = target_g;
          }
          if constexpr (std::is_same_v<T, bf16>) {
            f32_to_bf16(g, pd + n * V, v_limit);
          }
          std::fill(pd + n * V + v_limit, pd + (n + 1) * V, st<T>(0.0f));
        }
      }
      return;
    }
#pragma omp parallel for schedule(static) if (N * V > 16384)
    for (int64_t n = 0; n < N; ++n) {
      const T* row = pl + n * V;
      A mx = -std::numeric_limits<A>::infinity();
      for (int64_t c = 0; c < v_limit; ++c) mx = std::max(mx, load(row[c]));
      A s = 0;
      for (int64_t c = 0; c < v_limit; ++c) s += fast_exp(load(row[c]) - mx);
      const A l = mx + std::log(s);
      const bool ignored = tg[n] == ignore_index;
      plse[n] = l;
      ploss[n] = ignored ? A(0) : l - load(row[tg[n]]);
      if (!pd) continue;
      T* drow = pd + n * V;
      for (int64_t c = 0; c < V; ++c) {  // after the loss: drow may be row
        A g = 0;
        if (!ignored && c < v_limit) g = (fast_exp(load(row[c]) - l) - (c == tg[n] ? A(1) : A(0))) * inv_kept;
        drow[c] = st<T>(g);
      }
    }
  });
}

// In the forward loss = mean over kept rows of (lse_n - logit[n, t_n]); so
// dlogits[n, c] = (exp(logit[n,c] - lse_n) - [c == t_n]) * dloss / kept, 0 on ignored rows
// and padded columns.
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& kept, const Tensor& dloss, int64_t v_limit, int64_t ignore_index,
                            const Tensor& dlogits) {
  const int64_t k = kept_rows(kept);
  const double grad_scale = k ? dloss.item() / static_cast<double>(k) : 0.0;
  dispatch_float(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t V = logits.size(-1), N = logits.size(0);
    const T* pl = static_cast<const T*>(logits.data_ptr());
    const int32_t* tg = targets.data<int32_t>();
    const A* plse = static_cast<const A*>(lse.data_ptr());
    T* pd = static_cast<T*>(dlogits.data_ptr());
    const A gs = static_cast<A>(grad_scale);
#pragma omp parallel for schedule(static) if (N * V > 16384)
    for (int64_t n = 0; n < N; ++n) {
      const bool skipped = tg[n] == ignore_index || tg[n] < 0 || tg[n] >= v_limit;  // ignored or bad: 0
      for (int64_t c = 0; c < V; ++c) {
        A g = 0;
        if (!skipped && c < v_limit)
          g = (fast_exp(load(pl[n * V + c]) - plse[n]) - (c == tg[n] ? A(1) : A(0))) * gs;
        pd[n * V + c] = st<T>(g);
      }
    }
  });
}

// losses (N) -> out = sum / kept (0 when no row is kept); the sum as sum() takes it
void mean_of_kept(const Tensor& losses, const Tensor& kept, const Tensor& out) {
  const int64_t k = kept_rows(kept);
  sum(losses, out);
  const double s = out.item();
  dispatch_float(out.dtype(), "mean_of_kept", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const A total = static_cast<A>(s);  // the sum in the statistics dtype, then * (1/kept)
    static_cast<T*>(out.data_ptr())[0] =
        st<T>(k ? total * static_cast<A>(1.0 / static_cast<double>(k)) : A(0));
  });
}

void count_not_equal(const Tensor& targets, int64_t ignore_index, const Tensor& kept) {
  const int32_t* tg = targets.data<int32_t>();
  int64_t c = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) c += tg[i] != ignore_index;
  NDT_CHECK(c <= INT32_MAX, "count_not_equal: ", c, " entries do not fit the int32 count");
  kept.data<int32_t>()[0] = static_cast<int32_t>(c);
}

}  // namespace ndt::cpu
