// CUDA mixture-of-experts kernels, the twins of tensor/cpu/moe.cpp: the router's top k,
// moving token rows to and from their experts' sorted rows, and one cuBLAS GEMM per expert
// over its contiguous row block, all on the device's stream.
// Legend: N tokens, E experts, k choices per token, M = N*k rows sorted by expert, C channels,
// G groups (experts). order (M): sorted row r holds choice order[r] = n*k + j; slots (M) its
// inverse (choice c sits in sorted row slots[c]). f32 and bf16, computed in f32.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

constexpr int kWarpsPerBlock = kThreads / 32;  // moe_combine's weight gradient: one warp per choice

// ---- kernels ------------------------------------------------------------------------

// One thread per row n of probs (N,E): k passes, pass j taking the best expert ranked below
// pass j-1's pick in the order "larger value first, then lower index" (torch.topk's ties)
template <typename T>
__global__ void topk_forward_kernel(const T* probs, int64_t N, int64_t E, int64_t k, bool normalize,
                                    T* values, int32_t* experts) {
  NDT_GRID_STRIDE(n, N) {
    const T* row = probs + n * E;
    auto before = [&](int64_t a, int64_t b) {  // a ranks before b
      const float va = load(row[a]), vb = load(row[b]);
      return va > vb || (va == vb && a < b);
    };
    float total = 0.0f;
    for (int64_t j = 0, prev = -1; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if ((prev < 0 || before(prev, e)) && (best < 0 || before(e, best))) best = e;
      if (best < 0) best = prev;  // only for NaN probabilities: never an index outside the row
      experts[n * k + j] = static_cast<int32_t>(best);
      total += load(row[best]);
      prev = best;
    }
    for (int64_t j = 0; j < k; ++j) {
      const float x = load(row[experts[n * k + j]]);
      values[n * k + j] = store<T>(normalize ? x / total : x);
    }
  }
}

// One thread per row: v_j = p[e_j] (/ S when normalize); so dp[e_j] = dv_j, or
// (dv_j - sum_i dv_i p[e_i] / S) / S, and 0 elsewhere
template <typename T>
__global__ void topk_backward_kernel(const T* probs, const int32_t* experts, const T* dvalues, int64_t N,
                                     int64_t E, int64_t k, bool normalize, T* dprobs) {
  NDT_GRID_STRIDE(n, N) {
    const int32_t* e = experts + n * k;
    for (int64_t i = 0; i < E; ++i) dprobs[n * E + i] = store<T>(0.0f);
    float total = 0.0f, dot = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      total += load(probs[n * E + e[j]]);
      dot += load(dvalues[n * k + j]) * load(probs[n * E + e[j]]);
    }
    for (int64_t j = 0; j < k; ++j) {
      const float g = load(dvalues[n * k + j]);
      dprobs[n * E + e[j]] = store<T>(normalize ? (g - dot / total) / total : g);
    }
  }
}

// slots[order[r]] = r
__global__ void slots_kernel(const int32_t* order, int64_t M, int32_t* slots) {
  NDT_GRID_STRIDE(r, M) slots[order[r]] = static_cast<int32_t>(r);
}

// One thread per element of out (M,C): out[r] = x[order[r] / k]
template <typename T>
__global__ void dispatch_forward_kernel(const T* x, const int32_t* order, int64_t M, int64_t C, int64_t k,
                                        T* out) {
  NDT_GRID_STRIDE(i, M * C) {
    const int64_t r = i / C, c = i % C;
    out[i] = x[(order[r] / k) * C + c];
  }
}

// One thread per element of dx (N,C): dx[n] = sum_j dout[slots[n*k+j]], j in order
template <typename T>
__global__ void dispatch_backward_kernel(const T* dout, const int32_t* slots, int64_t N, int64_t C, int64_t k,
                                         T* dx) {
  NDT_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) acc += load(dout[slots[n * k + j] * C + c]);
    dx[i] = store<T>(acc);
  }
}

// One thread per element of out (N,C): out[n] = sum_j w[n,j] y[slots[n*k+j]]
template <typename T>
__global__ void combine_forward_kernel(const T* y, const T* w, const int32_t* slots, int64_t N, int64_t C,
                                       int64_t k, T* out) {
  NDT_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) acc += load(w[n * k + j]) * load(y[slots[n * k + j] * C + c]);
    out[i] = store<T>(acc);
  }
}

// One thread per element of dy (M,C): the row r of choice c = order[r] gets w[c] dout[c / k]
template <typename T>
__global__ void combine_backward_dy_kernel(const T* w, const T* dout, const int32_t* order, int64_t M,
                                           int64_t C, int64_t k, T* dy) {
  NDT_GRID_STRIDE(i, M * C) {
    const int64_t r = i / C, c = i % C, choice = order[r];
    dy[i] = store<T>(load(w[choice]) * load(dout[(choice / k) * C + c]));
  }
}

