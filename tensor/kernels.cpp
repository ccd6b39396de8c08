// Dispatch from ndt::kernels to the CPU or CUDA implementation by the device of the
// first tensor argument. Every tensor argument must be on that device.
#include "tensor/kernels.h"

#include <utility>

#include "tensor/cpu/kernels.h"
#ifdef NDT_WITH_CUDA
#include "tensor/cuda/kernels.h"
#endif

namespace ndt::kernels {
namespace {

void same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!first) first = t;
    NDT_CHECK(t->device() == first->device(), op, ": tensors on different devices (", first->device().str(),
              " and ", t->device().str(), ")");
  }
}

// Every kernel but fill and copy reads and writes its tensors as dense row-major arrays:
// a strided view (a transpose, a narrow of a non-leading dim) would be read as the wrong
// numbers, so it is refused here, for both backends, with the op and the tensor named.
void contiguous(const char* op, std::initializer_list<const Tensor*> ts) {
  int i = 0;
  for (const Tensor* t : ts) {
    ++i;
    if (!t->defined()) continue;
    NDT_CHECK(t->is_contiguous(), op, ": tensor argument ", i, " ", t->desc(), " with strides ",
              shape_str(t->strides()), " is not contiguous; pass t.contiguous()");
  }
}

// Whether two views may touch the same bytes: same storage and intersecting address ranges
// (conservative: two interleaved views that never share an element also count).
bool may_overlap(const Tensor& a, const Tensor& b) {
  if (!a.shares_storage(b) || a.numel() == 0 || b.numel() == 0) return false;
  auto range = [](const Tensor& t) {
    int64_t last = 0;  // offset of the last element touched, from the first
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.strides()[d];
    const auto* p = static_cast<const char*>(t.data_ptr());
    return std::pair{p, p + (last + 1) * static_cast<int64_t>(dtype_size(t.dtype()))};
  };
  const auto [a0, a1] = range(a);
  const auto [b0, b1] = range(b);
  return a0 < b1 && b0 < a1;
}

// Vocabulary-parallel kernels: logits (N, Vl) with 0 <= v_live <= Vl live columns.
void check_live_columns(const char* op, const Tensor& logits, int64_t v_live) {
  NDT_CHECK(logits.dim() == 2, op, ": logits must be (N, Vl), got ", logits.shape_str());
  NDT_CHECK(v_live >= 0 && v_live <= logits.size(1), op, ": v_live ", v_live, " outside [0, ", logits.size(1),
            "] for logits ", logits.shape_str());
}

}  // namespace

#ifdef NDT_WITH_CUDA
#define NDT_DISPATCH(dev, fn, ...)                 \
  if ((dev).is_cpu()) return cpu::fn(__VA_ARGS__); \
  return cuda::fn(__VA_ARGS__)
#else
#define NDT_DISPATCH(dev, fn, ...)                 \
  if ((dev).is_cpu()) return cpu::fn(__VA_ARGS__); \
  NDT_FAIL(#fn ": ndtrain was built without CUDA; rebuild with -DNDT_CUDA=ON or use device cpu")
#endif

void fill(const Tensor& t, double value) {
  same_device("fill", {&t});
  NDT_DISPATCH(t.device(), fill, t, value);
}

void copy(const Tensor& dst, const Tensor& src) {
  same_device("copy", {&dst, &src});
  if (may_overlap(dst, src)) {
    // The same view: nothing to do. Otherwise the result is that of reading all of src
    // before writing dst (as memmove does), on every backend: through a fresh copy.
    if (dst.data_ptr() == src.data_ptr() && dst.strides() == src.strides() && dst.dtype() == src.dtype())
      return;
    const Tensor tmp = src.clone();
    NDT_DISPATCH(dst.device(), copy, dst, tmp);
  }
  NDT_DISPATCH(dst.device(), copy, dst, src);
}

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, double alpha,
          double beta) {
  same_device("gemm", {&a, &b, &c});
  contiguous("gemm", {&a, &b, &c});
  NDT_DISPATCH(a.device(), gemm, a, trans_a, b, trans_b, c, alpha, beta);
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, bool gelu, const Tensor& out,
                    const Tensor& pre) {
  same_device("linear_forward", {&x, &w, &bias, &out, &pre});
  contiguous("linear_forward", {&x, &w, &bias, &out, &pre});
  NDT_CHECK(
      x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(0) && out.shape() == Shape({x.size(0), w.size(1)}),
      "linear_forward: x ", x.shape_str(), " @ w ", w.shape_str(), " -> out ", out.shape_str());
  NDT_CHECK(!bias.defined() || bias.shape() == Shape({w.size(1)}), "linear_forward: bias ", bias.shape_str());
  NDT_CHECK(!gelu || (pre.defined() && pre.shape() == out.shape()),
            "linear_forward: gelu needs pre of out's shape");
  NDT_DISPATCH(x.device(), linear_forward, x, w, bias, gelu, out, pre);
}

