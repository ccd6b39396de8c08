// The CUDA runtime of ndtrain: devices, one compute stream per device, stream-ordered
// allocation from the device's default memory pool, copies, and the cuBLAS handles.
//
// Memory: cudaMallocAsync/cudaFreeAsync on the compute stream, from the default pool with
// its release threshold at UINT64_MAX, so freed blocks stay in the pool for the next step
// instead of going back to the driver; trim_pool hands them back.
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/runtime.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace ndt::cuda {
namespace {

constexpr int kMaxDevices = 16;  // as in tensor/storage.cpp

struct DeviceState {
  std::once_flag stream_once, cublas_once, cublaslt_once;
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  std::atomic<bool> tf32{false};  // set_allow_tf32
  std::once_flag errors_once;
  ErrorRecord* errors = nullptr;  // device memory, zero while no kernel found anything
  // Pinned staging buffers for small host-to-device copies (memcpy): a copy from pageable
  // memory would wait for the stream; from pinned memory it is queued like a kernel.
  std::mutex staging_mu;
  struct Staging {
    void* host = nullptr;        // kStagingBytes of page-locked memory
    cudaEvent_t done = nullptr;  // recorded after the copy out of it was queued
  };
  std::vector<Staging> staging;  // kStagingSlots, used in turn
  size_t next_staging = 0;
};

constexpr size_t kStagingBytes = size_t(8) << 20;  // a batch of tokens fits many times over
constexpr size_t kStagingSlots = 4;

// Never destroyed: storages and handles may be released during static destruction, after
// which the CUDA runtime may already be gone.
DeviceState& state(int device) {
  static auto* states = new std::array<DeviceState, kMaxDevices>();
  NDT_CHECK(device >= 0 && device < device_count(), "cuda:", device, " does not exist (", device_count(),
            " CUDA device(s) visible)");
  NDT_CHECK(device < kMaxDevices, "cuda:", device, ": at most ", kMaxDevices, " devices are supported");
  return (*states)[device];
}

}  // namespace

bool compiled() { return true; }

namespace {
// cudaGetDeviceCount fails (no driver, no device, a driver older than the runtime) without
// aborting; that means zero devices, and the reason is kept for the messages.
struct DeviceQuery {
  int count = 0;
  std::string why;
};
const DeviceQuery& device_query() {
  static const DeviceQuery q = [] {
    DeviceQuery d;
    const cudaError_t e = cudaGetDeviceCount(&d.count);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the error so later calls do not see it
      d.count = 0;
      int driver = 0, runtime = 0;
      cudaDriverGetVersion(&driver);
      cudaRuntimeGetVersion(&runtime);
      if (e == cudaErrorInsufficientDriver && driver == 0)
        d.why = "no NVIDIA driver is installed";
      else if (e == cudaErrorInsufficientDriver)
        d.why = "the NVIDIA driver supports CUDA " + std::to_string(driver / 1000) + "." +
                std::to_string(driver % 1000 / 10) + " but this build needs " +
                std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) +
                ": update the driver";
      else
        d.why = cudaGetErrorString(e);
    } else if (d.count == 0) {
      d.why = "no CUDA device";
    }
    return d;
  }();
  return q;
}
}  // namespace

int device_count() { return device_query().count; }

std::string unavailable_reason() { return device_query().why; }

std::string device_name(int device) {
  cudaDeviceProp prop{};
  NDT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

namespace {
DeviceState& errors_of(int device) {
  DeviceState& s = state(device);
  std::call_once(s.errors_once, [&] {
    DeviceGuard g(device);
    void* d = nullptr;
    NDT_CUDA_CHECK(cudaMalloc(&d, sizeof(ErrorRecord)));  // once per device, outside the pool
    // zeroed on the compute stream (non-blocking: a plain cudaMemset on the legacy stream
    // would not be ordered before the kernels that write the record), once per device
    cudaStream_t s0 = stream(device);
    NDT_CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof(ErrorRecord), s0));
    NDT_CUDA_CHECK(cudaStreamSynchronize(s0));
    s.errors = static_cast<ErrorRecord*>(d);
  });
  return s;
}
}  // namespace

