// ndtrain: the pipeline stage a plan is of (train_gpt --plan with parallel.pp_size > 1): the
// blocks the rank holds, the actions its schedule runs, and two walks along those actions in
// the order the executor runs them (dist/pipeline_parallel/pipeline.cpp):
//   memory  what the rank holds at each backward (and zero-bubble weight pass): every
//           micro-batch between its F and its B keeps its chunk's activations, between its
//           B and its W its deferred weight GEMMs' inputs, and every message sent stays
//           alive until the step ends (the executor waits for its sends only then) -- on a
//           middle stage with the activation it received, which the sent output's graph
//           reaches
//   FSDP    which all-gathers and reduce-scatters each action starts (dist/fsdp/fsdp.cpp:
//           begin_micro before every action, the block wrapper in F, the backward hooks)
//
//   const StageView v = stage_view(config, dims, /*stage=*/0);  // pp = 1: the whole model, one F, one B
//   v.chunks[0]                  // {0, 6}: blocks h.0 .. h.5
//   v.actions                    // F0 F1 B0 F2 B1 ...: this rank's list of the schedule
//   fsdp_walk(v, mixed).block_gathers
//
// With pp = 1 the view is one micro-step, F then B, whose moments are the single process's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dist/mesh.h"
#include "dist/pipeline_parallel/schedule.h"
#include "models/gpt.h"
#include "train/config.h"
#include "train/planner/plan_types.h"

namespace ndt::train {

struct StageView {
  int64_t stage = 0;            // the pipeline rank
  int64_t p = 1, v = 1, m = 1;  // stages, chunks per rank, micro-batches
  std::string schedule = "1f1b";
  std::vector<int64_t> blocks;                      // of each virtual stage (p x v)
  std::vector<std::pair<int64_t, int64_t>> chunks;  // this rank's blocks [begin, end), by chunk
  bool first = true, last = true;                   // holds the embeddings; the head and the loss
  bool split_backward = false;                      // zb-h1: W's after the B's
  std::vector<dist::pp::Action> actions;            // this rank's, in order
  int64_t peak_in_flight = 1;                       // the schedule's, this rank's (simulate)

  int64_t virtual_stage(size_t chunk) const { return int64_t(chunk) * p + stage; }
  bool first_chunk(size_t chunk) const { return virtual_stage(chunk) == 0; }
  bool last_chunk(size_t chunk) const { return virtual_stage(chunk) == p * v - 1; }
  int64_t block_count() const;  // this rank's blocks, all chunks
  // The unit of this rank's i-th block (units: the embeddings, then the blocks in chunk order)
  // and the units of chunk c: [begin, end).
  std::pair<int64_t, int64_t> chunk_units(size_t chunk) const;
  models::PipelinePart part() const;
};

// Stage `stage` of c's pipeline on `dims` (pp = 1: the whole model). Throws ndt::Error with
// the trainer's message on a split or a schedule the trainer refuses.
StageView stage_view(const Config& c, const dist::ParallelDims& dims, int64_t stage);

// FSDP's collectives along the actions, counted as dist/fsdp/fsdp.cpp starts them: every
// action's begin_micro gathers the embeddings (once per step) and the rank's first block;
// F gathers each block of its chunk, prefetching the next, and releases it after its
// forward but the rank's last block; B gathers each block unless it is whole, prefetching
// the one before, and reduce-scatters the block's gradient after its backward (zb-h1: after
// a W that leaves none of the chunk's W's to come -- a gradient group with deferred
// gradients outstanding does not fire, autograd/hooks.h -- the block whole until then); after each
// B or W, end_micro reduce-scatters the embeddings' gradient under mixed precision (else
// end_accumulation does, once), and HSDP all-reduces the shards of what that action's drain
// finished when it is its chunk's last.
struct FsdpWalk {
  int64_t block_gathers = 0, block_reduces = 0;  // of one block's whole buffer, in all
  int64_t emb_reduces = 0;                       // reduce-scatters of the embeddings' gradient
  int64_t emb_replica_reduces = 0;               // HSDP's all-reduces of the embeddings' shard
  // before each action: the units whole (gathered, or being gathered) and the whole gradients
  std::vector<std::vector<bool>> whole_before, grad_before;
};
FsdpWalk fsdp_walk(const StageView& v, bool mixed);

// One micro-batch on one of the rank's chunks, in bytes: what it keeps from its F to its B;
// under zb-h1 from its B to its W; and its B's moments (their activations, FSDP's whole
// buffers and temporaries: the micro-batch's own, without the rest of the rank).
struct ChunkMemory {
  int64_t kept = 0, deferred = 0;
  std::vector<PlanMoment> backward;
};

// The rank's highest moments: each B's moments on top of what the rank holds then (the
// other micro-batches' kept activations, zb-h1's deferred inputs, the messages sent so far
// and not yet waited for, the gradient received for this B, and extra(action, chunk): bytes
// whole outside the chunk, FSDP's), and zb-h1's W's. Each kind of moment once, at its
// highest, its name saying at which action and how many micro-batches were held; totals
// count `persistent`. held: the activations (and deferred inputs) kept at the highest moment,
// in_flight the micro-batches among them.
struct MemoryWalk {
  std::vector<PlanMoment> moments;
  int64_t held = 0, in_flight = 0;
};
MemoryWalk walk_memory(const StageView& v, const std::vector<ChunkMemory>& chunks, int64_t io_bytes,
                       int64_t persistent, const std::function<int64_t(size_t action, size_t chunk)>& extra);

}  // namespace ndt::train
