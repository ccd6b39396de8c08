// ndtrain: what the planner knows of each kind of block (models/gpt.h's architectures), one
// description per kind: a block's memory per checkpointing mode (the memory plan,
// train/planner/plan.cpp), its work (the step's replay in time, train/planner/replay.cpp),
// what zb-h1's deferred weight gradients keep, its MLP's matrix products (--plan.calibrate),
// what the embeddings and the final norm cost beside it, and its relative cost per token for
// the pipeline's balance of the stages (dist::stage_blocks). Each kind is described in its
// model family's file, train/families/<arch>.cpp, with the op-by-op account of what its
// forward saves and computes (train::FamilyTools::planner; models/families.h lists the
// families). The attention core, which every kind runs, is shared (attention_core.cpp).
//
//   const BlockKind& kind = block_kind("llama");    // model.arch; shapes_of sets Shapes::kind
//   BlockMem m = s.kind->memory(s, nn::ACMode::selective);
//   BlockWork w = s.kind->work(s);
//   dist::plan_layout(cfg, dims, c.parallel, seq_len, m, block_cost(cfg, seq_len));
//
// Legend: train/planner/shapes.h. Adding a kind: every member of its BlockKind set, in its
// family's train/families/<arch>.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/gpt_config.h"
#include "nn/block_wrapper.h"
#include "tensor/dtype.h"
#include "train/planner/count.h"
#include "train/planner/shapes.h"

namespace ndt::train {

// What one block keeps for backward, and the most it holds on top of the blocks before it
// while its own backward runs (bytes; the block's input belongs to the block before).
struct BlockMem {
  Count saved = 0;            // kept from its forward to its backward (its output included)
  Count during_backward = 0;  // live while its backward runs, besides the earlier blocks:
  Count mlp = 0, attn = 0;    // ... the larger of its MLP's and its attention's moments
};

// A piece of compute: matrix-product FLOPs and element-wise floats moved; and the attention
// core's own: its products' FLOPs and its softmax's passes over the scores (each score read
// and written once a pass), which the CPU's fused kernel reaches at rates of its own
// (Cluster::attention_flops, score_pass_s); and a MoE MLP's grouped GEMMs' FLOPs, at the rate
// they reach in it (Cluster::expert_flops).
struct Work {
  double flops = 0, floats = 0;
  double core_flops = 0, score_passes = 0;
  double grouped_flops = 0;
};

// One block's pieces, forward and backward (the ops of nn::Block or nn::LlamaBlock and
// autograd/ops/*.cpp).
struct BlockWork {
  Work attn_in, core, attn_out, mlp;   // forward: ln_1 + c_attn + split; core; c_proj + residual; MLP
  Work attn_in_b, core_b, attn_out_b;  // their backward, up to c_attn's input gradient
  Work attn_in_dw;                     // ... c_attn's weight gradient
  // the MLP's backward by column-parallel linear, in the order it runs: (up to its input
  // gradient, its weight gradient); gpt2: (c_proj, GELU and c_fc's input gradient, c_fc's
  // weight gradient); llama: (down, silu_mul and up's input gradient, up's), (gate's input
  // gradient and the sum, gate's)
  std::vector<std::pair<Work, Work>> mlp_in;
  Work ln_1_b, ln_2_b;  // ... and the norms' (with the residual's sum)
  double scores = 0;    // the attention scores the core computes
};

// The embeddings' work on the first stage: the lookup, and its backward's scatter into their gradients.
struct EmbeddingsWork {
  Work forward, backward;
};

// One matrix product of the model's micro-step: (batch of) m x k times k x n, `count` of
// them per micro-step, in the dtype the trainer runs it in (--plan.calibrate times them).
struct Gemm {
  const char* what;
  int64_t batch, m, k, n, count;
  DType dtype;
};

// A kind of block, for the planner. Sizes from Shapes are this rank's (legend: shapes.h).
struct BlockKind {
  const char* name;  // the model.arch it describes

  // ---- memory (plan.cpp)
  // One block's memory under checkpointing mode `mode` (bytes).
  BlockMem (*memory)(const Shapes& s, nn::ACMode mode);
  // What the CPU's fused attention core (AttentionCore::cpu_fused) keeps for backward, as
  // the block feeds it (bytes; what the other cores keep is every kind's: core_saved).
  Count (*fused_core_saved)(const Shapes& s);
  // zb-h1: what the block's MLP keeps from a micro-batch's B to its W (elements): each
  // linear's input as its forward saved it and its output gradient (the attention's
  // c_attn and c_proj are every kind's: plan.cpp's deferred_block).
  Count (*deferred_mlp)(const Shapes& s);
  // Bytes of the tables the blocks' positions keep for the micro-step (rotary's angles), or 0.
  Count (*position_tables)(const Shapes& s);
  int64_t norm_stats;  // f32 statistics per row its norms keep (ln_f's too)

  // ---- work (replay.cpp)
  // One block's work, forward and backward.
  BlockWork (*work)(const Shapes& s);
  // The embeddings' work beside the blocks (gpt2's adds the positions').
  EmbeddingsWork (*embeddings)(const Shapes& s);
  // Column-parallel linears that read the MLP's input: under TP each sums its own input
  // gradient (and, sequence parallel, gathers its input); plan.cpp counts their bytes.
  int64_t mlp_inputs;

  // ---- from the model's config
  // The MLP's matrix products of one micro-step over N rows of C channels, I hidden units
  // and L blocks, in dtype w (tp = cp = 1), for --plan.calibrate.
  std::vector<Gemm> (*mlp_gemms)(int64_t N, int64_t C, int64_t I, int64_t L, DType w);
};

// The description of model.arch `arch`; throws ndt::Error for an architecture it lacks.
const BlockKind& block_kind(const std::string& arch);

// The relative forward cost per token of one of cfg's blocks for sequences of seq_len
// tokens, the pipeline's balance of its stages (dist::stage_blocks): 2 FLOPs per weight
// (models::Family::linear_weights), and attention's QK^T and PV, 4 T C (causal: half).
double block_cost(const models::GPTConfig& cfg, int64_t seq_len);

// ---- what every kind shares: the attention core (attention_core.cpp)

// The attention core's saved tensors, and its backward's own (bytes).
Count core_saved(const Shapes& s);
Count core_backward(const Shapes& s);
// The attention scores one block computes (all query-key pairs it evaluates).
double attention_scores(const Shapes& s);
// The CPU's fused kernel's query x key pairs on a diagonal block of T queries (blocks of 64
// queries against the keys up to the block's last), per head.
double causal_pairs(int64_t T);
// The ring's copies, elements read and written once each (0 without CP).
double ring_copies(const Shapes& s);

}  // namespace ndt::train
