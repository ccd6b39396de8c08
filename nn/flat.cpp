#include "nn/flat.h"

#include <algorithm>

#include "tensor/kernels.h"

namespace ndt::nn {

uint64_t name_hash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

int64_t FlatUnit::param_count() const {
  int64_t n = 0;
  for (const FlatParam& p : params) n += numel_of(p.spec.shape);
  return n;
}

void FlatParams::zero_grad() const {
  for (const FlatUnit& u : units) kernels::fill(u.grad, 0.0);
}

int64_t FlatParams::param_count() const {
  int64_t n = 0;
  for (const FlatUnit& u : units) n += u.param_count();
  return n;
}

const FlatParam* FlatParams::find(const std::string& name) const {
  for (const FlatUnit& u : units)
    for (const FlatParam& p : u.params)
      if (p.spec.name == name) return &p;
  return nullptr;
}

FlatParams materialize(const std::vector<UnitSpec>& specs, Device device, DType dtype, uint64_t seed) {
  FlatParams out;
  for (const UnitSpec& us : specs) {
    FlatUnit u;
    u.name = us.name;
    // decayed parameters first, registration order within each group
    std::vector<ParamSpec> order;
    for (const ParamSpec& p : us.params)
      if (p.weight_decay) order.push_back(p);
    for (const ParamSpec& p : us.params)
      if (!p.weight_decay) order.push_back(p);
    int64_t off = 0;
    bool in_decay = true;
    for (const ParamSpec& p : order) {
      if (in_decay && !p.weight_decay) {
        u.decay_end = off;
        in_decay = false;
      }
      u.params.push_back({p, off, Tensor()});
      off += (numel_of(p.shape) + kAlign - 1) / kAlign * kAlign;
    }
    if (in_decay) u.decay_end = off;
    u.numel = off;
    u.data = Tensor::zeros({u.numel}, dtype, device);
    u.grad = Tensor::zeros({u.numel}, dtype, device);
    for (FlatParam& fp : u.params) {
      fp.value = u.data.view_at(fp.offset, fp.spec.shape);
      switch (fp.spec.init.kind) {
        case Init::kNormal:
          kernels::fill_normal(fp.spec.init.rows >= 0 ? fp.value.narrow(0, 0, fp.spec.init.rows) : fp.value,
                               seed, name_hash(fp.spec.name), 0, 0.0f, fp.spec.init.std);
          break;
        case Init::kOnes:
          kernels::fill(fp.value, 1.0);
          break;
        case Init::kZeros:
          break;  // the buffer starts zeroed
      }
      fp.value.set_requires_grad(true);
      fp.value.set_name(fp.spec.name);
      fp.value.set_grad(u.grad.view_at(fp.offset, fp.spec.shape));
      if (fp.spec.slot) *fp.spec.slot = fp.value;
    }
    out.units.push_back(std::move(u));
  }
  return out;
}

}  // namespace ndt::nn
