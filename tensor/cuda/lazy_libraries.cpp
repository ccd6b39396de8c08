// cuBLAS, cuBLASLt and NVRTC, loaded on first use: the entry points ndtrain (and the cuDNN
// frontend, for NVRTC) calls, each forwarding to the real one in its library, which the first
// call opens (dlopen).
//
// Linked as ordinary libraries, they are mapped and relocated when the program starts, and
// that alone makes ~150 MiB (cuBLAS and cuBLASLt) and ~30 MiB (NVRTC) of every process
// resident -- also a run on CPU that never touches a GPU. Loaded here, a CUDA build's CPU run
// is as light as a CPU build's; the first GEMM on a GPU pays the load instead (once per
// process).
//
//   cublasHandle_t h;
//   cublasCreate(&h);  // opens libcublas.so.<major> (and with it libcublasLt), then creates
//
// Each library is looked up by its soname first (LD_LIBRARY_PATH, the program's runpath), then
// at the full path CMake found it at (NDT_CUBLAS_PATH, ...). A library that cannot be opened
// is one ndt::Error naming it and dlopen's reason. To call another function of these
// libraries, add its forwarder below: without one the link fails, naming the function.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>
#ifdef NDT_NVRTC_SONAME
#include <nvrtc.h>
#endif

#include <mutex>
#include <string>

#include "tensor/error.h"

namespace ndt::cuda {
namespace {

// One shared library, opened once (thread-safe), never closed: handles made from it live
// until the process ends.
class LazyLibrary {
 public:
  LazyLibrary(const char* soname, const char* path) : soname_(soname), path_(path) {}
  void* symbol(const char* name) {
    std::call_once(once_, [&] {
      handle_ = ::dlopen(soname_, RTLD_NOW | RTLD_LOCAL);
      if (!handle_) {
        const std::string why = ::dlerror();
        handle_ = ::dlopen(path_, RTLD_NOW | RTLD_LOCAL);
        if (!handle_) error_ = why + "; " + ::dlerror();
      }
    });
    NDT_CHECK(handle_ != nullptr, "cannot load ", soname_, " (", error_,
              "): put the CUDA toolkit's library folder on LD_LIBRARY_PATH");
    void* f = ::dlsym(handle_, name);
    NDT_CHECK(f != nullptr, soname_, " has no ", name, ": it is older than the one ndtrain was built with");
    return f;
  }

 private:
  const char* soname_;
  const char* path_;
  std::once_flag once_;
  void* handle_ = nullptr;
  std::string error_;
};

LazyLibrary& cublas_lib() {
  static LazyLibrary lib(NDT_CUBLAS_SONAME, NDT_CUBLAS_PATH);
  return lib;
}
LazyLibrary& cublaslt_lib() {
  static LazyLibrary lib(NDT_CUBLASLT_SONAME, NDT_CUBLASLT_PATH);
  return lib;
}
#ifdef NDT_NVRTC_SONAME
LazyLibrary& nvrtc_lib() {
  static LazyLibrary lib(NDT_NVRTC_SONAME, NDT_NVRTC_PATH);
  return lib;
}
#endif

}  // namespace

// f, the real function, called with the arguments: their types are the forwarder's parameter
// types, whose declaration in cublas_api.h / cublasLt.h gave it C linkage and checked them.
template <typename R, typename... A>
R call(void* f, A... args) {
  return reinterpret_cast<R (*)(A...)>(f)(args...);
}
}  // namespace ndt::cuda

// The body of a forwarder: the real function, looked up once per function, then called.
#define NDT_FORWARD(lib, R, fn, ...)                      \
  static void* const real = ndt::cuda::lib().symbol(#fn); \
  return ndt::cuda::call<R>(real, __VA_ARGS__)

// ---- cuBLAS (libcublas) ----------------------------------------------------------------------
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  NDT_FORWARD(cublas_lib, cublasStatus_t, cublasCreate_v2, handle);
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  NDT_FORWARD(cublas_lib, cublasStatus_t, cublasSetStream_v2, handle, stream);
}
const char* cublasGetStatusName(cublasStatus_t status) {
  NDT_FORWARD(cublas_lib, const char*, cublasGetStatusName, status);
}
const char* cublasGetStatusString(cublasStatus_t status) {
  NDT_FORWARD(cublas_lib, const char*, cublasGetStatusString, status);
}
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                            int n, int k, const void* alpha, const void* A, cudaDataType Atype, int lda,
                            const void* B, cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
  NDT_FORWARD(cublas_lib, cublasStatus_t, cublasGemmEx, handle, transa, transb, m, n, k, alpha, A, Atype, lda,
              B, Btype, ldb, beta, C, Ctype, ldc, computeType, algo);
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k, const void* alpha,
                                          const void* A, cudaDataType Atype, int lda, long long int strideA,
                                          const void* B, cudaDataType Btype, int ldb, long long int strideB,
                                          const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  NDT_FORWARD(cublas_lib, cublasStatus_t, cublasGemmStridedBatchedEx, handle, transa, transb, m, n, k, alpha,
              A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
              computeType, algo);
}

