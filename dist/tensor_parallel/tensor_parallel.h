// ndtrain: tensor parallelism (Megatron-LM) applied to a described GPT, before materialize.
//
// Every rank of the tp group holds a slice of each block's matrices and computes its share
// of the heads and of the MLP's hidden units:
//
//   attention   c_attn (C, 3C) column-parallel: the rank's heads' columns of q, of k and of
//               v (three blocks); its heads' attention; c_proj (C, C) row-parallel: those
//               heads' rows. In: f. Out: g, then the bias.
//   MLP         c_fc (C, 4C) column-parallel, GELU, c_proj (4C, C) row-parallel.
//   LayerNorms  whole on every rank (their inputs and gradients are whole, thanks to f/g).
//   wte         (Vp, C) split by vocabulary rows: the lookup masks the ids of other ranks
//               and g sums; the tied lm_head gives each rank the logits of its vocabulary
//               slice, and the vocabulary-parallel cross-entropy never gathers them.
//
// The Llama family the same way: c_attn (C, NKV (G+2) HS), laid out by kv group, column-
// parallel in whole groups (n_kv_head / tp kv heads and their query heads per rank: tp
// must divide n_kv_head); c_proj (NH HS, C) row-parallel; the SwiGLU MLP's gate and up
// column-parallel, down row-parallel; RMSNorms whole; an untied lm_head (Vp, C) split by
// vocabulary rows as wte. Qwen3's q_norm and k_norm (HS each) are whole on every rank, which
// applies them to its own heads: their gradients are partial, summed over the tp group by
// the strategy (nn::TpSlice::partial_grad; transformers' replicated_with_grad_allreduce).
//
// LoRA adapters (nn/lora.h) split with their linears (nn::LoraBlock::split_tensor_parallel):
// column-parallel, B by rows as the linear's columns and A whole, on the whole input f gives;
// row-parallel, A by columns as the linear's rows and B whole, its partial delta added to the
// GEMM's partial sum before g.
//
//   dist::apply_tensor_parallel(gpt, mesh.tp());   // after describe, before materialize
//   nn::FlatParams p = nn::materialize(gpt.units(), ...);   // local shapes, same init values
//
// Communication per micro-step, per rank, with activations of N = B*T rows x C channels:
// forward, one all-reduce (g) of N x C per attention and per MLP, one for the embedding;
// backward, one (f) per attention, per MLP and for lm_head's input; and three all-reduces
// of N numbers in the cross-entropy. Each all-reduce sends 2 (tp-1)/tp of its bytes.
//
// Sequence parallelism (parallel.sequence_parallel; dist/tensor_parallel/comm.h) keeps the
// LayerNorms, residual adds, the row-parallel biases and the embeddings' output on this
// rank's part of the sequence, (B, T/tp, C): f is then an all-gather of the parts (forward)
// and g a reduce-scatter into them, the same bytes. The parameters TP does not split (the
// LayerNorms', the row-parallel biases, wpe) then see only this rank's positions: their
// gradients are partial, and the strategy sums them over the tp group (dist/strategy.h).
#pragma once

#include "dist/comm/communicator.h"
#include "dist/sequence_split.h"
#include "models/gpt.h"

namespace ndt::dist {

// Throws ndt::Error naming the sizes when n_head, the MLP's hidden units, the padded
// vocabulary or (llama) n_kv_head do not divide by tp.
void check_tensor_parallel(const models::GPTConfig& cfg, int64_t tp);

// The two layers of Megatron-LM's tensor parallelism, each its split and its communication
// together (tp = nullptr: the split alone, as rank `rank` of `parts` holds it), the
// communication as the linear's nn::LinearComm (nn/layers.h):
// Column-parallel: W (C_in, C_out) split by columns (in `groups` equal blocks, each split:
// c_attn's q, k and v), with the bias; the input goes through f (the sum of its gradient
// over the ranks, inside the layer's op so that it runs under the weight gradient's GEMM:
// linear_shared_input), the output stays split. Row-parallel: W split by rows, taking a
// column-parallel layer's split output; the partial outputs are summed by g
// (reduce_from_tp) before the bias, held whole.
// split: ParallelModel's setting (dist/sequence_split.h; nullptr: no sequence
// parallelism). While split->sequence_parallel_now(), f and g are the sequence-parallel
// all-gather and reduce-scatter; sampling, which runs whole sequences, turns it off.
void column_parallel(nn::Linear& l, int64_t parts, int64_t rank, int64_t groups = 1,
                     Communicator* tp = nullptr, const SequenceSplit* split = nullptr);
void row_parallel(nn::Linear& l, int64_t parts, int64_t rank, Communicator* tp = nullptr,
                  const SequenceSplit* split = nullptr);

// Splits gpt's parameters (their specs: local shapes, TpSlice) and installs the f/g ops,
// the vocabulary-parallel embedding and loss. The communicator must outlive the model.
void apply_tensor_parallel(models::GPT& gpt, Communicator& tp, const SequenceSplit* split = nullptr);
// One block's share, as its nn::TensorParallelPlan says: its heads, its MLP hidden units
// (used by the GPT's, and by tests). A llama block's share is whole kv groups (n_kv_head / tp
// key/value heads and their query heads).
void apply_tensor_parallel(nn::DecoderBlock& block, Communicator& tp, const SequenceSplit* split = nullptr);
// The Llama family's MLP: gate and up column-parallel (this rank's hidden units), down
// row-parallel; intermediate_size must divide by tp.
void apply_tensor_parallel(nn::SwiGLU& mlp, Communicator& tp, const SequenceSplit* split = nullptr);
// Throws ndt::Error when a rank's tokens of a sequence (seq_len / (cp sp); sp: Ulysses) do not
// split among tp.
void check_sequence_parallel(int64_t seq_len, int64_t cp, int64_t tp, int64_t sp = 1);
// Only the splits, as rank `rank` of `parts` would hold them (no communication installed):
// the layout of another tensor-parallel rank, e.g. to read its checkpoint shards.
void split_tensor_parallel(models::GPT& gpt, int64_t parts, int64_t rank);

}  // namespace ndt::dist
