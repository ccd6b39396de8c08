// ndtrain: what a plan holds (train/planner/plan.h makes one): the per-rank bytes, the
// communication per dimension, the moments of the step's memory, the pipeline's stages. The
// planner's lower parts (shapes.h, pipeline.h) read and fill these without the planning
// functions above them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dist/mesh.h"

namespace ndt::train {

struct PlanComm {
  std::string dim;      // "fsdp", "replicate", "tp", "cp", "pp", "scalars"
  std::string what;     // e.g. "all-gather of every block (forward)"
  std::string formula;  // how the bytes follow from the sizes
  int64_t bytes = 0;    // sent per optimizer step by the planned rank
};

// One moment of the step at which memory is at its highest, and what is live then.
struct PlanMoment {
  std::string name;
  int64_t activations = 0, gathered = 0, transient = 0;
  int64_t total = 0;  // with the persistent bytes
};

// Pipeline parallelism: one stage of the plan (one rank of the pipeline, and the ranks of
// its stage, which hold the same sizes).
struct PlanStage {
  int64_t stage = 0;
  std::vector<std::pair<int64_t, int64_t>> chunks;  // blocks [begin, end) of each of its model chunks
  bool first = false, last = false;                 // holds the embeddings; the head and the loss
  int64_t params = 0;                               // its parameters after TP, before FSDP's sharding
  int64_t persistent_bytes = 0;                     // parameters, gradients, AdamW, the batch
  int64_t micro_activation_bytes = 0;               // kept by one micro-batch through its chunks
  int64_t in_flight = 0;                            // the schedule's most micro-batches held at once
  int64_t held_bytes = 0;                           // kept at its peak (with zb-h1's W inputs)
  int64_t peak_bytes = 0;
  std::string peak_at;
  int64_t comm_bytes = 0;
};

struct Plan {
  dist::ParallelDims dims;
  std::string strategy;
  std::string ac;  // none, full, selective
  int64_t ac_every = 1;
  // the batch
  int64_t micro_batch = 0, seq_len = 0, local_seq = 0, accum = 0, sequences = 0, tokens = 0;
  // the model: its architecture (gpt2 or llama), sizes, key/value heads (n_head for
  // gpt2), the MLP's hidden units (4 n_embd for gpt2, intermediate_size for llama) and
  // whether q, k and v have biases (gpt2: yes; llama: model.attention_bias)
  std::string arch = "gpt2";
  int64_t n_layer = 0, n_head = 0, n_embd = 0, padded_vocab = 0;
  int64_t n_kv_head = 0, mlp_hidden = 0;
  int64_t head_dim = 0;  // n_embd / n_head unless llama's model.head_dim
  bool qkv_bias = true;
  bool qk_norm = false;  // llama's model.qk_norm (Qwen3)
  // mixture of experts (model.n_experts > 0, nn::MoeBlock): experts of a MoE layer, per
  // token, each one's hidden units, the shared expert's (0: none); the MoE blocks of this
  // rank (of its pipeline stage), and which they are; the router's statistics all-reduced each micro-step
  // (the load-balancing or the z-loss on), the z-loss's logits kept; plan.ep_imbalance
  int64_t n_experts = 0, experts_per_tok = 0, expert_hidden = 0, shared_hidden = 0;
  int64_t moe_blocks = 0;
  std::vector<bool> block_moe;  // this stage's blocks, in its chunks' order: whether each is MoE
  bool router_stats = false, router_z = false;
  double ep_imbalance = 1;
  int64_t params_global = 0;  // every parameter once
  int64_t params_rank = 0;    // on this rank after tensor parallelism, before FSDP sharding
  // the flat units (the embeddings, then each block) on this rank: whole (padded) and shard
  // elements; the time model sends them
  std::vector<int64_t> unit_numel, unit_shard_numel;
  // expert parallelism inside FSDP: unit i's experts in a unit of their own (0: none), gathered
  // and reduced with it over the fsdp / ep ranks that hold them (models::GPT::units)
  std::vector<int64_t> experts_numel, experts_shard_numel;
  // the dtype of training; bytes of an activation (4, or 2 under bfloat16) and of an
  // element of FSDP's reduce-scatters (parallel.reduce_dtype under bfloat16)
  std::string dtype = "float32";
  int64_t act_bytes = 4, reduce_bytes = 4;
  // bytes per element that a reduction moves: NCCL reduces bf16 as bf16, MPI (CPU ranks) in
  // an f32 copy (dist/comm/communicator.h); FSDP's reduce-scatter and TP's all-reduces
  int64_t wire_reduce_bytes = 4, wire_act_reduce_bytes = 4;
  bool sequence_parallel = false;  // parallel.sequence_parallel with tp > 1
  int64_t sp_grad_numel = 0;       // of this rank's shards, the unsplit parameters' (summed over tp;
                                   // without sequence parallelism, q_norm's and k_norm's only)
  bool bf16_gemms_in_f32 = false;  // bf16 on a CPU without bf16 instructions: sgemm on f32 copies
  // bytes per rank
  int64_t param_bytes = 0, grad_bytes = 0, optim_bytes = 0;  // the shards this rank owns
  int64_t gathered_bytes = 0;                                // FSDP: whole buffers at the peak
  int64_t gathered_max_bytes = 0;                            // the most FSDP ever holds whole
  int64_t activation_bytes = 0;                              // saved for backward, one micro-step
  int64_t block_activation_bytes = 0;                        // of that, one block (mode of block 1, or 0)
  int64_t logits_bytes = 0, loss_temp_bytes = 0, other_bytes = 0;
  int64_t peak_bytes = 0;
  std::string peak_at;
  // LoRA ([lora], nn/lora.h): the base frozen (its parameters only: no gradients, no AdamW
  // moments, no weight-gradient GEMMs), the adapters' own parameters, gradients and moments
  // (whole on every rank, split with their linears under TP) counted in the bytes above;
  // each adapter keeps its x A^T (N, r) for backward
  int64_t lora_rank = 0;                 // 0: every weight trained
  int64_t lora_adapters = 0;             // adapters in a block (a packed q/k/v linear: one per part)
  int64_t adapter_params = 0;            // on this rank (after TP)
  int64_t adapter_activation_bytes = 0;  // of activation_bytes, the adapters' x A^T
  std::vector<PlanMoment> moments;
  std::vector<PlanComm> comm;
  int64_t comm_bytes = 0;
  std::vector<std::string> notes;
  // pipeline parallelism (dims.pp > 1): the schedule over `accum` micro-batches, the blocks
  // of each virtual stage (pp x pp_virtual of them), and every stage in brief; the rest of
  // the plan (sizes, memory, bytes) is stage `stage`'s, the one whose peak is highest
  std::string pp_schedule = "1f1b";
  int64_t pp_virtual = 1;
  std::vector<int64_t> pp_blocks;
  int64_t stage = 0;
  std::vector<std::pair<int64_t, int64_t>> chunks;  // this stage's blocks [begin, end), by chunk
  bool first_stage = true, last_stage = true;       // it holds the embeddings; the head and the loss
  int64_t io_bytes = 0;                             // an activation between stages, or its gradient
  int64_t in_flight = 1;                            // micro-batches whose activations it holds at once
  int64_t held_bytes = 0;                           // activations kept at the peak, all micro-batches
  int64_t deferred_bytes = 0;                       // zb-h1: one micro-batch's W inputs (see plan.cpp)
  std::vector<PlanStage> stages;
};

}  // namespace ndt::train
