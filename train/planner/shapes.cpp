// The shapes of a planned rank (train/planner/shapes.h).
#include "train/planner/shapes.h"

#include "tensor/checked.h"

namespace ndt::train {

// With cp > 1 the ring (on the CPU of fused pairs); on the CPU the fused kernel; on a GPU in
// bf16 cuDNN's flash attention, else the composed ops.
AttentionCore attention_core(const std::string& device, const std::string& dtype, int64_t cp) {
  if (cp > 1) return device == "cpu" ? AttentionCore::ring_fused : AttentionCore::ring;
  if (device == "cpu") return AttentionCore::cpu_fused;
  return dtype == "bfloat16" ? AttentionCore::cudnn : AttentionCore::composed;
}

bool fused(AttentionCore core) {
  return core == AttentionCore::cpu_fused || core == AttentionCore::ring_fused;
}

Shapes shapes_of(const Plan& p, const std::string& device) {
  const dist::ParallelDims& dims = p.dims;
  Shapes s;
  s.B = p.micro_batch;
  s.Tl = p.local_seq;
  s.N = checked_mul(s.B, s.Tl, "count");
  s.C = p.n_embd;
  s.Cl = s.C / dims.tp;
  s.H = checked_mul(4, s.C, "count") / dims.tp;
  s.NHl = p.n_head / dims.tp;
  s.hd = s.C / p.n_head;
  s.Vl = p.padded_vocab / dims.tp;
  s.Ns = p.sequence_parallel ? s.N / dims.tp : s.N;
  s.cp = dims.cp;
  s.tp = dims.tp;
  s.act_bytes = p.act_bytes;
  s.core = attention_core(device, p.dtype, dims.cp);
  return s;
}

}  // namespace ndt::train