ErrorRecord* error_record(int device) { return errors_of(device).errors; }

// Called after the host waited for the device's stream (or the whole device): the record's
// 32 bytes come back with one small copy on the (idle) stream.
void check_kernel_errors(int device) {
  DeviceState& s = state(device);
  if (!s.errors) return;  // no kernel that records errors has run on this device
  DeviceGuard g(device);
  ErrorRecord r{};
  NDT_CUDA_CHECK(cudaMemcpyAsync(&r, s.errors, sizeof r, cudaMemcpyDeviceToHost, s.stream));
  NDT_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  if (r.code == 0) return;
  // reported once; the device is usable again
  NDT_CUDA_CHECK(cudaMemsetAsync(s.errors, 0, sizeof(ErrorRecord), s.stream));
  NDT_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  const int code = r.code;
  const long long index = r.index, value = r.value, limit = r.limit;
  const char* when = " (found by a CUDA kernel on cuda:";
  switch (static_cast<KernelError>(code)) {
    case KernelError::kEmbeddingId:
      NDT_FAIL("embedding: id ", value, " at position ", index, " is outside the table's ", limit, " rows",
               when, device, ")");
    case KernelError::kCrossEntropyTarget:
      NDT_FAIL("cross_entropy: target ", value, " at row ", index, " is outside the vocabulary [0, ", limit,
               ")", when, device, ")");
    default:
      NDT_FAIL("a CUDA kernel on cuda:", device, " reported error code ", code);
  }
}

void check_launch(const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    ::ndt::detail::throw_error(file, line, ::ndt::detail::cat("CUDA launch error: ", cudaGetErrorString(e)));
  static const bool sync = [] {
    const char* v = std::getenv("NDT_CUDA_SYNC");
    return v && std::string(v) == "1";
  }();
  if (!sync) return;
  const cudaError_t k = cudaDeviceSynchronize();
  if (k != cudaSuccess)
    ::ndt::detail::throw_error(
        file, line,
        ::ndt::detail::cat("CUDA kernel fault: ", cudaGetErrorString(k),
                           " (NDT_CUDA_SYNC=1: reported at the launch that caused it)"));
  int device = 0;
  NDT_CUDA_CHECK(cudaGetDevice(&device));
  check_kernel_errors(device);
}

bool available() { return device_count() > 0; }

void set_device(int device) {
  state(device);  // range check
  NDT_CUDA_CHECK(cudaSetDevice(device));
}

void set_allow_tf32(int device, bool allow) { state(device).tf32 = allow; }
bool allow_tf32(int device) { return state(device).tf32; }

cudaStream_t stream(int device) {
  DeviceState& s = state(device);
  std::call_once(s.stream_once, [&] {
    DeviceGuard g(device);
    NDT_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    NDT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&s.pool, device));
    uint64_t threshold = UINT64_MAX;  // keep freed memory in the pool
    NDT_CUDA_CHECK(cudaMemPoolSetAttribute(s.pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  });
  return s.stream;
}

cublasHandle_t cublas(int device) {
  DeviceState& s = state(device);
  std::call_once(s.cublas_once, [&] {
    cudaStream_t st = stream(device);
    DeviceGuard g(device);
    NDT_CUBLAS_CHECK(cublasCreate(&s.cublas));
    NDT_CUBLAS_CHECK(cublasSetStream(s.cublas, st));
  });
  return s.cublas;
}

cublasLtHandle_t cublaslt(int device) {
  DeviceState& s = state(device);
  std::call_once(s.cublaslt_once, [&] {
    DeviceGuard g(device);
    NDT_CUBLAS_CHECK(cublasLtCreate(&s.cublaslt));
  });
  return s.cublaslt;
}

