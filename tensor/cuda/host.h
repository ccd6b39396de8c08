// ndtrain CUDA backend: its host side, shared by every tensor/cuda file (private to
// tensor/cuda): the check macros for CUDA runtime and cuBLAS calls, each device's stream and
// handles, DeviceGuard and Launch. common.cuh includes this with the device-side helpers; a
// file of the backend without kernels, built by the host compiler alone (sdpa.cpp: the cuDNN
// frontend's graphs), includes only this.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "tensor/error.h"
#include "tensor/tensor.h"

// ---- check macros ------------------------------------------------------------------
#define NDT_CUDA_CHECK(expr)                                                                         \
  do {                                                                                               \
    const cudaError_t ndt_err_ = (expr);                                                             \
    if (ndt_err_ != cudaSuccess)                                                                     \
      ::ndt::detail::throw_error(__FILE__, __LINE__,                                                 \
                                 ::ndt::detail::cat("CUDA error ", cudaGetErrorName(ndt_err_), " (", \
                                                    cudaGetErrorString(ndt_err_), ") in ", #expr));  \
  } while (0)

#define NDT_CUBLAS_CHECK(expr)                                                                           \
  do {                                                                                                   \
    const cublasStatus_t ndt_st_ = (expr);                                                               \
    if (ndt_st_ != CUBLAS_STATUS_SUCCESS)                                                                \
      ::ndt::detail::throw_error(__FILE__, __LINE__,                                                     \
                                 ::ndt::detail::cat("cuBLAS error ", cublasGetStatusName(ndt_st_), " (", \
                                                    cublasGetStatusString(ndt_st_), ") in ", #expr));    \
  } while (0)

// After a <<<...>>> launch: a bad configuration is reported here; faults inside the kernel
// surface at the next synchronizing call -- or here, when the environment sets
// NDT_CUDA_SYNC=1 (debugging: every launch is followed by a device synchronize).
#define NDT_CUDA_CHECK_LAUNCH() ::ndt::cuda::check_launch(__FILE__, __LINE__)

namespace ndt::cuda {

// NDT_CUDA_CHECK_LAUNCH's work: the launch error, and with NDT_CUDA_SYNC=1 the kernel's own.
void check_launch(const char* file, int line);

// ---- per-device runtime state (runtime.cu) -------------------------------------------
cudaStream_t stream(int device);        // the device's compute stream (non-blocking, lazy)
cublasHandle_t cublas(int device);      // bound to stream(device), lazy
cublasLtHandle_t cublaslt(int device);  // lazy; its calls take the stream

// Makes `device` current for the scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    NDT_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device_) NDT_CUDA_CHECK(cudaSetDevice(device_));
  }
  ~DeviceGuard() {
    if (prev_ != device_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int prev_ = 0;
};

// What a launcher needs: the tensor's device made current, and its stream.
struct Launch {
  explicit Launch(const Tensor& t) : device(t.device().index), guard(device), stream(cuda::stream(device)) {}
  int device;
  DeviceGuard guard;
  cudaStream_t stream;
};

}  // namespace ndt::cuda
