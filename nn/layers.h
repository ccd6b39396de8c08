// ndtrain: the building blocks of GPT-2 and of the Llama family. Each layer registers its parameters
// (nn/module.h) and its forward is a few ops; the backward comes from the ops (autograd/ops.h).
//
// Shape legend: B batch, T time, C channels, NH heads, HS = C/NH head size (Llama: or given), V vocab;
// Llama: NKV key/value heads, G = NH/NKV query heads per kv head, I the MLP's hidden size.
// Linear weights use GPT-2's Conv1D layout (in, out): y = x @ W + b.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "nn/module.h"

namespace ndt::nn {

// A function of one tensor: the communication a parallel layout puts around a layer.
using TensorFn = std::function<Tensor(const Tensor&)>;
// Context parallelism replaces an attention core with ring attention over the sequence
// pieces of its group: q (B,NH,T,HS), k, v (B,NKV,T,HS) at positions pos_offset.. ->
// (B,NH,T,HS). docs: packed rows' documents as the model was given them (GPT::forward;
// under context parallelism the whole rows'), or undefined.
using AttendFn = std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos_offset,
                                      const Tensor& docs)>;

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
  // input()'s collectives as an autograd op of their own: x (this rank's, or its part of the
  // sequence) -> the whole input every rank's GEMM sees (f). A linear with a LoRA adapter
  // runs it once and gives the result to both its GEMM and its adapter.
  virtual Tensor whole_input(const Tensor& x) const { return x; }
};

// A trainable addition to a linear's output, from the same input (LoRA's adapters,
// nn/lora.h): x (N, in) -> (N, out), added to x @ W + b before any activation. Under tensor
// parallelism (a LinearComm) it sees what this rank's GEMM sees: column-parallel, the whole
// input, giving this rank's output columns; row-parallel, this rank's input rows, giving a
// partial sum that the linear adds to its GEMM's before reduce_output sums the ranks'.
class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  virtual Tensor delta(const Tensor& x) const = 0;
};

class Linear : public Module {
 public:
  // weight (in, out) ~ N(0, std), bias (out) = 0 when bias is true.
  Linear(int64_t in, int64_t out, bool bias, float std);
  Tensor forward(const Tensor& x) const;       // x (..., in) -> (..., out)
  Tensor forward_gelu(const Tensor& x) const;  // gelu(forward(x)), fused where it can be
  Tensor weight, bias;
  int64_t in, out;
  bool has_bias;                                 // described with a bias (Llama's linears have none)
  std::shared_ptr<const LinearComm> comm;        // the parallel layout's collectives (nullptr: none)
  std::shared_ptr<const LinearAdapter> adapter;  // LoRA (nn/lora.h; nullptr: none)

 private:
  Tensor apply(const Tensor& x, bool gelu) const;
  Tensor apply_adapted(const Tensor& x, bool gelu) const;  // with `adapter`
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

// A normalization over the last dimension: LayerNorm or RMSNorm (a model's final norm is either).
class Norm : public Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;  // (..., C) -> (..., C)
};

class LayerNorm : public Norm {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Tensor forward(const Tensor& x) const override;  // (..., C) -> (..., C)
  Tensor weight, bias;
  double eps;
};

// RMSNorm (Llama, Qwen2): x / sqrt(mean(x^2) + eps) * w, no bias.
class RMSNorm : public Norm {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) const override;  // (..., C) -> (..., C)
  Tensor weight;
  double eps;
};

// The Llama family's MLP (SwiGLU): down(silu(gate x) * up x), C -> I -> C, no biases. Under
// tensor parallelism gate and up are column-parallel and down row-parallel, each with its
// own LinearComm, as GPT-2's c_fc and c_proj.
// How tensor parallelism splits a layer, as data (Megatron's pairs; torchtitan's plans):
// each linear column-parallel (its outputs, in `groups` blocks that split alike: q, k and v)
// or row-parallel (its inputs), and the counts every rank holds a part of (heads), each
// divided by tp. dist/tensor_parallel applies a plan without knowing the layer's class, so a
// new block kind says here, once, how it splits.
struct TensorParallelPlan {
  struct Split {
    Linear* linear;
    bool column;         // true: column-parallel; false: row-parallel
    int64_t groups = 1;  // column-parallel: the blocks of columns each split alike
  };
  struct Count {
    int64_t* value;
    const char* what;  // for the error: "heads", "key/value heads"
  };
  std::vector<Split> linears;
  std::vector<Count> counts;
  // Layers every rank holds whole but applies to its own heads only (Qwen3's q_norm, k_norm):
  // each rank's gradient of them is a partial sum, which the strategy sums over the tp group
  // (dist/strategy.h; transformers' "replicated_with_grad_allreduce").
  std::vector<Module*> partial_grads;
  TensorParallelPlan& operator+=(const TensorParallelPlan& o);
};

