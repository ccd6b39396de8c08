// CUDA RMSNorm over the last dim, the twin of tensor/cpu/rmsnorm.cpp. Legend: N rows, C
// channels. One warp per row for the forward and for dx; dw as one thread per column summing
// the rows in order (deterministic; the simple kernel, kept as the reference).
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

constexpr int kRowsPerBlock = kThreads / 32;  // one warp per row

// Blocks of kRowsPerBlock warps covering N rows (the row kernels do not stride)
unsigned row_blocks(int64_t N) {
  const int64_t b = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  NDT_CHECK(b < (int64_t(1) << 31), "rmsnorm: too many rows (", N, ")");
  return static_cast<unsigned>(b);
}

// ---- kernels ------------------------------------------------------------------------

// x (N,C), w (C) -> out (N,C) = x * rstd * w (x * rstd rounded to T first, as
// Hugging Face's LlamaRMSNorm), rstd (N) = 1 / sqrt(mean_c(x^2) + eps)
template <typename T>
__global__ void rmsnorm_forward_kernel(const T* x, const T* w, float eps, T* out, float* rstd, int64_t N,
                                       int64_t C) {
  const int lane = threadIdx.x % 32;
  const int64_t n = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (n >= N) return;
  const T* xr = x + n * C;
  float ss = 0.0f;
  for (int64_t c = lane; c < C; c += 32) ss += load(xr[c]) * load(xr[c]);
  const float r = rsqrtf(warp_sum(ss) / C + eps);
  for (int64_t c = lane; c < C; c += 32)
    out[n * C + c] = store<T>(load(store<T>(load(xr[c]) * r)) * load(w[c]));
  if (lane == 0) rstd[n] = r;
}

// forward: xhat = x * rstd, out = xhat * w; so dx = rstd * (dxhat - xhat * mean_c(dxhat * xhat)),
// dxhat = dout * w; one warp per row
template <typename T>
__global__ void rmsnorm_dx_kernel(const T* dout, const T* x, const T* w, const float* rstd, T* dx, int64_t N,
                                  int64_t C) {
  const int lane = threadIdx.x % 32;
  const int64_t n = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (n >= N) return;
  const T *dr = dout + n * C, *xr = x + n * C;
  const float r = rstd[n];
  float dot = 0.0f;
  for (int64_t c = lane; c < C; c += 32) dot += load(dr[c]) * load(w[c]) * load(xr[c]) * r;
  const float mean_dot = warp_sum(dot) / C;
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = load(xr[c]) * r, dxhat = load(dr[c]) * load(w[c]);
    dx[n * C + c] = store<T>(r * (dxhat - xhat * mean_dot));
  }
}

// dw (C) = sum_n dout * x * rstd, one thread per column, the rows in order
template <typename T>
__global__ void rmsnorm_dw_kernel(const T* dout, const T* x, const float* rstd, T* dw, int64_t N, int64_t C) {
  NDT_GRID_STRIDE(c, C) {
    float s = 0.0f;
    for (int64_t n = 0; n < N; ++n) s += load(dout[n * C + c]) * load(x[n * C + c]) * rstd[n];
    dw[c] = store<T>(s);
  }
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& out, const Tensor& rstd) {
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  if (N == 0) return;
  NDT_CHECK(rstd.dtype() == DType::f32, "rmsnorm_forward: rstd must be f32 on CUDA, got ", rstd.desc());
  Launch L(x);
  dispatch_float(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_forward_kernel<T><<<row_blocks(N), kThreads, 0, L.stream>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(w.data_ptr()), static_cast<float>(eps),
        static_cast<T*>(out.data_ptr()), rstd.data<float>(), N, C);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw) {
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  if (C == 0) return;
  NDT_CHECK(rstd.dtype() == DType::f32, "rmsnorm_backward: rstd must be f32 on CUDA, got ", rstd.desc());
  Launch L(x);
  dispatch_float(x.dtype(), "rmsnorm_backward", [&](auto tag) {
    using T = decltype(tag);
    const T *pd = static_cast<const T*>(dout.data_ptr()), *px = static_cast<const T*>(x.data_ptr());
    if (N > 0) {
      rmsnorm_dx_kernel<T><<<row_blocks(N), kThreads, 0, L.stream>>>(
          pd, px, static_cast<const T*>(w.data_ptr()), rstd.data<float>(), static_cast<T*>(dx.data_ptr()), N,
          C);
      NDT_CUDA_CHECK_LAUNCH();
    }
    rmsnorm_dw_kernel<T><<<grid_for(C), kThreads, 0, L.stream>>>(pd, px, rstd.data<float>(),
                                                                 static_cast<T*>(dw.data_ptr()), N, C);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ndt::cuda
