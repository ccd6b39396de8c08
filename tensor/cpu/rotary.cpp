// CPU rotary position embedding (RoPE) in Hugging Face's convention (rotate_half: the two
// halves of each head are the pairs). Legend: B batch, T positions, NH heads, HS head size,
// H = HS / 2 pairs.
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

// x (B,T,NH,HS), cos, sin (B,T,H) -> out (B,T,NH,HS): each pair (x_i, x_{i+H}) turned by
// the angle of its position and frequency,
//   out_i = x_i cos - x_{i+H} sin,  out_{i+H} = x_{i+H} cos + x_i sin
// (HF: out = x * cat(cos, cos) + rotate_half(x) * cat(sin, sin)). inverse: the angle's
// negative, which is the backward (a rotation's transpose is its inverse).
void rotary_forward(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse, const Tensor& out) {
  dispatch_float(x.dtype(), "rotary_forward", [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const int64_t B = x.size(0), Tn = x.size(1), NH = x.size(2), HS = x.size(3), H = HS / 2;
    const T *px = static_cast<const T*>(x.data_ptr()), *pc = static_cast<const T*>(cos.data_ptr()),
            *ps = static_cast<const T*>(sin.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const A sign = inverse ? A(-1) : A(1);
#pragma omp parallel for schedule(static) if (B * Tn * NH * HS > 65536)
    for (int64_t bt = 0; bt < B * Tn; ++bt)
      for (int64_t h = 0; h < NH; ++h) {
        const T* xr = px + (bt * NH + h) * HS;
        T* orow = po + (bt * NH + h) * HS;
        for (int64_t i = 0; i < H; ++i) {
          const A c = load(pc[bt * H + i]), s = sign * load(ps[bt * H + i]);
          const A x1 = load(xr[i]), x2 = load(xr[i + H]);
          orow[i] = st<T>(x1 * c - x2 * s);
          orow[i + H] = st<T>(x2 * c + x1 * s);
        }
      }
  });
}

}  // namespace ndt::cpu