void add(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta) {
  same_device("add", {&a, &b, &out});
  contiguous("add", {&a, &b, &out});
  NDT_DISPATCH(a.device(), add, a, b, out, alpha, beta);
}

void scale_by(const Tensor& t, const Tensor& s) {
  same_device("scale_by", {&t, &s});
  contiguous("scale_by", {&t, &s});
  NDT_CHECK(s.numel() == 1, "scale_by: the factor must have one element, got ", s.desc());
  NDT_DISPATCH(t.device(), scale_by, t, s);
}

void mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  same_device("mul", {&a, &b, &out});
  contiguous("mul", {&a, &b, &out});
  NDT_DISPATCH(a.device(), mul, a, b, out);
}

void scale(const Tensor& a, double s, const Tensor& out) {
  same_device("scale", {&a, &out});
  contiguous("scale", {&a, &out});
  NDT_DISPATCH(a.device(), scale, a, s, out);
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  same_device("add_", {&dst, &src});
  contiguous("add_", {&dst, &src});
  NDT_DISPATCH(dst.device(), add_, dst, src, alpha);
}

void gelu_forward(const Tensor& x, const Tensor& out) {
  same_device("gelu_forward", {&x, &out});
  contiguous("gelu_forward", {&x, &out});
  NDT_DISPATCH(x.device(), gelu_forward, x, out);
}

void gelu_backward(const Tensor& x, const Tensor& dout, const Tensor& dx) {
  same_device("gelu_backward", {&x, &dout, &dx});
  contiguous("gelu_backward", {&x, &dout, &dx});
  NDT_DISPATCH(x.device(), gelu_backward, x, dout, dx);
}

void sum(const Tensor& x, const Tensor& out) {
  same_device("sum", {&x, &out});
  contiguous("sum", {&x, &out});
  NDT_DISPATCH(x.device(), sum, x, out);
}

void sum_squares(const Tensor& x, const Tensor& out) {
  same_device("sum_squares", {&x, &out});
  contiguous("sum_squares", {&x, &out});
  NDT_DISPATCH(x.device(), sum_squares, x, out);
}

void sum_rows(const Tensor& x, const Tensor& out) {
  same_device("sum_rows", {&x, &out});
  contiguous("sum_rows", {&x, &out});
  NDT_DISPATCH(x.device(), sum_rows, x, out);
}

void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& out,
                       const Tensor& mean, const Tensor& rstd) {
  same_device("layernorm_forward", {&x, &w, &b, &out, &mean, &rstd});
  contiguous("layernorm_forward", {&x, &w, &b, &out, &mean, &rstd});
  NDT_DISPATCH(x.device(), layernorm_forward, x, w, b, eps, out, mean, rstd);
}

void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db,
                        const Tensor& dresidual) {
  same_device("layernorm_backward", {&dout, &x, &w, &mean, &rstd, &dx, &dw, &db, &dresidual});
  contiguous("layernorm_backward", {&dout, &x, &w, &mean, &rstd, &dx, &dw, &db, &dresidual});
  NDT_CHECK(!dresidual.defined() || (dresidual.shape() == dx.shape() && dresidual.dtype() == dx.dtype()),
            "layernorm_backward: dresidual ", dresidual.desc(), " must match dx ", dx.desc());
  NDT_DISPATCH(dout.device(), layernorm_backward, dout, x, w, mean, rstd, dx, dw, db, dresidual);
}

void add_layernorm_forward(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& bias, double eps,
                           const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd) {
  same_device("add_layernorm_forward", {&a, &b, &w, &bias, &sum, &out, &mean, &rstd});
  contiguous("add_layernorm_forward", {&a, &b, &w, &bias, &sum, &out, &mean, &rstd});
  NDT_DISPATCH(a.device(), add_layernorm_forward, a, b, w, bias, eps, sum, out, mean, rstd);
}

void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& out, const Tensor& rstd) {
  same_device("rmsnorm_forward", {&x, &w, &out, &rstd});
  contiguous("rmsnorm_forward", {&x, &w, &out, &rstd});
  NDT_DISPATCH(x.device(), rmsnorm_forward, x, w, eps, out, rstd);
}

void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw) {
  same_device("rmsnorm_backward", {&dout, &x, &w, &rstd, &dx, &dw});
  contiguous("rmsnorm_backward", {&dout, &x, &w, &rstd, &dx, &dw});
  NDT_DISPATCH(dout.device(), rmsnorm_backward, dout, x, w, rstd, dx, dw);
}

void silu_mul_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  same_device("silu_mul_forward", {&gate, &up, &out});
  contiguous("silu_mul_forward", {&gate, &up, &out});
  NDT_CHECK(gate.numel() == up.numel() && gate.numel() == out.numel(), "silu_mul_forward: gate ", gate.desc(),
            ", up ", up.desc(), " and out ", out.desc(), " must have as many elements");
  NDT_DISPATCH(gate.device(), silu_mul_forward, gate, up, out);
}

