#include "dist/fsdp/fsdp.h"

#include <algorithm>
#include <cmath>

#include "autograd/hooks.h"
#include "autograd/node.h"
#include "optim/adamw.h"
#include "tensor/kernels.h"

namespace ndt::dist {
namespace {
Storage& storage_of(const Tensor& t) { return *t.impl().storage; }
}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(const nn::FlatParams& params, Communicator& shard_group,
                                                   Communicator* replicas, std::optional<DType> reduce_dtype,
                                                   Communicator* tp, bool frozen, ExpertGroups experts)
    // each element lives in exactly one shard of the group (replicas hold equal copies; the
    // experts' shards over the ep ranks together cover the whole group too)
    : Strategy(params, &shard_group, tp),
      shard_group_(shard_group),
      replicas_(replicas && replicas->size() > 1 ? replicas : nullptr),
      experts_{experts.shards, experts.replicas && experts.replicas->size() > 1 ? experts.replicas : nullptr},
      reduce_dtype_(reduce_dtype),
      frozen_(frozen) {
  const size_t n = params.units.size();
  state_.resize(n);
  backward_began_.resize(n);
  experts_of_.assign(n, 0);
  blocks_end_ = n;
  for (size_t i = 0; i < n; ++i) {
    const nn::FlatUnit& u = params.units[i];
    NDT_CHECK(!u.experts || experts_.shards, "FSDP: unit ", u.name,
              " holds experts apart but no expert groups were given (ExpertGroups)");
    Communicator& g = shards_of(u);
    NDT_CHECK(u.shard_numel * g.size() == u.padded_numel, "FSDP: unit ", u.name, " is cut into ",
              u.padded_numel / std::max<int64_t>(u.shard_numel, 1), " shards but the group ", g.name(),
              " has ", g.size(), " ranks; materialize with a ShardSpec of ", g.size(), " shards");
    if (u.experts) {  // "h.i.experts" after every block: its block's unit is "h.i"
      blocks_end_ = std::min(blocks_end_, i);
      const std::string block = u.name.substr(0, u.name.size() - std::string(".experts").size());
      for (size_t b = 1; b < blocks_end_; ++b)
        if (params.units[b].name == block) experts_of_[b] = i;
    }
    if (i == 0 || frozen_) continue;  // the embeddings are reduced after backward (end_micro)
    std::vector<Tensor> ps;
    for (const nn::FlatParam& p : u.params) ps.push_back(p.value);
    autograd::GradGroup::create(ps, [this, i] { reduce_unit(i); });
  }
  if (experts_.shards)
    expert_scale_ =
        static_cast<double>(experts.shards->size() * (experts.replicas ? experts.replicas->size() : 1)) /
        static_cast<double>(shard_group.size() * (replicas ? replicas->size() : 1));
}

Communicator& FullyShardedDataParallel::shards_of(const nn::FlatUnit& u) const {
  return u.experts ? *experts_.shards : shard_group_;
}

Communicator* FullyShardedDataParallel::replicas_of(const nn::FlatUnit& u) const {
  return u.experts ? experts_.replicas : replicas_;
}

std::string FullyShardedDataParallel::name() const { return replicas_ ? "HSDP" : "FSDP"; }

// ---- gathering parameters ----------------------------------------------------------

void FullyShardedDataParallel::start_gather(size_t b) {
  start_gather_unit(b);
  if (experts_of_[b]) start_gather_unit(experts_of_[b]);
}

void FullyShardedDataParallel::wait_gather(size_t b) {
  wait_gather_unit(b);
  if (experts_of_[b]) wait_gather_unit(experts_of_[b]);
}

void FullyShardedDataParallel::release(size_t b) {
  release_unit(b);
  if (experts_of_[b]) release_unit(experts_of_[b]);
}

void FullyShardedDataParallel::start_gather_unit(size_t i) {
  UnitState& s = state_[i];
  if (s.gathered || s.gather) return;
  const nn::FlatUnit& u = params_.units[i];
  Communicator& g = shards_of(u);
  if (i > 0 && i < blocks_end_) max_gathered_ = std::max(max_gathered_, ++gathered_blocks_);
  if (g.size() == 1) {  // a unit of experts over one rank: the whole buffer is its shard, borrowed
    NDT_CHECK(u.compute_shard.numel() == u.padded_numel, "FSDP: unit ", u.name, " has a shard of ",
              u.compute_shard.numel(), " elements of ", u.padded_numel, " on a group of one rank");
    storage_of(u.full).borrow(u.compute_shard.data_ptr());
    s.gathered = true;
    return;
  }
  storage_of(u.full).allocate();
  g.note_unit(u.name);
  s.gather = g.all_gather(u.full, u.compute_shard);  // full (padded_numel) <- every rank's shard
}

void FullyShardedDataParallel::wait_gather_unit(size_t i) {
  start_gather_unit(i);
  UnitState& s = state_[i];
  if (s.gather) {
    s.gather->wait();
    s.gather = nullptr;
    s.gathered = true;
  }
}

void FullyShardedDataParallel::release_unit(size_t i) {
  UnitState& s = state_[i];
  if (s.gather) wait_gather_unit(i);  // never free memory a collective is writing
  if (!s.gathered) return;
  storage_of(params_.units[i].full).release();
  s.gathered = false;
  if (i > 0 && i < blocks_end_) --gathered_blocks_;
}

void FullyShardedDataParallel::alloc_grad(size_t i) {
  UnitState& s = state_[i];
  if (s.grad_live) return;
  const nn::FlatUnit& u = params_.units[i];
  storage_of(u.full_grad).allocate();
  kernels::fill(u.full_grad, 0.0);  // parameter gradients accumulate (+=) into it
  s.grad_live = true;
}

// ---- the unit wrapper: forward, and the hooks that drive backward ----------------------

nn::BlockWrapper FullyShardedDataParallel::wrapper() {
  return [this](int64_t block, const nn::BlockFn& fn, const Tensor& x) {
    const size_t i = static_cast<size_t>(block) + 1;
    const bool last = i + 1 == blocks_end_;
    const bool training = autograd::grad_enabled();
    wait_gather(i);                  // prefetched during the previous block, if any
    if (!last) start_gather(i + 1);  // prefetch the next block while this one computes
    Tensor y;
    {
      Trace::Scope t(trace_, "forward " + params_.units[i].name, Trace::kCompute);
      y = fn(x);
    }
    if (!training) {
      release(i);
      return y;
    }
    if (!last && reshard_) release(i);  // reshard after forward; the last block is the first backward needs
    return autograd::on_backward(y, [this, i] { before_backward(i); });
  };
}

void FullyShardedDataParallel::before_backward(size_t i) {
  drain(1);  // all but the newest: the all-gather below queues behind them anyway
  wait_gather(i);
  if (i > 1) start_gather(i - 1);  // prefetch the block whose backward comes next
  if (frozen_) {                   // the block after this one has had its backward: its parameters can go
    if (reshard_ && i + 1 < blocks_end_) release(i + 1);
    return;
  }
  for (const size_t u : {i, experts_of_[i]}) {
    if (u == 0) continue;
    alloc_grad(u);
    if (trace_) backward_began_[u] = trace_->now_us();
  }
}

// GradGroup of unit i: every parameter of the unit has its gradient for this micro-step.
void FullyShardedDataParallel::reduce_unit(size_t i) {
  if (trace_)
    trace_->add("backward " + params_.units[i].name, Trace::kCompute, backward_began_[i], trace_->now_us());
  if (reshard_) release_unit(i);  // the parameters are not needed again in this backward
  pending_.push_back(start_reduce(i));
}

// The mean over the shard group of unit i's full gradient, this rank's chunk of it: in the
// gradient's own dtype, or (mixed precision) in reduce_dtype, the master's by default.
FullyShardedDataParallel::PendingReduce FullyShardedDataParallel::start_reduce(size_t i) {
  const nn::FlatUnit& u = params_.units[i];
  PendingReduce p;
  p.unit = i;
  const DType rd = reduce_dtype_.value_or(u.grad.dtype());
  p.in = u.full_grad.dtype() == rd ? u.full_grad : u.full_grad.to(rd);
  if (!p.in.same(u.full_grad)) {  // the copy is what is reduced: the full gradient can go now
    storage_of(u.full_grad).release();
    state_[i].grad_live = false;
  }
  Communicator& g = shards_of(u);
  if (g.size() == 1) {  // the mean over one rank: the gradient itself, no copy
    p.out = p.in;
    return p;
  }
  p.out = Tensor::empty({u.shard_numel}, rd, u.grad.device());
  g.note_unit(u.name);
  p.work = g.reduce_scatter(p.out, p.in, ReduceOp::kAvg);
  return p;
}

// Finishes the reduce-scatters but the `keep` newest, in the order they started. By count,
// never by whether one happens to be done: every rank then starts the HSDP all-reduces at
// the same point among its collectives, a rule NCCL needs across communicators (ranks
// launching the replicas' all-reduce and the shards' all-gather in different orders can
// deadlock).
void FullyShardedDataParallel::drain(size_t keep) {
  size_t n = 0;
  for (; n + keep < pending_.size(); ++n) {
    PendingReduce& p = pending_[n];
    if (p.work) p.work->wait();  // (none over a group of one rank)
    const nn::FlatUnit& u = params_.units[p.unit];
    if (u.experts && expert_scale_ != 1)
      kernels::scale(p.out, expert_scale_, p.out);  // the mean over n, not n / ep
    kernels::add_(u.grad, p.out.dtype() == u.grad.dtype() ? p.out : p.out.to(u.grad.dtype()));  // accumulate
    storage_of(u.full_grad).release();  // after the add: over one rank p.out may be full_grad itself
    state_[p.unit].grad_live = false;
    if (Communicator* r = replicas_of(u); sync_ && r) {
      r->note_unit(u.name);
      replica_pending_.push_back(r->all_reduce(u.grad, ReduceOp::kAvg));
    }
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
}

// ---- the step --------------------------------------------------------------------------

void FullyShardedDataParallel::begin_micro(bool sync) {
  sync_ = sync;
  wait_gather(0);  // the embeddings stay gathered for the whole step
  if (blocks_end_ > 1) start_gather(1);
  if (!frozen_) alloc_grad(0);
}

// The embeddings' gradients: accumulated in the whole buffer over the micro-steps and
// reduced once, after the last; with mixed precision reduced every micro-step, like the
// blocks, so that the sum over micro-steps is taken in the master dtype, not the compute dtype.
void FullyShardedDataParallel::end_micro() {
  if (params_.units[0].mixed() && !frozen_) pending_.push_back(start_reduce(0));
  drain(0);  // the blocks' reduce-scatters, then the embeddings': in the order they started
  for (const WorkPtr& w : replica_pending_) w->wait();
  replica_pending_.clear();
}

void FullyShardedDataParallel::end_accumulation() {
  sync_ = true;  // the embeddings' shard is final: averaged over the replicas too (HSDP)
  if (!params_.units[0].mixed() && !frozen_) {
    pending_.push_back(start_reduce(0));
    drain(0);
    for (const WorkPtr& w : replica_pending_) w->wait();
    replica_pending_.clear();
  }
  sum_partial_grads_over_tp();
}

void FullyShardedDataParallel::end_step() { release_all(); }  // gathered copies are stale now

void FullyShardedDataParallel::begin_forward_only() {
  wait_gather(0);
  if (blocks_end_ > 1) start_gather(1);
}

void FullyShardedDataParallel::end_forward_only() { release_all(); }

void FullyShardedDataParallel::release_all() {
  for (size_t i = 0; i < state_.size(); ++i) release_unit(i);
}

Tensor FullyShardedDataParallel::gather_buffer(const nn::FlatUnit& u, const Tensor& shard) {
  Tensor full = Tensor::empty({u.padded_numel}, shard.dtype(), shard.device());
  shards_of(u).all_gather(full, shard)->wait();
  return full;
}

}  // namespace ndt::dist
