// Causal attention on the CPU as one kernel, for two callers:
// - self-attention straight from the packed (B,T,3C) output of c_attn: q, k and v are read
//   where c_attn wrote them and the output is written in the (B,T,C) layout c_proj reads, so
//   no head is ever copied out or back (ndt::self_attention);
// - attention of Tq queries over Tk keys at global position offsets, with the log-sum-exp as
//   a second output and its gradient in backward: (B,NH,T,HS) operands with any strides but
//   contiguous rows (ndt::attention: one step of ring attention, dist/context_parallel), k
//   and v with NKV heads, a divisor of NH (grouped-query attention).
// Flash-style blocks: a block of BQ queries computes its scores against the keys it can see
// only (the causal part above the diagonal is skipped), so the largest score buffer is BQ x
// Tk per thread, not Tq x Tk per head; backward computes the probabilities again from q, k
// and the saved log-sum-exp.
//
// Legend: B batch, NH heads, NKV key/value heads, G = NH / NKV query heads per kv head, HS
// head size, Tq queries, Tk keys; a block holds queries [r0, r1), nr = r1 - r0 of them, and
// query i sees keys [0, visible(i)): nk = visible(r1-1) for the block. Self-attention:
// NKV = NH, Tq = Tk = T, visible(i) = i + 1, row strides qkv 3C, y C.
//
// Packed rows (several documents in one row, key_lo given): query i of batch b sees keys
// [first(b, i), visible(i)), its own document's. Documents lie in runs, so first() and
// visible() grow with i and a block sees the keys [k0, k0 + nk) = [first(b, r0),
// visible(r1-1)): its scores are computed against those only (the keys of earlier documents
// are skipped whole, so a row of 4 equal documents costs about a quarter of a causal one) and
// the rows are masked inside that range.
//
// Grouped-query attention (NKV < NH): query head h reads kv head h / G in place (Hugging
// Face's repeat_kv order), so K and V are never copied per query head; in backward one task
// owns a kv head and adds the dk, dv of its G query heads into it, one head after the other.
//
// Every (b, h, query block) of the forward, and every (b, kv head) of the backward, is one
// task of an OpenMP loop whose GEMMs run on one thread each (OpenBLAS runs single-threaded
// inside a parallel region). Tasks write disjoint outputs and each sums in a fixed order, so
// results do not depend on the number of threads or on the schedule.
#include <omp.h>

#include <cblas.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {
namespace {

constexpr int64_t kBlockQ = 64;  // queries per block

// C (m,n) = alpha op(A) op(B) + beta C, row-major with leading dimensions: the strided head
// views need nothing more than lda = 3C.
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha,
              a, lda, b, ldb, beta, c, ldc);
}
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
               const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha,
              a, lda, b, ldb, beta, c, ldc);
}