// ---- cuBLASLt (libcublasLt) ------------------------------------------------------------------
cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  NDT_FORWARD(cublaslt_lib, cublasStatus_t, cublasLtCreate, handle);
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  NDT_FORWARD(cublaslt_lib, cublasStatus_t, cublasLtMatmulDescCreate, desc, compute, scale);
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  NDT_FORWARD(cublaslt_lib, cublasStatus_t, cublasLtMatmulDescDestroy, desc);
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  NDT_FORWARD(cublaslt_lib, cublasStatus_t, cublasLtMatmulDescSetAttribute, desc, attr, buf, size);
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  NDT_FORWARD(cublaslt_lib, cublasStatus_t, cublasLtMatmulPreferenceCreate, pref);
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  NDT_FORWARD(cublaslt_lib, cublasStatus_t, cublasLtMatmulPreferenceDestroy, pref);
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  NDT_FORWARD(cublaslt_lib, cublasStatus_t, cublasLtMatmulPreferenceSetAttribute, pref, attr, buf, size);
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  NDT_FORWARD(cublaslt_lib, cublasStatus_t, cublasLtMatrixLayoutCreate, layout, type, rows, cols, ld);
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  NDT_FORWARD(cublaslt_lib, cublasStatus_t, cublasLtMatrixLayoutDestroy, layout);
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  NDT_FORWARD(cublaslt_lib, cublasStatus_t, cublasLtMatmulAlgoGetHeuristic, handle, desc, a, b, c, d, pref,
              requested, results, returned);
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t adesc, const void* B,
                              cublasLtMatrixLayout_t bdesc, const void* beta, const void* C,
                              cublasLtMatrixLayout_t cdesc, void* D, cublasLtMatrixLayout_t ddesc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  NDT_FORWARD(cublaslt_lib, cublasStatus_t, cublasLtMatmul, handle, desc, alpha, A, adesc, B, bdesc, beta, C,
              cdesc, D, ddesc, algo, workspace, workspace_bytes, stream);
}

// ---- NVRTC (libnvrtc), which the cuDNN frontend's own engines call ----------------------------
#ifdef NDT_NVRTC_SONAME
nvrtcResult nvrtcVersion(int* major, int* minor) {
  NDT_FORWARD(nvrtc_lib, nvrtcResult, nvrtcVersion, major, minor);
}
const char* nvrtcGetErrorString(nvrtcResult result) {
  NDT_FORWARD(nvrtc_lib, const char*, nvrtcGetErrorString, result);
}
nvrtcResult nvrtcCreateProgram(nvrtcProgram* prog, const char* src, const char* name, int num_headers,
                               const char* const* headers, const char* const* include_names) {
  NDT_FORWARD(nvrtc_lib, nvrtcResult, nvrtcCreateProgram, prog, src, name, num_headers, headers,
              include_names);
}
nvrtcResult nvrtcDestroyProgram(nvrtcProgram* prog) {
  NDT_FORWARD(nvrtc_lib, nvrtcResult, nvrtcDestroyProgram, prog);
}
nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int num_options, const char* const* options) {
  NDT_FORWARD(nvrtc_lib, nvrtcResult, nvrtcCompileProgram, prog, num_options, options);
}
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t* size) {
  NDT_FORWARD(nvrtc_lib, nvrtcResult, nvrtcGetProgramLogSize, prog, size);
}
nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char* log) {
  NDT_FORWARD(nvrtc_lib, nvrtcResult, nvrtcGetProgramLog, prog, log);
}
nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t* size) {
  NDT_FORWARD(nvrtc_lib, nvrtcResult, nvrtcGetPTXSize, prog, size);
}
nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char* ptx) {
  NDT_FORWARD(nvrtc_lib, nvrtcResult, nvrtcGetPTX, prog, ptx);
}
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t* size) {
  NDT_FORWARD(nvrtc_lib, nvrtcResult, nvrtcGetCUBINSize, prog, size);
}
nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char* cubin) {
  NDT_FORWARD(nvrtc_lib, nvrtcResult, nvrtcGetCUBIN, prog, cubin);
}
#endif
