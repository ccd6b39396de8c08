// CUDA LayerNorm over the last dim, the twin of tensor/cpu/layernorm.cpp. Legend: N rows,
// C channels. One warp per row for the forward; the backward is one kernel: dx by a warp per
// row, dw and db as deterministic column sums (per chunk of rows, then the chunks in order).
#include <algorithm>
#include <climits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

constexpr int kRowsPerBlock = kThreads / 32;  // one warp per row
constexpr int64_t kRowChunk = 64;             // rows per partial sum of dw, db

// ---- kernels ------------------------------------------------------------------------

// One row by one warp, given the lane's partial sum s of the row xr (C): out (C) =
// (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps) (biased variance); lane 0 writes the
// row's mean and rstd
template <typename T>
__device__ void layernorm_row(const T* xr, float s, const T* w, const T* b, float eps, T* out, int64_t C,
                              int lane, float* mean, float* rstd) {
  const float m = warp_sum(s) / C;
  float v = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = load(xr[c]) - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(v) / C + eps);
  for (int64_t c = lane; c < C; c += 32) out[c] = store<T>((load(xr[c]) - m) * r * load(w[c]) + load(b[c]));
  if (lane == 0) {
    *mean = m;
    *rstd = r;
  }
}

// x (N,C), w (C), b (C) -> out (N,C), mean (N), rstd (N); one warp per row
template <typename T>
__global__ void layernorm_forward_kernel(const T* x, const T* w, const T* b, float eps, T* out, float* mean,
                                         float* rstd, int64_t N, int64_t C) {
  const int lane = threadIdx.x % 32;
  const int64_t n = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (n >= N) return;
  const T* xr = x + n * C;
  float s = 0.0f;
  for (int64_t c = lane; c < C; c += 32) s += load(xr[c]);
  layernorm_row(xr, s, w, b, eps, out + n * C, C, lane, mean + n, rstd + n);
}

// a, b (N,C) -> sum (N,C) = a + b, then as layernorm_forward_kernel on sum: one warp per
// row, the sum written once and re-read by the same lane (from L1) for the statistics
template <typename T>
__global__ void add_layernorm_forward_kernel(const T* a, const T* b, const T* w, const T* bias, float eps,
                                             T* sum, T* out, float* mean, float* rstd, int64_t N, int64_t C) {
  const int lane = threadIdx.x % 32;
  const int64_t n = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (n >= N) return;
  T* sr = sum + n * C;
  float s = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const T v = store<T>(load(a[n * C + c]) + load(b[n * C + c]));  // as add: rounded to T
    sr[c] = v;
    s += load(v);
  }
  layernorm_row<T>(sr, s, w, bias, eps, out + n * C, C, lane, mean + n, rstd + n);
}

// The backward in one kernel. In the forward, xhat = (x - mean) * rstd, out = xhat * w + b; so
//   dx = rstd * (dxhat - mean_c(dxhat) - xhat * mean_c(dxhat * xhat)),  dxhat = dout * w
//   dw = sum_n dout * xhat,  db = sum_n dout
// Block k owns rows [64k, 64k + 64): (a) one warp per row writes dx; (b) one thread per
// column sums its rows, in order, into the block's partial dw, db (partial (chunks, 2, C));
// (c) the last block to finish adds the partials, chunk by chunk, into dw and db. With
// dresidual (the residual stream's gradient), dx = the LayerNorm's gradient + dresidual. Fixed
// orders throughout: deterministic. done counts finished blocks (zero before; the last block
// sets it back to zero).
template <typename T>
__global__ void layernorm_backward_kernel(const T* dout, const T* x, const T* w, const float* mean,
                                          const float* rstd, const T* dresidual, T* dx, T* dw, T* db,
                                          int64_t N, int64_t C, float* partial, unsigned* done) {
  const int64_t r0 = blockIdx.x * kRowChunk, r1 = min(N, r0 + kRowChunk);
  // (a) dx, one warp per row
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  for (int64_t n = r0 + warp; n < r1; n += nwarps) {
    const T *dr = dout + n * C, *xr = x + n * C;
    const float m = mean[n], r = rstd[n];
    float mean_dxhat = 0.0f, mean_dxhat_xhat = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
      const float xhat = (load(xr[c]) - m) * r;
      const float dxhat = load(dr[c]) * load(w[c]);
      mean_dxhat += dxhat;
      mean_dxhat_xhat += dxhat * xhat;
    }
    mean_dxhat = warp_sum(mean_dxhat) / C;
    mean_dxhat_xhat = warp_sum(mean_dxhat_xhat) / C;
    for (int64_t c = lane; c < C; c += 32) {
      const float xhat = (load(xr[c]) - m) * r;
      const float dxhat = load(dr[c]) * load(w[c]);
      const float g = r * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
      dx[n * C + c] = store<T>(dresidual ? g + load(dresidual[n * C + c]) : g);
    }
  }
  // (b) this chunk's column sums (its rows are in L1/L2 from (a))
  float* pw = partial + blockIdx.x * 2 * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float sw = 0.0f, sb = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
      const float d = load(dout[r * C + c]);
      sw += d * (load(x[r * C + c]) - mean[r]) * rstd[r];
      sb += d;
    }
    pw[c] = sw;
    pw[C + c] = sb;
  }
  // (c) the last block adds the chunks in order
  __threadfence();  // this block's partials are visible before it counts itself done
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float sw = 0.0f, sb = 0.0f;
    for (unsigned k = 0; k < gridDim.x; ++k) {
      sw += __ldcg(partial + k * 2 * C + c);  // from L2: other blocks wrote them
      sb += __ldcg(partial + k * 2 * C + C + c);
    }
    dw[c] = store<T>(sw);
    db[c] = store<T>(sb);
  }
  if (threadIdx.x == 0) *done = 0;
}