// The lanes' sum in their fixed order (kLanes, tensor/cpu/fastmath.h).
template <typename T>
T lanes_total(const T (&acc)[kLanes]) {
  T s = 0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// kLanes elements as one value of GCC's vector extension (lowered to the clone's vector width)
template <typename T>
struct LanesOf;
template <>
struct LanesOf<float> {
  using type = float __attribute__((vector_size(kLanes * sizeof(float))));
};
template <>
struct LanesOf<double> {
  using type = double __attribute__((vector_size(kLanes * sizeof(double))));
};

// The row's visible keys [0, nvis) rounded up to whole groups of kLanes where the row [0, nk) has
// room: the loops below run over whole groups, the keys past nvis masked, so that no row ends in
// a scalar tail of up to kLanes - 1 exps (half the cost of short rows).
inline int64_t lane_groups_end(int64_t nvis, int64_t nk) {
  return std::min(nk, (nvis + kLanes - 1) / kLanes * kLanes) / kLanes * kLanes;
}

// The probabilities of one row again, from the scaled scores and the saved lse (whole lane
// groups, as softmax_row).
template <typename T>
[[gnu::always_inline]] inline void probs_row(T* s, int64_t nvis, int64_t nk, T lse) {
  const int64_t nv = lane_groups_end(nvis, nk);
  int64_t j = 0;
  for (; j < nv; j += kLanes)
    for (int l = 0; l < kLanes; ++l) s[j + l] = j + l < nvis ? fast_exp(s[j + l] - lse) : T(0);
  for (; j < nvis; ++j) s[j] = fast_exp(s[j] - lse);
  for (; j < nk; ++j) s[j] = T(0);
}

// One row of scaled scores s[0, nk), of which keys [0, nvis) are visible (none: lse -inf):
// p = exp(s - lse) there and 0 beyond, in place; returns lse = log sum_visible exp(s). The
// max and the sum in kLanes lanes (the max is exact in any order; the sum's order is fixed,
// the same at every vector width, the masked keys adding 0); p is exp(s - lse), the bits the
// backward's probs_row computes again.
// Always inlined: into each vector clone below, or GCC keeps one baseline (SSE2) copy that
// every clone calls, and the clones vectorize nothing.
template <typename T>
[[gnu::always_inline]] inline T softmax_row(T* s, int64_t nvis, int64_t nk) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const int64_t nv = lane_groups_end(nvis, nk);
  // the max a vector of kLanes at a time (GCC's vector extension, lowered to the clone's width)
  using Lanes = typename LanesOf<T>::type;
  Lanes lane_max = Lanes{} + kNegInf;
  int64_t j = 0;
  for (; j + kLanes <= nvis; j += kLanes) {
    Lanes x;
    std::memcpy(&x, s + j, sizeof x);
    lane_max = x > lane_max ? x : lane_max;
  }
  T mx = kNegInf;
  for (int l = 0; l < kLanes; ++l) mx = lane_max[l] > mx ? lane_max[l] : mx;
  for (; j < nvis; ++j) mx = s[j] > mx ? s[j] : mx;
  T acc[kLanes] = {};
  for (j = 0; j < nv; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += j + l < nvis ? fast_exp(s[j + l] - mx) : T(0);
  for (int l = 0; j < nvis; ++j, ++l) acc[l] += fast_exp(s[j] - mx);
  const T lse = mx + std::log(lanes_total(acc));
  probs_row(s, nvis, nk, lse);
  return lse;
}
// The f32 rows, vectorized at the machine's width (NDT_VECTOR_CLONES).
NDT_VECTOR_CLONES float softmax_row_f32(float* s, int64_t nvis, int64_t nk) {
  return softmax_row(s, nvis, nk);
}
float softmax_row_of(float* s, int64_t nvis, int64_t nk) { return softmax_row_f32(s, nvis, nk); }
double softmax_row_of(double* s, int64_t nvis, int64_t nk) { return softmax_row(s, nvis, nk); }

NDT_VECTOR_CLONES void probs_row_f32(float* s, int64_t nvis, int64_t nk, float lse) {
  probs_row(s, nvis, nk, lse);
}
void probs_row_of(float* s, int64_t nvis, int64_t nk, float lse) { probs_row_f32(s, nvis, nk, lse); }
void probs_row_of(double* s, int64_t nvis, int64_t nk, double lse) { probs_row(s, nvis, nk, lse); }

// ds = scale * p * (dp - d) over one row (in place in dp), and d = sum over HS of dy * y.
template <typename T>
void softmax_grad_row(const T* p, T* dp, int64_t nk, T d, T scale) {
  for (int64_t j = 0; j < nk; ++j) dp[j] = scale * p[j] * (dp[j] - d);
}
NDT_VECTOR_CLONES void softmax_grad_row_f32(const float* p, float* dp, int64_t nk, float d, float scale) {
  softmax_grad_row(p, dp, nk, d, scale);
}
void softmax_grad_row_of(const float* p, float* dp, int64_t nk, float d, float scale) {
  softmax_grad_row_f32(p, dp, nk, d, scale);
}
void softmax_grad_row_of(const double* p, double* dp, int64_t nk, double d, double scale) {
  softmax_grad_row(p, dp, nk, d, scale);
}

template <typename T>
[[gnu::always_inline]] inline T dot_row(const T* a, const T* b, int64_t n) {
  T acc[kLanes] = {};
  int64_t h = 0;
  for (; h + kLanes <= n; h += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[h + l] * b[h + l];
  for (int l = 0; h < n; ++h, ++l) acc[l] += a[h] * b[h];
  return lanes_total(acc);
}
NDT_VECTOR_CLONES float dot_row_f32(const float* a, const float* b, int64_t n) { return dot_row(a, b, n); }
float dot_row_of(const float* a, const float* b, int64_t n) { return dot_row_f32(a, b, n); }
double dot_row_of(const double* a, const double* b, int64_t n) { return dot_row(a, b, n); }

// One (B, NH, T, HS) operand, read or written in place: element (b, h, t, e) at
// p[b sb + h sh + t st + e]. Rows are contiguous (HS elements); the strides let q, k and v
// be the columns of c_attn's (B, T, 3C) output and y the columns of c_proj's (B, T, C) input.
template <typename T>
struct Heads {
  T* p;
  int64_t sb, sh, st;
  T* at(int64_t b, int64_t h, int64_t t) const { return p + b * sb + h * sh + t * st; }
};

// The shapes and the mask: Tq queries at global positions q_offset.., Tk keys at k_offset..;
// query i sees key j iff k_offset + j <= q_offset + i (and, packed, j >= key_lo[b, i]);
// query head h reads kv head h / G.
struct Dims {
  int64_t B, NH, NKV, Tq, Tk, HS, q_offset, k_offset;
  const int32_t* key_lo = nullptr;            // (B, Tq): the first key of each query's document, or none
  int64_t group() const { return NH / NKV; }  // G, query heads per kv head
  int64_t blocks() const { return (Tq + kBlockQ - 1) / kBlockQ; }
  int64_t visible(int64_t i) const { return std::clamp<int64_t>(q_offset - k_offset + i + 1, 0, Tk); }
  int64_t first(int64_t b, int64_t i) const { return key_lo ? key_lo[b * Tq + i] : 0; }
  // an OpenMP loop over `tasks` pays off only past a few GEMMs' worth of work
  bool parallel(int64_t tasks) const { return tasks > 1 && Tq * Tk * HS > 16384; }
};

template <typename T>
void zero_rows(T* p, int64_t rows, int64_t stride, int64_t n) {
  for (int64_t i = 0; i < rows; ++i) std::fill(p + i * stride, p + i * stride + n, T(0));
}

// lse (B, NH, Tq) contiguous
template <typename T>
void forward_impl(const Dims& d, Heads<const T> q, Heads<const T> k, Heads<const T> v, Heads<T> y, T* lse,
                  T scale) {
  const int64_t nb = d.blocks(), tasks = d.B * d.NH * nb;
  // later blocks see more keys: hand them out first (dynamic), so the last tasks are short
#pragma omp parallel if (d.parallel(tasks))
  {
    std::vector<T> s(static_cast<size_t>(kBlockQ * d.Tk));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t blk = nb - 1 - task % nb, bh = task / nb, b = bh / d.NH, h = bh % d.NH;
      const int64_t r0 = blk * kBlockQ, r1 = std::min(d.Tq, r0 + kBlockQ), nr = r1 - r0;
      // the block's keys [k0, k0 + nk): from its first query's first to its last query's last
      const int64_t k0 = d.first(b, r0), nk = d.visible(r1 - 1) - k0;
      T* yb = y.at(b, h, r0);  // (nr, HS)
      if (nk <= 0) {           // no query of the block sees a key: out 0, lse -inf
        zero_rows(yb, nr, y.st, d.HS);
        std::fill(lse + bh * d.Tq + r0, lse + bh * d.Tq + r1, -std::numeric_limits<T>::infinity());
        continue;
      }
      const int64_t g = h / d.group();                                                      // the kv head
      const T* qb = q.at(b, h, r0);                                                         // (nr, HS)
      const T* kb = k.at(b, g, k0);                                                         // (nk, HS)
      const T* vb = v.at(b, g, k0);                                                         // (nk, HS)
      blas_gemm(false, true, nr, nk, d.HS, scale, qb, q.st, kb, k.st, T(0), s.data(), nk);  // s = scale q k^T
      for (int64_t i = 0; i < nr; ++i) {  // row i sees [lo, hi) of the block's keys
        T* row = s.data() + i * nk;
        const int64_t lo = d.first(b, r0 + i) - k0, hi = d.visible(r0 + i) - k0;
        std::fill(row, row + lo, T(0));
        lse[bh * d.Tq + r0 + i] = softmax_row_of(row + lo, hi - lo, nk - lo);
      }
      blas_gemm(false, false, nr, d.HS, nk, T(1), s.data(), nk, vb, v.st, T(0), yb, y.st);  // y = p v
    }
  }
}

// dd (B, NH, Tq) = rowsum(dy * y) - dlse for every query row, first, in one pass in memory
// order: in the packed layout a block's rows lie C apart, and read there one after the other
// they stall on memory. Rows go (b, t, h) where a head's next row is farther than the next
// head (the packed layout), else (b, h, t). dlse may be null.
template <typename T>
std::vector<T> row_terms(const Dims& d, Heads<const T> y, Heads<const T> dy, const T* dlse) {
  const int64_t rows = d.B * d.NH * d.Tq;
  std::vector<T> dd_all(static_cast<size_t>(rows));
  const bool heads_inner = y.sh < y.st;
#pragma omp parallel for schedule(static) if (rows * d.HS > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / (d.NH * d.Tq), rest = r % (d.NH * d.Tq);
    const int64_t h = heads_inner ? rest % d.NH : rest / d.Tq, t = heads_inner ? rest / d.NH : rest % d.Tq;
    const int64_t row = (b * d.NH + h) * d.Tq + t;
    T v = dot_row_of(dy.at(b, h, t), y.at(b, h, t), d.HS);
    if (dlse) v -= dlse[row];
    dd_all[row] = v;
  }
  return dd_all;
}

