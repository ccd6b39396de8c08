#include "dist/pipeline_parallel/stages.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "tensor/error.h"

namespace ndt::dist {

double head_cost(const models::GPTConfig& c) {
  return 2.0 * static_cast<double>(c.padded_vocab()) * static_cast<double>(c.n_embd);
}

std::vector<int64_t> stage_blocks(const models::GPTConfig& cfg, double block_cost, int64_t stages,
                                  const std::string& split) {
  const int64_t L = cfg.n_layer;
  NDT_CHECK(stages >= 1 && stages <= L, "parallel.pp_size x parallel.pp_virtual = ", stages,
            " pipeline stages need at least that many blocks, but model.n_layer is ", L);
  if (!split.empty()) {
    std::vector<int64_t> n;
    std::stringstream ss(split);
    std::string item;
    while (std::getline(ss, item, ',')) {
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      while (used < item.size() && item[used] == ' ') ++used;
      NDT_CHECK(used > 0 && used == item.size() && v >= 1, "parallel.pp_split = '", split,
                "': each entry must be a number of blocks >= 1, got '", item, "'");
      n.push_back(v);
    }
    int64_t sum = 0;
    for (int64_t v : n) sum += v;
    NDT_CHECK(static_cast<int64_t>(n.size()) == stages && sum == L, "parallel.pp_split = '", split,
              "' gives ", n.size(), " stages of ", sum, " blocks; it needs ", stages,
              " entries (parallel.pp_size x parallel.pp_virtual) summing to model.n_layer = ", L);
    return n;
  }
  // The linear partition: best[s][i], the cheapest costliest stage when the first s stages
  // hold the first i blocks. Stage s's cost: its blocks, plus the head on the last stage.
  NDT_CHECK(block_cost > 0, "internal: stage_blocks needs a block's cost > 0, got ", block_cost);
  const double b = block_cost, head = head_cost(cfg);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(L + 1, 0));
  best[0][0] = 0;
  for (int64_t s = 1; s <= stages; ++s)
    for (int64_t i = s; i <= L; ++i)
      for (int64_t j = i - 1; j >= s - 1; --j) {  // stage s holds blocks [j, i); larger stages first
        const double cost = static_cast<double>(i - j) * b + (s == stages ? head : 0.0);
        const double worst = std::max(best[s - 1][j], cost);
        if (worst < best[s][i] * (1 - 1e-12)) best[s][i] = worst, cut[s][i] = j;
      }
  std::vector<int64_t> n(static_cast<size_t>(stages));
  for (int64_t s = stages, i = L; s >= 1; --s) {
    n[static_cast<size_t>(s - 1)] = i - cut[s][i];
    i = cut[s][i];
  }
  return n;
}

models::PipelinePart pipeline_part(const std::vector<int64_t>& blocks, int64_t pp, int64_t rank) {
  const int64_t stages = static_cast<int64_t>(blocks.size());
  NDT_CHECK(pp >= 1 && stages % pp == 0 && rank >= 0 && rank < pp, "pipeline_part: ", stages, " stages over ",
            pp, " ranks (rank ", rank, ")");
  models::PipelinePart part;
  int64_t begin = 0;
  for (int64_t s = 0; s < stages; ++s) {
    const int64_t end = begin + blocks[static_cast<size_t>(s)];
    if (s % pp == rank) part.chunks.push_back({begin, end});
    begin = end;
  }
  part.first = rank == 0;
  part.last = rank == pp - 1;
  return part;
}

PipelineLayout plan_pipeline(const models::GPTConfig& cfg, double block_cost, const PipelineOptions& o) {
  PipelineLayout l;
  l.blocks = o.stages == 1 && o.chunks == 1 ? std::vector<int64_t>{cfg.n_layer}
                                            : stage_blocks(cfg, block_cost, o.stages * o.chunks, o.split);
  try {
    l.schedule = pp::make_schedule(pp::parse_kind(o.schedule), static_cast<int>(o.stages),
                                   static_cast<int>(o.micro_batches), static_cast<int>(o.chunks));
    pp::validate(l.schedule);
  } catch (const Error& e) {  // the schedule's words (p, v, m) are these keys
    throw Error("parallel.pp_schedule = " + o.schedule + " with parallel.pp_size = " +
                std::to_string(o.stages) + " (p), parallel.pp_virtual = " + std::to_string(o.chunks) +
                " (v) and train.grad_accum_steps = " + std::to_string(o.micro_batches) + " (m): " + e.what());
  }
  return l;
}

models::PipelinePart PipelineLayout::part(int64_t rank) const {
  return pipeline_part(blocks, schedule.p, rank);
}

std::string PipelineLayout::describe() const {
  if (!staged()) return "";
  std::ostringstream o;
  o << "pipeline: " << schedule.p << " stages";
  if (schedule.v > 1) o << " x " << schedule.v << " model chunks per rank";
  o << ", blocks per stage";
  for (int64_t n : blocks) o << " " << n;
  o << ", schedule " << pp::kind_name(schedule.kind) << " over " << schedule.m << " micro-batches";
  return o.str();
}

std::string PipelineLayout::summary() const {
  std::string s = pp::kind_name(schedule.kind) + " over " + std::to_string(schedule.m) + " micro-batches";
  if (!staged()) return s + ", one stage";
  s += ", " + std::to_string(schedule.p) + " stages";
  if (schedule.v > 1) s += " x " + std::to_string(schedule.v) + " chunks";
  return s;
}

}  // namespace ndt::dist
