// CPU fill and copy: any strides, any dtype conversion (bf16 rounds to nearest even).
#include <cstring>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

// bf16 is the top half of an f32: widening is a shift; narrowing rounds to nearest even and
// keeps NaNs quiet (float_to_bf16's rule), as selects the compiler can vectorize.
NDT_VECTOR_CLONES void bf16_to_f32(const bf16* src, float* dst, int64_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<uint32_t>(s[i]) << 16;
}
NDT_VECTOR_CLONES void f32_to_bf16(const float* src, bf16* dst, int64_t n) {
  const uint32_t* s = reinterpret_cast<const uint32_t*>(src);
  uint16_t* d = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = s[i];
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x40u;
    d[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

namespace {

// Calls f(dst_offset, src_offset, n) for each run of the innermost dim, in row-major order
// of the shape. Offsets are in elements.
template <typename F>
void for_each_row(const Shape& shape, const Shape& dst_st, const Shape& src_st, F&& f) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  if (nd == 0) return f(0, 0, 1);
  const int64_t inner = shape[nd - 1];
  const int64_t rows = inner == 0 ? 0 : numel_of(shape) / inner;
#pragma omp parallel for schedule(static) if (rows * inner > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t rem = r, doff = 0, soff = 0;
    for (int64_t d = nd - 2; d >= 0; --d) {
      const int64_t i = rem % shape[d];
      rem /= shape[d];
      doff += i * dst_st[d];
      soff += i * src_st[d];
    }
    f(doff, soff, inner);
  }
}

}  // namespace

void fill(const Tensor& t, double value) {
  dispatch_all(t.dtype(), "fill", [&](auto tag) {
    using T = decltype(tag);
    const T v = store<T>(value);
    T* p = static_cast<T*>(t.data_ptr());
    const Shape& st = t.strides();
    if (t.is_contiguous()) {
      const int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
    for_each_row(t.shape(), st, st, [&](int64_t off, int64_t, int64_t n) {
      const int64_t s = st.empty() ? 1 : st.back();
      for (int64_t i = 0; i < n; ++i) p[off + i * s] = v;
    });
  });
}

void copy(const Tensor& dst, const Tensor& src) {
  NDT_CHECK(dst.shape() == src.shape(), "copy: shapes differ, dst ", dst.shape_str(), " src ",
            src.shape_str());
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memmove(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  dispatch_all(dst.dtype(), "copy", [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_all(src.dtype(), "copy", [&](auto stag) {
      using S = decltype(stag);
      D* d = static_cast<D*>(dst.data_ptr());
      const S* s = static_cast<const S*>(src.data_ptr());
      const int64_t nd = dst.dim();
      const int64_t dstep = nd ? dst.strides().back() : 1, sstep = nd ? src.strides().back() : 1;
      for_each_row(dst.shape(), dst.strides(), src.strides(), [&](int64_t doff, int64_t soff, int64_t n) {
        if constexpr (std::is_same_v<D, float> && std::is_same_v<S, bf16>) {
          if (dstep == 1 && sstep == 1) return bf16_to_f32(s + soff, d + doff, n);
        } else if constexpr (std::is_same_v<D, bf16> && std::is_same_v<S, float>) {
          if (dstep == 1 && sstep == 1) return f32_to_bf16(s + soff, d + doff, n);
        }
        for (int64_t i = 0; i < n; ++i) {
          if constexpr (std::is_same_v<D, S>) {
            d[doff + i * dstep] = s[soff + i * sstep];
          } else if constexpr (std::is_same_v<S, int32_t> || std::is_same_v<S, uint16_t>) {
            // integers go through double, which holds every int32 exactly (float holds only
            // those up to 2^24)
            d[doff + i * dstep] = store<D>(static_cast<double>(s[soff + i * sstep]));
          } else if constexpr (std::is_same_v<D, bf16> && !std::is_same_v<S, double>) {
            d[doff + i * dstep] = float_to_bf16(load(s[soff + i * sstep]));
          } else {
            d[doff + i * dstep] = store<D>(static_cast<double>(load(s[soff + i * sstep])));
          }
        }
      });
    });
  });
}

}  // namespace ndt::cpu
