// CUDA LayerNorm over the last dim, the twin of tensor/cpu/layernorm.cpp. Legend: N rows,
// C channels. One warp per row for the forward and for dx; dw and db are column sums done
// in two deterministic passes (partial sums over chunks of rows, then the chunks in order).
#include <algorithm>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

constexpr int kRowsPerBlock = kThreads / 32;  // one warp per row
constexpr int64_t kRowChunk = 64;             // rows per partial sum of dw, db

// ---- kernels ------------------------------------------------------------------------

// x (N,C), w (C), b (C) -> out (N,C), mean (N), rstd (N)
// out = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var + eps) (biased variance)
template <typename T>
__global__ void layernorm_forward_kernel(const T* x, const T* w, const T* b, float eps, T* out, float* mean,
                                         float* rstd, int64_t N, int64_t C) {
  const int lane = threadIdx.x % 32;
  const int64_t n = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (n >= N) return;
  const T* xr = x + n * C;
  float s = 0.0f;
  for (int64_t c = lane; c < C; c += 32) s += load(xr[c]);
  const float m = warp_sum(s) / C;
  float v = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = load(xr[c]) - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(v) / C + eps);
  for (int64_t c = lane; c < C; c += 32)
    out[n * C + c] = store<T>((load(xr[c]) - m) * r * load(w[c]) + load(b[c]));
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

// In the forward, xhat = (x - mean) * rstd and out = xhat * w + b; so
//   dx = rstd * (dxhat - mean_c(dxhat) - xhat * mean_c(dxhat * xhat)),  dxhat = dout * w
// dout, x (N,C), w (C), mean, rstd (N) -> dx (N,C)
template <typename T>
__global__ void layernorm_backward_dx_kernel(const T* dout, const T* x, const T* w, const float* mean,
                                             const float* rstd, T* dx, int64_t N, int64_t C) {
  const int lane = threadIdx.x % 32;
  const int64_t n = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (n >= N) return;
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
    dx[n * C + c] = store<T>(r * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat));
  }
}

// and db = sum_n dout, dw = sum_n dout * xhat: first pass over chunks of rows
// dout, x (N,C), mean, rstd (N) -> pdw, pdb (chunks,C)
template <typename T>
__global__ void layernorm_backward_partial_kernel(const T* dout, const T* x, const float* mean,
                                                  const float* rstd, int64_t N, int64_t C, int64_t chunks,
                                                  float* pdw, float* pdb) {
  NDT_GRID_STRIDE(i, chunks * C) {
    const int64_t c = i % C, r0 = (i / C) * kRowChunk, r1 = min(N, r0 + kRowChunk);
    float sw = 0.0f, sb = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
      const float d = load(dout[r * C + c]);
      sw += d * (load(x[r * C + c]) - mean[r]) * rstd[r];
      sb += d;
    }
    pdw[i] = sw;
    pdb[i] = sb;
  }
}

// second pass: pdw, pdb (chunks,C) -> dw, db (C), chunks summed in order
template <typename T>
__global__ void layernorm_backward_final_kernel(const float* pdw, const float* pdb, int64_t chunks, int64_t C,
                                                T* dw, T* db) {
  NDT_GRID_STRIDE(c, C) {
    float sw = 0.0f, sb = 0.0f;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      sw += pdw[ch * C + c];
      sb += pdb[ch * C + c];
    }
    dw[c] = store<T>(sw);
    db[c] = store<T>(sb);
  }
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

void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db) {
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  if (C == 0) return;
  check_stat(mean, "layernorm_backward", "mean");
  check_stat(rstd, "layernorm_backward", "rstd");
  Launch L(x);
  const int64_t chunks = std::max<int64_t>(1, (N + kRowChunk - 1) / kRowChunk);
  Tensor pdw = Tensor::empty({chunks, C}, DType::f32, x.device());
  Tensor pdb = Tensor::empty({chunks, C}, DType::f32, x.device());
  dispatch_float(x.dtype(), "layernorm_backward", [&](auto tag) {
    using T = decltype(tag);
    const T *pd = static_cast<const T*>(dout.data_ptr()), *px = static_cast<const T*>(x.data_ptr());
    if (N > 0) {
      layernorm_backward_dx_kernel<T><<<row_blocks(N), kThreads, 0, L.stream>>>(
          pd, px, static_cast<const T*>(w.data_ptr()), mean.data<float>(), rstd.data<float>(),
          static_cast<T*>(dx.data_ptr()), N, C);
      NDT_CUDA_CHECK_LAUNCH();
    }
    layernorm_backward_partial_kernel<T><<<grid_for(chunks * C), kThreads, 0, L.stream>>>(
        pd, px, mean.data<float>(), rstd.data<float>(), N, C, chunks, pdw.data<float>(), pdb.data<float>());
    NDT_CUDA_CHECK_LAUNCH();
    layernorm_backward_final_kernel<T><<<grid_for(C), kThreads, 0, L.stream>>>(
        pdw.data<float>(), pdb.data<float>(), chunks, C, static_cast<T*>(dw.data_ptr()),
        static_cast<T*>(db.data_ptr()));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ndt::cuda