class SwiGLU : public Module {
 public:
  SwiGLU(int64_t C, int64_t I, float std, float proj_std);
  Tensor forward(const Tensor& x) const;  // (B, T, C) -> (B, T, C)
  // gate and up column-parallel (this rank's hidden units of each), down row-parallel
  TensorParallelPlan tensor_parallel_plan();
  Linear gate_proj, up_proj, down_proj;
};

// c_fc (C -> 4C), GELU, c_proj (4C -> C)
class MLP : public Module {
 public:
  MLP(int64_t C, float std, float proj_std);
  Tensor forward(const Tensor& x) const;      // (B, T, C) -> (B, T, C)
  TensorParallelPlan tensor_parallel_plan();  // c_fc column-parallel, c_proj row-parallel
  Linear c_fc, c_proj;
};

// c_attn (C -> 3C) gives q, k, v; causal attention per head; c_proj (C -> C).
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t C, int64_t n_head, float std, float proj_std);
  // x (B, T, C) at positions pos_offset.. -> (B, T, C); the causal mask uses positions;
  // docs (B, T) i32: packed rows, each document attends to itself (ndt::attention)
  Tensor forward(const Tensor& x, int64_t pos_offset = 0, const Tensor& docs = {}) const;
  // The attention core, between the two linears: qkv (B, T, 3C) -> heads, causal softmax
  // attention, heads merged -> (B, T, C). It has no parameters; selective activation
  // checkpointing recomputes it in backward (nn::recompute_selected) instead of keeping
  // what it saves (on CPU the fused kernel's log-sum-exps; composed, q, k, v, the
  // (B*NH, T, T) probabilities and the output). Without `attend`, ndt::self_attention.
  Tensor core(const Tensor& qkv, int64_t pos_offset = 0, const Tensor& docs = {}) const;
  Linear c_attn, c_proj;
  int64_t n_head;   // heads on this rank (n_head / tp under tensor parallelism)
  AttendFn attend;  // context parallelism's ring attention (empty: self_attention)
};

// Where a block's tokens sit in their sequences: the offset of the first (the causal mask's)
// and, for rotary embeddings, the cos and sin of every token's angles (B, T, HS/2)
// (models/rope.h; undefined for GPT-2, whose positions are added once at the embeddings);
// for packed rows the document of every token, docs (B, T) i32 (undefined: one per row).
// MoE blocks (nn/moe.h) leave their routers' statistics in `router` for the load-balancing
// loss (nullptr: none wanted).
struct RouterLoss;
struct Positions {
  int64_t offset = 0;
  Tensor cos, sin;
  Tensor docs;
  std::shared_ptr<RouterLoss> router;
};

// One of a block's linears as Hugging Face names its module inside the block (PEFT's LoRA
// target_modules match these names): "self_attn.q_proj", "mlp.c_fc". Its output columns are
// all of the linear's (part < 0), or part `part` of each of `groups` blocks of columns sized
// `sizes` (the Llama's packed c_attn: NKV groups of {G HS, HS, HS}, q, k and v).
struct LinearSite {
  std::string name;
  Linear* linear;
  int part = -1;
  int64_t groups = 1;
  std::vector<int64_t> sizes;
  int64_t out() const { return part < 0 ? linear->out : groups * sizes[static_cast<size_t>(part)]; }
};

// A decoder block of either architecture; the model runs its blocks through this.
class DecoderBlock : public Module {
 public:
  virtual Tensor forward(const Tensor& x, const Positions& pos) const = 0;  // (B, T, C) -> (B, T, C)
  // The attention core's replacement that context parallelism installs (ring attention)
  virtual AttendFn& attend() = 0;
  // Its split under tensor parallelism: each rank some heads and some MLP hidden units.
  virtual TensorParallelPlan tensor_parallel_plan() = 0;
  // Its linears under Hugging Face's names, in the order of its forward.
  virtual std::vector<LinearSite> linear_sites() = 0;
};

