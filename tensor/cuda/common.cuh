// ndtrain CUDA backend: what every tensor/cuda/*.cu file shares (private to tensor/cuda).
//
//   void scale(const Tensor& a, double s, const Tensor& out) {
//     Launch L(a);                                   // sets a's device, picks its stream
//     dispatch_float(a.dtype(), "scale", [&](auto tag) {
//       using T = decltype(tag);                     // float or __nv_bfloat16
//       scale_kernel<T><<<grid_for(n), kThreads, 0, L.stream>>>(...);
//       NDT_CUDA_CHECK_LAUNCH();
//     });
//   }
//
// Check macros throw ndt::Error with file:line (tensor/error.h); they, the streams and
// handles, DeviceGuard and Launch are in host.h. Device code loads every float type into
// float (f32 compute, bf16 rounds to nearest even on the way back).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "tensor/error.h"
#include "tensor/tensor.h"

#include "tensor/cuda/host.h"

namespace ndt::cuda {

// ---- bad input found by a kernel (runtime.cu) -------------------------------------------
// A kernel cannot throw. One that finds bad input (an id outside the embedding table, a
// target outside the vocabulary) records the first finding in its device's error record and
// goes on with a harmless value. The host reads the record whenever it waits for the
// device anyway -- synchronize(), every copy to or from the host (where the trainer reads
// the loss) -- and throws there, naming the op, the position and the value. So no launcher
// synchronizes to check its input; with NDT_CUDA_SYNC=1 the check follows every launch and
// the error surfaces at the op that found it.
enum class KernelError : int { kNone = 0, kEmbeddingId = 1, kCrossEntropyTarget = 2 };
struct ErrorRecord {
  int code;  // a KernelError; 0 while nothing was found
  int unused;
  long long index, value, limit;  // where (position, row), what (id, target), the bound
};
ErrorRecord* error_record(int device);  // in device memory
void check_kernel_errors(int device);   // throws, and clears the record, if a kernel wrote it

__device__ __forceinline__ void record_error(ErrorRecord* r, KernelError code, int64_t index, int64_t value,
                                             int64_t limit) {
  if (atomicCAS(&r->code, 0, static_cast<int>(code)) == 0) {  // the first finding wins
    r->index = index;
    r->value = value;
    r->limit = limit;
  }
}

// ---- launch geometry -----------------------------------------------------------------
// A grid-stride loop over [0, n): NDT_GRID_STRIDE(i, n) out[i] = ...;
#define NDT_GRID_STRIDE(i, n)                                               \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

constexpr int kThreads = 256;
// Blocks for a grid-stride loop over n items (capped; the loop covers the rest).
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(b, 1, int64_t(1) << 20));
}

// ---- 128-bit accesses ------------------------------------------------------------------
// Pack<T>: 16 bytes of T (4 floats, 8 bf16), loaded and stored as one 128-bit access by the
// elementwise kernels when every pointer they touch is 16-byte aligned (pool allocations
// are; views into a flat buffer may not be, and take the scalar loop).
template <typename T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- dtype dispatch (host) -------------------------------------------------------------
template <typename F>
void dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32:
      f(float{});
      break;
    case DType::bf16:
      f(__nv_bfloat16{});
      break;
    case DType::f64:
      NDT_FAIL(op,
               ": float64 is CPU only (the CUDA kernels take float32 or bfloat16); "
               "move the tensors to cpu or cast them");
    default:
      NDT_FAIL(op, ": dtype ", dtype_name(dt), " is not supported on CUDA (float32 or bfloat16)");
  }
}

// Every dtype (fill and copy).
template <typename F>
void dispatch_all(DType dt, F&& f) {
  switch (dt) {
    case DType::f32:
      f(float{});
      break;
    case DType::bf16:
      f(__nv_bfloat16{});
      break;
    case DType::f64:
      f(double{});
      break;
    case DType::i32:
      f(int32_t{});
      break;
    case DType::u16:
      f(uint16_t{});
      break;
  }
}

inline void check_stat(const Tensor& t, const char* op, const char* what) {
  NDT_CHECK(t.dtype() == DType::f32, op, ": ", what, " must be float32 on CUDA, got ", t.desc());
}

// ---- device load/store -----------------------------------------------------------------
__device__ __forceinline__ float load(float x) { return x; }
__device__ __forceinline__ float load(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T store(float v);
template <>
__device__ __forceinline__ float store<float>(float v) {
  return v;
}
// round to nearest even, like float_to_bf16 in tensor/dtype.h
template <>
__device__ __forceinline__ __nv_bfloat16 store<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// ---- deterministic reductions (fixed order for a fixed launch shape) --------------------
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Every thread of the block gets the result. blockDim.x a multiple of 32, at most 1024.
// Uses shared memory; safe to call several times in a row.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float shared[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // a previous call may still be reading shared
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const float id = kMax ? -INFINITY : 0.0f;
  float w = lane < nwarps ? shared[lane] : id;
  return kMax ? warp_max(w) : warp_sum(w);
}
__device__ __forceinline__ float block_sum(float v) { return block_reduce<false>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<true>(v); }

}  // namespace ndt::cuda