void silu_mul_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                       const Tensor& dup) {
  same_device("silu_mul_backward", {&gate, &up, &dout, &dgate, &dup});
  contiguous("silu_mul_backward", {&gate, &up, &dout, &dgate, &dup});
  NDT_DISPATCH(gate.device(), silu_mul_backward, gate, up, dout, dgate, dup);
}

void rotary_forward(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse, const Tensor& out) {
  same_device("rotary_forward", {&x, &cos, &sin, &out});
  contiguous("rotary_forward", {&x, &cos, &sin, &out});
  NDT_CHECK(x.dim() == 4 && x.size(3) % 2 == 0 && cos.dim() == 3 && cos.shape() == sin.shape() &&
                cos.size(0) == x.size(0) && cos.size(1) == x.size(1) && cos.size(2) == x.size(3) / 2 &&
                out.shape() == x.shape() && cos.dtype() == x.dtype() && sin.dtype() == x.dtype(),
            "rotary_forward: x (B,T,NH,HS) with an even HS and cos, sin (B,T,HS/2) of its dtype, got ",
            x.desc(), ", ", cos.desc(), ", ", sin.desc());
  NDT_DISPATCH(x.device(), rotary_forward, x, cos, sin, inverse, out);
}

void softmax_forward(const Tensor& x, const Tensor& out) {
  same_device("softmax_forward", {&x, &out});
  contiguous("softmax_forward", {&x, &out});
  NDT_DISPATCH(x.device(), softmax_forward, x, out);
}

void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx) {
  same_device("softmax_backward", {&y, &dy, &dx});
  contiguous("softmax_backward", {&y, &dy, &dx});
  NDT_DISPATCH(y.device(), softmax_backward, y, dy, dx);
}

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& kept, int64_t v_limit,
                           int64_t ignore_index, const Tensor& losses, const Tensor& lse,
                           const Tensor& dlogits) {
  same_device("cross_entropy_forward", {&logits, &targets, &kept, &losses, &lse, &dlogits});
  contiguous("cross_entropy_forward", {&logits, &targets, &kept, &losses, &lse, &dlogits});
  // dlogits may be logits itself (written over), but no other overlap
  NDT_CHECK(!dlogits.defined() || dlogits.data_ptr() == logits.data_ptr() || !may_overlap(dlogits, logits),
            "cross_entropy_forward: dlogits partly overlaps logits");
  NDT_CHECK(logits.dim() == 2 && v_limit >= 1 && v_limit <= logits.size(1), "cross_entropy_forward: v_limit ",
            v_limit, " outside [1, columns] of logits ", logits.desc());
  NDT_DISPATCH(logits.device(), cross_entropy_forward, logits, targets, kept, v_limit, ignore_index, losses,
               lse, dlogits);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& kept, const Tensor& dloss, int64_t v_limit, int64_t ignore_index,
                            const Tensor& dlogits) {
  same_device("cross_entropy_backward", {&logits, &targets, &lse, &kept, &dloss, &dlogits});
  contiguous("cross_entropy_backward", {&logits, &targets, &lse, &kept, &dloss, &dlogits});
  NDT_CHECK(logits.dim() == 2 && v_limit >= 1 && v_limit <= logits.size(1),
            "cross_entropy_backward: v_limit ", v_limit, " outside [1, columns] of logits ", logits.desc());
  NDT_DISPATCH(logits.device(), cross_entropy_backward, logits, targets, lse, kept, dloss, v_limit,
               ignore_index, dlogits);
}

void mean_of_kept(const Tensor& losses, const Tensor& kept, const Tensor& out) {
  same_device("mean_of_kept", {&losses, &kept, &out});
  contiguous("mean_of_kept", {&losses, &kept, &out});
  NDT_DISPATCH(losses.device(), mean_of_kept, losses, kept, out);
}

void count_not_equal(const Tensor& targets, int64_t ignore_index, const Tensor& kept) {
  same_device("count_not_equal", {&targets, &kept});
  contiguous("count_not_equal", {&targets, &kept});
  NDT_DISPATCH(targets.device(), count_not_equal, targets, ignore_index, kept);
}

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, int64_t v_start,
                       int64_t v_total) {
  same_device("embedding_forward", {&ids, &table, &out});
  contiguous("embedding_forward", {&ids, &table, &out});
  if (v_total < 0) v_total = v_start + table.size(0);
  NDT_CHECK(v_start >= 0 && v_start + table.size(0) <= v_total && v_total <= INT32_MAX,
            "embedding_forward: rows [", v_start, ", ", v_start + table.size(0), ") of a vocabulary of ",
            v_total, " do not fit");
  NDT_DISPATCH(ids.device(), embedding_forward, ids, table, out, v_start, v_total);
}

