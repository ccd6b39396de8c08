// CUDA pieces of causal attention, the twins of tensor/cpu/attention.cpp: masked softmax
// with log-sum-exp, its backward, the row-wise dot product, and the merge of partial
// results over key blocks (ring attention).
// Legend: Bh = batch*heads, Tq queries, Tk keys, HS head size.
#include <algorithm>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

constexpr int kRowsPerBlock = kThreads / 32;  // rowwise_dot, merges: one warp per row

// ---- kernels ------------------------------------------------------------------------

// s (Bh,Tq,Tk) scores -> p in place; lse (Bh,Tq); block r does row r (query i = r % Tq).
// Query i sees key j iff k_offset + j <= q_offset + i (and, packed documents, j >=
// key_lo[b, i] with key_lo (B,Tq) and the rows (B, heads, Tq)); p = exp(scale*s - lse)
// there, 0 elsewhere; a row that sees no key gets p = 0 and lse = -inf.
template <typename T>
__global__ void attention_softmax_forward_kernel(T* s, float scale, int64_t Tq, int64_t Tk, int64_t q_offset,
                                                 int64_t k_offset, float* lse, const int32_t* key_lo,
                                                 int64_t heads) {
  const int64_t r = blockIdx.x, i = r % Tq;
  // the visible keys [lo, nvis): j <= q_offset + i - k_offset, from the document's first
  // (the same for the whole block)
  const int64_t nvis = min(max(q_offset + i - k_offset + 1, int64_t(0)), Tk);
  const int64_t lo = key_lo ? int64_t(key_lo[r / (heads * Tq) * Tq + i]) : int64_t(0);
  T* row = s + r * Tk;
  if (nvis <= lo) {
    for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x) row[j] = store<T>(0.0f);
    if (threadIdx.x == 0) lse[r] = -INFINITY;
    return;
  }
  float mx = -INFINITY;
  for (int64_t j = lo + threadIdx.x; j < nvis; j += blockDim.x) mx = fmaxf(mx, scale * load(row[j]));
  mx = block_max(mx);
  float sum = 0.0f;
  for (int64_t j = lo + threadIdx.x; j < nvis; j += blockDim.x) sum += expf(scale * load(row[j]) - mx);
  sum = block_sum(sum);
  const float l = mx + logf(sum);
  // each thread rewrites only the entries it read
  for (int64_t j = threadIdx.x; j < Tk; j += blockDim.x)
    row[j] = store<T>(j >= lo && j < nvis ? expf(scale * load(row[j]) - l) : 0.0f);
  if (threadIdx.x == 0) lse[r] = l;
}

// In the forward p = exp(scale*s - lse), out = p v, and lse = log sum_j exp(scale*s_j); so
// ds = scale * p * (dp - d + dlse), with dp = dout v^T and d = rowsum(dout * out).
// p, dp (rows,Tk), d, dlse (rows) (dlse may be null) -> ds in place of dp
template <typename T>
__global__ void attention_softmax_backward_kernel(const T* p, T* dp, const float* d, const float* dlse,
                                                  float scale, int64_t rows, int64_t Tk) {
  NDT_GRID_STRIDE(k, rows * Tk) {
    const int64_t r = k / Tk;
    const float extra = dlse ? dlse[r] : 0.0f;
    dp[k] = store<T>(scale * load(p[k]) * (load(dp[k]) - d[r] + extra));
  }
}

// a, b (rows,HS) -> out (rows): out = sum_HS a*b; one warp per row
template <typename T>
__global__ void rowwise_dot_kernel(const T* a, const T* b, float* out, int64_t rows, int64_t HS) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (r >= rows) return;
  float s = 0.0f;
  for (int64_t h = lane; h < HS; h += 32) s += load(a[r * HS + h]) * load(b[r * HS + h]);
  s = warp_sum(s);
  if (lane == 0) out[r] = s;
}

// The weight of one partial result in the merge: exp(lse_part - lse), 0 for a part that saw
// no key (lse_part = -inf; also when lse = -inf, where the subtraction would give NaN).
__device__ __forceinline__ float merge_weight(float lse_part, float lse) {
  return lse_part == -INFINITY ? 0.0f : expf(lse_part - lse);
}

