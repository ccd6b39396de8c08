#include "dist/tensor_parallel/tensor_parallel.h"

#include <algorithm>
#include <string>

#include "autograd/ops.h"
#include "dist/tensor_parallel/comm.h"
#include "models/family.h"

namespace ndt::dist {

void check_tensor_parallel(const models::GPTConfig& c, int64_t tp) {
  NDT_CHECK(tp >= 1, "tensor parallelism: tp_size must be >= 1, got ", tp);  // before dividing by it
  NDT_CHECK(c.n_head % tp == 0, "tensor parallelism: model.n_head = ", c.n_head,
            " is not divisible by tp_size = ", tp, "; each rank computes n_head / tp_size heads");
  NDT_CHECK(c.kv_heads() % tp == 0, "tensor parallelism: model.n_kv_head = ", c.kv_heads(),
            " key/value heads are not divisible by tp_size = ", tp,
            "; each rank holds whole key/value heads and the query heads that read them");
  NDT_CHECK(c.mlp_hidden() % tp == 0, "tensor parallelism: the MLP's ", c.mlp_hidden(), " hidden units (",
            c.family().mlp_hidden_key, ") are not divisible by tp_size = ", tp);
  NDT_CHECK(c.padded_vocab() % tp == 0, "tensor parallelism: the vocabulary of ", c.padded_vocab(),
            " rows (model.vocab_size ", c.vocab_size, " padded to a multiple of model.vocab_multiple ",
            c.vocab_multiple, ") is not divisible by tp_size = ", tp,
            "; set model.vocab_multiple to a multiple of ", tp,
            " (a checkpoint written with another vocab_multiple resumes: its padded rows are unused zeros)");
}

void check_sequence_parallel(int64_t seq_len, int64_t cp, int64_t tp, int64_t sp) {
  const std::string by = sp > 1 ? "(cp_size x sp_size) = " + std::to_string(seq_len) + " / (" +
                                      std::to_string(cp) + " x " + std::to_string(sp) + ")"
                                : "cp_size = " + std::to_string(seq_len) + " / " + std::to_string(cp);
  NDT_CHECK(seq_len % (cp * sp) == 0 && (seq_len / (cp * sp)) % tp == 0,
            "sequence parallelism: each rank's train.seq_len / ", by,
            " tokens of a sequence must be divisible by tp_size = ", tp,
            " (each tp rank holds its part of them between the attention and the MLP)");
}

namespace {

bool sequence_parallel_now(const SequenceSplit* split) { return split && split->sequence_parallel_now(); }

// f: the input is whole on every rank, and backward sums its gradient over the ranks;
// sequence parallel: f is an all-gather of the ranks' parts (backward: a reduce-scatter of
// the gradient into them), made again in backward for the weight gradient, so the layer
// keeps only this rank's part of its input. Inside the linear's own op, so that backward
// runs them under its GEMMs (linear_shared_input).
class ColumnParallelComm : public nn::LinearComm {
 public:
  ColumnParallelComm(Communicator& tp, const SequenceSplit* split) : tp_(tp), split_(split) {}
  SharedInput input() const override {
    Communicator* tp = &tp_;
    if (!sequence_parallel_now(split_))
      return {StartFn(), [tp](const Tensor& dx) { return start_all_reduce_sum_in_place(dx, *tp); }};
    return {[tp](const Tensor& part) { return start_all_gather_sequence(part, *tp); },
            [tp](const Tensor& dx) { return start_reduce_scatter_sequence_sum(dx, *tp); }};
  }
  // the same f as an op of its own (a linear with a LoRA adapter: its GEMM's and its adapter's input)
  Tensor whole_input(const Tensor& x) const override {
    return sequence_parallel_now(split_) ? gather_sequence(x, tp_) : copy_to_tp(x, tp_);
  }

 private:
  Communicator& tp_;
  const SequenceSplit* split_;
};

// g: the partial products summed over the ranks (sequence parallel: each rank keeps its
// part of the sum); the linear adds the bias (whole on every rank) once, after it
class RowParallelComm : public nn::LinearComm {
 public:
  RowParallelComm(Communicator& tp, const SequenceSplit* split) : tp_(tp), split_(split) {}
  bool reduces_output() const override { return true; }
  Tensor reduce_output(const Tensor& partial) const override {
    return sequence_parallel_now(split_) ? reduce_scatter_sequence(partial, tp_)
                                         : reduce_from_tp(partial, tp_);
  }

