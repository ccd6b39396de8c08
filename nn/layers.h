// ndtrain: the GPT-2 building blocks. Each layer registers its parameters (nn/module.h)
// and its forward is a few ops; the backward comes from the ops (autograd/ops.h).
//
// Shape legend: B batch, T time, C channels, NH heads, HS = C/NH head size, V vocab.
// Linear weights use GPT-2's Conv1D layout (in, out): y = x @ W + b.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "autograd/ops.h"
#include "nn/module.h"

namespace ndt::nn {

// A function of one tensor: the communication a parallel layout puts around a layer.
using TensorFn = std::function<Tensor(const Tensor&)>;

// What a parallel layout does around one linear's GEMM, set by dist/tensor_parallel
// (column_parallel, row_parallel); a linear without one is this rank's alone. Linear reads
//
//   x -> input(): the input's collectives, inside the op -> x @ W -> reduce_output -> + b
//
// Column-parallel: every rank of the group holds the same input and its own columns of W;
// input() sums the input's gradient over the ranks in backward (Megatron-LM's f; sequence
// parallel: it also gathers the input from the ranks' parts in forward), run inside the
// linear's op so that backward overlaps it with the weight gradient's GEMM
// (linear_shared_input in autograd/ops.h). Row-parallel: each rank's output is a partial
// sum over its rows of W; reduce_output sums the ranks' (g; sequence parallel: keeps this
// rank's part of the sum), and the bias, whole on every rank, is added once after it.
class LinearComm {
 public:
  virtual ~LinearComm() = default;
  // The collectives on a shared input for this forward (empty: the input is this rank's own).
  virtual SharedInput input() const { return {}; }
  // true: the GEMM's output is a partial sum that reduce_output makes whole before the bias
  virtual bool reduces_output() const { return false; }
  // (..., out) partial sums -> the sum over the group (an autograd op: g)
  virtual Tensor reduce_output(const Tensor& partial) const { return partial; }
};

class Linear : public Module {
 public:
  // weight (in, out) ~ N(0, std), bias (out) = 0 when bias is true.
  Linear(int64_t in, int64_t out, bool bias, float std);
  Tensor forward(const Tensor& x) const;       // x (..., in) -> (..., out)
  Tensor forward_gelu(const Tensor& x) const;  // gelu(forward(x)), fused where it can be
  Tensor weight, bias;
  int64_t in, out;
  bool has_bias;                           // described with a bias (Llama's linears have none)
  std::shared_ptr<const LinearComm> comm;  // the parallel layout's collectives (nullptr: none)

 private:
  Tensor apply(const Tensor& x, bool gelu) const;
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

// RMSNorm (Llama, Qwen2): x / sqrt(mean(x^2) + eps) * w, no bias.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) const;  // (..., C) -> (..., C)
  Tensor weight;
  double eps;
};

// The Llama family's MLP (SwiGLU): down(silu(gate x) * up x), C -> I -> C, no biases. Under
// tensor parallelism gate and up are column-parallel and down row-parallel, each with its
// own LinearComm, as GPT-2's c_fc and c_proj.
class SwiGLU : public Module {
 public:
  SwiGLU(int64_t C, int64_t I, float std, float proj_std);
  Tensor forward(const Tensor& x) const;  // (B, T, C) -> (B, T, C)
  Linear gate_proj, up_proj, down_proj;
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
