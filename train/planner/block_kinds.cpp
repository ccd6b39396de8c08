// The kinds of block the planner describes (train/planner/block_kinds.h).
#include "train/planner/block_kinds.h"

#include "models/family.h"
#include "train/families/family_tools.h"

namespace ndt::train {

const BlockKind& block_kind(const std::string& arch) { return *family_tools(arch).planner; }

double block_cost(const models::GPTConfig& cfg, int64_t seq_len) {
  const double weights = cfg.family().linear_weights(cfg);
  return 2.0 * weights + 2.0 * static_cast<double>(seq_len) * static_cast<double>(cfg.n_embd);
}

}  // namespace ndt::train
