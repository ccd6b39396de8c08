// Rotary position embedding (RoPE, Su et al. 2021) in Hugging Face's convention. Legend:
// B batch, T positions, NH heads, HS head size.
#include "autograd/ops/common.h"

namespace ndt {
using namespace ops_detail;

// x (B,T,NH,HS), cos, sin (B,T,HS/2) -> (B,T,NH,HS)
Tensor rotary(const Tensor& x_in, const Tensor& cos_in, const Tensor& sin_in) {
  check_same("rotary", {&x_in, &cos_in, &sin_in});
  Tensor x = x_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  Tensor out = empty_like(x);
  kernels::rotary_forward(x, cos, sin, /*inverse=*/false, out);  // checks the shapes
  autograd::record("rotary", {out}, {x_in}, [cos, sin](const Grads& g) -> Grads {
    // forward: each pair turned by its angle, out = R x; so dx = R^T dout, the pair turned
    // back by the same angle
    Tensor dy = g[0].contiguous(), dx = empty_like(dy);
    kernels::rotary_forward(dy, cos, sin, /*inverse=*/true, dx);
    return {dx};
  });
  return out;
}

}  // namespace ndt
