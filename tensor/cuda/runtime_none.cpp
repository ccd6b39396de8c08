// The CUDA runtime entry points of a CPU-only build: nothing is available, and any use
// says how to get a CUDA build.
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace ndt::cuda {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  NDT_FAIL(what,
           ": ndtrain was built without CUDA; rebuild with -DNDT_CUDA=ON on a machine "
           "with the CUDA toolkit, or use device cpu");
}
}  // namespace

bool compiled() { return false; }
bool available() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "this build has no CUDA backend"; }
std::string device_name(int) { no_cuda("device_name"); }
void set_device(int) { no_cuda("set_device"); }
void set_allow_tf32(int, bool) { no_cuda("set_allow_tf32"); }
bool allow_tf32(int) { return false; }
void* alloc(size_t, int) { no_cuda("cuda alloc"); }
void free(void*, int) { no_cuda("cuda free"); }
void trim_pool(int) {}
size_t pool_reserved_bytes(int) { return 0; }
int64_t fused_linear_calls() { return 0; }
void memcpy(void*, const void*, size_t, CopyKind, int) { no_cuda("cuda memcpy"); }
void synchronize(int) {}
void* compute_stream(int) { no_cuda("compute_stream"); }

}  // namespace ndt::cuda
