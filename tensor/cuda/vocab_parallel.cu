// CUDA pieces of vocabulary-parallel cross-entropy, the twins of
// tensor/cpu/vocab_parallel.cpp: each rank holds the logits of the global columns
// [v_start, v_start + Vl), of which the first v_live are vocabulary (the rest is padding).
// Legend: N rows, Vl local columns. One block per row for the row statistics, f32 math.
#include <algorithm>
#include <climits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

// ---- kernels ------------------------------------------------------------------------

// logits (N,Vl) -> out (N): max over the live columns, -inf if there are none; block n does row n
template <typename T>
__global__ void rowmax_kernel(const T* logits, int64_t Vl, int64_t v_live, float* out) {
  const T* row = logits + blockIdx.x * Vl;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < v_live; j += blockDim.x) mx = fmaxf(mx, load(row[j]));
  mx = block_max(mx);
  if (threadIdx.x == 0) out[blockIdx.x] = mx;
}

// logits (N,Vl), targets (N), gmax (N) -> sumexp (N) = sum_{j < v_live} exp(logit_j - gmax),
// target_logit (N) = logit[target - v_start] if that column is live here, else 0; block n does row n
template <typename T>
__global__ void cross_entropy_partials_kernel(const T* logits, const int32_t* targets, const float* gmax,
                                              int64_t Vl, int64_t v_start, int64_t v_live,
                                              int64_t ignore_index, float* sumexp, float* target_logit) {
  const int64_t n = blockIdx.x;
  const T* row = logits + n * Vl;
  const float m = gmax[n];
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < v_live; j += blockDim.x) s += expf(load(row[j]) - m);
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const int64_t t = targets[n], j = t - v_start;  // the target's local column
    sumexp[n] = s;
    target_logit[n] = t != ignore_index && j >= 0 && j < v_live ? load(row[j]) : 0.0f;
  }
}

// In the forward loss_n = log(sumexp_n) + gmax_n - logit[n, t_n], where sumexp_n sums
// exp(logit - gmax_n) over every rank's live columns; so
// dlogits[n, j] = (exp(logit[n,j] - gmax_n) / sumexp_n - [v_start + j == t_n]) * dloss / kept,
// 0 on ignored rows and padded columns. logits, dlogits (N,Vl); targets, gmax, sumexp (N)
template <typename T>
__global__ void cross_entropy_parallel_backward_kernel(const T* logits, const int32_t* targets,
                                                       const float* gmax, const float* sumexp, int64_t N,
                                                       int64_t Vl, int64_t v_start, int64_t v_live,
                                                       int64_t ignore_index, const int32_t* kept,
                                                       const float* dloss, T* dlogits) {
  const float grad_scale = *kept > 0 ? *dloss / static_cast<float>(*kept) : 0.0f;
  NDT_GRID_STRIDE(i, N * Vl) {
    const int64_t n = i / Vl, j = i % Vl, t = targets[n];
    float g = 0.0f;
    if (t != ignore_index && j < v_live)
      g = (expf(load(logits[i]) - gmax[n]) / sumexp[n] - (v_start + j == t ? 1.0f : 0.0f)) * grad_scale;
    dlogits[i] = store<T>(g);
  }
}

// loss_n = log(sumexp_n) + gmax_n - target_logit_n, 0 for ignored rows
__global__ void cross_entropy_parallel_losses_kernel(const float* gmax, const float* sumexp,
                                                     const float* target, const int32_t* targets, int64_t N,
                                                     int64_t ignore_index, float* losses) {
  NDT_GRID_STRIDE(n, N) losses[n] = targets[n] == ignore_index ? 0.0f : logf(sumexp[n]) + gmax[n] - target[n];
}

