// ndtrain: Ulysses sequence parallelism (DeepSpeed-Ulysses; Accelerate's sp_size): the
// sequence cut across the sp ranks, attention over the whole sequence for a share of the heads.
//
// Each rank holds a contiguous part of T / sp positions of every sequence (its tokens, targets
// and positions). Everything but attention is per token and runs unchanged on them. Around
// attention, an all-to-all turns q, k, v from (B, H, T/sp, HS) (every head, this rank's
// positions) into (B, H/sp, T, HS) (this rank's heads, every position); ordinary attention
// runs on them (packed rows: the whole rows' documents, which every rank holds; nothing more
// travels); a second all-to-all turns the output back. Backward is autograd's: each
// all-to-all's gradient is the inverse all-to-all.
//
// Grouped-query attention with fewer kv heads than sp ranks: each kv head is replicated
// sp / NKV times before the all-to-all (as DeepSpeed does), so k and v each send sp / NKV times
// the bytes they would with NKV = sp; their gradients add up on the way back.
//
//   dist::Ulysses sp(gpt, mesh.sp(), seq_len);   // installs the attention and the positions
//   Tensor x = sp.local(batch.inputs), y = sp.local(batch.targets);   // (B, T) -> (B, T/sp)
//   loss = gpt.forward(x, y).loss;   // the mean over this rank's tokens; the trainer averages ranks
//
// Per layer and micro-step each rank sends (sp - 1) / sp of q, k, v and the output in
// forward, and as much again in backward: 4 (sp - 1) / sp x B T/sp C values with multi-head
// attention, whatever T is.
#pragma once

#include "dist/comm/communicator.h"
#include "dist/sequence_split.h"
#include "models/gpt.h"

namespace ndt::dist {

// Throws ndt::Error (one line naming the keys) when the model or the sequence cannot be split
// over sp ranks: n_head % sp, seq_len % sp, or kv heads that neither sp divides nor divide sp.
void check_ulysses(const models::GPTConfig& cfg, int64_t seq_len, int64_t sp);

// The all-to-all as an autograd op: x is cut into sp pieces along split_dim, piece j goes to
// rank j, and the pieces received from ranks 0..sp-1 are joined along cat_dim. With split_dim 1
// and cat_dim 2, (B, H, T/sp, HS) -> (B, H/sp, T, HS); backward is the inverse all-to-all.
Tensor all_to_all(const Tensor& x, int64_t split_dim, int64_t cat_dim, Communicator& sp);

// Attention of this rank's positions under Ulysses: q (B, NH, T/sp, HS), k, v (B, NKV, T/sp,
// HS) -> (B, NH, T/sp, HS), causal over the whole sequence; docs: the whole rows' documents
// (B, T) i32, or undefined (one per row).
Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& sp,
                         const Tensor& docs = {});

class Ulysses {
 public:
  // Installs Ulysses attention and this rank's positions on every block of gpt. While
  // split->active is false (sampling: every rank runs whole sequences) the model attends and
  // positions as on one process; split: ParallelModel's (nullptr: always on).
  Ulysses(models::GPT& gpt, Communicator& sp, int64_t seq_len, const SequenceSplit* split = nullptr);
  // (B, T) tokens of the whole sequences -> (B, T/sp): this rank's contiguous part.
  Tensor local(const Tensor& tokens) const;

 private:
  Communicator& sp_;
  int64_t T_;
};

}  // namespace ndt::dist