void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable, int64_t v_start) {
  same_device("embedding_backward", {&ids, &dout, &dtable});
  contiguous("embedding_backward", {&ids, &dout, &dtable});
  NDT_CHECK(v_start >= 0 && v_start + dtable.size(0) <= INT32_MAX, "embedding_backward: v_start ", v_start,
            " out of range");
  NDT_DISPATCH(ids.device(), embedding_backward, ids, dout, dtable, v_start);
}

// key_lo (B, Tq) i32 on the device dev, each row non-decreasing in [0, Tk]
// (ndt::document_key_starts makes it so): the kernels read keys from it without further checks
static void check_key_lo(const char* op, const Tensor& key_lo, Device dev, int64_t Tq, int64_t Tk) {
  NDT_CHECK(key_lo.device() == dev && key_lo.dtype() == DType::i32 && key_lo.dim() == 2 &&
                key_lo.size(1) == Tq && key_lo.is_contiguous(),
            op, ": key_lo must be (B, ", Tq, ") int32 contiguous on ", dev.str(), ", got ", key_lo.desc());
  const Tensor host = key_lo.to(Device::cpu());
  const int32_t* lo = host.data<int32_t>();
  for (int64_t b = 0; b < key_lo.size(0); ++b)
    for (int64_t i = 0; i < Tq; ++i) {
      const int64_t x = lo[b * Tq + i];
      NDT_CHECK(x >= 0 && x <= Tk && (i == 0 || x >= lo[b * Tq + i - 1]), op, ": key_lo[", b, ", ", i,
                "] = ", x, " must be in [0, ", Tk, "] and not below the one before");
    }
}

void attention_softmax_forward(const Tensor& s, double scale, int64_t q_offset, int64_t k_offset,
                               const Tensor& lse, const Tensor& key_lo) {
  same_device("attention_softmax_forward", {&s, &lse});
  contiguous("attention_softmax_forward", {&s, &lse});
  if (key_lo.defined()) {  // packed documents
    check_key_lo("attention_softmax_forward", key_lo, s.device(), s.size(1), s.size(2));
    NDT_CHECK(key_lo.size(0) > 0 && s.size(0) % key_lo.size(0) == 0, "attention_softmax_forward: key_lo ",
              key_lo.shape_str(), " does not divide the rows of s ", s.shape_str());
  }
  NDT_DISPATCH(s.device(), attention_softmax_forward, s, scale, q_offset, k_offset, lse, key_lo);
}

void attention_softmax_backward(const Tensor& p, const Tensor& dp, const Tensor& d, const Tensor& dlse,
                                double scale) {
  same_device("attention_softmax_backward", {&p, &dp, &d, &dlse});
  contiguous("attention_softmax_backward", {&p, &dp, &d, &dlse});
  NDT_DISPATCH(p.device(), attention_softmax_backward, p, dp, d, dlse, scale);
}

void rowwise_dot(const Tensor& a, const Tensor& b, const Tensor& out) {
  same_device("rowwise_dot", {&a, &b, &out});
  contiguous("rowwise_dot", {&a, &b, &out});
  NDT_DISPATCH(a.device(), rowwise_dot, a, b, out);
}

// key_lo of B rows for the fused kernels (CPU only; they check their own device)
static void check_batch_key_lo(const char* op, const Tensor& key_lo, int64_t B, int64_t Tq, int64_t Tk) {
  check_key_lo(op, key_lo, Device::cpu(), Tq, Tk);
  NDT_CHECK(key_lo.size(0) == B, op, ": key_lo ", key_lo.shape_str(), " must have the batch's ", B, " rows");
}

// The packed self-attention kernels exist on the CPU only: on CUDA, ndt::self_attention
// composes the attention pieces instead (tensor/kernels.h).
static void check_self_attention(const char* op, const Tensor& qkv, int64_t n_head, const Tensor& y,
                                 const Tensor& lse) {
  NDT_CHECK(qkv.device().is_cpu(), op, ": CPU only, got ", qkv.desc(),
            " (CUDA composes the attention pieces)");
  NDT_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0 && n_head > 0 && qkv.size(2) / 3 % n_head == 0, op,
            ": qkv must be (B, T, 3C) with C divisible by n_head ", n_head, ", got ", qkv.shape_str());
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  NDT_CHECK(y.shape() == Shape({B, T, C}) && lse.shape() == Shape({B, n_head, T}), op, ": y must be (", B,
            ", ", T, ", ", C, ") and lse (", B, ", ", n_head, ", ", T, "), got ", y.shape_str(), " and ",
            lse.shape_str());
  NDT_CHECK(y.dtype() == qkv.dtype() && lse.dtype() == qkv.dtype(), op, ": qkv ", qkv.desc(), ", y ",
            y.desc(), " and lse ", lse.desc(), " must share one dtype");
}

