// ndtrain: the layout of the ranks (ParallelDims) and one communicator per dimension
// (DeviceMesh).
//
// Six dimensions, named as in Hugging Face Accelerate's ParallelismConfig, from outermost
// to innermost: pp x dp_replicate x dp_shard x cp x sp x tp. So
// rank = ((((p*R + r)*S + s)*CP + c)*SP + u)*TP + t: TP neighbours are adjacent ranks (inside a
// node); pipeline stages are furthest apart, so under --map-by ppr:K:node the links that
// cross nodes carry only a stage boundary's activations (one tensor per micro-batch), and
// replicas come next (HSDP: sharding inside a node, one gradient all-reduce across nodes).
// Every other group lies inside one pipeline stage. sp (Ulysses sequence parallelism) sits
// next to cp, since both split the sequence, and inside it: its all-to-alls move a share of
// every layer's activations, so its ranks should share a host before the ring's do.
//
//   // no pipeline, 2 replicas, the rest of the world sharded, no CP or TP
//   auto dims = dist::ParallelDims::resolve(1, 2, -1, 1, 1, world->size());
//   dist::DeviceMesh mesh(dims, world);
//   mesh.fsdp().all_gather(full, shard);  // shard x cp: the ranks that shard parameters
//   mesh.dp().size();                     // replicate x shard: the ranks that read different data
//
// Flattened groups: dp = replicate x shard (the data-parallel ranks: each reads its own
// batch); fsdp = shard x cp x sp (the ranks over which parameters are sharded: CP and SP ranks
// hold different tokens of the same sequences, so they reduce gradients like data-parallel ranks).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/comm/communicator.h"

namespace ndt::dist {

// A run's layout as its config words it ([parallel]; train::ParallelSection extends it, so the
// trainer hands it over as it is). The sizes: ParallelDims::resolve; the pipeline's and sequence
// parallelism's words: plan_layout (dist/parallelize.h).
struct ParallelConfig {
  int64_t dp_replicate_size = 1, dp_shard_size = 1, tp_size = 1, cp_size = 1;
  // Ulysses sequence parallelism (dist/ulysses/ulysses.h): each rank holds T / sp_size tokens;
  // around attention, all-to-alls turn them into all T tokens of n_head / sp_size heads and back
  int64_t sp_size = 1;
  // Expert parallelism (dist/expert_parallel/): each rank of an ep group (ep_size consecutive
  // data ranks) holds n_experts / ep_size experts of every MoE layer; tokens travel to them
  int64_t ep_size = 1;
  // Pipeline parallelism (dist/pipeline_parallel/): pp_size stages over the blocks, outermost
  // in the mesh; the step's train.grad_accum_steps micro-batches flow through them in the
  // order pp_schedule gives (gpipe, 1f1b, interleaved with pp_virtual chunks per rank, or
  // zb-h1); pp_split: the blocks of each stage ("3,3,2"; empty: balanced by cost)
  int64_t pp_size = 1, pp_virtual = 1;
  std::string pp_schedule = "1f1b", pp_split;
  // TP: LayerNorms, residual adds and embeddings on this rank's T / tp positions (Megatron-LM's
  // sequence parallelism); f and g become an all-gather and a reduce-scatter
  bool sequence_parallel = false;
};

struct ParallelDims {
  int64_t pp = 1, dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1, sp = 1;
  // expert parallelism: ep consecutive data ranks (dp_rank / ep alike) share one layer's experts;
  // not a dimension of its own (it splits the data ranks' experts, not the world)
  int64_t ep = 1;

  // Resolves dp_shard = -1 ("the rest of the world") and checks every size against the
  // world; throws ndt::Error naming the five sizes and the world size.
  static ParallelDims resolve(int64_t pp, int64_t dp_replicate, int64_t dp_shard, int64_t cp, int64_t tp,
                              int64_t world);
  // The same with sp ranks of Ulysses sequence parallelism (between cp and tp).
  static ParallelDims resolve_sp(int64_t pp, int64_t dp_replicate, int64_t dp_shard, int64_t cp, int64_t sp,
                                 int64_t tp, int64_t world);
  static ParallelDims resolve(const ParallelConfig& c, int64_t world);  // the config's sizes
  // Sets ep after checking that ep_size consecutive data ranks lie in one shard group (or, with
  // dp_shard = 1, one replicate group); throws naming the keys.
  void set_expert_parallel(int64_t ep_size);

