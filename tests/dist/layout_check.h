// The data-parallel layout check shared by tests/test_mpi_dp.cpp, test_mpi_fsdp.cpp and
// test_mpi_hsdp.cpp: a GPT trained for 3 AdamW steps (gradient accumulation 2, float64)
// by every rank of the world in one layout of replicas x shards, against the single
// process on the same global batch, which every rank also runs. It checks
//   - the gradient norm and every gradient of this rank's shard, at every step (the
//     padding of a shard stays zero), and the parameters after the last step;
//   - the bytes this rank allocates: its padded shard of parameters, gradients and AdamW's
//     two moments, nothing more;
//   - the communication of 3 steps against the analytic volume: DP one all-reduce per unit
//     per step (none in accumulation micro-steps); FSDP at most two blocks gathered at
//     once, and its all-gathers, reduce-scatters and (HSDP) the replicas' all-reduces.
//
//   TEST(DistFSDP, FullyShardedEqualsOneProcess) { check_layout({"fsdp", 1, -1}, false); }
#pragma once

#include <cstdint>

#include "models/gpt.h"

namespace ndt::testing {

// 3 blocks, C 16, 2 heads, vocabulary 37 (odd: the flat buffers' sizes divide by no world
// size, so the shards are padded), 16 positions.
models::GPTConfig odd_sized_gpt();

// How the world's ranks hold the model: `replicate` replicas x `shard` shards; -1 for
// either is every rank (dp: {"dp", -1, 1}, fsdp: {"fsdp", 1, -1}, hsdp: {"hsdp", 2, -1}).
struct DataParallelLayout {
  const char* name;
  int64_t replicate, shard;
};

// Runs the check above for layout L on ndt::testing::world(), with activation
// checkpointing on every block when `checkpointing`; failures are gtest failures.
void check_layout(const DataParallelLayout& L, bool checkpointing);

}  // namespace ndt::testing
