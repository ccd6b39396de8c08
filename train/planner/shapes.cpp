// The shapes of a planned rank (train/planner/shapes.h).
#include "train/planner/shapes.h"

#include <algorithm>
#include <cmath>

#include "tensor/checked.h"
#include "train/planner/block_kinds.h"

namespace ndt::train {

// With cp > 1 the ring (on the CPU of fused pairs); on the CPU the fused kernel; on a GPU in
// bf16 cuDNN's flash attention, else the composed ops.
AttentionCore attention_core(const std::string& device, const std::string& dtype, int64_t cp, int64_t sp) {
  if (sp > 1) return AttentionCore::ulysses;
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
  shapes.sp = dims.sp;
  shapes.act_bytes = plan.act_bytes;
  shapes.core = attention_core(device, plan.dtype, dims.cp, dims.sp);
  shapes.inner = attention_core(device, plan.dtype, dims.cp);
  shapes.E = plan.n_experts;
  shapes.k = plan.experts_per_tok;
  shapes.Ie = plan.expert_hidden;
  shapes.Hs = plan.shared_hidden / dims.tp;
  shapes.ep = dims.ep;
  shapes.router_z = plan.router_z;
  shapes.imbalance = dims.ep > 1 ? plan.ep_imbalance : 1.0;
  return shapes;
}

int64_t Shapes::R() const {
  if (ep == 1) return M();
  return static_cast<int64_t>(std::ceil(imbalance * static_cast<double>(M())));
}

Shapes moe_block(const Shapes& s) {
  NDT_CHECK(s.E > 0, "internal: moe_block of a model without experts");
  Shapes m = s;
  m.moe = true;
  return m;
}

Shapes ulysses_view(const Shapes& s) {
  if (s.sp == 1) return s;
  Shapes v = s;
  v.Tl = checked_mul(s.Tl, s.sp, "count");
  v.N = checked_mul(s.B, v.Tl, "count");
  v.NHl = s.NHl / s.sp;
  v.Cl = s.Cl / s.sp;
  v.KVl = std::max(s.KVl / s.sp, s.hd);  // kv heads replicated up to one a rank
  v.Q = checked_add(v.Cl, checked_mul(2, v.KVl, "count"), "count");
  v.Ns = v.N;
  v.sp = 1;
  v.core = s.inner;
  return v;
}

}  // namespace ndt::train
