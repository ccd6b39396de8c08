// ndtrain: the GPT family of decoders, in two architectures (model families, each described
// in models/families/<arch>.cpp: models/family.h).
//
// gpt2 (Radford et al. 2019, as in llm.c):
//   token + learned position embeddings -> n_layer pre-LN blocks (LayerNorm, multi-head
//   attention, GELU MLP, biases everywhere) -> final LayerNorm -> logits through the token
//   embedding (lm_head tied to wte) -> cross-entropy
// llama (Llama 3, Qwen2, Mistral):
//   token embeddings -> n_layer pre-norm blocks (RMSNorm, grouped-query attention with
//   rotary position embeddings, SwiGLU MLP, no biases but Qwen2's on q, k, v) -> final
//   RMSNorm -> logits through lm_head (its own weight unless tie_embeddings) -> cross-entropy
//
// Shape legend: B batch, T time, C = n_embd, NH = n_head, NKV = n_kv_head, HS = C/NH,
// I = intermediate_size, V vocab, Vp padded vocab.
//
//   models::GPTConfig cfg{.n_layer = 2, .n_head = 3, .n_embd = 12, .vocab_size = 11, .block_size = 8};
//   models::GPT gpt(cfg);                                   // described only
//   nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f32, 1337);
//   Tensor loss = gpt.forward(idx, targets).loss;           // idx, targets (B, T) i32
//   ndt::backward(loss);                                    // grads in params.units[*].grad
//
// Both architectures name their parameters alike: wte, h.i.{ln_1, attn.c_attn, attn.c_proj,
// ln_2, mlp.*}, ln_f (and wpe for gpt2, lm_head for an untied llama); train/checkpoint/hf.h
// maps them to a Hugging Face folder's names.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/gpt_config.h"
#include "models/rope.h"
#include "nn/block_wrapper.h"
#include "nn/flat.h"
#include "nn/layers.h"
#include "nn/lora.h"

namespace ndt::models {

// Pipeline parallelism (dist/pipeline_parallel/): the part of the model one rank holds. It
// runs one chunk of consecutive blocks per virtual stage it holds (several under interleaved
// schedules), in chunk order; the pipeline's first stage starts with the embeddings and its
// last ends with the final norm, the head and the loss. The default: the whole model.
struct PipelinePart {
  std::vector<std::pair<int64_t, int64_t>> chunks;  // blocks [begin, end) of each chunk (empty: all)
  bool first = true;  // holds the embeddings (chunk 0 is the pipeline's first stage)
  bool last = true;   // holds the head and the loss (the last chunk is the pipeline's last stage)
  bool whole() const { return first && last; }
};

struct GPTOutput {
  Tensor logits;    // (B*T, Vp); padded columns never affect the loss. Undefined after a
                    // forward with targets and gradients on (single process): the fused loss
                    // (cross_entropy_fused) keeps its gradient in their memory
  Tensor loss;      // scalar mean cross-entropy, when targets were given (training with mixture-of-
                    // experts layers: + model.router_aux_loss_coef x aux_loss + router_z_loss_coef x z_loss)
  Tensor aux_loss;  // the routers' load-balancing loss (nn/moe.h), with router_aux_loss_coef > 0
  Tensor z_loss;    // the routers' z-loss (nn/moe.h), with router_z_loss_coef > 0
};

class GPT : public nn::Module {
 public:
  // part: what this rank holds under pipeline parallelism (only those blocks are made;
  // each keeps its name h.<i> in the whole model).
  explicit GPT(const GPTConfig& cfg, PipelinePart part = {});

  // idx (B, T) i32; targets (B, T) i32 or undefined (then no loss). The tokens sit at
  // positions pos_offset .. pos_offset+T-1 of their sequences (context parallelism gives
  // each rank a later piece of the sequence); pos_offset + T <= block_size.
  // Packed rows: docs (B, T) i32, non-decreasing along each row, the document of every token
  // (undefined: one per row). Each document attends only to itself and its positions restart
  // at pos_offset (Hugging Face's position_ids of packed rows); that a document's last token
  // does not predict the next one's first is the targets' business (-1 there). Under context
  // parallelism (the positions hook set) docs are the whole rows' (B, T_seq), idx this rank's
  // pieces of them: the hooks take what they need (a document may start on another rank).
  GPTOutput forward(const Tensor& idx, const Tensor& targets, int64_t pos_offset = 0,
                    const Tensor& docs = {}) const;
  // For generation: the logits of the token after each row, idx (B, T) at positions
  // pos_offset.. -> (B, Vp). Only the last position goes through the lm_head (a prompt's
  // other T-1 rows would cost T-1 GEMM rows of the vocabulary and be thrown away).
  Tensor next_token_logits(const Tensor& idx, int64_t pos_offset = 0) const;

