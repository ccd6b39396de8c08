// ndtrain: parameters in flat buffers (docs/design.md, decision 1).
//
// Each FSDP unit (a transformer block; the embeddings and final norm form one more) owns
// one contiguous buffer for its parameters and a twin for their gradients; every parameter
// is a view into the first, and its .grad a view into the second. The optimizer, clipping,
// collectives and checkpoints work on whole buffers, never per tensor.
//
// Layout of a unit's buffer: the parameters that take weight decay first, then the
// others, each starting at a multiple of kAlign elements (gaps are zero and stay zero).
// So elements [0, decay_end) decay and the rest do not: one fused optimizer pass per
// buffer needs only that one number.
//
//   std::vector<nn::UnitSpec> units = model.units();        // described, not allocated
//   nn::FlatParams params = nn::materialize(units, Device::cpu(), DType::f32, /*seed=*/1337);
//   // model.h[0].attn.c_attn.weight is now a view into params.units[1].data
//
// Initial values come from the counter-based RNG keyed by (seed, hash(name), element),
// so they do not depend on the layout or the device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/module.h"

namespace ndt::nn {

constexpr int64_t kAlign = 32;  // elements; keeps every view 64-byte aligned in bf16 and f32

struct UnitSpec {
  std::string name;  // e.g. "h.3" or "embeddings"
  std::vector<ParamSpec> params;
};

struct FlatParam {
  ParamSpec spec;
  int64_t offset = 0;  // in elements, into the unit's buffer
  Tensor value;        // view into FlatUnit::data
};

struct FlatUnit {
  std::string name;
  std::vector<FlatParam> params;  // in buffer order (decayed first)
  int64_t numel = 0;              // buffer length, padding included
  int64_t decay_end = 0;          // elements [0, decay_end) take weight decay
  Tensor data;                    // (numel) parameters
  Tensor grad;                    // (numel) gradients
  int64_t param_count() const;    // parameters without padding
};

struct FlatParams {
  std::vector<FlatUnit> units;
  void zero_grad() const;
  int64_t param_count() const;
  const FlatParam* find(const std::string& name) const;  // nullptr if absent
};

// Allocates each unit's buffers on `device`, points every spec's slot at its view (with
// requires_grad and .grad set), and initializes values from (seed, name, index).
FlatParams materialize(const std::vector<UnitSpec>& units, Device device, DType dtype, uint64_t seed);

// Stable 64-bit FNV-1a hash of a parameter name: its RNG stream id.
uint64_t name_hash(const std::string& name);

}  // namespace ndt::nn
