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
  for (const FlatUnit& u : units) {
    kernels::fill(u.grad, 0.0);
    if (u.mixed() && !u.sharded()) kernels::fill(u.full_grad, 0.0);
  }
}

void FlatParams::refresh_compute() const {
  for (const FlatUnit& u : units)
    if (u.mixed()) u.compute_shard.copy_(u.data);  // rounds to the compute dtype
}

void fold_grad(const FlatUnit& u) {
  if (u.full_grad.same(u.grad)) return;
  NDT_CHECK(!u.sharded(), "fold_grad: unit ", u.name, " is sharded (FSDP reduces full_grad itself)");
  kernels::add_(u.grad, u.full_grad.to(u.grad.dtype()));
  kernels::fill(u.full_grad, 0.0);
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

int64_t FlatParams::shard_bytes() const {
  int64_t b = 0;
  for (const FlatUnit& u : units)
    b += static_cast<int64_t>(u.data.nbytes() + (u.grad.defined() ? u.grad.nbytes() : 0));
  return b;
}

ShardPart shard_part(const FlatUnit& u, const FlatParam& p) {
  const int64_t s0 = u.shard_offset, s1 = s0 + u.shard_numel;
  return {std::max(p.offset, s0) - s0, std::min(p.offset + numel_of(p.spec.shape), s1) - s0};
}

void for_each_shard_run(const FlatUnit& u, const FlatParam& p,
                        const std::function<void(int64_t dst, int64_t global, int64_t len)>& fn) {
  const int64_t n = numel_of(p.spec.shape), s0 = u.shard_offset, s1 = s0 + u.shard_numel;
  const int64_t a = std::max(p.offset, s0) - p.offset, b = std::min(p.offset + n, s1) - p.offset;
  for_each_tp_run(p.spec, a, b, [&](int64_t i, int64_t g, int64_t len) { fn(p.offset + i - s0, g, len); });
}

namespace {

// A tensor of `numel` elements whose storage starts released (no memory until gathered).
Tensor released_buffer(int64_t numel, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(numel) * dtype_size(dtype), device, false);
  impl->shape = {numel};
  impl->strides = {1};
  impl->dtype = dtype;
  return Tensor(impl);
}

}  // namespace

namespace {

// Initializes the elements [lo, hi) of parameter p (indices within this rank's part of
// it), which live in `dst` (hi - lo elements): the same values as the same elements of the
// whole parameter initialized on one process.
void init_range(const FlatParam& p, const Tensor& dst, int64_t lo, int64_t hi, uint64_t seed) {
  const Init& init = p.spec.init;
  switch (init.kind) {
    case Init::kNormal: {
      // only the first `rows` rows are drawn (vocabulary padding stays zero)
      const Shape& g = p.spec.global_shape();
      const int64_t drawn = init.rows >= 0 ? init.rows * (numel_of(g) / g[0]) : numel_of(g);
      for_each_tp_run(p.spec, lo, hi, [&](int64_t i, int64_t start, int64_t n) {
        const int64_t live = std::max<int64_t>(0, std::min(n, drawn - start));
        if (live > 0)
          kernels::fill_normal(dst.narrow(0, i - lo, live), seed, name_hash(p.spec.name),
                               static_cast<uint64_t>(start), 0.0f, init.std);
      });
      break;
    }
    case Init::kUniform:
      for_each_tp_run(p.spec, lo, hi, [&](int64_t i, int64_t start, int64_t n) {
        kernels::fill_uniform(dst.narrow(0, i - lo, n), seed, name_hash(p.spec.name),
                              static_cast<uint64_t>(start), -init.std, init.std);
      });
      break;
    case Init::kOnes:
      kernels::fill(dst, 1.0);
      break;
    case Init::kZeros:
      break;  // the buffer starts zeroed
  }
}

}  // namespace

std::vector<FlatUnit> flat_layout(const std::vector<UnitSpec>& specs, ShardSpec all) {
  std::vector<FlatUnit> out;
  for (const UnitSpec& us : specs) {
    const ShardSpec shard = all.of(us);
    NDT_CHECK(shard.count >= 1 && shard.rank >= 0 && shard.rank < shard.count, "materialize: bad shard ",
              shard.rank, " of ", shard.count, " for unit ", us.name);
    FlatUnit u;
    u.name = us.name;
    u.experts = us.experts;
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
    u.padded_numel = (off + shard.count - 1) / shard.count * shard.count;
    u.shard_numel = u.padded_numel / shard.count;
    u.shard_offset = shard.rank * u.shard_numel;
    u.shard_count = shard.count;
    out.push_back(std::move(u));
  }
  return out;
}

FlatParams materialize(const std::vector<UnitSpec>& specs, Device device, DType dtype, uint64_t seed,
                       ShardSpec all, std::optional<DType> compute_dtype, bool frozen) {
  const DType cd = compute_dtype.value_or(dtype);
  FlatParams out;
  for (FlatUnit& u : flat_layout(specs, all)) {
    const int64_t shards = u.sharded() ? std::max<int64_t>(u.shard_count, 2) : 1;  // 1: full is data
    u.data = Tensor::zeros({u.shard_numel}, dtype, device);
    if (!frozen) u.grad = Tensor::zeros({u.shard_numel}, dtype, device);
    if (shards == 1 && cd == dtype) {
      u.full = u.data;
      u.full_grad = u.grad;
    } else if (shards == 1) {  // mixed precision: the model's copy, and its gradient
      u.full = Tensor::zeros({u.padded_numel}, cd, device);
      if (!frozen) u.full_grad = Tensor::zeros({u.padded_numel}, cd, device);
    } else {
      u.full = released_buffer(u.padded_numel, cd, device);
      if (!frozen) u.full_grad = released_buffer(u.padded_numel, cd, device);
    }
    u.compute_shard = cd == dtype   ? u.data
                      : shards == 1 ? u.full
                                    : Tensor::zeros({u.shard_numel}, cd, device);
    const int64_t s0 = u.shard_offset, s1 = s0 + u.shard_numel;
    for (FlatParam& fp : u.params) {
      // this rank's part of the parameter: buffer elements [a, b)
      const int64_t a = std::max(fp.offset, s0), b = std::min(fp.offset + numel_of(fp.spec.shape), s1);
      if (a < b) init_range(fp, u.data.narrow(0, a - s0, b - a), a - fp.offset, b - fp.offset, seed);
      fp.value = u.full.view_at(fp.offset, fp.spec.shape);
      fp.value.set_name(fp.spec.name);
      if (!frozen) {
        fp.value.set_requires_grad(true);
        fp.value.set_grad(u.full_grad.view_at(fp.offset, fp.spec.shape));
      }
      if (fp.spec.slot) *fp.spec.slot = fp.value;
    }
    out.units.push_back(std::move(u));
  }
  out.refresh_compute();  // the model computes with the initial values too
  return out;
}

std::string FlatParams::describe() const {
  std::string s = std::to_string(param_count()) + " in " + std::to_string(units.size()) + " flat buffers:";
  for (const FlatUnit& u : units) s += " " + u.name + "=" + std::to_string(u.param_count());
  return s;
}

}  // namespace ndt::nn
