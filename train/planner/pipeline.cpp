// The pipeline stage of a plan and the walks along its actions (train/planner/pipeline.h).
#include "train/planner/pipeline.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <sstream>

#include "dist/parallelize.h"
#include "tensor/checked.h"
#include "train/planner/block_kinds.h"

namespace ndt::train {

int64_t StageView::block_count() const {
  int64_t n = 0;
  for (const auto& [b, e] : chunks) n += e - b;
  return n;
}

std::pair<int64_t, int64_t> StageView::chunk_units(size_t chunk) const {
  int64_t begin = 1;
  for (size_t c = 0; c < chunk; ++c) begin += chunks[c].second - chunks[c].first;
  return {begin, begin + chunks[chunk].second - chunks[chunk].first};
}

models::PipelinePart StageView::part() const {
  if (p == 1) return {};
  models::PipelinePart part;
  part.chunks = chunks;
  part.first = first;
  part.last = last;
  return part;
}

StageView stage_view(const Config& c, const dist::ParallelDims& dims, int64_t stage) {
  StageView v;
  v.stage = stage;
  v.p = dims.pp;
  if (dims.pp == 1) {  // one micro-step: its forward, then its backward
    v.blocks = {c.model.n_layer};
    v.chunks = {{0, c.model.n_layer}};
    v.actions = {{dist::pp::Op::kF, 0, 0}, {dist::pp::Op::kB, 0, 0}};
    return v;
  }
  // the trainer's layout (one place for the layout's rules: dist::plan_layout)
  const dist::PipelineLayout l =
      dist::plan_layout(c.model, dims, c.parallel, c.train.seq_len, c.train.grad_accum_steps,
                        block_cost(c.model, c.train.seq_len));
  const dist::pp::Schedule& s = l.schedule;
  v.v = s.v;
  v.m = s.m;
  v.schedule = c.parallel.pp_schedule;
  v.blocks = l.blocks;
  const models::PipelinePart part = l.part(stage);
  v.chunks = part.chunks;
  v.first = part.first;
  v.last = part.last;
  v.split_backward = s.split_backward;
  v.actions = s.ranks[static_cast<size_t>(stage)];
  v.peak_in_flight = dist::pp::simulate(s).peak_in_flight[static_cast<size_t>(stage)];
  return v;
}

FsdpWalk fsdp_walk(const StageView& v, bool mixed) {
  const auto units = static_cast<size_t>(1 + v.block_count());
  FsdpWalk w;
  std::vector<bool> whole(units, false), grad(units, false);
  std::deque<size_t> pending;  // reduce-scatters started, not yet drained
  bool sync = false;
  int64_t block_replicas = 0;
  auto gather = [&](size_t u) {
    if (u >= units || whole[u]) return;
    whole[u] = true;
    if (u > 0) ++w.block_gathers;
  };
  auto reduce = [&](size_t u) {   // reduce_unit / start_reduce
    if (u > 0) whole[u] = false;  // a block is released; the embeddings stay whole for the step
    pending.push_back(u);
    if (u > 0)
      ++w.block_reduces;
    else
      ++w.emb_reduces;
  };
  auto drain = [&](size_t keep) {
    while (pending.size() > keep) {
      const size_t u = pending.front();
      pending.pop_front();
      grad[u] = false;
      if (sync) (u == 0 ? w.emb_replica_reduces : block_replicas) += 1;
    }
  };
  // zb-h1: a chunk's gradient groups wait while any of its B's has its W to come
  // (autograd/hooks.h: a group with deferred gradients outstanding does not fire)
  std::vector<int64_t> outstanding(v.chunks.size(), 0);
  // each chunk's last B or W: its units get no more gradient this step (Pipeline::run)
  std::map<int, size_t> last_grad;
  for (size_t i = 0; i < v.actions.size(); ++i)
    if (v.actions[i].op != dist::pp::Op::kF) last_grad[v.actions[i].chunk] = i;
  for (size_t i = 0; i < v.actions.size(); ++i) {
    w.whole_before.push_back(whole);
    w.grad_before.push_back(grad);
    const dist::pp::Action& a = v.actions[i];
    const auto [begin, end] = v.chunk_units(static_cast<size_t>(a.chunk));
    if (!dist::pp::continues_micro_step(v.actions, i)) {  // begin_micro, with its B's sync
      const size_t j = dist::pp::continues_micro_step(v.actions, i + 1) ? i + 1 : i;
      sync = last_grad[v.actions[j].chunk] == j;
      gather(0);
      gather(1);
      grad[0] = true;
    }
    if (a.op == dist::pp::Op::kF) {
      for (int64_t u = begin; u < end; ++u) {
        gather(static_cast<size_t>(u));
        const bool rank_last = static_cast<size_t>(u) + 1 == units;
        if (!rank_last) {
          gather(static_cast<size_t>(u + 1));
          whole[static_cast<size_t>(u)] = false;
        }
      }
      continue;
    }
    int64_t& waiting = outstanding[static_cast<size_t>(a.chunk)];
    waiting += a.op == dist::pp::Op::kB && v.split_backward ? 1 : a.op == dist::pp::Op::kW ? -1 : 0;
    for (int64_t u = end - 1; u >= begin; --u) {
      if (a.op == dist::pp::Op::kB) {  // before_backward
        drain(1);
        gather(static_cast<size_t>(u));
        if (u > 1) gather(static_cast<size_t>(u - 1));
        grad[static_cast<size_t>(u)] = true;
      }
      if (waiting == 0) reduce(static_cast<size_t>(u));  // the unit's gradient group fires
    }
    if (mixed) reduce(0);  // end_micro
    drain(0);
  }
  sync = true;  // end_accumulation
  if (!mixed) reduce(0);
  drain(0);
  NDT_CHECK(block_replicas == v.block_count(), "internal: HSDP would all-reduce ", block_replicas,
            " block shards for ", v.block_count(), " blocks");
  return w;
}

namespace {
// "B3", or "B3.1" (micro-batch 3, chunk 1) when the rank holds several chunks
std::string label(const dist::pp::Action& a, int64_t v) {
  std::ostringstream os;
  os << "FBW"[static_cast<int>(a.op)] << a.micro;
  if (v > 1) os << "." << a.chunk;
  return os.str();
}
}  // namespace

MemoryWalk walk_memory(const StageView& v, const std::vector<ChunkMemory>& chunks, int64_t io_bytes,
                       int64_t persistent, const std::function<int64_t(size_t action, size_t chunk)>& extra) {
  auto add = [](int64_t a, int64_t b) { return checked_add(a, b, "count"); };
  std::set<std::pair<int, int>> live, deferred;  // (micro, chunk): F run, B not; B run, W not
  int64_t sent = 0;                              // messages alive only in the executor's send list
  MemoryWalk out;
  std::map<std::string, size_t> at;  // moment name -> its place in out.moments
  int64_t best = -1;
  auto consider = [&](const std::string& name, const std::string& where, PlanMoment m, int64_t held,
                      int64_t in_flight) {
    m.total = add(add(add(persistent, m.activations), m.gathered), m.transient);
    if (m.total > best) best = m.total, out.held = held, out.in_flight = in_flight;
    m.name = name + (v.p > 1 ? " (" + where + ")" : "");
    const auto it = at.find(name);
    if (it == at.end()) {
      at[name] = out.moments.size();
      out.moments.push_back(m);
    } else if (m.total > out.moments[it->second].total) {
      out.moments[it->second] = m;
    }
  };
  for (size_t i = 0; i < v.actions.size(); ++i) {
    const dist::pp::Action& a = v.actions[i];
    const auto c = static_cast<size_t>(a.chunk);
    const auto key = std::make_pair(a.micro, a.chunk);
    if (a.op == dist::pp::Op::kF) {
      live.insert(key);
      continue;
    }
    int64_t kept = 0, waiting = 0;  // the micro-batches' activations, the deferred W inputs
    for (const auto& [j, k] : live) kept = add(kept, chunks[static_cast<size_t>(k)].kept);
    for (const auto& [j, k] : deferred) waiting = add(waiting, chunks[static_cast<size_t>(k)].deferred);
    const int64_t messages = sent * io_bytes;
    const std::string where = label(a, v.v) + ", " + std::to_string(live.size()) + " micro-batch" +
                              (live.size() == 1 ? "" : "es") + " held";
    if (a.op == dist::pp::Op::kW) {
      PlanMoment m;
      m.activations = add(add(kept, waiting), messages);
      m.gathered = extra(i, c);
      consider("weight gradients (W)", where, m, add(kept, waiting), int64_t(live.size()));
      deferred.erase(key);
      continue;
    }
    // B: the others' activations with this one's moments, and the gradient it received
    const int64_t others = kept - chunks[c].kept;
    for (PlanMoment m : chunks[c].backward) {
      m.activations = add(add(add(m.activations, others), waiting), messages);
      m.gathered = add(m.gathered, extra(i, c));
      m.transient = add(m.transient, v.last_chunk(c) ? 0 : io_bytes);
      consider(m.name, where, m, add(kept, waiting), int64_t(live.size()));
    }
    live.erase(key);
    if (!v.last_chunk(c)) ++sent;   // the activation it sent in F, now held by the send alone
    if (!v.first_chunk(c)) ++sent;  // the gradient of its input, sent back
    // ... and a middle stage's input: the sent output's graph (its nodes' saved tensors are
    // released, their edges are not) ends at the leaf that received it
    if (!v.last_chunk(c) && !v.first_chunk(c)) ++sent;
    if (v.split_backward) deferred.insert(key);
  }
  return out;
}

}  // namespace ndt::train