// out_a, out_b (rows,HS), lse_a, lse_b (rows) -> out (rows,HS), lse (rows); one warp per row:
// lse = logaddexp(lse_a, lse_b), out = w_a out_a + w_b out_b with w = exp(lse_part - lse)
template <typename T>
__global__ void attention_merge_forward_kernel(const T* out_a, const float* lse_a, const T* out_b,
                                               const float* lse_b, T* out, float* lse, int64_t rows,
                                               int64_t HS) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (r >= rows) return;
  const float la = lse_a[r], lb = lse_b[r], mx = fmaxf(la, lb);
  // logaddexp, shifted by the larger so that nothing overflows; -inf if both are
  const float l = mx == -INFINITY ? -INFINITY : mx + log1pf(expf(fminf(la, lb) - mx));
  const float wa = merge_weight(la, l), wb = merge_weight(lb, l);
  for (int64_t h = lane; h < HS; h += 32) {
    const int64_t k = r * HS + h;
    // a part with weight 0 is not read, so whatever it holds cannot turn into NaN
    const float va = wa != 0.0f ? wa * load(out_a[k]) : 0.0f, vb = wb != 0.0f ? wb * load(out_b[k]) : 0.0f;
    out[k] = store<T>(va + vb);
  }
  if (lane == 0) lse[r] = l;
}

// In the forward pass this was lse = log(exp(lse_a) + exp(lse_b)) and
// out = w_a out_a + w_b out_b with w_a = exp(lse_a - lse); so (tensor/cpu/attention.cpp
// derives it) dout_a = w_a dout, dlse_a = w_a (dlse + sum_HS dout * (out_a - out)), same for
// b. dout and dlse may be null (zero). One warp per row.
template <typename T>
__global__ void attention_merge_backward_kernel(const T* out_a, const float* lse_a, const T* out_b,
                                                const float* lse_b, const T* out, const float* lse,
                                                const T* dout, const float* dlse, T* dout_a, float* dlse_a,
                                                T* dout_b, float* dlse_b, int64_t rows, int64_t HS) {
  const int lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (r >= rows) return;
  const float wa = merge_weight(lse_a[r], lse[r]), wb = merge_weight(lse_b[r], lse[r]);
  float dot_a = 0.0f, dot_b = 0.0f;  // sum over HS of dout * (out_part - out)
  for (int64_t h = lane; h < HS; h += 32) {
    const int64_t k = r * HS + h;
    const float g = dout ? load(dout[k]) : 0.0f;
    dout_a[k] = store<T>(wa * g);
    dout_b[k] = store<T>(wb * g);
    if (wa != 0.0f) dot_a += g * (load(out_a[k]) - load(out[k]));
    if (wb != 0.0f) dot_b += g * (load(out_b[k]) - load(out[k]));
  }
  dot_a = warp_sum(dot_a);
  dot_b = warp_sum(dot_b);
  if (lane == 0) {
    const float gl = dlse ? dlse[r] : 0.0f;
    dlse_a[r] = wa * (gl + dot_a);
    dlse_b[r] = wb * (gl + dot_b);
  }
}

