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
// With tensor parallelism (sp x tp): TP first gives each tp rank its heads (its columns of
// c_attn: n_head / tp query heads, n_kv_head / tp kv heads); Ulysses then all-to-alls those over
// the sp ranks of the same tp rank, so each rank attends with n_head / (tp sp) heads over the
// whole sequence (kv heads replicated when sp exceeds the tp rank's n_kv_head / tp). With TP's
// sequence parallelism the sp rank's T / sp tokens are cut once more over tp between the
// linears (T / (sp tp) each); c_attn's all-gather gives back the T / sp, as without Ulysses.
//
// With context parallelism (USP, Fang and Zhao 2024: Ulysses inside the ring): each cp rank
// holds its head and tail chunks (dist/context_parallel/ring_attention.h), T / cp tokens, and
// its sp ranks split those contiguously, T / (cp sp) each. Attention: the all-to-all over sp
// gives this rank's n_head / sp heads on the cp rank's T / cp positions, in their order; ring
// attention over cp runs on those heads; the inverse all-to-all brings the output back. Packed
// rows: the whole rows' documents, which every rank holds, serve both.
//
//   dist::Ulysses sp(gpt, mesh.sp(), seq_len);   // installs the attention and the positions
//   Tensor x = sp.local(batch.inputs), y = sp.local(batch.targets);   // (B, T) -> (B, T/sp)
//   loss = gpt.forward(x, y).loss;   // the mean over this rank's tokens; the trainer averages ranks
//
//   dist::ContextParallel cp(gpt, mesh.cp(), seq_len);        // USP: the ring first ...
//   dist::Ulysses sp(gpt, mesh.sp(), seq_len, nullptr, 1, mesh.cp().size());   // ... inside it
//   Tensor x = sp.local(cp.local(batch.inputs));               // (B, T) -> (B, T / (cp sp))
//
// Per layer and micro-step each rank sends (sp - 1) / sp of q, k, v and the output in
// forward, and as much again in backward: 4 (sp - 1) / sp x B T/sp C values with multi-head
// attention, whatever T is. Under sp x tp, C / tp of them (the tp rank's heads) on T / sp
// tokens; under USP, on T / (cp sp) tokens, besides the ring's K/V blocks of n_kv_head / sp heads
// (replicated up to 1 per rank) on T / cp positions.
#pragma once

#include "dist/comm/communicator.h"
#include "dist/sequence_split.h"
#include "models/gpt.h"

namespace ndt::dist {

// Throws ndt::Error (one line naming the keys) when the model or the sequence cannot be split
// over sp ranks inside tp and cp: n_head % (tp sp), seq_len % (cp sp), or kv heads of a tp rank
// (n_kv_head / tp) that neither sp divides nor divide sp.
void check_ulysses(const models::GPTConfig& cfg, int64_t seq_len, int64_t sp, int64_t tp = 1, int64_t cp = 1);

// The all-to-all as an autograd op: x is cut into sp pieces along split_dim, piece j goes to
// rank j, and the pieces received from ranks 0..sp-1 are joined along cat_dim. With split_dim 1
// and cat_dim 2, (B, H, T/sp, HS) -> (B, H/sp, T, HS); backward is the inverse all-to-all.
Tensor all_to_all(const Tensor& x, int64_t split_dim, int64_t cat_dim, Communicator& sp);

// Attention of this rank's positions under Ulysses: q (B, NH, T/sp, HS), k, v (B, NKV, T/sp,
// HS) -> (B, NH, T/sp, HS), causal over the whole sequence; docs: the whole rows' documents
// (B, T) i32, or undefined (one per row). inner: the attention of this rank's heads over the
// group's T positions (USP: ring attention over cp, on the cp rank's chunks); empty: attention().
Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& sp,
                         const Tensor& docs = {}, const nn::AttendFn& inner = {});

class Ulysses {
 public:
  // Installs Ulysses attention and this rank's positions on every block of gpt, around the
  // attention and positions already there (cp > 1: ContextParallel's, installed first). While
  // split->active is false (sampling: every rank runs whole sequences) the model attends and
  // positions as on one process; split: ParallelModel's (nullptr: always on). seq_len: the whole
  // sequence; tp, cp: the sizes around sp (their checks: check_ulysses).
  Ulysses(models::GPT& gpt, Communicator& sp, int64_t seq_len, const SequenceSplit* split = nullptr,
          int64_t tp = 1, int64_t cp = 1);
  // (B, T / cp) tokens (the whole sequences; cp > 1: the cp rank's chunks) -> (B, T / (cp sp)):
  // this rank's contiguous part.
  Tensor local(const Tensor& tokens) const;

 private:
  Communicator& sp_;
  int64_t T_;  // the tokens of a sequence the sp group shares: seq_len / cp
};

}  // namespace ndt::dist
