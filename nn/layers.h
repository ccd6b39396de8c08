// ndtrain: the GPT-2 building blocks. Each layer registers its parameters (nn/module.h)
// and its forward is a few ops; the backward comes from the ops (autograd/ops.h).
//
// Shape legend: B batch, T time, C channels, NH heads, HS = C/NH head size, V vocab.
// Linear weights use GPT-2's Conv1D layout (in, out): y = x @ W + b.
#pragma once

#include <cstdint>
#include <functional>

#include "autograd/ops.h"
#include "nn/module.h"

namespace ndt::nn {

// A function of one tensor: the communication that tensor parallelism puts around a layer.
using TensorFn = std::function<Tensor(const Tensor&)>;

class Linear : public Module {
 public:
  // weight (in, out) ~ N(0, std), bias (out) = 0 when bias is true.
  Linear(int64_t in, int64_t out, bool bias, float std);
  Tensor forward(const Tensor& x) const;       // x (..., in) -> (..., out)
  Tensor forward_gelu(const Tensor& x) const;  // gelu(forward(x)), fused where it can be
  Tensor weight, bias;
  int64_t in, out;
  // Tensor parallelism (dist/tensor_parallel) sets these: a column-parallel layer copies
  // its input to the group first (f), a row-parallel one sums its partial outputs over the
  // group (g) before adding the bias, which is whole on every rank.
  TensorFn before, reduce_before_bias;
  // Sequence parallelism, on a column-parallel layer: while gathered_when() is true the
  // input comes in parts of the sequence, and the layer runs linear_gathered with these
  // (all-gather, reduce-scatter) instead of `before`: it keeps only the part for backward.
  std::function<bool()> gathered_when;
  TensorFn gather_input, scatter_input_grad;
};

class Embedding : public Module {
 public:
  // live_rows < num: rows past it (vocab padding) start at zero; -1: all rows drawn
  Embedding(int64_t num, int64_t dim, float std, int64_t live_rows = -1);
  Tensor forward(const Tensor& ids) const;  // ids (...) i32 -> (..., dim)
  Tensor weight;                            // (num, dim)
  // Vocabulary parallelism replaces the lookup (each rank holds a slice of the rows).
  std::function<Tensor(const Tensor& ids, const Tensor& table)> lookup;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) const;  // (..., C) -> (..., C)
  Tensor weight, bias;
  double eps;
};

// c_fc (C -> 4C), GELU, c_proj (4C -> C)
class MLP : public Module {
 public:
  MLP(int64_t C, float std, float proj_std);
  Tensor forward(const Tensor& x) const;  // (B, T, C) -> (B, T, C)
  Linear c_fc, c_proj;
};

// c_attn (C -> 3C) gives q, k, v; causal attention per head; c_proj (C -> C).
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t C, int64_t n_head, float std, float proj_std);
  // x (B, T, C) at positions pos_offset.. -> (B, T, C); the causal mask uses positions
  Tensor forward(const Tensor& x, int64_t pos_offset = 0) const;
  // The attention core, between the two linears: qkv (B, T, 3C) -> heads, causal softmax
  // attention, heads merged -> (B, T, C). It has no parameters; selective activation
  // checkpointing recomputes it in backward (nn::recompute_selected) instead of keeping
  // what it saves (on CPU the fused kernel's log-sum-exps; composed, q, k, v, the
  // (B*NH, T, T) probabilities and the output). Without `attend`, ndt::self_attention.
  Tensor core(const Tensor& qkv, int64_t pos_offset = 0) const;
  Linear c_attn, c_proj;
  int64_t n_head;  // heads on this rank (n_head / tp under tensor parallelism)
  // Context parallelism replaces the attention core (ring attention over the sequence
  // pieces of the group): q, k, v (B,NH,T,HS) -> (B,NH,T,HS).
  std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos_offset)> attend;
};

// Pre-LN transformer block: x + attn(ln_1(x)), then + mlp(ln_2(x)).
class Block : public Module {
 public:
  Block(int64_t C, int64_t n_head, float std, float proj_std);
  Tensor forward(const Tensor& x, int64_t pos_offset = 0) const;  // (B, T, C) -> (B, T, C)
  LayerNorm ln_1;
  CausalSelfAttention attn;
  LayerNorm ln_2;
  MLP mlp;
};

}  // namespace ndt::nn
