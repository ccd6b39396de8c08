// CUDA fill and copy: any strides (up to 8 dims), any dtype conversion (bf16 rounds to
// nearest even), the twin of tensor/cpu/copy.cpp.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

constexpr int kMaxDims = 8;

// Shape and strides (in elements) of up to two tensors, passed by value to the kernels.
struct Layout {
  int nd;
  int64_t shape[kMaxDims];
  int64_t dst_st[kMaxDims];
  int64_t src_st[kMaxDims];
};

Layout make_layout(const char* op, const Tensor& dst, const Tensor& src) {
  NDT_CHECK(dst.dim() <= kMaxDims, op, ": at most ", kMaxDims, " dims on CUDA, got ", dst.desc());
  Layout l{};
  l.nd = static_cast<int>(dst.dim());
  for (int d = 0; d < l.nd; ++d) {
    l.shape[d] = dst.shape()[d];
    l.dst_st[d] = dst.strides()[d];
    l.src_st[d] = src.strides()[d];
  }
  return l;
}

// Element i in row-major order of the shape -> its offsets in dst and src.
__device__ __forceinline__ void offsets(const Layout& l, int64_t i, int64_t& doff, int64_t& soff) {
  doff = 0;
  soff = 0;
  for (int d = l.nd - 1; d >= 0; --d) {
    const int64_t c = i % l.shape[d];
    i /= l.shape[d];
    doff += c * l.dst_st[d];
    soff += c * l.src_st[d];
  }
}

// double -> bf16 in one rounding (to nearest even), as store<bf16>(double) on the CPU
// (tensor/cpu/dispatch.h): the f32 step rounds to odd, so it cannot create a false tie.
__host__ __device__ inline __nv_bfloat16 double_to_bf16(double v) {
  float f = static_cast<float>(v);
  if (v != v || static_cast<double>(f) == v) return __float2bfloat16_rn(f);
  uint32_t u;
  memcpy(&u, &f, 4);
  if (fabs(static_cast<double>(f)) > fabs(v)) --u;  // toward zero (inf -> FLT_MAX)
  u |= 1u;                                          // inexact: sticky bit
  memcpy(&f, &u, 4);
  return __float2bfloat16_rn(f);
}

// Conversions as on the CPU: integers through double (exact for every int32), to bf16 from
// a float-like type through float (one rounding), from double in one rounding.
template <typename D, typename S>
__device__ __forceinline__ D convert(S v) {
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (std::is_integral_v<S>) {
    if constexpr (std::is_same_v<D, __nv_bfloat16>)
      return double_to_bf16(static_cast<double>(v));
    else
      return static_cast<D>(static_cast<double>(v));
  } else if constexpr (std::is_same_v<D, __nv_bfloat16>) {
    if constexpr (std::is_same_v<S, double>)
      return double_to_bf16(v);
    else
      return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    return static_cast<D>(__bfloat162float(v));
  } else {
    return static_cast<D>(v);
  }
}

// The fill value in T, rounded as the CPU's fill does.
template <typename T>
T host_value(double v) {
  return static_cast<T>(v);
}
template <>
__nv_bfloat16 host_value<__nv_bfloat16>(double v) {
  return double_to_bf16(v);
}

// ---- kernels ------------------------------------------------------------------------

// t (any strides) = v
template <typename T>
__global__ void fill_kernel(T* t, Layout l, int64_t n, T v) {
  NDT_GRID_STRIDE(i, n) {
    int64_t off, unused;
    offsets(l, i, off, unused);
    t[off] = v;
  }
}

template <typename T>
__global__ void fill_contiguous_kernel(T* t, int64_t n, T v) {
  NDT_GRID_STRIDE(i, n)
  t[i] = v;
}

// dst (any strides) = convert(src (any strides)), same shape
template <typename D, typename S>
__global__ void copy_kernel(D* dst, const S* src, Layout l, int64_t n) {
  NDT_GRID_STRIDE(i, n) {
    int64_t doff, soff;
    offsets(l, i, doff, soff);
    dst[doff] = convert<D>(src[soff]);
  }
}

template <typename D, typename S>
__global__ void copy_contiguous_kernel(D* dst, const S* src, int64_t n) {
  NDT_GRID_STRIDE(i, n)
  dst[i] = convert<D>(src[i]);
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void fill(const Tensor& t, double value) {
  const int64_t n = t.numel();
  if (n == 0) return;
  Launch L(t);
  dispatch_all(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.data_ptr());
    if (t.is_contiguous()) {
      fill_contiguous_kernel<T><<<grid_for(n), kThreads, 0, L.stream>>>(p, n, host_value<T>(value));
    } else {
      fill_kernel<T>
          <<<grid_for(n), kThreads, 0, L.stream>>>(p, make_layout("fill", t, t), n, host_value<T>(value));
    }
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void copy(const Tensor& dst, const Tensor& src) {
  NDT_CHECK(dst.shape() == src.shape(), "copy: shapes differ, dst ", dst.shape_str(), " src ",
            src.shape_str());
  const int64_t n = dst.numel();
  if (n == 0) return;
  Launch L(dst);
  const bool contiguous = dst.is_contiguous() && src.is_contiguous();
  if (contiguous && dst.dtype() == src.dtype()) {
    NDT_CUDA_CHECK(
        cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, L.stream));
    return;
  }
  const Layout l = contiguous ? Layout{} : make_layout("copy", dst, src);
  dispatch_all(dst.dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_all(src.dtype(), [&](auto stag) {
      using S = decltype(stag);
      D* d = static_cast<D*>(dst.data_ptr());
      const S* s = static_cast<const S*>(src.data_ptr());
      if (contiguous) {
        copy_contiguous_kernel<D, S><<<grid_for(n), kThreads, 0, L.stream>>>(d, s, n);
      } else {
        copy_kernel<D, S><<<grid_for(n), kThreads, 0, L.stream>>>(d, s, l, n);
      }
      NDT_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace ndt::cuda