// GPT-2's pre-LN block: x + attn(ln_1(x)), then + mlp(ln_2(x)).
class Block : public DecoderBlock {
 public:
  Block(int64_t C, int64_t n_head, float std, float proj_std, double norm_eps = 1e-5);
  Tensor forward(const Tensor& x, const Positions& pos = {}) const override;
  AttendFn& attend() override { return attn.attend; }
  // c_attn column-parallel in three blocks (this rank's heads of q, of k and of v), c_proj
  // row-parallel (those heads' rows); the MLP's
  TensorParallelPlan tensor_parallel_plan() override;
  std::vector<LinearSite> linear_sites() override;  // attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj
  LayerNorm ln_1;
  CausalSelfAttention attn;
  LayerNorm ln_2;
  MLP mlp;
};

// The sizes and options of a Llama-family block (nn::LlamaBlock, nn::GroupedQueryAttention).
struct LlamaDims {
  int64_t C, n_head, n_kv_head, intermediate;
  bool qkv_bias;
  double norm_eps;
  int64_t head_dim = 0;  // HS; 0: C / n_head
  bool qk_norm = false;  // RMSNorms over each head of q and of k (Qwen3)
};

// The Llama family's attention (Llama 3, Qwen2, Qwen3, Mistral): grouped-query attention with
// rotary position embeddings. NH query heads share NKV key/value heads (NKV divides NH;
// G = NH / NKV query heads per group; NKV = 1 is multi-query attention), HS = C / NH unless
// given (Qwen3-0.6B: C 1024, NH 16, HS 128: q has NH HS = 2048 channels).
//
// q, k and v come from one linear, c_attn (C, NKV (G + 2) HS), whose columns are laid out
// by kv group: for group g, its G query heads (g G .. g G + G - 1), then k_g, then v_g.
// Query head h thus reads kv head h / G, as Hugging Face's repeat_kv does, and tensor
// parallelism splits c_attn's columns into whole groups (a plain column split when tp
// divides NKV). Hugging Face's separate q_proj, k_proj and v_proj are packed into it when a
// model is read, and unpacked when it is written (train/checkpoint/hf.h). c_proj (NH HS, C).
// Optional biases on q, k and v (Qwen2's attention_bias); none on c_proj. Optional q_norm and
// k_norm (Qwen3): an RMSNorm over the HS channels of every head of q and of k, one weight (HS)
// shared by all heads, applied after c_attn and before the rotary embeddings.
class GroupedQueryAttention : public Module {
 public:
  GroupedQueryAttention(const LlamaDims& d, float std, float proj_std);
  // x (B, T, C) at `pos` -> (B, T, C)
  Tensor forward(const Tensor& x, const Positions& pos) const;
  // The attention core, between the two linears: qkv (B, T, NKV (G+2) HS) -> q, k, v,
  // (q_norm, k_norm), rotary on q and k, causal attention with the shared kv heads ->
  // (B, T, NH HS). Its only parameters are the optional norms'; selective activation
  // checkpointing recomputes it in backward.
  Tensor core(const Tensor& qkv, const Positions& pos) const;
  // self_attn.{q,k,v}_proj (parts of c_attn), self_attn.o_proj
  std::vector<LinearSite> linear_sites();
  // c_attn's columns are laid out by kv group, so a plain column split gives each rank whole
  // groups (its kv heads and the query heads that read them); c_proj's rows of those query
  // heads; q_norm's and k_norm's gradients partial (each rank's heads)
  TensorParallelPlan tensor_parallel_plan();
  Linear c_attn, c_proj;
  std::unique_ptr<RMSNorm> q_norm, k_norm;  // (HS) each; nullptr without qk_norm
  int64_t n_head, n_kv_head, head_dim;      // heads on this rank (/ tp under tensor parallelism)
  AttendFn attend;  // context parallelism's ring attention (empty: attention over the sequence)
};

// The Llama family's block: x + attn(ln_1(x)), then + mlp(ln_2(x)), with RMSNorms, grouped-
// query attention with rotary embeddings and the SwiGLU MLP.
class LlamaBlock : public DecoderBlock {
 public:
  using Dims = LlamaDims;
  LlamaBlock(const Dims& d, float std, float proj_std);
  Tensor forward(const Tensor& x, const Positions& pos) const override;
  AttendFn& attend() override { return attn.attend; }
  // c_attn's columns are laid out by kv group, so a plain column split gives each rank whole
  // groups (its kv heads and the query heads that read them); c_proj's rows of those query
  // heads; the SwiGLU's
  TensorParallelPlan tensor_parallel_plan() override;
  // self_attn.{q,k,v}_proj (parts of c_attn), self_attn.o_proj, mlp.{gate,up,down}_proj
  std::vector<LinearSite> linear_sites() override;
  RMSNorm ln_1;
  GroupedQueryAttention attn;
  RMSNorm ln_2;
  SwiGLU mlp;
};

}  // namespace ndt::nn
