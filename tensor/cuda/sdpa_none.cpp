// The fused-attention entry points of a CPU-only build (tensor/cuda/sdpa.h): never supported,
// so attention always takes the composed path.
#include "tensor/cuda/sdpa.h"
#include "tensor/error.h"

namespace ndt::cuda {

bool sdpa_compiled() { return false; }
bool sdpa_supported(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, std::string* why) {
  if (why) *why = "ndtrain was built without CUDA";
  return false;
}
bool sdpa_prepare(const Tensor&, const Tensor&, const Tensor&, bool, double, bool, std::string* why) {
  if (why) *why = "ndtrain was built without CUDA";
  return false;
}
void sdpa_forward(const Tensor&, const Tensor&, const Tensor&, bool, double, const Tensor&, const Tensor&) {
  NDT_FAIL("sdpa_forward: ndtrain was built without CUDA");
}
void sdpa_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                   bool, double, const Tensor&, const Tensor&, const Tensor&) {
  NDT_FAIL("sdpa_backward: ndtrain was built without CUDA");
}

}  // namespace ndt::cuda