// lse, dlse (B, NH, Tq) contiguous; dlse may be null (no gradient on lse). q, y, dy, dq have
// NH heads, k, v, dk, dv NKV.
template <typename T>
void backward_impl(const Dims& d, Heads<const T> q, Heads<const T> k, Heads<const T> v, Heads<const T> y,
                   const T* lse, Heads<const T> dy, const T* dlse, Heads<T> dq, Heads<T> dk, Heads<T> dv,
                   T scale) {
  const int64_t nb = d.blocks(), G = d.group(), tasks = d.B * d.NKV;
  const std::vector<T> dd_all = row_terms(d, y, dy, dlse);
#pragma omp parallel if (d.parallel(tasks))
  {
    std::vector<T> p(static_cast<size_t>(kBlockQ * d.Tk)), dp(p.size());
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < tasks; ++bg) {  // one kv head: dk, dv are this task's alone
      const int64_t b = bg / d.NKV, g = bg % d.NKV;
      const T* kb = k.at(b, g, 0);
      const T* vb = v.at(b, g, 0);
      T* dkb = dk.at(b, g, 0);
      T* dvb = dv.at(b, g, 0);
      // the kv head's query heads g G .. g G + G - 1 in turn, each from its last block (it
      // sees the most keys) to its first: the first of them all writes dk and dv (beta 0;
      // rows no query sees are zeroed), every later one adds
      // (packed rows: the blocks' key ranges do not nest, so dk, dv start at zero and every
      // block adds)
      bool first = true;
      if (d.key_lo) {
        zero_rows(dkb, d.Tk, dk.st, d.HS);
        zero_rows(dvb, d.Tk, dv.st, d.HS);
        first = false;
      }
      for (int64_t h = g * G; h < (g + 1) * G; ++h) {
        const int64_t bh = b * d.NH + h;  // the query head's rows of lse and dlse
        for (int64_t blk = nb - 1; blk >= 0; --blk) {
          const int64_t r0 = blk * kBlockQ, r1 = std::min(d.Tq, r0 + kBlockQ), nr = r1 - r0;
          const int64_t k0 = d.first(b, r0), nk = d.visible(r1 - 1) - k0;  // keys [k0, k0 + nk)
          T* dqb = dq.at(b, h, r0);
          if (nk <= 0) {  // (causal: and so for every earlier block)
            zero_rows(dqb, nr, dq.st, d.HS);
            continue;
          }
          if (first) {
            zero_rows(dkb + nk * dk.st, d.Tk - nk, dk.st, d.HS);
            zero_rows(dvb + nk * dv.st, d.Tk - nk, dv.st, d.HS);
          }
          const T beta = first ? T(0) : T(1);
          first = false;
          const T* qb = q.at(b, h, r0);
          const T* dyb = dy.at(b, h, r0);
          const T *kbk = kb + k0 * k.st, *vbk = vb + k0 * v.st;  // the block's keys
          T *dkbk = dkb + k0 * dk.st, *dvbk = dvb + k0 * dv.st;
          // forward: s = scale q k^T, p = exp(s - lse) (masked), y = p v, lse = log sum exp s; so
          //   dv = p^T dy,  dp = dy v^T,  ds = scale p (dp - rowsum(dy * y) + dlse),
          //   dq = ds k,  dk = ds^T q
          // (the scale of s is in ds; the GEMM for s is the forward's again; with G > 1, k and
          // v served G query heads, so their gradients are the sums over those heads)
          blas_gemm(false, true, nr, nk, d.HS, scale, qb, q.st, kbk, k.st, T(0), p.data(), nk);
          const T* dd = dd_all.data() + bh * d.Tq + r0;  // (nr)
          for (int64_t i = 0; i < nr; ++i) {             // row i sees [lo, hi) of the block's keys
            T* row = p.data() + i * nk;
            const int64_t lo = d.first(b, r0 + i) - k0, hi = d.visible(r0 + i) - k0;
            std::fill(row, row + lo, T(0));
            probs_row_of(row + lo, hi - lo, nk - lo, lse[bh * d.Tq + r0 + i]);
          }
          blas_gemm(true, false, nk, d.HS, nr, T(1), p.data(), nk, dyb, dy.st, beta, dvbk, dv.st);
          blas_gemm(false, true, nr, nk, d.HS, T(1), dyb, dy.st, vbk, v.st, T(0), dp.data(), nk);
          for (int64_t i = 0; i < nr; ++i)
            softmax_grad_row_of(p.data() + i * nk, dp.data() + i * nk, nk, dd[i], scale);
          blas_gemm(false, false, nr, d.HS, nk, T(1), dp.data(), nk, kbk, k.st, T(0), dqb, dq.st);
          blas_gemm(true, false, nk, d.HS, nr, T(1), dp.data(), nk, qb, q.st, beta, dkbk, dk.st);
        }
      }
      if (first) {  // no query of any of the group's heads saw any key
        zero_rows(dkb, d.Tk, dk.st, d.HS);
        zero_rows(dvb, d.Tk, dv.st, d.HS);
      }
    }
  }
}

