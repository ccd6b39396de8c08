// ndtrain: which blocks each pipeline stage holds.
//
// Pipeline parallelism cuts the model's blocks into p x v consecutive pieces, the virtual
// stages (v = 1 but for interleaved schedules); rank r of the pipeline holds virtual stages
// r, r + p, r + 2p, ... (Megatron-LM's interleaved layout), one model chunk each. The first
// stage also embeds the tokens and the last computes the final norm, the head and the loss,
// so the balance is by cost, not by count: each block costs its forward FLOPs per token (its
// matrix products and attention, as GPT::flops_per_token counts them) and the last stage
// the head's as well.
//
//   std::vector<int64_t> n = dist::stage_blocks(cfg, seq_len, /*stages=*/p * v, "");  // {4, 4, 3, ...}
//   models::PipelinePart part = dist::pipeline_part(n, p, mesh.coords().pp);
//   models::GPT gpt(cfg, part);   // only this rank's blocks are described
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/gpt.h"

namespace ndt::dist {

// The number of blocks of each of `stages` virtual stages: `split` ("3,3,2": parallel.pp_split)
// when given, else the split that makes the costliest stage cheapest (ties: earlier stages
// take more). Throws ndt::Error, naming parallel.pp_split or parallel.pp_size, when there are
// fewer blocks than stages or `split` does not sum to model.n_layer.
std::vector<int64_t> stage_blocks(const models::GPTConfig& cfg, int64_t seq_len, int64_t stages,
                                  const std::string& split);

// What pipeline rank `rank` of `pp` holds: chunk c is virtual stage c * pp + rank.
models::PipelinePart pipeline_part(const std::vector<int64_t>& blocks, int64_t pp, int64_t rank);

// The relative forward cost per token of one block and of the head (for the balance above,
// and the planner's picture of the stages).
double block_cost(const models::GPTConfig& cfg, int64_t seq_len);
double head_cost(const models::GPTConfig& cfg);

}  // namespace ndt::dist
