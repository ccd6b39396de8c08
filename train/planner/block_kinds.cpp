// The kinds of block the planner describes (train/planner/block_kinds.h).
#include "train/planner/block_kinds.h"

namespace ndt::train {

// One file each; this table is the only list of them.
extern const BlockKind kGpt2Block;   // kinds/gpt2.cpp
extern const BlockKind kLlamaBlock;  // kinds/llama.cpp

const BlockKind& block_kind(const std::string& arch) {
  for (const BlockKind* kind : {&kGpt2Block, &kLlamaBlock})
    if (arch == kind->name) return *kind;
  NDT_FAIL("the planner has no description of model.arch = '", arch,
           "': add one in train/planner/kinds/ and its line in block_kinds.cpp");
}

double pipeline_block_cost(const models::GPTConfig& cfg, int64_t seq_len) {
  const double weights = block_kind(cfg.arch).linear_weights(cfg);
  return 2.0 * weights + 2.0 * static_cast<double>(seq_len) * static_cast<double>(cfg.n_embd);
}

}  // namespace ndt::train
