// ndtrain: measure the machine a plan will run on and write a --cluster file.
//
//   mpirun -np 4 --map-by ppr:2:node build/train_gpt --config gpt.ini --plan --plan.calibrate cluster.ini
//   build/train_gpt --config gpt.ini --plan --plan.search --cluster cluster.ini
//
// Every rank measures at once, as they will train: the matrix products of one micro-step
// of the config's model (each linear's shape, the attention's batched products, lm_head,
// in the proportions one micro-step runs them), an element-wise pass over memory, the CPU's
// fused attention core (forward and backward at the model's head size and at 4 times it:
// its products' rate and its softmax's cost per score, Cluster::attention_flops), and then
// all-reduces of two sizes between pairs of ranks inside a host (every pair at once) and
// between two hosts (every pair at once, and one pair alone: a host's links count as what
// one pair moves, shared by the host's ranks, which is what training steps reach), and for
// each class of link what its transfers cost the computation they run under (the model's
// step again with all-reduces behind it: Cluster::intra_cpu_share, inter_cpu_share). The
// hosts are the ranks' host names; ranks must sit on them in order, the same number on each.
#pragma once

#include <ostream>

#include "train/config.h"

namespace ndt::train {

// Runs the measurement on the launcher's ranks; rank 0 prints what it measured and writes
// c.plan_calibrate. Returns the exit code.
int calibrate_main(const Config& c, std::ostream& out, std::ostream& err);

}  // namespace ndt::train