template <typename F>
void dispatch_f32_f64(DType dt, const char* op, F&& f) {
  if (dt == DType::f32) return f(float{});
  if (dt == DType::f64) return f(double{});
  NDT_FAIL(op, ": dtype ", dtype_name(dt), " is not supported (float32 or float64; bf16 is computed in f32)");
}

// Part `part` (0 q, 1 k, 2 v) of the packed (B, T, 3C) qkv, and the heads of a (B, T, C)
// tensor (y, dy): head h in columns [h HS, (h+1) HS).
template <typename T>
Heads<T> packed_part(T* qkv, int64_t part, int64_t T_, int64_t C, int64_t n_head) {
  return {qkv + part * C, T_ * 3 * C, C / n_head, 3 * C};
}
template <typename T>
Heads<T> channels(T* y, int64_t T_, int64_t C, int64_t n_head) {
  return {y, T_ * C, C / n_head, C};
}
// A (B, NH, T, HS) tensor with contiguous rows, as it lies.
template <typename T>
Heads<T> heads_of(const Tensor& t) {
  return {t.data<std::remove_const_t<T>>(), t.strides()[0], t.strides()[1], t.strides()[2]};
}
// key_lo (B, Tq) i32 contiguous, or undefined: no document mask
const int32_t* lo_of(const Tensor& key_lo) { return key_lo.defined() ? key_lo.data<int32_t>() : nullptr; }

}  // namespace

