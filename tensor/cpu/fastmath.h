// ndtrain CPU kernels: branch-free float math that the compiler can vectorize, for the
// hot elementwise loops (GELU). Accuracy: exp to ~2 ulp over [-87, 88] (Cephes' expf
// polynomial after a Cody-Waite range reduction); tanh to ~2e-7 absolute.
#pragma once

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>

// Compile a function for AVX-512, AVX2 and the baseline, picked at load time (GCC's
// target_clones): the hot float loops run at the machine's vector width while the binary
// still runs on any x86-64.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NDT_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define NDT_VECTOR_CLONES
#endif

namespace ndt::cpu {

// Lanes of the fixed-order reductions (tensor/cpu/self_attention.cpp, softmax.cpp): lane l
// takes elements l, l+L, ..., then the lanes combine in a fixed order, so the result is the
// same at every vector width (no reassociation left to the compiler).
constexpr int kLanes = 16;

// Written so GCC vectorizes it at the baseline x86-64 ISA (SSE2): no floor (rounding by
// adding and subtracting 1.5 * 2^23), min/max as comparisons, the power of two built in bits.
inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float t = x * 1.44269504088896341f;                      // x / ln 2
  const float n = (t + 12582912.0f) - 12582912.0f;               // round(t), |t| < 2^22
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // x - n ln 2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// double keeps the library's exp (gradient checks want every digit)
inline double fast_exp(double x) { return std::exp(x); }

// tanh(u) = 1 - 2 / (exp(2u) + 1): exact limits +-1, absolute error ~2e-7
inline float fast_tanh(float u) { return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f); }

// double keeps the library's tanh (gradient checks want every digit)
inline double fast_tanh(double u) { return std::tanh(u); }

// Below this many elements, an elementwise loop runs on one thread (threads cost more than
// they save).
constexpr int64_t kParallelMin = 32768;

// Splits [0, n) into one contiguous chunk per thread: f(lo, hi) on each (a vectorized loop
// over its chunk). `per_item`: the elements each of the n items holds (rows of a matrix), which
// decide whether threads pay off.
template <typename F>
void parallel_chunks(int64_t n, F&& f, int64_t per_item = 1) {
#pragma omp parallel if (n * per_item > kParallelMin)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    if (hi > lo) f(lo, hi);
  }
}

// bf16 loops run through the f32 ones a block at a time: widened, computed, rounded once.
constexpr int64_t kBf16Block = 256;

}  // namespace ndt::cpu
