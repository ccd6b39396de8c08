// Elementwise ops: add, sub, mul, scale, gelu, cast. b is a's shape or a row vector
// broadcast over a's last dim (a bias); its gradient then sums over the broadcast rows.
#include "autograd/ops/common.h"

namespace ndt {
using namespace ops_detail;

namespace {
void check_broadcast(const char* op, const Tensor& a, const Tensor& b) {
  check_same(op, {&a, &b});
  const bool same = a.shape() == b.shape();
  const bool row = b.dim() == 1 && a.dim() >= 1 && b.size(0) == a.size(-1);
  NDT_CHECK(same || row, op, ": shapes ", a.shape_str(), " and ", b.shape_str(),
            " do not match (b must have a's shape or be a row of a's last dim)");
}

// The gradient of a broadcast operand: the incoming gradient summed over broadcast rows.
Tensor reduce_to(const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  Tensor out = Tensor::empty(shape, g.dtype(), g.device());
  kernels::sum_rows(g.contiguous(), out);
  return out;
}

Tensor add_impl(const char* op, const Tensor& a_in, const Tensor& b_in, double beta) {
  check_broadcast(op, a_in, b_in);
  Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor out = empty_like(a);
  kernels::add(a, b, out, 1.0, beta);
  autograd::record(op, {out}, {a_in, b_in},
                   [bshape = b.shape(), beta, na = a_in.requires_grad(),
                    nb = b_in.requires_grad()](const Grads& g) -> Grads {
                     // forward: out = a + beta*b; so da = dout, db = beta * dout (summed over broadcast rows)
                     Tensor db;
                     if (nb) {
                       db = reduce_to(g[0], bshape);
                       if (beta != 1.0) {
                         Tensor s = empty_like(db);
                         kernels::scale(db.contiguous(), beta, s);
                         db = s;
                       }
                     }
                     return {na ? g[0] : Tensor(), db};
                   });
  return out;
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return add_impl("add", a, b, 1.0); }
Tensor sub(const Tensor& a, const Tensor& b) { return add_impl("sub", a, b, -1.0); }

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  check_broadcast("mul", a_in, b_in);
  Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor out = empty_like(a);
  kernels::mul(a, b, out);
  autograd::record("mul", {out}, {a_in, b_in},
                   [a = a.detach(), b = b.detach(), na = a_in.requires_grad(),
                    nb = b_in.requires_grad()](const Grads& g) -> Grads {
                     // forward: out = a*b; so da = dout*b, db = dout*a (summed over broadcast rows)
                     const Tensor dout = g[0].contiguous();
                     Tensor da, db;
                     if (na) {
                       da = empty_like(a);
                       kernels::mul(dout, b, da);
                     }
                     if (nb) {
                       Tensor full = empty_like(a);
                       kernels::mul(dout, a, full);
                       db = reduce_to(full, b.shape());
                     }
                     return {da, db};
                   });
  return out;
}

Tensor scale(const Tensor& a_in, double s) {
  check_same("scale", {&a_in});
  Tensor a = a_in.contiguous();
  Tensor out = empty_like(a);
  kernels::scale(a, s, out);
  autograd::record("scale", {out}, {a_in}, [s](const Grads& g) -> Grads {
    // forward: out = s*a; so da = s*dout
    Tensor da = empty_like(g[0]);
    kernels::scale(g[0].contiguous(), s, da);
    return {da};
  });
  return out;
}

Tensor dropout(const Tensor& x_in, const kernels::DropoutKey& key_in, const Tensor& positions) {
  check_same("dropout", {&x_in});
  NDT_CHECK(!positions.defined() || (positions.dtype() == DType::i32 && positions.dim() == 1 &&
                                     positions.is_contiguous() && positions.device() == x_in.device()),
            "dropout: positions ", positions.desc(), " must be (run) i32, contiguous, on the device of x ",
            x_in.desc());
  kernels::DropoutKey key = key_in;
  if (positions.defined())
    key.positions = static_cast<const int32_t*>(positions.data_ptr()), key.run = positions.size(0);
  Tensor x = x_in.contiguous();
  Tensor out = empty_like(x);
  kernels::dropout(x, key, out);
  // the backward holds positions, whose memory the key points into
  autograd::record("dropout", {out}, {x_in}, [key, positions](const Grads& g) -> Grads {
    // forward: out = mask * x / (1 - p); so dx = mask * dout / (1 - p), the same mask from the
    // same key (nothing was saved)
    Tensor dx = empty_like(g[0]);
    kernels::dropout(g[0].contiguous(), key, dx);
    return {dx};
  });
  return out;
}

Tensor gelu(const Tensor& x_in) {
  check_same("gelu", {&x_in});
  Tensor x = x_in.contiguous();
  Tensor out = empty_like(x);
  kernels::gelu_forward(x, out);
  autograd::record("gelu", {out}, {x_in}, [x = x.detach()](const Grads& g) -> Grads {
    // forward: out = gelu(x); so dx = gelu'(x) * dout (tensor/cpu/elementwise.cpp spells it out)
    Tensor dx = empty_like(x);
    kernels::gelu_backward(x, g[0].contiguous(), dx);
    return {dx};
  });
  return out;
}

// gate, up (...) -> silu(gate) * up (...)
Tensor silu_mul(const Tensor& gate_in, const Tensor& up_in) {
  check_same("silu_mul", {&gate_in, &up_in});
  NDT_CHECK(gate_in.shape() == up_in.shape(), "silu_mul: gate ", gate_in.shape_str(), " and up ",
            up_in.shape_str(), " differ");
  Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
  Tensor out = empty_like(gate);
  kernels::silu_mul_forward(gate, up, out);
  autograd::record("silu_mul", {out}, {gate_in, up_in},
                   [gate = gate.detach(), up = up.detach()](const Grads& g) -> Grads {
                     // forward: out = silu(gate) * up; the kernel's comment derives dgate, dup
                     Tensor dgate = empty_like(gate), dup = empty_like(up);
                     kernels::silu_mul_backward(gate, up, g[0].contiguous(), dgate, dup);
                     return {dgate, dup};
                   });
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  Tensor out = x.dtype() == dtype ? x.contiguous().clone() : x.to(dtype).contiguous();
  if (!is_floating(dtype)) return out;
  autograd::record("cast", {out}, {x}, [from = x.dtype()](const Grads& g) -> Grads {
    // forward: out = (dtype) x; so dx = (x's dtype) dout
    return {g[0].to(from)};
  });
  return out;
}

}  // namespace ndt