void self_attention_forward(const Tensor& qkv, int64_t n_head, double scale, const Tensor& y,
                            const Tensor& lse, const Tensor& key_lo) {
  same_device("self_attention_forward", {&qkv, &y, &lse});
  contiguous("self_attention_forward", {&qkv, &y, &lse});
  check_self_attention("self_attention_forward", qkv, n_head, y, lse);
  if (key_lo.defined())
    check_batch_key_lo("self_attention_forward", key_lo, qkv.size(0), qkv.size(1), qkv.size(1));
  cpu::self_attention_forward(qkv, n_head, scale, y, lse, key_lo);
}

void self_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& lse, const Tensor& dy,
                             int64_t n_head, double scale, const Tensor& dqkv, const Tensor& key_lo) {
  same_device("self_attention_backward", {&qkv, &y, &lse, &dy, &dqkv});
  contiguous("self_attention_backward", {&qkv, &y, &lse, &dy, &dqkv});
  check_self_attention("self_attention_backward", qkv, n_head, y, lse);
  NDT_CHECK(dy.shape() == y.shape() && dqkv.shape() == qkv.shape() && dy.dtype() == y.dtype() &&
                dqkv.dtype() == qkv.dtype(),
            "self_attention_backward: dy ", dy.desc(), " and dqkv ", dqkv.desc(), " must match y ", y.desc(),
            " and qkv ", qkv.desc());
  if (key_lo.defined())
    check_batch_key_lo("self_attention_backward", key_lo, qkv.size(0), qkv.size(1), qkv.size(1));
  cpu::self_attention_backward(qkv, y, lse, dy, n_head, scale, dqkv, key_lo);
}

// attention_fused_*: (B, NH, T, HS) operands on the CPU whose rows are contiguous; k, v and
// their gradients may have NKV heads, a divisor of q's NH (grouped-query attention).
static void check_heads(const char* op, const Tensor& ref, std::initializer_list<const Tensor*> ts) {
  NDT_CHECK(ref.device().is_cpu(), op, ": CPU only, got ", ref.desc(),
            " (CUDA composes the attention pieces)");
  for (const Tensor* t : ts) {
    NDT_CHECK(t->dim() == 4 && t->size(0) == ref.size(0) && t->size(1) > 0 && ref.size(1) % t->size(1) == 0 &&
                  t->size(3) == ref.size(3) && t->dtype() == ref.dtype(),
              op, ": every operand must be (B, NH, T, HS) like q ", ref.desc(),
              " (k, v: NH or a divisor of it), got ", t->desc());
    NDT_CHECK(t->strides()[3] == 1 || t->size(3) == 1, op, ": the rows of ", t->desc(),
              " must be contiguous (last stride 1)");
  }
}
static void check_lse(const char* op, const Tensor& q, const Tensor& lse) {
  NDT_CHECK(lse.shape() == Shape({q.size(0), q.size(1), q.size(2)}) && lse.dtype() == q.dtype() &&
                lse.is_contiguous(),
            op, ": lse must be contiguous (", q.size(0), ", ", q.size(1), ", ", q.size(2), ") in ",
            dtype_name(q.dtype()), ", got ", lse.desc());
}

void attention_fused_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset,
                             int64_t k_offset, double scale, const Tensor& y, const Tensor& lse,
                             const Tensor& key_lo) {
  same_device("attention_fused_forward", {&q, &k, &v, &y, &lse});
  check_heads("attention_fused_forward", q, {&q, &k, &v, &y});
  NDT_CHECK(k.shape() == v.shape() && y.shape() == q.shape(), "attention_fused_forward: k ", k.desc(), ", v ",
            v.desc(), " and y ", y.desc(), " must be shaped as k, k and q ", q.desc());
  check_lse("attention_fused_forward", q, lse);
  if (key_lo.defined())
    check_batch_key_lo("attention_fused_forward", key_lo, q.size(0), q.size(2), k.size(2));
  cpu::attention_fused_forward(q, k, v, q_offset, k_offset, scale, y, lse, key_lo);
}

void attention_fused_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& y,
                              const Tensor& lse, const Tensor& dy, const Tensor& dlse, int64_t q_offset,
                              int64_t k_offset, double scale, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, const Tensor& key_lo) {
  same_device("attention_fused_backward", {&q, &k, &v, &y, &lse, &dy, &dq, &dk, &dv});
  check_heads("attention_fused_backward", q, {&q, &k, &v, &y, &dy, &dq, &dk, &dv});
  NDT_CHECK(k.shape() == v.shape() && y.shape() == q.shape() && dy.shape() == q.shape() &&
                dq.shape() == q.shape() && dk.shape() == k.shape() && dv.shape() == k.shape(),
            "attention_fused_backward: y, dy and dq must be shaped as q ", q.desc(), ", v, dk and dv as k ",
            k.desc());
  check_lse("attention_fused_backward", q, lse);
  if (dlse.defined()) check_lse("attention_fused_backward", q, dlse);
  if (key_lo.defined())
    check_batch_key_lo("attention_fused_backward", key_lo, q.size(0), q.size(2), k.size(2));
  cpu::attention_fused_backward(q, k, v, y, lse, dy, dlse, q_offset, k_offset, scale, dq, dk, dv, key_lo);
}