int row_threads(int64_t C) { return static_cast<int>(std::clamp<int64_t>((C + 31) / 32 * 32, 32, kThreads)); }

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void attention_softmax_forward(const Tensor& s, double scale, int64_t q_offset, int64_t k_offset,
                               const Tensor& lse, const Tensor& key_lo) {
  const int64_t Tq = s.size(1), Tk = s.size(2), rows = s.size(0) * Tq;
  if (rows == 0) return;
  check_stat(lse, "attention_softmax_forward", "lse");
  Launch L(s);
  dispatch_float(s.dtype(), "attention_softmax_forward", [&](auto tag) {
    using T = decltype(tag);
    attention_softmax_forward_kernel<T><<<static_cast<unsigned>(rows), row_threads(Tk), 0, L.stream>>>(
        static_cast<T*>(s.data_ptr()), static_cast<float>(scale), Tq, Tk, q_offset, k_offset,
        lse.data<float>(), key_lo.defined() ? key_lo.data<int32_t>() : nullptr,
        key_lo.defined() ? s.size(0) / key_lo.size(0) : 1);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void attention_softmax_backward(const Tensor& p, const Tensor& dp, const Tensor& d, const Tensor& dlse,
                                double scale) {
  const int64_t Tk = p.size(2), rows = p.size(0) * p.size(1);
  if (rows * Tk == 0) return;
  check_stat(d, "attention_softmax_backward", "d");
  if (dlse.defined()) check_stat(dlse, "attention_softmax_backward", "dlse");
  Launch L(p);
  dispatch_float(p.dtype(), "attention_softmax_backward", [&](auto tag) {
    using T = decltype(tag);
    attention_softmax_backward_kernel<T><<<grid_for(rows * Tk), kThreads, 0, L.stream>>>(
        static_cast<const T*>(p.data_ptr()), static_cast<T*>(dp.data_ptr()), d.data<float>(),
        dlse.defined() ? dlse.data<float>() : nullptr, static_cast<float>(scale), rows, Tk);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void rowwise_dot(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t HS = a.size(-1), rows = HS ? a.numel() / HS : 0;
  if (rows == 0) return;
  check_stat(out, "rowwise_dot", "out");
  Launch L(a);
  dispatch_float(a.dtype(), "rowwise_dot", [&](auto tag) {
    using T = decltype(tag);
    const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    rowwise_dot_kernel<T><<<blocks, kThreads, 0, L.stream>>>(static_cast<const T*>(a.data_ptr()),
                                                             static_cast<const T*>(b.data_ptr()),
                                                             out.data<float>(), rows, HS);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void attention_merge_forward(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                             const Tensor& lse_b, const Tensor& out, const Tensor& lse) {
  const int64_t HS = out_a.size(-1), rows = lse_a.numel();
  if (rows == 0) return;
  for (const Tensor* t : {&lse_a, &lse_b, &lse}) check_stat(*t, "attention_merge_forward", "lse");
  Launch L(out_a);
  dispatch_float(out_a.dtype(), "attention_merge_forward", [&](auto tag) {
    using T = decltype(tag);
    const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    attention_merge_forward_kernel<T><<<blocks, kThreads, 0, L.stream>>>(
        static_cast<const T*>(out_a.data_ptr()), lse_a.data<float>(), static_cast<const T*>(out_b.data_ptr()),
        lse_b.data<float>(), static_cast<T*>(out.data_ptr()), lse.data<float>(), rows, HS);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void attention_merge_backward(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                              const Tensor& lse_b, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              const Tensor& dlse, const Tensor& dout_a, const Tensor& dlse_a,
                              const Tensor& dout_b, const Tensor& dlse_b) {
  const int64_t HS = out_a.size(-1), rows = lse_a.numel();
  if (rows == 0) return;
  for (const Tensor* t : {&lse_a, &lse_b, &lse, &dlse, &dlse_a, &dlse_b})
    if (t->defined()) check_stat(*t, "attention_merge_backward", "lse and its gradients");
  Launch L(out_a);
  dispatch_float(out_a.dtype(), "attention_merge_backward", [&](auto tag) {
    using T = decltype(tag);
    const unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
    attention_merge_backward_kernel<T><<<blocks, kThreads, 0, L.stream>>>(
        static_cast<const T*>(out_a.data_ptr()), lse_a.data<float>(), static_cast<const T*>(out_b.data_ptr()),
        lse_b.data<float>(), static_cast<const T*>(out.data_ptr()), lse.data<float>(),
        dout.defined() ? static_cast<const T*>(dout.data_ptr()) : nullptr,
        dlse.defined() ? dlse.data<float>() : nullptr, static_cast<T*>(dout_a.data_ptr()),
        dlse_a.data<float>(), static_cast<T*>(dout_b.data_ptr()), dlse_b.data<float>(), rows, HS);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ndt::cuda
