// The attention core every kind of block runs, for the planner (train/planner/block_kinds.h):
// what it keeps for backward, its backward's own tensors, its scores and the ring's copies.
// Legend: train/planner/shapes.h; w = 4, the bytes of the f32 elements the core computes in.
#include <algorithm>

#include "train/planner/block_kinds.h"

namespace ndt::train {

double causal_pairs(int64_t T) {
  double pairs = 0;
  for (int64_t r0 = 0; r0 < T; r0 += 64)
    pairs += double(std::min<int64_t>(64, T - r0)) * double(std::min<int64_t>(T, r0 + 64));
  return pairs;
}

// The attention core's saved tensors in bytes (autograd/ops/attention.cpp or, with cp > 1,
// the ring of dist/context_parallel/ring_attention.cpp), without the c_proj input. q is
// N Cl, k and v N KVl each (N Q together; KVl = Cl but under llama's grouped-query
// attention, where each kv head serves NHl / NKVl query heads in place, never copied per
// head). Off the cuDNN path the core computes in f32 under bf16 too (4-byte elements, w).
//   cpu_fused: the CPU's fused kernel, as the block feeds it: its kind's
//              (BlockKind::fused_core_saved)
//   cudnn:     q, k, v (heads_to_front's copies, N Q), the output o (N Cl), lse (N NHl)
//   composed:  q, k, v (contiguous copies in f32, N Q), the probabilities p (B NHl Tl^2),
//              the output o (N Cl)
//   ring:      per (query chunk, key chunk) pair that the causal mask leaves (2 cp + 1 of
//              them on every rank) the checkpointed attention keeps its K and V halves
//              (N KVl together: split_last copies them once per key chunk, 2 cp on rank 0),
//              both query halves (N Cl, shared), each pair's output and lse and each
//              merge's (2 cp + 1 and 2 cp - 1: 4 cp halves of N Cl / 2, as measured; 4 cp
//              lse of N NHl / 2); the
//              probabilities are recomputed per pair in backward (one (Tl/2)^2 block at a
//              time). Under bf16 each of the 2 cp - 1 merges keeps f32 copies of its two
//              inputs and its output (3 halves; in f32 those are the outputs themselves)
//   ring_fused: the same tensors (the CPU's fused pairs keep their inputs, output and lse
//              instead of a checkpoint's), and under bf16 each pair's f32 output too
//              (2 cp + 1 halves)
//   ulysses:   the inner core's on ulysses_view(s), the all-to-all's outputs (dist/ulysses:
//              the all-to-alls themselves keep nothing); there the CPU's fused kernel is
//              attention()'s on q, k, v as they came (N Q), its output in f32 (N Cl) and lse
//              (N NHl), whatever the block
Count core_saved(const Shapes& s) {
  if (s.core == AttentionCore::ulysses) {
    const Shapes v = ulysses_view(s);
    if (v.core != AttentionCore::cpu_fused) return core_saved(v);
    return v.N * v.Q * v.act_bytes + v.N * v.Cl * kF + v.N * v.NHl * kF;
  }
  const Count B = s.B, Tl = s.Tl, N = s.N, Cl = s.Cl, KVl = s.KVl, Q = s.Q, NHl = s.NHl, cp = s.cp,
              a = s.act_bytes, w = kF;
  switch (s.core) {
    case AttentionCore::cpu_fused:
      return s.kind->fused_core_saved(s);
    case AttentionCore::cudnn:
      return (N * Q + N * Cl) * a + N * NHl * kF;
    case AttentionCore::composed:
      return (N * Q + N * Cl + B * NHl * Tl * Tl) * w;
    case AttentionCore::ring:
    case AttentionCore::ring_fused:
    case AttentionCore::ulysses:
      break;
  }
  const Count pairs = 2 * cp + 1, key_chunks = 2 * cp, lse = 2 * cp * N * NHl * kF;
  if (a == w) return (N * Cl + key_chunks * N * KVl + 4 * cp * N * Cl / 2) * w + lse;
  const Count outputs_f32 = s.core == AttentionCore::ring_fused ? pairs : Count(0);
  return (N * Cl + key_chunks * N * KVl) * a + (3 * (2 * cp - 1) + outputs_f32) * N * Cl / 2 * w + lse;
}

// The attention backward's own tensors, in bytes: fused, dq, dk, dv (N Q in f32: gpt2's
// dqkv; the score blocks are per-thread scratch of 64 x Tl), under bf16 also q, k, v and
// dout converted to f32 (N Q + N Cl) and dq, dk, dv rounded back (N Q); cuDNN, the
// contiguous dout and dq, dk, dv (N Cl + N Q); composed, dout, dv, dq, dk (N Cl + N Q) and
// ds (p's shape), in f32, under bf16 dq, dk, dv rounded back (N Q); with the ring one score
// block of (Tl/2)^2 per pair, recomputed, plus the pair's p; with the fused ring a pair's
// dq, dk, dv (halves of N Q), under bf16 also its q, k, v and dout in f32 (halves of N Q +
// N Cl) and dq, dk, dv rounded back (halves of N Q). Ulysses: the inner core's, and the
// output gradient the all-to-all's backward brought (N Cl).
Count core_backward(const Shapes& s) {
  if (s.core == AttentionCore::ulysses) return core_backward(ulysses_view(s)) + s.N * s.Cl * s.act_bytes;
  const Count B = s.B, Tl = s.Tl, N = s.N, Cl = s.Cl, Q = s.Q, NHl = s.NHl, a = s.act_bytes, w = kF;
  const bool mixed = !(a == w);
  switch (s.core) {
    case AttentionCore::cpu_fused:
      return N * Q * w + (mixed ? (N * Q + N * Cl) * w + N * Q * a : Count(0));
    case AttentionCore::cudnn:
      return (N * Cl + N * Q) * a;
    case AttentionCore::composed:
      return (N * Cl + N * Q + B * NHl * Tl * Tl) * w + (mixed ? N * Q * a : Count(0));
    case AttentionCore::ring_fused:
      return N * Q / 2 * w + (mixed ? (N * Q + N * Cl) / 2 * w + N * Q / 2 * a : Count(0));
    case AttentionCore::ring:
    case AttentionCore::ulysses:
      break;
  }
  const Count Tc = Tl / 2;
  return (N * Cl + N * Q + 2 * B * NHl * Tc * Tc) * w;
}

// The attention scores one block computes (all query-key pairs it evaluates): one process
// evaluates the causal half (cuDNN skips masked tiles; the CPU's fused kernel takes blocks
// of 64 queries against the keys up to the block's last; the composed path on a GPU is
// counted as half too); the ring evaluates 2 cp + 1 pairs of chunks of Tc = Tl / 2 on every
// rank, two of them diagonal (the fused kernel's blocks there, as in one process), the
// others whole. Ulysses: the inner core's, on this rank's heads over the cp rank's tokens.
double attention_scores(const Shapes& shapes) {
  if (shapes.core == AttentionCore::ulysses) return attention_scores(ulysses_view(shapes));
  const double B = double(shapes.B), NHl = double(shapes.NHl), Tl = double(shapes.Tl);
  if (shapes.cp == 1)
    return B * NHl * (shapes.core == AttentionCore::cpu_fused ? causal_pairs(shapes.Tl) : Tl * Tl * 0.5);
  const double Tc = Tl / 2;
  const double diagonal = fused(shapes.core) ? causal_pairs(static_cast<int64_t>(Tc)) : Tc * Tc;
  return B * NHl * (2 * diagonal + Tc * Tc * double(2 * shapes.cp - 1));
}

// The ring's copies, each read and written once: q into its halves (2 N Cl), k and v into
// one message (4 N KVl), each step's K/V into halves and each of the 2 cp key chunks into K
// and V (4 cp + 4 cp N KVl), the output halves joined (2 N Cl), and each of the 2 cp - 1
// merges reads two partial outputs and writes one (3/2 N Cl each); none without CP. Ulysses:
// the inner ring's on ulysses_view, and each all-to-all's copies of q, k, v and the output in
// and out (dist/ulysses: the pieces to send and the received ones into place, twice each):
// 4 (2 N Cl + 2 N KVr), KVr the kv channels as sent (replicated: sp hd)
double ring_copies(const Shapes& shapes) {
  if (shapes.core == AttentionCore::ulysses) {
    const double N = double(shapes.N), KVr = double(std::max(shapes.KVl, shapes.sp * shapes.hd));
    return ring_copies(ulysses_view(shapes)) + 4 * (2 * N * double(shapes.Cl) + 2 * N * KVr);
  }
  if (shapes.cp == 1) return 0.0;
  const double cp = double(shapes.cp), N = double(shapes.N);
  return (4 + 1.5 * (2 * cp - 1)) * N * double(shapes.Cl) + (4 + 8 * cp) * N * double(shapes.KVl);
}

}  // namespace ndt::train
