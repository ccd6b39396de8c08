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

// logits (N,V), targets (N) -> losses (N) = lse - logit[target], lse (N); ignored rows: 0.
// Only columns [0, v_limit) count. A bad target records its row in *bad_row (first wins).
template <typename T>
__global__ void cross_entropy_forward_kernel(const T* logits, const int32_t* targets, int64_t V,
                                             int64_t v_limit, int64_t ignore_index, float* losses, float* lse,
                                             int* bad_row) {
  const int64_t n = blockIdx.x;
  const T* row = logits + n * V;
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < v_limit; c += blockDim.x) mx = fmaxf(mx, load(row[c]));
  mx = block_max(mx);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < v_limit; c += blockDim.x) s += expf(load(row[c]) - mx);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const float l = mx + logf(s);
    const int64_t t = targets[n];
    lse[n] = l;
    if (t == ignore_index) {
      losses[n] = 0.0f;
    } else if (t < 0 || t >= v_limit) {
      losses[n] = 0.0f;
      atomicMin(bad_row, static_cast<int>(n));
    } else {
      losses[n] = l - load(row[t]);
    }
  }
}

// In the forward loss = mean_n (lse_n - logit[n, t_n]); so
// dlogits[n, c] = (exp(logit[n,c] - lse_n) - [c == t_n]) * grad_scale, 0 on ignored rows
// and padded columns. logits, dlogits (N,V), targets, lse (N)
template <typename T>
__global__ void cross_entropy_backward_kernel(const T* logits, const int32_t* targets, const float* lse,
                                              int64_t N, int64_t V, int64_t v_limit, int64_t ignore_index,
                                              float grad_scale, T* dlogits) {
  NDT_GRID_STRIDE(i, N * V) {
    const int64_t n = i / V, c = i % V, t = targets[n];
    float g = 0.0f;
    if (t != ignore_index && c < v_limit)
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

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t v_limit, int64_t ignore_index,
                           const Tensor& losses, const Tensor& lse) {
  const int64_t V = logits.size(-1), N = logits.size(0);
  if (N == 0) return;
  NDT_CHECK(targets.dtype() == DType::i32, "cross_entropy: targets must be int32, got ", targets.desc());
  NDT_CHECK(N < INT_MAX, "cross_entropy: too many rows (", N, ")");
  check_stat(losses, "cross_entropy_forward", "losses");
  check_stat(lse, "cross_entropy_forward", "lse");
  Launch L(logits);
  Tensor bad_row = Tensor::full({1}, INT_MAX, DType::i32, logits.device());
  dispatch_float(logits.dtype(), "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_forward_kernel<T><<<static_cast<unsigned>(N), row_threads(v_limit), 0, L.stream>>>(
        static_cast<const T*>(logits.data_ptr()), targets.data<int32_t>(), V, v_limit, ignore_index,
        losses.data<float>(), lse.data<float>(), bad_row.data<int32_t>());
    NDT_CUDA_CHECK_LAUNCH();
  });
  const int64_t n = bad_row.to_vector<int32_t>()[0];  // read as an integer; synchronizes
  if (n != INT_MAX) {
    const int64_t t = static_cast<int64_t>(targets.narrow(0, n, 1).item());
    NDT_FAIL("cross_entropy: target ", t, " at row ", n, " is outside the vocabulary [0, ", v_limit, ")");
  }
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, int64_t v_limit,
                            int64_t ignore_index, double grad_scale, const Tensor& dlogits) {
  const int64_t V = logits.size(-1), N = logits.size(0);
  if (N * V == 0) return;
  check_stat(lse, "cross_entropy_backward", "lse");
  Launch L(logits);
  dispatch_float(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_backward_kernel<T><<<grid_for(N * V), kThreads, 0, L.stream>>>(
        static_cast<const T*>(logits.data_ptr()), targets.data<int32_t>(), lse.data<float>(), N, V, v_limit,
        ignore_index, static_cast<float>(grad_scale), static_cast<T*>(dlogits.data_ptr()));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

int64_t count_not_equal(const Tensor& targets, int64_t ignore_index) {
  const int64_t n = targets.numel();
  if (n == 0) return 0;
  NDT_CHECK(targets.dtype() == DType::i32, "count_not_equal: targets must be int32, got ", targets.desc());
  NDT_CHECK(n < INT_MAX, "count_not_equal: too many entries (", n, ")");
  Launch L(targets);
  Tensor count = Tensor::zeros({1}, DType::i32, targets.device());
  count_not_equal_kernel<<<grid_for(n), kThreads, 0, L.stream>>>(targets.data<int32_t>(), n, ignore_index,
                                                                 count.data<int32_t>());
  NDT_CUDA_CHECK_LAUNCH();
  return count.to_vector<int32_t>()[0];  // read as an integer; synchronizes
}

}  // namespace ndt::cuda