  // Pipeline parallelism: chunk `chunk` of this rank's part on one micro-batch. idx (B, T) is
  // the micro-batch's tokens, which every stage reads (the blocks' positions come from them);
  // x the previous stage's output (B, T, C) (sequence parallel: (B, T/tp, C)), undefined for
  // the pipeline's first chunk, which embeds idx. Returns the chunk's output, the next
  // stage's x, or for the pipeline's last chunk the loss (a scalar), from targets (B, T).
  // docs: packed rows, as for forward (every stage takes them). router: the micro-batch's
  // load-balancing statistics on this stage (router_loss(); nullptr: none), which the last
  // chunk turns into the loss's load-balancing part.
  Tensor forward_chunk(size_t chunk, const Tensor& idx, const Tensor& x, const Tensor& targets,
                       int64_t pos_offset = 0, const Tensor& docs = {},
                       const std::shared_ptr<nn::RouterLoss>& router = nullptr) const;
  // ... and for the last chunk when sampling: the logits of the token after each row (B, Vp).
  Tensor next_token_logits_chunk(size_t chunk, const Tensor& idx, const Tensor& x,
                                 int64_t pos_offset = 0) const;
  const PipelinePart& part() const { return part_; }
  // A new RouterLoss for a training forward (nullptr without MoE, or with neither
  // router_aux_loss_coef nor router_z_loss_coef, or when not training: evaluation's loss is
  // the cross-entropy alone)
  std::shared_ptr<nn::RouterLoss> router_loss() const;

  // Each block runs through these wrappers (nn/block_wrapper.h), added from outside: activation
  // checkpointing, FSDP's gather and free. A wrapper is called with the block's index i in
  // h (under pipeline parallelism, in this rank's part: block_index(i) in the whole model);
  // that block's flat buffer is units()[i + 1] (units()[0] holds the embeddings, which no
  // wrapper runs: wte is used at both ends of the model).
  void add_block_wrapper(nn::BlockWrapper w) { wrappers_.push_back(std::move(w)); }

  // Set by tensor and context parallelism (dist/), empty on one process:
  nn::TensorFn before_lm_head;  // TP: copy to the group (f) before the vocab-sliced lm_head,
                                // (B, T, C) -> (B, T, C) (sequence parallel: (B, T/tp, C) in)
  // TP with sequence parallelism: the (B, T) positions -> this rank's part of them (B, T/tp)
  nn::TensorFn sequence_part;
  // TP: the loss over vocab-sliced logits (vocab-parallel cross-entropy)
  std::function<Tensor(const Tensor& logits, const Tensor& targets)> loss_fn;
  nn::TensorFn gather_logits;  // TP: (N, Vp/tp) -> (N, Vp), for sampling
  // DP, CP, Ulysses (dist/parallelize.cpp): set on every forward's RouterLoss (nn/moe.h): the
  // load-balancing statistics of the micro-step's whole batch from every rank's part of it, and
  // the gradient's scale (unset: this rank's alone)
  std::function<void(nn::RouterLoss&)> reduce_router_stats;
  double router_grad_scale = 1;
  // CP: the position of every token (B, T) i32 (a rank's tokens are two pieces of the sequence);
  // docs: the whole rows' documents (B, T_seq) when packed (positions restart per document),
  // or undefined
  std::function<Tensor(const Tensor& idx, int64_t pos_offset, const Tensor& docs)> positions;

  // The FSDP units: "embeddings" (wte, wpe or lm_head, ln_f) first, then one per block "h.i".
  // Under pipeline parallelism, this rank's: its blocks, and of the embeddings what its
  // stages use -- the tied embeddings (wte, wpe, ln_f) whole on the first and the last stage,
  // their gradients summed between the two; untied, wte on the first and ln_f, lm_head on the
  // last; nothing (an empty unit) in between. experts_apart (expert parallelism inside FSDP):
  // each MoE block's routed experts leave its unit for one of their own, "h.i.experts"
  // (UnitSpec::experts), after every block's unit, so that block i's unit stays i + 1.
  std::vector<nn::UnitSpec> units(bool experts_apart = false) const;
  // h[i]'s index in the whole model.
  int64_t block_index(size_t i) const { return block_index_[i]; }

  // LoRA (nn/lora.h): adapters on the linears of every block that c.targets names, installed
  // before materializing (after, the units() buffers are the frozen base). Throws ndt::Error
  // naming the lora.* key that does not fit the model.
  void add_lora(const nn::LoraConfig& c);
  bool has_lora() const { return !lora.empty(); }
  // The adapters' flat units, shaped as units(): an empty "embeddings" unit first, then one
  // "h.i" per block with that block's adapters (h.i.self_attn.q_proj.lora_A, ...).
  std::vector<nn::UnitSpec> adapter_units() const;
  nn::LoraConfig lora_config;  // what add_lora was given (rank 0: none)
  // lora.dropout's state, shared by every adapter (nn::LoraDropout; off until a trainer sets
  // training, so evaluation and generation run without it); nullptr without LoRA
  std::shared_ptr<nn::LoraDropout> lora_dropout;
  std::vector<std::unique_ptr<nn::LoraBlock>> lora;  // h[i]'s adapters