void attention_merge_forward(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                             const Tensor& lse_b, const Tensor& out, const Tensor& lse) {
  same_device("attention_merge_forward", {&out_a, &lse_a, &out_b, &lse_b, &out, &lse});
  contiguous("attention_merge_forward", {&out_a, &lse_a, &out_b, &lse_b, &out, &lse});
  NDT_DISPATCH(out_a.device(), attention_merge_forward, out_a, lse_a, out_b, lse_b, out, lse);
}

void attention_merge_backward(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                              const Tensor& lse_b, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              const Tensor& dlse, const Tensor& dout_a, const Tensor& dlse_a,
                              const Tensor& dout_b, const Tensor& dlse_b) {
  same_device("attention_merge_backward",
              {&out_a, &lse_a, &out_b, &lse_b, &out, &lse, &dout, &dlse, &dout_a, &dlse_a, &dout_b, &dlse_b});
  contiguous("attention_merge_backward",
             {&out_a, &lse_a, &out_b, &lse_b, &out, &lse, &dout, &dlse, &dout_a, &dlse_a, &dout_b, &dlse_b});
  NDT_DISPATCH(out_a.device(), attention_merge_backward, out_a, lse_a, out_b, lse_b, out, lse, dout, dlse,
               dout_a, dlse_a, dout_b, dlse_b);
}

void rowmax(const Tensor& logits, int64_t v_live, const Tensor& out) {
  same_device("rowmax", {&logits, &out});
  contiguous("rowmax", {&logits, &out});
  check_live_columns("rowmax", logits, v_live);
  NDT_DISPATCH(logits.device(), rowmax, logits, v_live, out);
}

void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& gmax, int64_t v_start,
                            int64_t v_live, int64_t ignore_index, const Tensor& sumexp,
                            const Tensor& target_logit) {
  same_device("cross_entropy_partials", {&logits, &targets, &gmax, &sumexp, &target_logit});
  contiguous("cross_entropy_partials", {&logits, &targets, &gmax, &sumexp, &target_logit});
  check_live_columns("cross_entropy_partials", logits, v_live);
  NDT_DISPATCH(logits.device(), cross_entropy_partials, logits, targets, gmax, v_start, v_live, ignore_index,
               sumexp, target_logit);
}

void cross_entropy_parallel_backward(const Tensor& logits, const Tensor& targets, const Tensor& gmax,
                                     const Tensor& sumexp_global, int64_t v_start, int64_t v_live,
                                     int64_t ignore_index, const Tensor& kept, const Tensor& dloss,
                                     const Tensor& dlogits) {
  same_device("cross_entropy_parallel_backward",
              {&logits, &targets, &gmax, &sumexp_global, &kept, &dloss, &dlogits});
  contiguous("cross_entropy_parallel_backward",
             {&logits, &targets, &gmax, &sumexp_global, &kept, &dloss, &dlogits});
  check_live_columns("cross_entropy_parallel_backward", logits, v_live);
  NDT_DISPATCH(logits.device(), cross_entropy_parallel_backward, logits, targets, gmax, sumexp_global,
               v_start, v_live, ignore_index, kept, dloss, dlogits);
}

void cross_entropy_parallel_losses(const Tensor& gmax, const Tensor& sumexp_global,
                                   const Tensor& target_logit_global, const Tensor& targets,
                                   int64_t ignore_index, const Tensor& losses) {
  same_device("cross_entropy_parallel_losses",
              {&gmax, &sumexp_global, &target_logit_global, &targets, &losses});
  contiguous("cross_entropy_parallel_losses",
             {&gmax, &sumexp_global, &target_logit_global, &targets, &losses});
  NDT_CHECK(targets.numel() == losses.numel(),
            "cross_entropy_parallel_losses: targets must have one entry per loss (", losses.numel(),
            "), got ", targets.desc());
  NDT_DISPATCH(gmax.device(), cross_entropy_parallel_losses, gmax, sumexp_global, target_logit_global,
               targets, ignore_index, losses);
}

void moe_topk_forward(const Tensor& probs, int64_t k, bool normalize, const Tensor& values,
                      const Tensor& experts) {
  same_device("moe_topk_forward", {&probs, &values, &experts});
  contiguous("moe_topk_forward", {&probs, &values, &experts});
  NDT_CHECK(probs.dim() == 2 && k >= 1 && k <= probs.size(1) && values.shape() == Shape({probs.size(0), k}) &&
                experts.shape() == values.shape() && experts.dtype() == DType::i32,
            "moe_topk_forward: probs ", probs.desc(), ", k ", k, " -> values ", values.desc(), ", experts ",
            experts.desc());
  NDT_DISPATCH(probs.device(), moe_topk_forward, probs, k, normalize, values, experts);
}