void self_attention_forward(const Tensor& qkv, int64_t n_head, double scale, const Tensor& y,
                            const Tensor& lse, const Tensor& key_lo) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  if (B * T == 0) return;
  const Dims d{B, n_head, n_head, T, T, C / n_head, 0, 0, lo_of(key_lo)};
  dispatch_f32_f64(qkv.dtype(), "self_attention_forward", [&](auto tag) {
    using F = decltype(tag);
    const F* x = qkv.data<F>();
    forward_impl<F>(d, packed_part(x, 0, T, C, n_head), packed_part(x, 1, T, C, n_head),
                    packed_part(x, 2, T, C, n_head), channels(y.data<F>(), T, C, n_head), lse.data<F>(),
                    static_cast<F>(scale));
  });
}

void self_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& lse, const Tensor& dy,
                             int64_t n_head, double scale, const Tensor& dqkv, const Tensor& key_lo) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  if (B * T == 0) return;
  const Dims d{B, n_head, n_head, T, T, C / n_head, 0, 0, lo_of(key_lo)};
  dispatch_f32_f64(qkv.dtype(), "self_attention_backward", [&](auto tag) {
    using F = decltype(tag);
    const F* x = qkv.data<F>();
    F* dx = dqkv.data<F>();
    backward_impl<F>(d, packed_part(x, 0, T, C, n_head), packed_part(x, 1, T, C, n_head),
                     packed_part(x, 2, T, C, n_head), channels<const F>(y.data<F>(), T, C, n_head),
                     lse.data<F>(), channels<const F>(dy.data<F>(), T, C, n_head), nullptr,
                     packed_part(dx, 0, T, C, n_head), packed_part(dx, 1, T, C, n_head),
                     packed_part(dx, 2, T, C, n_head), static_cast<F>(scale));
  });
}

