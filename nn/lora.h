// ndtrain: LoRA adapters (Hu et al. 2021) with Hugging Face PEFT's math, on any of a block's
// linears. A targeted linear computes
//
//   y = x W + b + scale * (x A^T) B^T,   A (r, in), B (out, r),  scale = alpha / r
//                                                                (rslora: alpha / sqrt(r))
//
// A starts Kaiming-uniform (torch's nn.Linear default, a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in)))
// and B at zero, as PEFT does, so the adapted model starts equal to its base. A and B are kept
// in PEFT's (torch's) layout, so an adapter folder is a copy of them. The Llama's packed
// c_attn carries separate adapters for q, k and v (PEFT's q_proj, k_proj, v_proj), each
// added to its own columns of the kv groups (LinearSite).
//
//   nn::LoraConfig c{.rank = 8, .alpha = 16, .targets = {"q_proj", "v_proj"}};
//   nn::LoraBlock lora(block, c);            // installs the adapters on block's linears
//   auto specs = lora.parameters("h.0");      // h.0.self_attn.q_proj.lora_A, ...
//
// The adapters are parameters of their own Module, not of the block: they live in flat
// buffers of their own (models::GPT::adapter_units), so the base model's buffers can be
// frozen whole (nn::materialize's frozen) while the optimizer, the gradient reductions and
// the checkpoints see only the adapters. Under tensor parallelism each adapter is split with
// its linear (LoraBlock::split_tensor_parallel, Megatron's LoRA), and a linear runs its
// adapter on the input its own GEMM sees (Linear::apply_adapted).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/layers.h"

namespace ndt::nn {

struct LoraConfig {                  // train_gpt's [lora]
  int64_t rank = 0;                  // r; 0: no adapters
  double alpha = 8;                  // PEFT's lora_alpha
  double dropout = 0;                // PEFT's lora_dropout: on the adapters' input, in training only
  std::vector<std::string> targets;  // PEFT's target_modules, or {"all-linear"}; empty: PEFT's default
  bool rslora = false;               // PEFT's use_rslora: scale alpha / sqrt(r)
  bool on() const { return rank > 0; }
  double scale() const;
};

// PEFT's default target_modules for a family's linears when lora.targets is empty:
// q_proj and v_proj (llama), c_attn (gpt2).
std::vector<std::string> default_lora_targets(const std::vector<LinearSite>& sites);

// Whether PEFT's target name `target` selects the module `name`: equal, or its last dotted
// parts ("q_proj" selects "self_attn.q_proj"); "all-linear" selects every linear.
bool lora_target_matches(const std::string& target, const std::string& name);

// Throws ndt::Error naming the key when c cannot be applied to blocks with these sites: a
// target that matches none of them, rank < 1 or above a targeted linear's width, alpha <= 0,
// dropout outside [0, 1).
void check_lora(const LoraConfig& c, const std::vector<LinearSite>& sites);

// PEFT's lora_dropout: y = x W + b + scale (dropout(x) A^T) B^T while training; evaluation and
// generation run without it. The mask is counter-based (kernels::dropout), keyed by
//   stream  (step, micro-batch of the step, the adapter: its block and its place in it)
//   index   (token, input channel) of the element in the micro-step's whole input: token
//           (data rank x micro_batch_size + sequence) x seq_len + position, channel of the
//           linear's whole input,
// so a data-parallel rank (its rows of the micro-step, row_start) and a tensor-parallel one (a
// row-parallel linear's input columns, LoraAdapter::in_start) draw the mask of the same
// elements on one process. Under context parallelism and Ulysses a rank holds pieces of every
// sequence: `positions` gives the position in its sequence of each of them (the position in
// the row, also in packed rows, where the model's positions restart per document), and
// token n of the rank's sequence s is (data rank x micro_batch_size + s) x seq_len +
// positions[n]. The model owns one (models::GPT::lora_dropout); the trainer sets the step, the
// micro-batch and training around its training micro-batches, dist::ParallelModel the positions.
struct LoraDropout {
  double p = 0;
  uint64_t seed = 0;
  bool training = false;  // off: no dropout (evaluation, generation, and until a trainer sets it)
  int64_t step = 0, micro = 0;
  int64_t row_start = 0;  // this rank's first token in the micro-step's tokens over the data ranks
  // CP, Ulysses: (L) i32 on the model's device, the positions in its sequence of the rank's L
  // tokens of each sequence; undefined: the rank holds whole sequences
  Tensor positions;
  int64_t seq_len = 0;  // with positions: the tokens of a whole sequence
  bool on() const { return training && p > 0; }
  void place(int64_t run_seed, int64_t first_row) {
    seed = static_cast<uint64_t>(run_seed), row_start = first_row;
  }
  // An adapter's input x (N, in) -> dropout(x) (N, in): x's columns are those from col_start of
  // the linear's whole input of `width` channels, the mask the adapter's (its id in the stream)
  Tensor drop(const Tensor& x, int64_t width, int64_t col_start, uint64_t id) const;
};

// The trainer's scope of one step's training micro-batches: dropout on (at `step`) while it
// lives, off after, also when the step throws; d nullptr (no LoRA): nothing.
class LoraDropoutStep {
 public:
  LoraDropoutStep(LoraDropout* d, int64_t step) : d_(d) {
    if (d_) d_->training = true, d_->step = step;
  }
  ~LoraDropoutStep() {
    if (d_) d_->training = false;
  }
  void set_micro(int64_t micro) {  // the micro-batch of the step about to run
    if (d_) d_->micro = micro;
  }
  LoraDropoutStep(const LoraDropoutStep&) = delete;
  LoraDropoutStep& operator=(const LoraDropoutStep&) = delete;