void moe_topk_backward(const Tensor& probs, const Tensor& experts, const Tensor& dvalues, bool normalize,
                       const Tensor& dprobs) {
  same_device("moe_topk_backward", {&probs, &experts, &dvalues, &dprobs});
  contiguous("moe_topk_backward", {&probs, &experts, &dvalues, &dprobs});
  NDT_CHECK(dprobs.shape() == probs.shape() && dvalues.shape() == experts.shape(),
            "moe_topk_backward: probs ", probs.desc(), ", experts ", experts.desc(), ", dvalues ",
            dvalues.desc(), ", dprobs ", dprobs.desc());
  NDT_DISPATCH(probs.device(), moe_topk_backward, probs, experts, dvalues, normalize, dprobs);
}

void moe_slots(const Tensor& order, const Tensor& slots) {
  same_device("moe_slots", {&order, &slots});
  contiguous("moe_slots", {&order, &slots});
  NDT_CHECK(order.dtype() == DType::i32 && slots.dtype() == DType::i32 && order.numel() == slots.numel(),
            "moe_slots: order ", order.desc(), " and slots ", slots.desc(), " must be int32 of one size");
  NDT_DISPATCH(order.device(), moe_slots, order, slots);
}

void moe_dispatch_forward(const Tensor& x, const Tensor& order, int64_t k, const Tensor& out) {
  same_device("moe_dispatch_forward", {&x, &order, &out});
  contiguous("moe_dispatch_forward", {&x, &order, &out});
  NDT_CHECK(
      x.dim() == 2 && out.shape() == Shape({order.numel(), x.size(1)}) && order.numel() == x.size(0) * k,
      "moe_dispatch_forward: x ", x.desc(), ", order ", order.desc(), ", k ", k, " -> out ", out.desc());
  NDT_DISPATCH(x.device(), moe_dispatch_forward, x, order, k, out);
}

void moe_dispatch_backward(const Tensor& dout, const Tensor& slots, int64_t k, const Tensor& dx) {
  same_device("moe_dispatch_backward", {&dout, &slots, &dx});
  contiguous("moe_dispatch_backward", {&dout, &slots, &dx});
  NDT_CHECK(
      dx.dim() == 2 && dout.shape() == Shape({slots.numel(), dx.size(1)}) && slots.numel() == dx.size(0) * k,
      "moe_dispatch_backward: dout ", dout.desc(), ", slots ", slots.desc(), ", k ", k, " -> dx ", dx.desc());
  NDT_DISPATCH(dout.device(), moe_dispatch_backward, dout, slots, k, dx);
}

namespace {

// The groups' row blocks must tile the M rows of a and c, one matrix of b per group.
void check_groups(const char* op, const Tensor& rows, const Tensor& per_group,
                  const std::vector<int64_t>& counts) {
  int64_t m = 0;
  for (int64_t n : counts) {
    NDT_CHECK(n >= 0, op, ": a group count is negative (", n, ")");
    m += n;
  }
  NDT_CHECK(rows.dim() == 2 && m == rows.size(0), op, ": counts sum to ", m, " but the rows are ",
            rows.desc());
  NDT_CHECK(per_group.dim() == 3 && per_group.size(0) == static_cast<int64_t>(counts.size()), op, ": ",
            counts.size(), " groups but the per-group tensor is ", per_group.desc());
}

}  // namespace

void grouped_gemm(const Tensor& a, const Tensor& b, bool trans_b, const Tensor& c,
                  const std::vector<int64_t>& counts) {
  same_device("grouped_gemm", {&a, &b, &c});
  contiguous("grouped_gemm", {&a, &b, &c});
  check_groups("grouped_gemm", a, b, counts);
  NDT_CHECK(c.dim() == 2 && c.size(0) == a.size(0) && a.size(1) == b.size(trans_b ? 2 : 1) &&
                c.size(1) == b.size(trans_b ? 1 : 2),
            "grouped_gemm: a ", a.desc(), " @ b ", b.desc(), trans_b ? " (transposed)" : "", " -> c ",
            c.desc());
  // each group's rows are one contiguous block: group g is a GEMM of a's rows [lo, lo + m) and
  // b[g] into c's same rows (on a CPU the groups spread over the threads: cpu::grouped_gemm; on
  // a GPU one after the other on the device's stream)
  if (a.device().is_cpu()) return cpu::grouped_gemm(a, b, trans_b, c, counts);
  int64_t lo = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    const int64_t m = counts[g];
    if (m > 0)
      gemm(a.narrow(0, lo, m), false, b.select(0, static_cast<int64_t>(g)), trans_b, c.narrow(0, lo, m), 1.0,
           0.0);
    lo += m;
  }
}