// Threads for a block that walks one row of C columns: a multiple of 32, at most 256.
int row_threads(int64_t C) { return static_cast<int>(std::clamp<int64_t>((C + 31) / 32 * 32, 32, kThreads)); }

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void rowmax(const Tensor& logits, int64_t v_live, const Tensor& out) {
  const int64_t N = logits.size(0), Vl = logits.size(1);
  if (N == 0) return;
  NDT_CHECK(N < INT_MAX, "rowmax: too many rows (", N, ")");
  check_stat(out, "rowmax", "out");
  Launch L(logits);
  dispatch_float(logits.dtype(), "rowmax", [&](auto tag) {
    using T = decltype(tag);
    rowmax_kernel<T><<<static_cast<unsigned>(N), row_threads(v_live), 0, L.stream>>>(
        static_cast<const T*>(logits.data_ptr()), Vl, v_live, out.data<float>());
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& gmax, int64_t v_start,
                            int64_t v_live, int64_t ignore_index, const Tensor& sumexp,
                            const Tensor& target_logit) {
  const int64_t N = logits.size(0), Vl = logits.size(1);
  if (N == 0) return;
  NDT_CHECK(targets.dtype() == DType::i32, "cross_entropy_partials: targets must be int32, got ",
            targets.desc());
  NDT_CHECK(N < INT_MAX, "cross_entropy_partials: too many rows (", N, ")");
  check_stat(gmax, "cross_entropy_partials", "gmax");
  check_stat(sumexp, "cross_entropy_partials", "sumexp");
  check_stat(target_logit, "cross_entropy_partials", "target_logit");
  Launch L(logits);
  dispatch_float(logits.dtype(), "cross_entropy_partials", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_partials_kernel<T><<<static_cast<unsigned>(N), row_threads(v_live), 0, L.stream>>>(
        static_cast<const T*>(logits.data_ptr()), targets.data<int32_t>(), gmax.data<float>(), Vl, v_start,
        v_live, ignore_index, sumexp.data<float>(), target_logit.data<float>());
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_parallel_backward(const Tensor& logits, const Tensor& targets, const Tensor& gmax,
                                     const Tensor& sumexp_global, int64_t v_start, int64_t v_live,
                                     int64_t ignore_index, const Tensor& kept, const Tensor& dloss,
                                     const Tensor& dlogits) {
  const int64_t N = logits.size(0), Vl = logits.size(1);
  if (N * Vl == 0) return;
  NDT_CHECK(targets.dtype() == DType::i32, "cross_entropy_parallel_backward: targets must be int32, got ",
            targets.desc());
  check_stat(gmax, "cross_entropy_parallel_backward", "gmax");
  check_stat(sumexp_global, "cross_entropy_parallel_backward", "sumexp_global");
  check_stat(dloss, "cross_entropy_parallel_backward", "dloss");
  NDT_CHECK(kept.dtype() == DType::i32, "cross_entropy_parallel_backward: kept must be int32, got ",
            kept.desc());
  Launch L(logits);
  dispatch_float(logits.dtype(), "cross_entropy_parallel_backward", [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_parallel_backward_kernel<T><<<grid_for(N * Vl), kThreads, 0, L.stream>>>(
        static_cast<const T*>(logits.data_ptr()), targets.data<int32_t>(), gmax.data<float>(),
        sumexp_global.data<float>(), N, Vl, v_start, v_live, ignore_index, kept.data<int32_t>(),
        dloss.data<float>(), static_cast<T*>(dlogits.data_ptr()));
    NDT_CUDA_CHECK_LAUNCH();
  });
}

void cross_entropy_parallel_losses(const Tensor& gmax, const Tensor& sumexp_global,
                                   const Tensor& target_logit_global, const Tensor& targets,
                                   int64_t ignore_index, const Tensor& losses) {
  const int64_t N = losses.numel();
  if (N == 0) return;
  for (const Tensor* t : {&gmax, &sumexp_global, &target_logit_global, &losses})
    check_stat(*t, "cross_entropy_parallel_losses", "a statistic");
  Launch L(losses);
  cross_entropy_parallel_losses_kernel<<<grid_for(N), kThreads, 0, L.stream>>>(
      gmax.data<float>(), sumexp_global.data<float>(), target_logit_global.data<float>(),
      targets.data<int32_t>(), N, ignore_index, losses.data<float>());
  NDT_CUDA_CHECK_LAUNCH();
}

}  // namespace ndt::cuda
