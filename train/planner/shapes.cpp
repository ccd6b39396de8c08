// The shapes of a planned rank (train/planner/shapes.h).
#include "train/planner/shapes.h"

#include "tensor/checked.h"
#include "train/planner/block_kinds.h"

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

Shapes shapes_of(const Plan& plan, const std::string& device) {
  const dist::ParallelDims& dims = plan.dims;
  Shapes shapes;
  shapes.B = plan.micro_batch;
  shapes.Tl = plan.local_seq;
  shapes.N = checked_mul(shapes.B, shapes.Tl, "count");
  shapes.kind = &block_kind(plan.arch);
  shapes.C = plan.n_embd;
  shapes.H = plan.mlp_hidden / dims.tp;
  shapes.NHl = plan.n_head / dims.tp;
  shapes.hd = plan.head_dim;
  shapes.Cl = checked_mul(shapes.NHl, shapes.hd, "count");  // this rank's heads' channels
  shapes.KVl = checked_mul(plan.n_kv_head, shapes.hd, "count") / dims.tp;
  shapes.Q = checked_add(shapes.Cl, checked_mul(2, shapes.KVl, "count"), "count");
  shapes.qkv_bias = plan.qkv_bias;
  shapes.qk_norm = plan.qk_norm;
  shapes.Vl = plan.padded_vocab / dims.tp;
  shapes.Ns = plan.sequence_parallel ? shapes.N / dims.tp : shapes.N;
  shapes.cp = dims.cp;
  shapes.tp = dims.tp;
  shapes.act_bytes = plan.act_bytes;
  shapes.core = attention_core(device, plan.dtype, dims.cp);
  return shapes;
}

}  // namespace ndt::train
