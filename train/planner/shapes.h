// ndtrain: the shapes one rank computes with in a micro-step, as both of the planner's
// models see them: the memory plan (train/planner/plan.cpp) and the step's replay in time
// (train/planner/replay.cpp); and which attention core runs on them.
//
//   const Shapes s = shapes_of(plan, config.train.device);   // once plan() has the sizes
//   s.N * s.C          // elements of one activation: B Tl rows of n_embd
//   fused(s.core)      // the CPU's fused attention kernel (alone, or in the ring's pairs)
//
// Legend (this rank's view):
//   B   micro-batch (sequences)          T    sequence length
//   Tl  = T / cp tokens of a sequence    N    = B Tl rows
//   Ns  rows of the regions between the attention and the MLP (LayerNorms, residuals): N,
//       or N / tp with sequence parallelism
//   C   = n_embd                         Cl   = C / tp attention channels
//   H   = 4 C / tp MLP hidden units      NHl  = n_head / tp heads
//   hd  = C / n_head head size           Vl   = Vp / tp vocabulary rows (Vp: padded)
//   L   blocks                           cp, tp  the context- and tensor-parallel degrees
//   a   bytes of an activation (the compute dtype's: 4, or 2 under bfloat16)
// The sizes divide: plan() refuses a layout where they do not, as the trainer does.
#pragma once

#include <cstdint>
#include <string>

#include "train/planner/plan.h"

namespace ndt::train {

// Which attention core a rank runs (autograd/ops/attention.cpp; with cp > 1 the ring of
// dist/context_parallel/ring_attention.cpp).
enum class AttentionCore {
  cpu_fused,   // the CPU's fused kernel (ndt::self_attention): the scores made again in backward
  cudnn,       // a GPU in bf16: cuDNN's flash attention (for the head sizes it supports: GPT's)
  composed,    // a GPU otherwise: the composed ops
  ring,        // cp > 1 on a GPU: composed pairs, each recomputed in backward
  ring_fused,  // cp > 1 on the CPU: the fused kernel's pairs
};

// The core of train.device `device` ("cpu", "cuda", "cuda:N") in train.dtype `dtype` with cp ranks.
AttentionCore attention_core(const std::string& device, const std::string& dtype, int64_t cp);
// The CPU's fused kernel, alone or in the ring's pairs.
bool fused(AttentionCore core);

struct Shapes {
  int64_t B = 0, Tl = 0, N = 0, Ns = 0;
  int64_t C = 0, Cl = 0, H = 0, NHl = 0, hd = 0, Vl = 0;
  int64_t cp = 1, tp = 1;
  int64_t act_bytes = 4;  // a
  AttentionCore core = AttentionCore::cpu_fused;
};

// The shapes of the plan's rank on train.device `device`: from the plan's layout, batch,
// model and dtype (plan() fills those first). The products are checked (tensor/checked.h): one that does
// not fit int64 throws ndt::Error.
Shapes shapes_of(const Plan& plan, const std::string& device);

}  // namespace ndt::train
