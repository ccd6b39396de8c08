// ndtrain: the communication of tensor parallelism, as autograd ops named after the math
// (Megatron-LM's f and g, and the vocabulary-parallel embedding and cross-entropy).
//
//   y = copy_to_tp(x, tp);       // f: forward x as it is; backward: sum the ranks' dx
//   y = reduce_from_tp(x, tp);   // g: forward the sum of the ranks' x; backward: dy as it is
//
// A column-parallel linear computes its slice of the outputs from the whole input, so its
// input goes through f (each rank's dx is partial); a row-parallel linear computes a partial
// sum from its slice of the inputs, so its output goes through g. (The blocks' column-parallel
// linears run f inside their own op, linear_shared_input, so that the sum of dx runs under
// the weight gradient's GEMM; lm_head's input goes through copy_to_tp.) With a group of one
// rank each op is the identity.
//
// Shape legend: N rows (B*T), C channels, Vl = Vp / tp vocabulary rows of this rank.
#pragma once

#include <cstdint>

#include "autograd/ops.h"
#include "dist/comm/communicator.h"
#include "nn/module.h"

namespace ndt::dist {

Tensor copy_to_tp(const Tensor& x, Communicator& tp);
Tensor reduce_from_tp(const Tensor& x, Communicator& tp);

// Sequence parallelism (Megatron-LM's, Korthikanti et al. 2022): outside the attention and
// the MLP (LayerNorms, residual adds, biases, embeddings) each rank holds only its part of
// the sequence, (B, T/tp, C) of the (B, T, C) those regions see: rank q the positions
// [q T/tp, (q+1) T/tp) of every sequence. f becomes an all-gather of the parts and g a
// reduce-scatter into them; they move the bytes of the all-reduce they replace (an
// all-reduce is a reduce-scatter followed by an all-gather):
//
//   y = gather_sequence(x, tp);          // (B, T/tp, ...) -> (B, T, ...); backward: dy's sum
//                                        //   over the ranks, scattered into the parts
//   y = reduce_scatter_sequence(x, tp);  // (B, T, ...) partial sums -> this rank's part of
//                                        //   the sum, (B, T/tp, ...); backward: dy gathered
Tensor gather_sequence(const Tensor& x, Communicator& tp);
Tensor reduce_scatter_sequence(const Tensor& x, Communicator& tp);
// The same two collectives as plain functions (no autograd), and started: the Pending
// they return waits for the collective and gives its result. Column-parallel layers run
// them inside their own op (linear_shared_input in autograd/ops.h), gathering the input
// again in backward for the weight gradient instead of keeping it whole.
Tensor all_gather_sequence(const Tensor& x, Communicator& tp);
Tensor reduce_scatter_sequence_sum(const Tensor& y, Communicator& tp);
Pending start_all_gather_sequence(const Tensor& x, Communicator& tp);
Pending start_reduce_scatter_sequence_sum(const Tensor& y, Communicator& tp);
// x (contiguous) summed over the ranks in place, started; the Pending gives x once done
Pending start_all_reduce_sum_in_place(const Tensor& x, Communicator& tp);

// ids (...) i32, table (Vl, C): this rank's rows [v_start, v_start + Vl) of the embedding.
// Each rank looks up the ids it holds (zeros for the others) and g sums the ranks:
// (..., C), the same on every rank.
Tensor vocab_parallel_embedding(const Tensor& ids, const Tensor& table, int64_t v_start, Communicator& tp);

// logits (N, Vl) of this rank's vocabulary slice, targets (N) i32 with global ids -> the mean
// cross-entropy over rows whose target != ignore_index, the same scalar on every rank. The
// row maximum, the sum of exponentials and the target's logit are all-reduced (N numbers
// each); the (N, Vp) logits never exist on one rank. Columns >= v_live of the slice are
// vocabulary padding and never count.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t v_start,
                                    int64_t v_live, int64_t ignore_index, Communicator& tp);

// (N, Vl) on every rank -> (N, Vp): the whole logits, for sampling.
Tensor gather_vocab(const Tensor& logits, Communicator& tp);

// Checkpoints: the whole parameter from every rank's slice (collective over tp; the spec's
// TpSlice says where each slice goes), and this rank's slice of a whole parameter.
Tensor gather_param(const nn::ParamSpec& spec, const Tensor& local, Communicator& tp);
Tensor slice_param(const nn::ParamSpec& spec, const Tensor& whole);

}  // namespace ndt::dist
