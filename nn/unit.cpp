#include "nn/unit.h"

#include "autograd/checkpoint.h"

namespace ndt::nn {

UnitWrapper activation_checkpointing(int64_t every) {
  NDT_CHECK(every >= 1, "activation_checkpointing: every must be >= 1, got ", every);
  return [every](int64_t unit, const UnitFn& fn, const Tensor& x) {
    if (unit % every != 0) return fn(x);
    // fn is copied: backward recomputes it long after this call returned
    return autograd::checkpoint(
        [fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; }, {x})[0];
  };
}

UnitFn wrap_unit(const std::vector<UnitWrapper>& wrappers, int64_t unit, UnitFn fn) {
  for (const UnitWrapper& w : wrappers)
    fn = [w, unit, inner = std::move(fn)](const Tensor& x) { return w(unit, inner, x); };
  return fn;
}

}  // namespace ndt::nn
