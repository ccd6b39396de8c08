// ndtrain: the CUDA runtime as the rest of the code sees it (no CUDA headers here).
//
// Everything outside tensor/cuda talks to the GPU through these functions. When ndtrain is
// built without CUDA, available() is false and the others throw ndt::Error.
//
//   if (ndt::cuda::available()) { void* p = ndt::cuda::alloc(1 << 20, 0); ... }
#pragma once

#include <cstddef>
#include <string>

namespace ndt::cuda {

bool compiled();     // built with the CUDA backend
bool available();    // compiled() and at least one device is visible
int device_count();  // 0 when not available
// Why no device is available ("" when one is): no driver, no device, or a driver older than
// this build's CUDA runtime (with both versions), for the one line a user sees.
std::string unavailable_reason();
// The device's name as the driver gives it, e.g. "NVIDIA H100 80GB HBM3".
std::string device_name(int device);
void set_device(int device);

// float32 GEMMs on `device` may use TF32 tensor cores (inputs rounded to 10 mantissa bits,
// f32 accumulation: about 8x the f32 rate on A100/H100, a relative error near 1e-3).
// Off until asked for: train_gpt turns it on with train.tf32 (its default on GPUs), the
// tests compare against the CPU in strict f32. bf16 GEMMs are not affected.
void set_allow_tf32(int device, bool allow);
bool allow_tf32(int device);

// Stream-ordered allocation on the device's compute stream (cudaMallocAsync pool).
void* alloc(size_t nbytes, int device);
void free(void* p, int device);
void trim_pool(int device);  // release unused pool memory to the system
// Bytes the device's pool holds from the driver (in use or kept for reuse). Constant from
// one training step to the next once the pool has warmed up: no driver allocation.
size_t pool_reserved_bytes(int device);
// How many linear_forward calls (all devices) ran as one cuBLASLt GEMM with its bias / GELU
// epilogue rather than composed: lets a test see that the fused path really ran.
int64_t fused_linear_calls();

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
// Ordered on the device's compute stream. A copy to the host synchronizes before returning;
// one from the host returns once `src` may be reused: up to 8 MiB through a pinned staging
// buffer without waiting for the device (uploading a batch does not stall the queue), larger
// ones after the copy.
void memcpy(void* dst, const void* src, size_t nbytes, CopyKind kind, int device);
void synchronize(int device);

// The device's compute stream as an opaque handle (a cudaStream_t), for the one file that
// orders other streams against it (the NCCL communicator in dist/comm).
void* compute_stream(int device);

}  // namespace ndt::cuda
