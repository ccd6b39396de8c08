// CUDA rotary position embedding, the twin of tensor/cpu/rotary.cpp (Hugging Face's
// rotate_half convention). Legend: B batch, T positions, NH heads, HS head size, H = HS/2.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

// ---- kernels ------------------------------------------------------------------------

// One thread per pair (b, t, head, i): out_i = x_i c - x_{i+H} s, out_{i+H} = x_{i+H} c + x_i s,
// with c, s of (b, t, i); sign -1 turns the pairs back (the backward)
template <typename T>
__global__ void rotary_kernel(const T* x, const T* cos, const T* sin, float sign, T* out, int64_t pairs,
                              int64_t NH, int64_t H) {
  NDT_GRID_STRIDE(p, pairs) {
    const int64_t i = p % H, row = p / H, bt = row / NH;  // row: (b, t, head)
    const T* xr = x + row * 2 * H;
    const float c = load(cos[bt * H + i]), s = sign * load(sin[bt * H + i]);
    const float x1 = load(xr[i]), x2 = load(xr[i + H]);
    out[row * 2 * H + i] = store<T>(x1 * c - x2 * s);
    out[row * 2 * H + i + H] = store<T>(x2 * c + x1 * s);
  }
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void rotary_forward(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse, const Tensor& out) {
  const int64_t NH = x.size(2), H = x.size(3) / 2, pairs = x.numel() / 2;
  if (pairs == 0) return;
  Launch L(x);
  dispatch_float(x.dtype(), "rotary_forward", [&](auto tag) {
    using T = decltype(tag);
    rotary_kernel<T><<<grid_for(pairs), kThreads, 0, L.stream>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(cos.data_ptr()),
        static_cast<const T*>(sin.data_ptr()), inverse ? -1.0f : 1.0f, static_cast<T*>(out.data_ptr()), pairs,
        NH, H);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ndt::cuda