// One warp per choice i = n*k + j: dw[i] = <dout[n], y[slots[i]]>
template <typename T>
__global__ void combine_backward_dw_kernel(const T* y, const T* dout, const int32_t* slots, int64_t M,
                                           int64_t C, int64_t k, T* dw) {
  const int lane = threadIdx.x % 32;
  const int64_t i = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
  if (i >= M) return;
  const T *yrow = y + slots[i] * C, *drow = dout + (i / k) * C;
  float s = 0.0f;
  for (int64_t c = lane; c < C; c += 32) s += load(drow[c]) * load(yrow[c]);
  s = warp_sum(s);
  if (lane == 0) dw[i] = store<T>(s);
}

template <typename T>
const T* cptr(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}
template <typename T>
T* mptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void moe_topk_forward(const Tensor& probs, int64_t k, bool normalize, const Tensor& values,
                      const Tensor& experts) {
  const int64_t N = probs.size(0), E = probs.size(1);
  if (N == 0) return;
  Launch L(probs);
  dispatch_float(probs.dtype(), "moe_topk_forward", [&](auto tag) {
    using T = decltype(tag);
    topk_forward_kernel<T><<<grid_for(N), kThreads, 0, L.stream>>>(cptr<T>(probs), N, E, k, normalize,
                                                                   mptr<T>(values), mptr<int32_t>(experts));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void moe_topk_backward(const Tensor& probs, const Tensor& experts, const Tensor& dvalues, bool normalize,
                       const Tensor& dprobs) {
  const int64_t N = probs.size(0), E = probs.size(1), k = experts.size(1);
  if (N == 0) return;
  Launch L(probs);
  dispatch_float(probs.dtype(), "moe_topk_backward", [&](auto tag) {
    using T = decltype(tag);
    topk_backward_kernel<T><<<grid_for(N), kThreads, 0, L.stream>>>(
        cptr<T>(probs), cptr<int32_t>(experts), cptr<T>(dvalues), N, E, k, normalize, mptr<T>(dprobs));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void moe_slots(const Tensor& order, const Tensor& slots) {
  const int64_t M = order.numel();
  if (M == 0) return;
  Launch L(order);
  slots_kernel<<<grid_for(M), kThreads, 0, L.stream>>>(cptr<int32_t>(order), M, mptr<int32_t>(slots));
  NDT_CUDA_CHECK_LAUNCH();
}

void moe_dispatch_forward(const Tensor& x, const Tensor& order, int64_t k, const Tensor& out) {
  const int64_t M = order.numel(), C = x.size(1);
  if (M * C == 0) return;
  Launch L(x);
  dispatch_float(x.dtype(), "moe_dispatch_forward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_forward_kernel<T>
        <<<grid_for(M * C), kThreads, 0, L.stream>>>(cptr<T>(x), cptr<int32_t>(order), M, C, k, mptr<T>(out));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void moe_dispatch_backward(const Tensor& dout, const Tensor& slots, int64_t k, const Tensor& dx) {
  const int64_t N = dx.size(0), C = dx.size(1);
  if (N * C == 0) return;
  Launch L(dx);
  dispatch_float(dx.dtype(), "moe_dispatch_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_backward_kernel<T><<<grid_for(N * C), kThreads, 0, L.stream>>>(
        cptr<T>(dout), cptr<int32_t>(slots), N, C, k, mptr<T>(dx));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void moe_combine_forward(const Tensor& y, const Tensor& weights, const Tensor& slots, const Tensor& out) {
  const int64_t N = weights.size(0), k = weights.size(1), C = y.size(1);
  if (N * C == 0) return;
  Launch L(y);
  dispatch_float(y.dtype(), "moe_combine_forward", [&](auto tag) {
    using T = decltype(tag);
    combine_forward_kernel<T><<<grid_for(N * C), kThreads, 0, L.stream>>>(
        cptr<T>(y), cptr<T>(weights), cptr<int32_t>(slots), N, C, k, mptr<T>(out));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void moe_combine_backward(const Tensor& y, const Tensor& weights, const Tensor& dout, const Tensor& order,
                          const Tensor& slots, const Tensor& dy, const Tensor& dweights) {
  const int64_t M = y.size(0), C = y.size(1), k = weights.size(1);
  if (M == 0) return;
  Launch L(y);
  dispatch_float(y.dtype(), "moe_combine_backward", [&](auto tag) {
    using T = decltype(tag);
    if (C > 0) {
      combine_backward_dy_kernel<T><<<grid_for(M * C), kThreads, 0, L.stream>>>(
          cptr<T>(weights), cptr<T>(dout), cptr<int32_t>(order), M, C, k, mptr<T>(dy));
      NDT_CUDA_CHECK_LAUNCH();
    }
    const unsigned blocks = static_cast<unsigned>((M + kWarpsPerBlock - 1) / kWarpsPerBlock);
    combine_backward_dw_kernel<T><<<blocks, kThreads, 0, L.stream>>>(
        cptr<T>(y), cptr<T>(dout), cptr<int32_t>(slots), M, C, k, mptr<T>(dweights));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ndt::cuda
