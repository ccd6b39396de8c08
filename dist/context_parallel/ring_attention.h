// ndtrain: context parallelism: the sequence cut across the cp ranks, attention as a ring
// (RingAttention, Liu et al. 2023) with head-tail load balancing.
//
// The T positions of a sequence are cut into 2 cp chunks of Tc = T / (2 cp); rank r holds
// chunks r and 2cp-1-r (its "head" and "tail"), so that under the causal mask every rank
// has the same work. Its tokens, targets and positions are those two chunks side by side,
// (B, 2 Tc). Everything but attention is per token and runs unchanged on them.
//
// Attention: each rank starts with the keys and values of its own two chunks; cp - 1 times
// it passes its current K/V block to rank r+1 and receives rank r-1's (the next pass starts
// before this block is computed on, so it travels during the compute). For each of its two
// query chunks and each key chunk it holds, it computes attention with the global positions
// (skipping the pairs the causal mask hides entirely) and merges the partial outputs
// through their log-sum-exp, in f32. Backward is autograd's: dQ stays, and the gradients of
// the K/V blocks flow back around the ring to their owners (dist/context_parallel/comm.h).
//
// Packed rows (several documents in a row): every rank holds the whole rows' documents, as
// the loader reads them, so nothing more travels. A pair's mask is its part of the
// block-diagonal causal mask, from those documents at the pair's global offsets (a query sees
// the keys at or before it in its own document); a query whose document starts after a key
// chunk sees none of it (lse -inf: the merge gives it no weight), and every query sees at
// least itself. Positions restart at each document's start, wherever it lies: computed from
// the whole rows, then this rank's two pieces taken (the same numbers as one process).
//
//   dist::ContextParallel cp(gpt, mesh.cp(), seq_len);   // installs the attention and positions
//   Tensor x = cp.local(batch.inputs), y = cp.local(batch.targets);   // (B, T) -> (B, 2 Tc)
//   loss = gpt.forward(x, y).loss;   // the mean over this rank's tokens; the trainer averages ranks
//   loss = gpt.forward(x, y, 0, batch.docs).loss;   // packed rows: the whole rows' docs (B, T)
//
// Per layer and micro-step, each rank sends cp - 1 K/V blocks forward (2 B NKV 2Tc HS values
// each: with grouped-query attention only the NKV kv heads travel, NH/NKV times less than
// multi-head) and, in backward, cp - 1 gradient blocks of the same size. Attention memory per
// rank: on the CPU no score block is kept (the pairs run the fused kernel of attention());
// elsewhere one (Tc x Tc) block at a time (each pair is recomputed in backward), about
// 1/(4 cp^2) of the single process's T x T.
#pragma once

#include <memory>

#include "dist/comm/communicator.h"
#include "dist/sequence_split.h"
#include "models/gpt.h"

namespace ndt::dist {

// Throws ndt::Error when seq_len does not divide into 2 x cp chunks.
void check_context_parallel(int64_t seq_len, int64_t cp);

// Attention of this rank's queries over the whole sequence, around the ring. q (B, NH, 2 Tc,
// HS), k, v (B, NKV, 2 Tc, HS) with NKV dividing NH (grouped-query attention, as attention()):
// the rank's head chunk, then its tail chunk -> (B, NH, 2 Tc, HS). docs: packed rows, the
// whole rows' documents (B, 2 cp Tc) i32 as attention() takes them (undefined: one per row).
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& cp,
                      const Tensor& docs = {});

class ContextParallel {
 public:
  // Installs ring attention and the head-tail positions on every block of gpt. While
  // split->active is false (sampling, where every rank runs the whole sequence), the model
  // attends and positions as on one process; split: ParallelModel's (nullptr: always on).
  ContextParallel(models::GPT& gpt, Communicator& cp, int64_t seq_len, const SequenceSplit* split = nullptr);
  // (B, T) tokens of the whole sequences -> (B, 2 Tc): this rank's head and tail chunks.
  Tensor local(const Tensor& tokens) const;

 private:
  Communicator& cp_;
  int64_t T_;
};

}  // namespace ndt::dist
