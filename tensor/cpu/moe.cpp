// CPU mixture-of-experts kernels: the router's top k, moving token rows to and from their
// experts' sorted rows, and one GEMM per expert over its contiguous row block.
// Legend: N tokens, E experts, k choices per token, M = N*k rows sorted by expert, C channels,
// G groups (experts), K and N a GEMM's inner and output dims. order (M): sorted row r holds
// choice order[r] = n*k + j; slots (M) its inverse (choice c sits in sorted row slots[c]).
// bf16 is computed in f32 and rounded once; f64 in f64.
#include <cstring>
#include <type_traits>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {
namespace {

constexpr int64_t kParallelElems = 32768;  // below this many elements a loop runs on one thread

template <typename T>
const T* ptr(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}
template <typename T>
T* mut(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// out (C) = sum_j w[j] rows[j] (C), the rows base + at[j] C for j = 0..k-1 added in order
// (w null: every weight 1), accumulated in acc (C), which may be out itself where T is A. A
// row at a time: the k rows' loops run along c at the vector width, where a loop over j
// inside one over c read k far-apart values per element. Always inlined (into the f32
// clones below).
template <typename T, typename A>
[[gnu::always_inline]] inline void weighted_rows(const T* base, const int32_t* at, const T* w, int64_t k,
                                                 int64_t C, A* acc, T* out) {
  for (int64_t c = 0; c < C; ++c) acc[c] = A(0);
  for (int64_t j = 0; j < k; ++j) {
    const T* row = base + static_cast<int64_t>(at[j]) * C;
    const A wj = w ? load(w[j]) : A(1);
    for (int64_t c = 0; c < C; ++c) acc[c] += wj * load(row[c]);
  }
  if (static_cast<void*>(acc) != static_cast<void*>(out))
    for (int64_t c = 0; c < C; ++c) out[c] = st<T>(acc[c]);
}
NDT_VECTOR_CLONES void weighted_rows_f32(const float* base, const int32_t* at, const float* w, int64_t k,
                                         int64_t C, float* out) {
  weighted_rows(base, at, w, k, C, out, out);
}

// Each of the N rows of out (N,C): weighted_rows of its k rows at[n k ..] (weights w + n k),
// f32 through the vector clones, bf16 and f64 through an accumulator row per thread.
template <typename T>
void weighted_rows_all(const T* base, const int32_t* at, const T* w, int64_t N, int64_t k, int64_t C,
                       T* out) {
  using A = acc_t<T>;
#pragma omp parallel if (N * k * C > kParallelElems)
  {
    std::vector<A> acc(std::is_same_v<T, float> ? 0 : static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* wn = w ? w + n * k : nullptr;
      if constexpr (std::is_same_v<T, float>)
        weighted_rows_f32(base, at + n * k, wn, k, C, out + n * C);
      else
        weighted_rows(base, at + n * k, wn, k, C, acc.data(), out + n * C);
    }
  }
}

}  // namespace

// ---- router: top k ------------------------------------------------------------------------

// probs (N,E) -> values (N,k), experts (N,k) i32: k passes over the row, pass j taking the
// best expert ranked below pass j-1's pick, in the order "larger value first, then lower
// index" (torch.topk's ties): no list of taken experts (the CUDA twin runs the same loop)
void moe_topk_forward(const Tensor& probs, int64_t k, bool normalize, const Tensor& values,
                      const Tensor& experts) {
  const int64_t N = probs.size(0), E = probs.size(1);
  dispatch_float(probs.dtype(), "moe_topk_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* p = ptr<T>(probs);
    T* v = mut<T>(values);
    int32_t* ex = mut<int32_t>(experts);
#pragma omp parallel for schedule(static) if (N * E > kParallelElems)
    for (int64_t n = 0; n < N; ++n) {
      const T* row = p + n * E;
      auto before = [&](int64_t a, int64_t b) {  // a ranks before b
        const A va = load(row[a]), vb = load(row[b]);
        return va > vb || (va == vb && a < b);
      };
      A total = 0;
      for (int64_t j = 0, prev = -1; j < k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e)
          if ((prev < 0 || before(prev, e)) && (best < 0 || before(e, best))) best = e;
        if (best < 0) best = prev;  // only for NaN probabilities: never an index outside the row
        ex[n * k + j] = static_cast<int32_t>(best);
        total += load(row[best]);
        prev = best;
      }
      for (int64_t j = 0; j < k; ++j) {
        const A x = load(row[ex[n * k + j]]);
        v[n * k + j] = st<T>(normalize ? x / total : x);
      }
    }
  });
}