void* alloc(size_t nbytes, int device) {
  cudaStream_t st = stream(device);
  DeviceState& s = state(device);
  DeviceGuard g(device);
  void* p = nullptr;
  cudaError_t err = cudaMallocFromPoolAsync(&p, nbytes, s.pool, st);
  if (err == cudaErrorMemoryAllocation) {
    // Freed blocks may still wait on the stream: let them finish, give unused memory back
    // to the driver, and try once more.
    cudaGetLastError();
    NDT_CUDA_CHECK(cudaStreamSynchronize(st));
    NDT_CUDA_CHECK(cudaMemPoolTrimTo(s.pool, 0));
    err = cudaMallocFromPoolAsync(&p, nbytes, s.pool, st);
  }
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    NDT_FAIL("out of CUDA memory on cuda:", device, " allocating ", nbytes, " bytes (", free_b >> 20,
             " MiB free of ", total_b >> 20,
             " MiB); reduce the batch size or "
             "enable activation checkpointing");
  }
  NDT_CUDA_CHECK(err);
  return p;
}

void free(void* p, int device) {
  if (!p) return;
  cudaStream_t st = stream(device);
  DeviceGuard g(device);
  NDT_CUDA_CHECK(cudaFreeAsync(p, st));
}

void trim_pool(int device) {
  if (!available()) return;
  cudaStream_t st = stream(device);
  DeviceState& s = state(device);
  DeviceGuard g(device);
  NDT_CUDA_CHECK(cudaStreamSynchronize(st));  // so blocks freed on the stream are releasable
  NDT_CUDA_CHECK(cudaMemPoolTrimTo(s.pool, 0));
}

size_t pool_reserved_bytes(int device) {
  stream(device);  // the pool is set up with the stream
  uint64_t reserved = 0;
  NDT_CUDA_CHECK(cudaMemPoolGetAttribute(state(device).pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  return static_cast<size_t>(reserved);
}

void memcpy(void* dst, const void* src, size_t nbytes, CopyKind kind, int device) {
  if (nbytes == 0) return;
  cudaStream_t st = stream(device);
  DeviceGuard g(device);
  const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                             : cudaMemcpyDeviceToDevice;
  if (kind == CopyKind::kHostToDevice && nbytes <= kStagingBytes) {
    // Through a pinned buffer: the caller's buffer is free once copied into it, and the
    // host does not wait for the device. A slot is reused only after its last copy is done.
    DeviceState& s = state(device);
    std::lock_guard<std::mutex> lock(s.staging_mu);
    if (s.staging.empty()) {  // all slots or none: a failed allocation leaves no half-made slot
      std::vector<DeviceState::Staging> slots(kStagingSlots);
      for (DeviceState::Staging& b : slots) {
        NDT_CUDA_CHECK(cudaHostAlloc(&b.host, kStagingBytes, cudaHostAllocDefault));
        NDT_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
      }
      s.staging = std::move(slots);
    }
    DeviceState::Staging& b = s.staging[s.next_staging];
    s.next_staging = (s.next_staging + 1) % s.staging.size();
    NDT_CUDA_CHECK(cudaEventSynchronize(b.done));  // returns at once if never recorded
    std::memcpy(b.host, src, nbytes);
    NDT_CUDA_CHECK(cudaMemcpyAsync(dst, b.host, nbytes, cudaMemcpyHostToDevice, st));
    NDT_CUDA_CHECK(cudaEventRecord(b.done, st));
    return;
  }
  NDT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, k, st));
  // The host buffer may be reused as soon as we return (and D2H results read at once).
  if (kind != CopyKind::kDeviceToDevice) {
    NDT_CUDA_CHECK(cudaStreamSynchronize(st));
    check_kernel_errors(device);
  }
}

void synchronize(int device) {
  cudaStream_t st = stream(device);
  DeviceGuard g(device);
  NDT_CUDA_CHECK(cudaStreamSynchronize(st));
  check_kernel_errors(device);
}

void* compute_stream(int device) { return stream(device); }

}  // namespace ndt::cuda