unsigned row_blocks(int64_t N) { return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& out,
                       const Tensor& mean, const Tensor& rstd) {
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  if (N == 0) return;
  check_stat(mean, "layernorm_forward", "mean");
  check_stat(rstd, "layernorm_forward", "rstd");
  Launch L(x);
  dispatch_float(x.dtype(), "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    layernorm_forward_kernel<T><<<row_blocks(N), kThreads, 0, L.stream>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(w.data_ptr()),
        static_cast<const T*>(b.data_ptr()), static_cast<float>(eps), static_cast<T*>(out.data_ptr()),
        mean.data<float>(), rstd.data<float>(), N, C);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void add_layernorm_forward(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& bias, double eps,
                           const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  const int64_t C = a.size(-1), N = C ? a.numel() / C : 0;
  if (N == 0) return;
  check_stat(mean, "add_layernorm_forward", "mean");
  check_stat(rstd, "add_layernorm_forward", "rstd");
  Launch L(a);
  dispatch_float(a.dtype(), "add_layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    add_layernorm_forward_kernel<T><<<row_blocks(N), kThreads, 0, L.stream>>>(
        static_cast<const T*>(a.data_ptr()), static_cast<const T*>(b.data_ptr()),
        static_cast<const T*>(w.data_ptr()), static_cast<const T*>(bias.data_ptr()), static_cast<float>(eps),
        static_cast<T*>(sum.data_ptr()), static_cast<T*>(out.data_ptr()), mean.data<float>(),
        rstd.data<float>(), N, C);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db,
                        const Tensor& dresidual) {
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  if (C == 0) return;
  check_stat(mean, "layernorm_backward", "mean");
  check_stat(rstd, "layernorm_backward", "rstd");
  Launch L(x);
  const int64_t chunks = std::max<int64_t>(1, (N + kRowChunk - 1) / kRowChunk);
  NDT_CHECK(chunks < INT_MAX, "layernorm_backward: too many rows (", N, ")");
  Tensor partial = Tensor::empty({chunks, 2, C}, DType::f32, x.device());
  Tensor done = Tensor::zeros({1}, DType::i32, x.device());
  dispatch_float(x.dtype(), "layernorm_backward", [&](auto tag) {
    using T = decltype(tag);
    layernorm_backward_kernel<T><<<static_cast<unsigned>(chunks), kThreads, 0, L.stream>>>(
        static_cast<const T*>(dout.data_ptr()), static_cast<const T*>(x.data_ptr()),
        static_cast<const T*>(w.data_ptr()), mean.data<float>(), rstd.data<float>(),
        dresidual.defined() ? static_cast<const T*>(dresidual.data_ptr()) : nullptr,
        static_cast<T*>(dx.data_ptr()), static_cast<T*>(dw.data_ptr()), static_cast<T*>(db.data_ptr()), N, C,
        partial.data<float>(), static_cast<unsigned*>(done.data_ptr()));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ndt::cuda
