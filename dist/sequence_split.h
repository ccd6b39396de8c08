// ndtrain: how a forward splits its sequences among ranks: one setting, owned by
// dist::ParallelModel (dist/parallelize.h) and read by everything that depends on it.
//
//   context parallelism    each cp rank runs two chunks of every sequence (ring attention)
//   sequence parallelism   each tp rank keeps its part of the positions between the
//                          attention and the MLP (dist/tensor_parallel/tensor_parallel.h)
//
// Training and evaluation split; sampling runs whole sequences of any length on every rank,
// so ParallelModel::generate turns both off around it. The strategy reads
// `sequence_parallel` alone: whether the unsplit parameters' gradients are partial.
#pragma once

namespace ndt::dist {

struct SequenceSplit {
  bool sequence_parallel = false;  // configured (parallel.sequence_parallel with tp > 1)
  bool active = true;              // false while sampling: every rank runs whole sequences
  // sequence parallelism's collectives and parts in this forward
  bool sequence_parallel_now() const { return sequence_parallel && active; }
};

}  // namespace ndt::dist