 private:
  Communicator& tp_;
  const SequenceSplit* split_;
};

}  // namespace

void column_parallel(nn::Linear& l, int64_t parts, int64_t rank, int64_t groups, Communicator* tp,
                     const SequenceSplit* split) {
  // W (C_in, C_out): this rank's columns of each of the `groups` blocks, and their bias
  l.split_param("weight", 1, parts, rank, groups);
  if (l.has_bias) l.split_param("bias", 0, parts, rank, groups);  // (the Llama family's have none)
  if (tp) l.comm = std::make_shared<ColumnParallelComm>(*tp, split);
}

void row_parallel(nn::Linear& l, int64_t parts, int64_t rank, Communicator* tp, const SequenceSplit* split) {
  // W (C_in, C_out): this rank's rows; its input is the split output of a column-parallel layer
  l.split_param("weight", 0, parts, rank);
  if (tp) l.comm = std::make_shared<RowParallelComm>(*tp, split);
}

namespace {

// A layer's plan (nn::TensorParallelPlan) as rank `rank` of `parts` holds it; with a
// communicator, with its f and g.
void apply_plan(const nn::TensorParallelPlan& plan, int64_t parts, int64_t rank, Communicator* tp,
                const SequenceSplit* split) {
  for (const nn::TensorParallelPlan::Count& c : plan.counts)
    NDT_CHECK(*c.value % parts == 0, "tensor parallelism: ", *c.value, " ", c.what, " do not divide among ",
              parts, " ranks");
  for (const nn::TensorParallelPlan::Split& s : plan.linears) {
    if (s.column)
      column_parallel(*s.linear, parts, rank, s.groups, tp, split);
    else
      row_parallel(*s.linear, parts, rank, tp, split);
  }
  for (const nn::TensorParallelPlan::Count& c : plan.counts) *c.value /= parts;
  for (nn::Module* m : plan.partial_grads) m->mark_partial_grads();
}

// Every block's plan, and its LoRA adapters' split alike (nn::LoraBlock::split_tensor_parallel)
void apply_block_plans(models::GPT& gpt, int64_t parts, int64_t rank, Communicator* tp,
                       const SequenceSplit* split) {
  for (size_t i = 0; i < gpt.h.size(); ++i) {
    const nn::TensorParallelPlan plan = gpt.h[i]->tensor_parallel_plan();
    if (i < gpt.lora.size()) gpt.lora[i]->split_tensor_parallel(plan, parts, rank);
    apply_plan(plan, parts, rank, tp, split);
  }
}

// The vocabulary's rows of wte and of an untied lm_head: this rank's slice
void split_vocabulary(models::GPT& gpt, int64_t parts, int64_t rank) {
  gpt.wte.split_param("weight", 0, parts, rank);
  if (gpt.lm_head) gpt.lm_head->split_param("weight", 0, parts, rank);
}

}  // namespace

void apply_tensor_parallel(nn::DecoderBlock& block, Communicator& tp, const SequenceSplit* split) {
  if (tp.size() > 1) apply_plan(block.tensor_parallel_plan(), tp.size(), tp.rank(), &tp, split);
}

void apply_tensor_parallel(nn::SwiGLU& mlp, Communicator& tp, const SequenceSplit* split) {
  if (tp.size() > 1) apply_plan(mlp.tensor_parallel_plan(), tp.size(), tp.rank(), &tp, split);
}

void split_tensor_parallel(models::GPT& gpt, int64_t parts, int64_t rank) {
  NDT_CHECK(parts >= 1 && rank >= 0 && rank < parts, "tensor parallelism: rank ", rank, " of tp_size ", parts,
            "; tp_size must be >= 1 and the rank in [0, tp_size)");
  if (parts == 1) return;
  check_tensor_parallel(gpt.cfg, parts);
  apply_block_plans(gpt, parts, rank, /*tp=*/nullptr, /*split=*/nullptr);
  split_vocabulary(gpt, parts, rank);
}

void apply_tensor_parallel(models::GPT& gpt, Communicator& tp, const SequenceSplit* split) {
  const int64_t n = tp.size();
  if (n == 1) return;
  check_tensor_parallel(gpt.cfg, n);
  apply_block_plans(gpt, n, tp.rank(), &tp, split);
  // the vocabulary: wte rows [v_start, v_start + Vl) on this rank
  const int64_t Vl = gpt.cfg.padded_vocab() / n, v_start = tp.rank() * Vl;
  const int64_t v_live = std::clamp<int64_t>(gpt.cfg.vocab_size - v_start, 0, Vl);  // the rest is padding
  split_vocabulary(gpt, n, tp.rank());
  gpt.wte.lookup = [&tp, v_start, split](const Tensor& ids, const Tensor& table) {
    if (!sequence_parallel_now(split)) return vocab_parallel_embedding(ids, table, v_start, tp);
    // the rank's rows for its ids (zeros for the others'), summed into each rank's part
    return reduce_scatter_sequence(embedding(ids, table, v_start, tp.size() * table.size(0)), tp);
  };
  // sequence parallel: the positions (B, T) i32 of this rank's part, for gpt2's wpe
  gpt.sequence_part = [&tp, split](const Tensor& pos) {
    if (!sequence_parallel_now(split)) return pos;
    const int64_t Ts = pos.size(1) / tp.size();
    return pos.narrow(1, tp.rank() * Ts, Ts).contiguous();
  };
  // f: lm_head is column-parallel; its input whole on every rank (gathered, sequence parallel)
  gpt.before_lm_head = [&tp, split](const Tensor& x) {
    return sequence_parallel_now(split) ? gather_sequence(x, tp) : copy_to_tp(x, tp);
  };
  gpt.loss_fn = [&tp, v_start, v_live](const Tensor& logits, const Tensor& targets) {
    return vocab_parallel_cross_entropy(logits, targets, v_start, v_live, /*ignore_index=*/-1, tp);
  };
  gpt.gather_logits = [&tp](const Tensor& logits) { return gather_vocab(logits, tp); };
}

}  // namespace ndt::dist