 private:
  LoraDropout* d_;
};

// One target's pair: lora_A (r, in), lora_B (out, r), as PEFT names and lays them out.
class LoraAdapter : public Module {
 public:
  LoraAdapter(int64_t in, int64_t out, int64_t rank);
  // x (N, in) -> scale (x' A^T) B^T (N, out); x' = x, or dropout(x) when d is on
  Tensor forward(const Tensor& x, double scale, const LoraDropout* d = nullptr) const;
  Tensor A, B;
  int64_t in, out, rank;  // in, out: the whole linear's (before any tensor-parallel split)
  int64_t in_start = 0;   // the whole input's column of x's column 0 (row-parallel: rank x in / tp)
  uint64_t id = 0;        // the adapter's part of its dropout stream (block, place in the block)
};

// What a linear adds to its output: its adapters' deltas, each in its own columns.
class LoraLinear : public LinearAdapter {
 public:
  LoraLinear(const LinearSite& site, double scale, std::shared_ptr<const LoraDropout> dropout = nullptr)
      : site_(site), scale_(scale), dropout_(std::move(dropout)) {}
  void add(int part, const LoraAdapter* a) { parts_.push_back({part, a}); }
  // x (N, in) -> (N, out); a packed linear's parts without an adapter get zeros
  Tensor delta(const Tensor& x) const override;

 private:
  LinearSite site_;  // the linear's layout of columns (its part and name unused)
  double scale_;
  std::shared_ptr<const LoraDropout> dropout_;  // the model's (nullptr: none)
  std::vector<std::pair<int, const LoraAdapter*>> parts_;
};

// One block's adapters, named by their Hugging Face module ("self_attn.q_proj.lora_A"),
// installed on the block's linears (Linear::adapter) when made.
class LoraBlock : public Module {
 public:
  // dropout: the model's LoraDropout (nullptr: none); layer: the block's index (dropout streams)
  LoraBlock(DecoderBlock& block, const LoraConfig& c, std::shared_ptr<const LoraDropout> dropout = nullptr,
            int64_t layer = 0);
  std::vector<std::unique_ptr<LoraAdapter>> adapters;
  std::vector<std::string> names;  // adapters[i]'s module: "self_attn.q_proj"
  std::vector<LinearSite> sites;   // adapters[i]'s linear and its columns
  // Tensor parallelism (Megatron's LoRA): each adapter split as its linear is in `plan`, as
  // rank `rank` of `parts` holds it. Column-parallel linear: B (out, r) split by rows with
  // the linear's columns (q, k, v alike), A whole, its gradient a partial sum over the tp
  // ranks (each sees its columns' share). Row-parallel: A (r, in) split by columns with the
  // linear's rows, B whole, its gradient partial (each rank's delta is a partial sum).
  // The strategy sums the partial gradients over the tp group (nn::TpSlice::partial_grad).
  void split_tensor_parallel(const TensorParallelPlan& plan, int64_t parts, int64_t rank);
};

}  // namespace ndt::nn
