// CUDA softmax and fused softmax + cross-entropy over rows, the twins of
// tensor/cpu/softmax.cpp. Legend: N rows, C/V columns. One block per row, f32 math.
#include <algorithm>
#include <climits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

// ---- kernels ------------------------------------------------------------------------

// x (N,C) -> out (N,C): out = exp(x - max) / sum exp(x - max); block n does row n
template <typename T>
__global__ void softmax_forward_kernel(const T* x, T* out, int64_t C) {
  const T* xr = x + blockIdx.x * C;
  T* orow = out + blockIdx.x * C;
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) mx = fmaxf(mx, load(xr[c]));
  mx = block_max(mx);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += expf(load(xr[c]) - mx);
  s = block_sum(s);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) orow[c] = store<T>(expf(load(xr[c]) - mx) / s);
}

// In the forward y = softmax(x); so dx = y * (dy - sum_c(dy * y))
template <typename T>
__global__ void softmax_backward_kernel(const T* y, const T* dy, T* dx, int64_t C) {
  const int64_t off = blockIdx.x * C;
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += load(dy[off + c]) * load(y[off + c]);
  dot = block_sum(dot);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    dx[off + c] = store<T>(load(y[off + c]) * (load(dy[off + c]) - dot));
}

// (max, sum of exp(x - max)) of a row piece, combined two at a time: the online softmax.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};  // both empty
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
// Every thread of the block gets the row's (max, sum). blockDim.x a multiple of 32.
__device__ MaxSum block_max_sum(MaxSum v) {
  __shared__ MaxSum shared[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1)
    v = combine(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : MaxSum{-INFINITY, 0.0f};
  for (int o = 16; o > 0; o >>= 1)
    v = combine(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  return v;
}

// logits (N,V), targets (N), kept (1) -> losses (N) = lse - logit[target], lse (N); ignored
// rows: 0. Only columns [0, v_limit) count. One block per row: one pass for (max, sum exp)
// (online), then, with dlogits, one pass writing the fused classifier's gradient
// (softmax - onehot) / kept over the row (dlogits may be logits: the loss is taken first,
// and each element is read and written by the same thread). A bad target is recorded.
template <typename T>
__global__ void cross_entropy_forward_kernel(const T* logits, const int32_t* targets, const int32_t* kept,
                                             int64_t V, int64_t v_limit, int64_t ignore_index, float* losses,
                                             float* lse, T* dlogits, ErrorRecord* err) {
  const int64_t n = blockIdx.x;
  const T* row = logits + n * V;
  MaxSum acc{-INFINITY, 0.0f};
  for (int64_t c = threadIdx.x; c < v_limit; c += blockDim.x) {  // combine(acc, {x, 1}) with one exp
    const float x = load(row[c]);
    if (x > acc.m) {  // a new maximum rescales the sum (from m = -inf: exp(-inf) = 0)
      acc.s = acc.s * expf(acc.m - x) + 1.0f;
      acc.m = x;
    } else if (x != -INFINITY) {  // -inf adds nothing (and -inf - -inf would be NaN); NaN propagates
      acc.s += expf(x - acc.m);
    }
  }
  acc = block_max_sum(acc);
  const float l = acc.m + logf(acc.s);
  const int64_t t = targets[n];
  const bool ignored = t == ignore_index, bad = !ignored && (t < 0 || t >= v_limit);
  if (threadIdx.x == 0) {
    lse[n] = l;
    losses[n] = ignored || bad ? 0.0f : l - load(row[t]);
    if (bad) record_error(err, KernelError::kCrossEntropyTarget, n, t, v_limit);
  }
  if (!dlogits) return;
  __syncthreads();  // row[t] is read before the row is overwritten
  const float inv_kept = *kept > 0 ? 1.0f / static_cast<float>(*kept) : 0.0f;
  T* drow = dlogits + n * V;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    float g = 0.0f;
    if (!ignored && !bad && c < v_limit) g = (expf(load(row[c]) - l) - (c == t ? 1.0f : 0.0f)) * inv_kept;
    drow[c] = store<T>(g);
  }
}

// In the forward loss = mean over kept rows of (lse_n - logit[n, t_n]); so
// dlogits[n, c] = (exp(logit[n,c] - lse_n) - [c == t_n]) * dloss / kept, 0 on ignored rows
// and padded columns. logits, dlogits (N,V), targets, lse (N), dloss, kept (1)
template <typename T>
__global__ void cross_entropy_backward_kernel(const T* logits, const int32_t* targets, const float* lse,
                                              const int32_t* kept, const float* dloss, int64_t N, int64_t V,
                                              int64_t v_limit, int64_t ignore_index, T* dlogits) {
  const float grad_scale = *kept > 0 ? *dloss / static_cast<float>(*kept) : 0.0f;
  NDT_GRID_STRIDE(i, N * V) {
    const int64_t n = i / V, c = i % V, t = targets[n];
    float g = 0.0f;
    if (t != ignore_index && t >= 0 && t < v_limit && c < v_limit)  // a bad target: 0, as in the forward
      g = (expf(load(logits[i]) - lse[n]) - (c == t ? 1.0f : 0.0f)) * grad_scale;
    dlogits[i] = store<T>(g);
  }
}

// targets (n) -> *count += number of entries != ignore_index (integer atomics: exact)
__global__ void count_not_equal_kernel(const int32_t* targets, int64_t n, int64_t ignore_index, int* count) {
  int c = 0;
  NDT_GRID_STRIDE(i, n) c += targets[i] != ignore_index;
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if (threadIdx.x % 32 == 0 && c) atomicAdd(count, c);
}

// losses (n) -> *out = sum / kept (0 when kept is 0). One block, fixed order: deterministic.
__global__ void mean_of_kept_kernel(const float* losses, int64_t n, const int32_t* kept, float* out) {
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += losses[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = *kept > 0 ? s * (1.0f / static_cast<float>(*kept)) : 0.0f;
}

// Threads for a block that walks one row of C columns: a multiple of 32, at most 256.
int row_threads(int64_t C) { return static_cast<int>(std::clamp<int64_t>((C + 31) / 32 * 32, 32, kThreads)); }

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void softmax_forward(const Tensor& x, const Tensor& out) {
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  if (N == 0) return;
  Launch L(x);
  dispatch_float(x.dtype(), "softmax_forward", [&](auto tag) {
    using T = decltype(tag);
    softmax_forward_kernel<T><<<static_cast<unsigned>(N), row_threads(C), 0, L.stream>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), C);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  const int64_t C = y.size(-1), N = C ? y.numel() / C : 0;
  if (N == 0) return;
  Launch L(y);
  dispatch_float(y.dtype(), "softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    softmax_backward_kernel<T><<<static_cast<unsigned>(N), row_threads(C), 0, L.stream>>>(
        static_cast<const T*>(y.data_ptr()), static_cast<const T*>(dy.data_ptr()),
        static_cast<T*>(dx.data_ptr()), C);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& kept, int64_t v_limit,
                           int64_t ignore_index, const Tensor& losses, const Tensor& lse,
                           const Tensor& dlogits) {
  const int64_t V = logits.size(-1), N = logits.size(0);
  if (N == 0) return;
  NDT_CHECK(targets.dtype() == DType::i32 && kept.dtype() == DType::i32,
            "cross_entropy: targets and kept must be int32, got ", targets.desc(), ", ", kept.desc());
  NDT_CHECK(N < INT_MAX, "cross_entropy: too many rows (", N, ")");
  check_stat(losses, "cross_entropy_forward", "losses");
  check_stat(lse, "cross_entropy_forward", "lse");
  NDT_CHECK(!dlogits.defined() || dlogits.dtype() == logits.dtype(),
            "cross_entropy_forward: dlogits must have the logits' dtype, got ", dlogits.desc());
  Launch L(logits);
  ErrorRecord* err = error_record(L.device);  // read at the next synchronization
  dispatch_float(logits.dtype(), "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    T* d = dlogits.defined() ? static_cast<T*>(dlogits.data_ptr()) : nullptr;
    cross_entropy_forward_kernel<T><<<static_cast<unsigned>(N), row_threads(v_limit), 0, L.stream>>>(
        static_cast<const T*>(logits.data_ptr()), targets.data<int32_t>(), kept.data<int32_t>(), V, v_limit,
        ignore_index, losses.data<float>(), lse.data<float>(), d, err);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& kept, const Tensor& dloss, int64_t v_limit, int64_t ignore_index,
                            const Tensor& dlogits) {
  const int64_t V = logits.size(-1), N = logits.size(0);
  if (N * V == 0) return;
  check_stat(lse, "cross_entropy_backward", "lse");
  check_stat(dloss, "cross_entropy_backward", "dloss");
  Launch L(logits);
  dispatch_float(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_backward_kernel<T><<<grid_for(N * V), kThreads, 0, L.stream>>>(
        static_cast<const T*>(logits.data_ptr()), targets.data<int32_t>(), lse.data<float>(),
        kept.data<int32_t>(), dloss.data<float>(), N, V, v_limit, ignore_index,
        static_cast<T*>(dlogits.data_ptr()));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void mean_of_kept(const Tensor& losses, const Tensor& kept, const Tensor& out) {
  check_stat(losses, "mean_of_kept", "losses");
  check_stat(out, "mean_of_kept", "out");
  Launch L(out);
  mean_of_kept_kernel<<<1, 1024, 0, L.stream>>>(losses.data<float>(), losses.numel(), kept.data<int32_t>(),
                                                out.data<float>());
  NDT_CUDA_CHECK_LAUNCH();
}

void count_not_equal(const Tensor& targets, int64_t ignore_index, const Tensor& kept) {
  const int64_t n = targets.numel();
  NDT_CHECK(targets.dtype() == DType::i32 && kept.dtype() == DType::i32,
            "count_not_equal: targets and kept must be int32, got ", targets.desc(), ", ", kept.desc());
  NDT_CHECK(n < INT_MAX, "count_not_equal: too many entries (", n, ")");
  Launch L(targets);
  NDT_CUDA_CHECK(cudaMemsetAsync(kept.data_ptr(), 0, sizeof(int32_t), L.stream));
  if (n == 0) return;
  count_not_equal_kernel<<<grid_for(n), kThreads, 0, L.stream>>>(targets.data<int32_t>(), n, ignore_index,
                                                                 kept.data<int32_t>());
  NDT_CUDA_CHECK_LAUNCH();
}

}  // namespace ndt::cuda