// In the forward v_j = p_{e_j} (normalize: / S, S = sum_i p_{e_i}); so dp_{e_j} = dv_j, or with
// normalize dp_{e_j} = dv_j / S - sum_i dv_i p_{e_i} / S^2 = (dv_j - sum_i dv_i v_i) / S.
void moe_topk_backward(const Tensor& probs, const Tensor& experts, const Tensor& dvalues, bool normalize,
                       const Tensor& dprobs) {
  const int64_t N = probs.size(0), E = probs.size(1), k = experts.size(1);
  dispatch_float(probs.dtype(), "moe_topk_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T *p = ptr<T>(probs), *dv = ptr<T>(dvalues);
    const int32_t* ex = ptr<int32_t>(experts);
    T* dp = mut<T>(dprobs);
#pragma omp parallel for schedule(static) if (N * E > kParallelElems)
    for (int64_t n = 0; n < N; ++n) {
      const int32_t* e = ex + n * k;
      for (int64_t i = 0; i < E; ++i) dp[n * E + i] = st<T>(A(0));
      A total = 0, dot = 0;  // S and sum_i dv_i p_{e_i}
      for (int64_t j = 0; j < k; ++j) {
        total += load(p[n * E + e[j]]);
        dot += load(dv[n * k + j]) * load(p[n * E + e[j]]);
      }
      for (int64_t j = 0; j < k; ++j) {
        const A g = load(dv[n * k + j]);
        dp[n * E + e[j]] = st<T>(normalize ? (g - dot / total) / total : g);
      }
    }
  });
}

// ---- rows to experts and back -------------------------------------------------------------

// order (M) -> slots (M): slots[order[r]] = r
void moe_slots(const Tensor& order, const Tensor& slots) {
  const int64_t M = order.numel();
  const int32_t* o = ptr<int32_t>(order);
  int32_t* s = mut<int32_t>(slots);
  for (int64_t r = 0; r < M; ++r) s[o[r]] = static_cast<int32_t>(r);
}

// x (N,C) -> out (M,C): out[r] = x[order[r] / k], a copy of whole rows
void moe_dispatch_forward(const Tensor& x, const Tensor& order, int64_t k, const Tensor& out) {
  const int64_t M = order.numel(), C = x.size(1), bytes = C * static_cast<int64_t>(dtype_size(x.dtype()));
  const int32_t* o = ptr<int32_t>(order);
  const char* px = static_cast<const char*>(x.data_ptr());
  char* po = static_cast<char*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (M * C > kParallelElems)
  for (int64_t r = 0; r < M; ++r)
    std::memcpy(po + r * bytes, px + (o[r] / k) * bytes, static_cast<size_t>(bytes));
}

// In the forward each token was copied to its k sorted rows; so dx[n] = sum_j dout[slots[n*k+j]],
// summed in the order of j (the same bits on any number of threads)
void moe_dispatch_backward(const Tensor& dout, const Tensor& slots, int64_t k, const Tensor& dx) {
  const int64_t N = dx.size(0), C = dx.size(1);
  dispatch_float(dx.dtype(), "moe_dispatch_backward", [&](auto tag) {
    using T = decltype(tag);
    weighted_rows_all<T>(ptr<T>(dout), ptr<int32_t>(slots), nullptr, N, k, C, mut<T>(dx));
  });
}

// y (M,C), weights (N,k) -> out (N,C): out[n] = sum_j weights[n,j] y[slots[n*k+j]]
void moe_combine_forward(const Tensor& y, const Tensor& weights, const Tensor& slots, const Tensor& out) {
  const int64_t N = weights.size(0), k = weights.size(1), C = y.size(1);
  dispatch_float(y.dtype(), "moe_combine_forward", [&](auto tag) {
    using T = decltype(tag);
    weighted_rows_all<T>(ptr<T>(y), ptr<int32_t>(slots), ptr<T>(weights), N, k, C, mut<T>(out));
  });
}

// In the forward out[n] = sum_j w[n,j] y[slots[n*k+j]]; so the sorted row r of choice c = order[r]
// gets dy[r] = w[c] dout[c / k], and dw[n,j] = <dout[n], y[slots[n*k+j]]>
void moe_combine_backward(const Tensor& y, const Tensor& weights, const Tensor& dout, const Tensor& order,
                          const Tensor& slots, const Tensor& dy, const Tensor& dweights) {
  const int64_t N = weights.size(0), k = weights.size(1), C = y.size(1), M = y.size(0);
  dispatch_float(y.dtype(), "moe_combine_backward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T *py = ptr<T>(y), *w = ptr<T>(weights), *d = ptr<T>(dout);
    const int32_t *o = ptr<int32_t>(order), *s = ptr<int32_t>(slots);
    T *pdy = mut<T>(dy), *pdw = mut<T>(dweights);
#pragma omp parallel for schedule(static) if (M * C > kParallelElems)
    for (int64_t r = 0; r < M; ++r) {
      const A wc = load(w[o[r]]);
      const T* drow = d + (o[r] / k) * C;
      for (int64_t c = 0; c < C; ++c) pdy[r * C + c] = st<T>(wc * load(drow[c]));
    }
#pragma omp parallel for schedule(static) if (N * k * C > kParallelElems)
    for (int64_t i = 0; i < N * k; ++i) {
      const T *yrow = py + s[i] * C, *drow = d + (i / k) * C;
      if constexpr (std::is_same_v<T, float>) {
        pdw[i] = dot_f32(drow, yrow, C);  // in fixed lanes, at the vector width
      } else {
        A acc = 0;
        for (int64_t c = 0; c < C; ++c) acc += load(drow[c]) * load(yrow[c]);
        pdw[i] = st<T>(acc);
      }
    }
  });
}

}  // namespace ndt::cpu
