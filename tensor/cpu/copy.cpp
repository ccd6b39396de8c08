// CPU fill and copy: any strides, any dtype conversion (bf16 rounds to nearest even).
#include <omp.h>

#include <algorithm>
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

// The two tensors' common layout with as few dimensions as they allow: size-1 dimensions
// dropped, and d joined to the one before it where both tensors step over the pair as over
// one dimension (stride[d-1] = stride[d] shape[d] in each). A permuted (B, T, NH, HS) view
// of a (B, T, C) buffer keeps its four; a narrow of whole rows becomes one long row.
struct Layout {
  Shape shape, dst, src;
};
Layout merged(const Shape& shape, const Shape& dst_st, const Shape& src_st) {
  Layout m;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!m.shape.empty() && m.dst.back() == dst_st[d] * shape[d] && m.src.back() == src_st[d] * shape[d]) {
      m.shape.back() *= shape[d];
      m.dst.back() = dst_st[d];
      m.src.back() = src_st[d];
    } else {
      m.shape.push_back(shape[d]);
      m.dst.push_back(dst_st[d]);
      m.src.push_back(src_st[d]);
    }
  }
  if (m.shape.empty()) m.shape = m.dst = m.src = Shape{1};  // one element
  return m;
}

// Calls f(dst_offset, src_offset, n, dst_step, src_step) for each run of the innermost
// (merged) dimension, in row-major order of the shape; offsets and steps in elements. Each
// thread takes a contiguous range of rows: the first row's offsets from its index, the
// next ones by stepping the outer indices like an odometer (no division per row).
template <typename F>
void for_each_row(const Shape& shape, const Shape& dst_st, const Shape& src_st, F&& f) {
  const Layout m = merged(shape, dst_st, src_st);
  const int64_t nd = static_cast<int64_t>(m.shape.size()), inner = m.shape.back();
  const int64_t rows = inner == 0 ? 0 : numel_of(m.shape) / inner;
  const int64_t dstep = m.dst.back(), sstep = m.src.back();
#pragma omp parallel if (rows * inner > 32768)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
    Shape idx(static_cast<size_t>(std::max<int64_t>(nd - 1, 0)));
    int64_t rem = r0, doff = 0, soff = 0;
    for (int64_t d = nd - 2; d >= 0; --d) {
      idx[d] = rem % m.shape[d];
      rem /= m.shape[d];
      doff += idx[d] * m.dst[d];
      soff += idx[d] * m.src[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      f(doff, soff, inner, dstep, sstep);
      for (int64_t d = nd - 2; d >= 0; --d) {
        doff += m.dst[d];
        soff += m.src[d];
        if (++idx[d] < m.shape[d]) break;
        idx[d] = 0;
        doff -= m.dst[d] * m.shape[d];
        soff -= m.src[d] * m.shape[d];
      }
    }
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
      if constexpr (sizeof(T) == 2) {  // bf16: as 16-bit words, which the compiler vectorizes
        uint16_t w;
        std::memcpy(&w, &v, 2);
        uint16_t* q = reinterpret_cast<uint16_t*>(p);
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; ++i) q[i] = w;
      } else {
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; ++i) p[i] = v;
      }
      return;
    }
    for_each_row(t.shape(), st, st, [&](int64_t off, int64_t, int64_t n, int64_t s, int64_t) {
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
      for_each_row(dst.shape(), dst.strides(), src.strides(),
                   [&](int64_t doff, int64_t soff, int64_t n, int64_t dstep, int64_t sstep) {
                     if constexpr (std::is_same_v<D, S>) {
                       if (dstep == 1 && sstep == 1)
                         return static_cast<void>(std::memcpy(d + doff, s + soff, size_t(n) * sizeof(D)));
                     } else if constexpr (std::is_same_v<D, float> && std::is_same_v<S, bf16>) {
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