void grouped_gemm_dw(const Tensor& a, const Tensor& dc, const std::vector<int64_t>& counts, const Tensor& dw,
                     double beta) {
  same_device("grouped_gemm_dw", {&a, &dc, &dw});
  contiguous("grouped_gemm_dw", {&a, &dc, &dw});
  check_groups("grouped_gemm_dw", a, dw, counts);
  NDT_CHECK(dc.dim() == 2 && dc.size(0) == a.size(0) && dw.size(1) == a.size(1) && dw.size(2) == dc.size(1),
            "grouped_gemm_dw: a ", a.desc(), ", dc ", dc.desc(), " -> dw ", dw.desc());
  for (size_t g = 0; g < counts.size(); ++g)  // a group without rows: its weights took no part
    if (counts[g] == 0 && beta == 0.0) fill(dw.select(0, static_cast<int64_t>(g)), 0.0);  // (added: stays)
  if (a.device().is_cpu()) return cpu::grouped_gemm_dw(a, dc, counts, dw, beta);
  int64_t lo = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    const int64_t m = counts[g];
    if (m > 0)
      gemm(a.narrow(0, lo, m), true, dc.narrow(0, lo, m), false, dw.select(0, static_cast<int64_t>(g)), 1.0,
           beta);
    lo += m;
  }
}

void moe_combine_forward(const Tensor& y, const Tensor& weights, const Tensor& slots, const Tensor& out) {
  same_device("moe_combine_forward", {&y, &weights, &slots, &out});
  contiguous("moe_combine_forward", {&y, &weights, &slots, &out});
  NDT_CHECK(y.dim() == 2 && weights.dim() == 2 && y.size(0) == weights.numel() &&
                slots.numel() == y.size(0) && out.shape() == Shape({weights.size(0), y.size(1)}),
            "moe_combine_forward: y ", y.desc(), ", weights ", weights.desc(), ", slots ", slots.desc(),
            " -> out ", out.desc());
  NDT_DISPATCH(y.device(), moe_combine_forward, y, weights, slots, out);
}

void moe_combine_backward(const Tensor& y, const Tensor& weights, const Tensor& dout, const Tensor& order,
                          const Tensor& slots, const Tensor& dy, const Tensor& dweights) {
  same_device("moe_combine_backward", {&y, &weights, &dout, &order, &slots, &dy, &dweights});
  contiguous("moe_combine_backward", {&y, &weights, &dout, &order, &slots, &dy, &dweights});
  NDT_CHECK(dy.shape() == y.shape() && dweights.shape() == weights.shape() &&
                dout.shape() == Shape({weights.size(0), y.size(1)}) && order.numel() == y.size(0) &&
                slots.numel() == y.size(0),
            "moe_combine_backward: y ", y.desc(), ", weights ", weights.desc(), ", dout ", dout.desc(),
            " -> dy ", dy.desc(), ", dweights ", dweights.desc());
  NDT_DISPATCH(y.device(), moe_combine_backward, y, weights, dout, order, slots, dy, dweights);
}

void fill_uniform(const Tensor& t, uint64_t seed, uint64_t stream, uint64_t start, float lo, float hi) {
  same_device("fill_uniform", {&t});
  contiguous("fill_uniform", {&t});
  NDT_DISPATCH(t.device(), fill_uniform, t, seed, stream, start, lo, hi);
}

void fill_normal(const Tensor& t, uint64_t seed, uint64_t stream, uint64_t start, float mean, float std) {
  same_device("fill_normal", {&t});
  contiguous("fill_normal", {&t});
  NDT_DISPATCH(t.device(), fill_normal, t, seed, stream, start, mean, std);
}

void dropout(const Tensor& x, const DropoutKey& key, const Tensor& out) {
  same_device("dropout", {&x, &out});
  contiguous("dropout", {&x, &out});
  NDT_CHECK(x.dim() == 2 && out.shape() == x.shape() && out.dtype() == x.dtype(), "dropout: x ", x.desc(),
            " must be (N, C) and out ", out.desc(), " the same");
  NDT_CHECK(key.p >= 0 && key.p < 1 && key.row_start >= 0 && key.col_start >= 0 &&
                key.row_stride >= key.col_start + x.size(1),
            "dropout: p = ", key.p, " must be in [0, 1) and the columns [", key.col_start, ", ",
            key.col_start + x.size(1), ") within the row stride ", key.row_stride);
  NDT_CHECK(!key.positions || (key.run > 0 && x.size(0) % key.run == 0 && key.seq_len >= key.run),
            "dropout: x ", x.desc(), " must be whole sequences of run = ", key.run,
            " rows (the positions' length), within seq_len = ", key.seq_len);
  NDT_DISPATCH(x.device(), dropout, x, key, out);
}

void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWArgs& a) {
  same_device("adamw_step", {&param, &grad, &m, &v});
  contiguous("adamw_step", {&param, &grad, &m, &v});
  NDT_DISPATCH(param.device(), adamw_step, param, grad, m, v, a);
}

}  // namespace ndt::kernels
