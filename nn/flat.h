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
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace ndt::nn {

constexpr int64_t kAlign = 32;  // elements; keeps every view 64-byte aligned in bf16 and f32

struct UnitSpec {
  std::string name;  // e.g. "h.3" or "embeddings"
  std::vector<ParamSpec> params;
  // an MoE block's experts in a unit of their own ("h.3.experts"), sharded over the ranks that
  // hold the same experts (ShardSpec::experts; expert parallelism inside FSDP)
  bool experts = false;
};

struct FlatParam {
  ParamSpec spec;
  int64_t offset = 0;  // in elements, into the unit's buffer
  Tensor value;        // view into FlatUnit::data
};

struct FlatUnit {
  std::string name;
  std::vector<FlatParam> params;  // in buffer order (decayed first)
  int64_t numel = 0;              // buffer length, alignment gaps included
  int64_t decay_end = 0;          // elements [0, decay_end) take weight decay
  // Sharding (FSDP): the buffer is padded to padded_numel, a multiple of the shard count,
  // and this rank owns elements [shard_offset, shard_offset + shard_numel). Unsharded, the
  // one shard is the whole buffer.
  int64_t padded_numel = 0;
  int64_t shard_offset = 0;
  int64_t shard_numel = 0;
  int64_t shard_count = 1;
  bool experts = false;  // UnitSpec::experts: sharded over the expert shard group
  Tensor data;           // (shard_numel) this rank's parameters: what the optimizer updates
  Tensor grad;           // (shard_numel) their gradients
  Tensor full;           // (padded_numel) the whole buffer, which every parameter views
  Tensor full_grad;      // (padded_numel) its gradient, which every parameter's .grad views
  // Unsharded, full and data are one tensor (and full_grad and grad). Sharded, full and
  // full_grad start with their memory released: FSDP gathers into them when the unit runs
  // and releases them after (Storage::allocate/release), while the views stay valid.
  //
  // Mixed precision (a compute dtype below the master dtype, e.g. bf16 over f32): data and
  // grad stay in the master dtype (the optimizer's), full and full_grad are in the compute
  // dtype and never the same tensors as data and grad; compute_shard is the compute-dtype
  // copy of data that FSDP gathers from (unsharded: full itself). refresh_compute() makes
  // the copies after the optimizer has stepped; fold_grad() adds full_grad into grad.
  Tensor compute_shard;
  // units of experts are FSDP's also over a group of one rank, so that a block's two units
  // behave alike (there full borrows compute_shard's memory while "gathered": no copy)
  bool sharded() const { return shard_count > 1 || experts; }
  bool mixed() const { return full.dtype() != data.dtype(); }
  int64_t param_count() const;  // parameters without padding
};

struct FlatParams {
  std::vector<FlatUnit> units;
  void zero_grad() const;  // the shards' gradients (and, mixed and unsharded, full_grad)
  // Mixed precision: the compute-dtype copies of the parameters from the master shards
  // (after every optimizer step and every load); a no-op otherwise.
  void refresh_compute() const;
  int64_t param_count() const;
  // "1234 in 3 flat buffers: embeddings=... h.0=... h.1=..."
  std::string describe() const;
  const FlatParam* find(const std::string& name) const;  // nullptr if absent
  int64_t shard_bytes() const;                           // data + grad of every shard
};

// Which part of every buffer this rank holds: shard `rank` of `count`. Units of experts
// (UnitSpec::experts) are cut by `experts` when it is set: under expert parallelism inside
// FSDP only the ranks holding the same experts share them.
struct ShardSpec {
  ShardSpec(int64_t r = 0, int64_t n = 1) : rank(r), count(n) {}
  int64_t rank, count;
  struct Part {
    int64_t rank = 0, count = 0;  // count 0: as the other units
  } experts;
  ShardSpec of(const UnitSpec& u) const {  // the shard of u's buffer this rank holds
    return u.experts && experts.count > 0 ? ShardSpec{experts.rank, experts.count} : *this;
  }
};

// The layout of each unit's buffer (parameter offsets, decay_end, numel, the shard) without
// allocating anything: what materialize allocates, and where a checkpoint's whole buffers
// keep each parameter. data/grad/full/full_grad and the parameters' values stay undefined.
std::vector<FlatUnit> flat_layout(const std::vector<UnitSpec>& units, ShardSpec shard = {});

// Allocates each unit's buffers on `device`, points every spec's slot at its view (with
// requires_grad and .grad set), and initializes values from (seed, name, index). With a
// ShardSpec of count > 1, only this rank's shard is allocated and initialized: element i
// of a parameter gets the same value on every layout, and no rank holds the whole model.
// With compute_dtype set and different from dtype, mixed precision: dtype is the master
// (the optimizer's) and the parameters the model computes with are compute_dtype copies.
// frozen: parameters that are never trained (a LoRA run's base model): no gradient buffers
// (grad and full_grad stay undefined) and no requires_grad, so the ops that read them skip
// their weight gradients; nothing steps or reduces them.
FlatParams materialize(const std::vector<UnitSpec>& units, Device device, DType dtype, uint64_t seed,
                       ShardSpec shard = {}, std::optional<DType> compute_dtype = std::nullopt,
                       bool frozen = false);

// Mixed precision, unsharded: grad += full_grad (converted), then full_grad = 0; no-op when
// full_grad is grad.
void fold_grad(const FlatUnit& u);

// The elements of parameter p that this rank's shard of unit u holds: [begin, end) as
// offsets into the shard (u.grad, u.data); empty (begin >= end) when it holds none.
struct ShardPart {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end > begin ? end - begin : 0; }
};
ShardPart shard_part(const FlatUnit& u, const FlatParam& p);

// Calls fn(offset in the shard, global element index, length) for every run of parameter
// p's elements that this rank's shard of unit u holds: its tensor-parallel slice of p, and
// of that the part inside [shard_offset, shard_offset + shard_numel). Within a run both the
// shard offsets and the global indices are contiguous.
void for_each_shard_run(const FlatUnit& u, const FlatParam& p,
                        const std::function<void(int64_t dst, int64_t global, int64_t len)>& fn);

// Stable 64-bit FNV-1a hash of a parameter name: its RNG stream id.
uint64_t name_hash(const std::string& name);

}  // namespace ndt::nn