  // false while evaluating (ParallelModel::evaluate): the loss is the cross-entropy alone, without
  // the mixture of experts' load-balancing loss that training adds
  mutable bool training = true;  // (a mode of the forward, not the model: set on a const model too)

  // Model FLOPs per token for forward + backward (6N + attention), for MFU / GFLOP/s.
  double flops_per_token(int64_t T) const;

  // Whether parameter `name` holds the vocabulary's rows, padded to padded_vocab(): wte, and
  // an untied lm_head. Their rows past vocab_size are zeros that nothing trains (their logits
  // are masked); checkpoints store only the vocab_size live rows.
  static bool vocab_rows(const std::string& name) { return name == "wte.weight" || name == "lm_head.weight"; }

  // The (Vp, C) matrix of the logits: wte (tied) or lm_head.
  const nn::Embedding& head() const { return cfg.tied() ? wte : *lm_head; }
  nn::Embedding& head() { return cfg.tied() ? wte : *lm_head; }

  const GPTConfig cfg;
  nn::Embedding wte;
  std::unique_ptr<nn::Embedding> wpe;  // gpt2's learned positions (llama: none)
  std::vector<std::unique_ptr<nn::DecoderBlock>> h;
  std::unique_ptr<nn::Norm> ln_f;          // the family's: nn::LayerNorm (gpt2) or nn::RMSNorm (llama)
  std::unique_ptr<nn::Embedding> lm_head;  // an untied llama's (Vp, C) head (else none)

 private:
  Tensor final_norm(const Tensor& x) const;
  // router: the forward's load-balancing statistics (nullptr: none)
  Tensor trunk(const Tensor& idx, int64_t pos_offset, const Tensor& docs,
               const std::shared_ptr<nn::RouterLoss>& router = nullptr) const;
  // trunk's parts: the positions of idx's tokens (B, T) (restarting per document of docs) and
  // what the blocks see of them; the embeddings (B, T, C); blocks h[begin, end); the final
  // norm (and TP's copy) before the head
  Tensor positions_of(const Tensor& idx, int64_t pos_offset, const Tensor& docs, bool& cached) const;
  Tensor embed(const Tensor& idx, const Tensor& pos) const;
  Tensor run_blocks(size_t begin, size_t end, Tensor x, const nn::Positions& block_pos) const;
  Tensor before_head(const Tensor& x) const;
  // x (B, T, C) at the head -> logits and loss (+ the router's load-balancing loss)
  GPTOutput head_forward(const Tensor& x, const Tensor& idx, const Tensor& targets,
                         const std::shared_ptr<nn::RouterLoss>& router = nullptr) const;
  GPTOutput head_logits(const Tensor& x, const Tensor& idx, const Tensor& targets) const;
  // chunk's h range and its input: the embeddings of idx, or x
  Tensor chunk_trunk(size_t chunk, const Tensor& idx, const Tensor& x, int64_t pos_offset, const Tensor& docs,
                     const std::shared_ptr<nn::RouterLoss>& router = nullptr) const;
  PipelinePart part_;
  std::vector<int64_t> block_index_;  // h[i]'s index in the whole model
  std::vector<size_t> chunk_begin_;   // chunk c is h[chunk_begin_[c], chunk_begin_[c + 1])
  // The (B, T) positions tensor and the rotary tables of the last forward and what they
  // were made for: uploaded once, not every step (an upload waits for the device).
  struct PositionsCache {
    int64_t B = -1, T = -1, offset = -1;
    Device device;
    Tensor pos;
    nn::Positions rope;
  };
  mutable PositionsCache pos_cache_;
  nn::Positions block_positions(const Tensor& pos, int64_t pos_offset, bool cached, DType dtype,
                                const Tensor& docs) const;
  std::vector<nn::BlockWrapper> wrappers_;
  mutable std::vector<double> aux_values_;  // the load-balancing losses since take_aux_loss
  mutable std::vector<double> z_values_;    // the z-losses since take_z_loss

 public:
  // The mean of the load-balancing losses of the forwards since the last call (MoE with
  // router_aux_loss_coef; -1: none), for the step's log.
  double take_aux_loss() const;
  // ... and of the router z-losses (router_z_loss_coef; -1: none)
  double take_z_loss() const;
};

}  // namespace ndt::models