void attention_fused_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset,
                             int64_t k_offset, double scale, const Tensor& y, const Tensor& lse,
                             const Tensor& key_lo) {
  const Dims d{q.size(0), q.size(1), k.size(1), q.size(2),    k.size(2),
               q.size(3), q_offset,  k_offset,  lo_of(key_lo)};
  if (d.B * d.NH * d.Tq == 0) return;
  dispatch_f32_f64(q.dtype(), "attention_fused_forward", [&](auto tag) {
    using F = decltype(tag);
    forward_impl<F>(d, heads_of<const F>(q), heads_of<const F>(k), heads_of<const F>(v), heads_of<F>(y),
                    lse.data<F>(), static_cast<F>(scale));
  });
}

void attention_fused_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& y,
                              const Tensor& lse, const Tensor& dy, const Tensor& dlse, int64_t q_offset,
                              int64_t k_offset, double scale, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, const Tensor& key_lo) {
  const Dims d{q.size(0), q.size(1), k.size(1), q.size(2),    k.size(2),
               q.size(3), q_offset,  k_offset,  lo_of(key_lo)};
  if (d.B * d.NKV * (d.Tq + d.Tk) == 0) return;
  dispatch_f32_f64(q.dtype(), "attention_fused_backward", [&](auto tag) {
    using F = decltype(tag);
    backward_impl<F>(d, heads_of<const F>(q), heads_of<const F>(k), heads_of<const F>(v),
                     heads_of<const F>(y), lse.data<F>(), heads_of<const F>(dy),
                     dlse.defined() ? dlse.data<F>() : nullptr, heads_of<F>(dq), heads_of<F>(dk),
                     heads_of<F>(dv), static_cast<F>(scale));
  });
}

}  // namespace ndt::cpu
