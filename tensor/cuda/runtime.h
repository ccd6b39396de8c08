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

bool compiled();      // built with the CUDA backend
bool available();     // compiled() and at least one device is visible
int device_count();   // 0 when not available
// Why no device is available ("" when one is): no driver, no device, or a driver older than
// this build's CUDA runtime (with both versions), for the one line a user sees.
std::string unavailable_reason();
void set_device(int device);

// Stream-ordered allocation on the device's compute stream (cudaMallocAsync pool).
void* alloc(size_t nbytes, int device);
void free(void* p, int device);
void trim_pool(int device);  // release unused pool memory to the system

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
// Ordered on the device's compute stream; host copies synchronize before returning.
void memcpy(void* dst, const void* src, size_t nbytes, CopyKind kind, int device);
void synchronize(int device);

// The device's compute stream as an opaque handle (a cudaStream_t), for the one file that
// orders other streams against it (the NCCL communicator in dist/comm).
void* compute_stream(int device);

}  // namespace ndt::cuda