  int64_t world() const { return pp * stage_size(); }
  int64_t stage_size() const { return dp_replicate * dp_shard * cp * sp * tp; }  // ranks of one stage
  int64_t dp() const { return dp_replicate * dp_shard; }                         // ranks with different data
  int64_t fsdp() const { return dp_shard * cp * sp; }  // ranks that shard parameters
  bool sharded() const { return fsdp() > 1; }
  // expert parallelism inside FSDP: each MoE block's experts in a unit of their own
  // (models::GPT::units), sharded over fsdp / ep ranks (DeviceMesh::ep_shard)
  bool experts_apart() const { return ep > 1 && sharded(); }
  // ... and the ranks each unit of experts is sharded over (DeviceMesh::ep_shard: fsdp / ep, or
  // with ep over the replicas (dp_shard 1) the whole FSDP group) and averaged over (ep_replicate)
  int64_t expert_shards() const { return dp_shard > 1 ? fsdp() / ep : fsdp(); }
  int64_t expert_replicas() const { return dp_shard > 1 ? dp_replicate : dp_replicate / ep; }

  struct Coords {
    int64_t pp = 0, replicate = 0, shard = 0, cp = 0, tp = 0, sp = 0;
  };
  Coords coords(int64_t rank) const;
  int64_t rank_of(const Coords& c) const;
  std::string str() const;       // "dp_replicate 2 x dp_shard 2 x cp 1 x tp 1 = 4 ranks" (pp first when > 1)
  std::string strategy() const;  // "single process", "DP", "FSDP", "HSDP", ...
};

class DeviceMesh {
 public:
  // Collective over `world`: every rank builds the same mesh.
  DeviceMesh(const ParallelDims& dims, std::shared_ptr<Communicator> world);

  const ParallelDims& dims() const { return dims_; }
  const ParallelDims::Coords& coords() const { return coords_; }
  int64_t dp_rank() const { return coords_.replicate * dims_.dp_shard + coords_.shard; }
  int64_t fsdp_rank() const { return (coords_.shard * dims_.cp + coords_.cp) * dims_.sp + coords_.sp; }
  int64_t ep_rank() const { return dp_rank() % dims_.ep; }

  Communicator& world() const { return *world_; }
  // The pipeline: the ranks with this rank's coordinates in every other dimension, one per
  // stage, in stage order (stage s is member s).
  Communicator& pp() const { return *pp_; }
  Communicator& replicate() const { return *replicate_; }
  Communicator& shard() const { return *shard_; }
  Communicator& cp() const { return *cp_; }
  Communicator& sp() const { return *sp_; }  // Ulysses: the ranks that hold one sequence's parts
  Communicator& tp() const { return *tp_; }
  Communicator& dp() const { return *dp_; }
  Communicator& fsdp() const { return *fsdp_; }
  // Expert parallelism: the ep ranks that split one layer's experts (consecutive data ranks),
  // and the data ranks that hold the same experts (dp / ep of them: expert gradients sum there)
  Communicator& ep() const { return *ep_; }
  Communicator& ep_data() const { return *ep_data_; }
  // Inside FSDP the experts' units are sharded over the FSDP ranks that hold the same experts
  // (fsdp / ep of them) and averaged over the replicas that hold them (HSDP)
  Communicator& ep_shard() const { return *ep_shard_; }
  Communicator& ep_replicate() const { return *ep_replicate_; }

  // Every communicator once (the world first), for byte counters and the trace.
  std::vector<Communicator*> all() const;
  int64_t bytes_sent() const;  // sum over all()
  void reset_stats() const;

  int64_t bytes_across_hosts() const;  // of bytes_sent(), those sent to ranks on other hosts

  // Every world rank's host name and node-local rank (the launcher's: it picks cuda:<n>),
  // gathered when the mesh was made.
  const std::vector<std::string>& hosts() const { return hosts_; }
  bool spans_hosts() const;

  // The layout, one line per rank with its coordinates and host (ranges of ranks per host
  // when the world is large). Meant to be printed by rank 0.
  std::string describe() const;

 private:
  void gather_hosts();
  // Tells each group which of its members are on another host, and names it in words.
  void describe_groups();
  ParallelDims dims_;
  ParallelDims::Coords coords_;
  std::vector<std::string> hosts_;
  std::vector<int32_t> local_ranks_;
  std::shared_ptr<Communicator> world_, pp_, replicate_, shard_, cp_, sp_, tp_, dp_, fsdp_, ep_, ep_data_,
      ep_shard_, ep_replicate_;
};

}  // namespace ndt::dist
