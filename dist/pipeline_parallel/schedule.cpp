// ndtrain: the four pipeline schedules, built as tables (see schedule.h).
//
// Each builder writes rank r's list from a closed formula: warmup forwards, a steady phase,
// cooldown backwards. None needs a search; validate() and simulate() (simulate.cpp) check
// what they produce, and tests/test_pp_schedule.cpp checks the bubbles against the papers.
#include "dist/pipeline_parallel/schedule.h"

#include <algorithm>

#include "tensor/error.h"

namespace ndt::dist::pp {

namespace {

// GPipe (Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using
// Pipeline Parallelism"): every rank runs all m forwards, then all m backwards, so it holds
// all m micro-batches' activations at the peak.
//
// The backwards run in micro-batch order 0..m-1 on every rank (PyTorch's ScheduleGPipe does
// the same; the paper's figure draws them in reverse). Either order is FIFO-consistent as
// long as every rank uses the same one: with v = 1 a link r -> r+1 carries only activations
// and r+1 -> r only gradients, each sent in the sender's order of F's (or B's) and consumed in
// the receiver's order of the same micro-batches. 0..m-1 frees the oldest activations
// first, as 1F1B's cooldown does, and costs the same time in the simulator.
std::vector<Action> gpipe_rank(int m) {
  std::vector<Action> out;
  for (int i = 0; i < m; ++i) out.push_back({Op::kF, i, 0});
  for (int i = 0; i < m; ++i) out.push_back({Op::kB, i, 0});
  return out;
}

// 1F1B, PipeDream-Flush (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN
// Training" and "Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM", Megatron's forward_backward_pipelining_without_interleaving): rank r runs
// min(p - r - 1, m) warmup forwards, then pairs (F of the next micro-batch, B of the oldest),
// then the remaining B's. It holds at most p - r micro-batches, not m, at GPipe's bubble.
//
// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 3.1, the H1 schedule)
// is the same order of F's and B's with backward split: B computes only the input gradient,
// which the previous stage waits for, and W the weight gradient, which nobody waits for. In
// 1F1B rank r's last backward ends r backward-times before rank 0's (its cooldown bubble),
// so rank r runs the W's of its first r micro-batches last, in that bubble, and every other
// W right after its B; the B's the ranks above wait for come sooner. With f = b = w that
// leaves p - 1 idle ticks per rank instead of 1F1B's 3 (p - 1), the paper's
// (p-1)(T_F + T_B - T_W), with 1F1B's peak of micro-batches in flight (F to B).
// PaddlePaddle's pipeline_scheduler_ZBH1 pass defers the same W's. Deferring p - r - 1 W's
// instead, the mirror image, is slower than not deferring at all (p=4, m=8: makespan 33
// against 30 undeferred and 27 here): the ranks near the loss, whose B's everyone waits
// for, would run the most W's on the way.
std::vector<Action> one_f_one_b_rank(int p, int m, int r, bool split) {
  const int warmup = std::min(p - r - 1, m);
  const int deferred = split ? std::min(r, m) : 0;  // W's of micro-batches 0..deferred-1
  std::vector<Action> out;
  auto backward = [&](int i) {
    out.push_back({Op::kB, i, 0});
    if (split && i >= deferred) out.push_back({Op::kW, i, 0});
  };
  for (int i = 0; i < warmup; ++i) out.push_back({Op::kF, i, 0});
  for (int i = 0; i < m - warmup; ++i) {  // steady: one forward, one backward
    out.push_back({Op::kF, warmup + i, 0});
    backward(i);
  }
  for (int i = m - warmup; i < m; ++i) backward(i);  // cooldown
  for (int i = 0; i < deferred; ++i) out.push_back({Op::kW, i, 0});
  return out;
}

// Interleaved 1F1B (Narayanan et al. 2021, section 2.2.2; Megatron-LM's
// forward_backward_pipelining_with_interleaving). Rank r runs m*v forwards and m*v backwards,
// numbered k = 0..m*v-1 in its own order. Forward k runs chunk (k / p) % v, so the ranks
// push p micro-batches through chunk 0, then the same p through chunk 1, ...; backward k
// runs the chunks in reverse (v - 1 - that). Within a chunk the micro-batch is
// (k / (p*v)) * p + k % p (Megatron's get_model_chunk_id and
// get_microbatch_id_in_model_chunk). Rank r runs (p - r - 1) * 2 + (v - 1) * p warmup
// forwards (capped at m*v), then pairs (forward k = warmup + i, backward i), then the
// remaining backwards. The bubble is (p - 1) / v of a micro-batch's time per rank: the
// tests find idle / compute == (p - 1) / (v m) exactly.
//
// Megatron additionally makes every rank all-warmup when m == p. The simulator gives the
// same makespan without that special case, and the later ranks then hold fewer
// micro-batches, so it is left out. Every link here is FIFO-consistent as built, including
// p = 2 where both directions of one link carry activations and gradients: the ranks share
// one numbering k, and a message from stage s to s + 1 (or back) keeps its place in it.
std::vector<Action> interleaved_rank(int p, int m, int v, int r) {
  const int total = m * v;
  const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, total);
  auto micro = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto forward = [&](int k) { return Action{Op::kF, micro(k), (k / p) % v}; };
  auto backward = [&](int k) { return Action{Op::kB, micro(k), v - 1 - (k / p) % v}; };
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k) out.push_back(forward(k));
  for (int i = 0; i < total - warmup; ++i) {
    out.push_back(forward(warmup + i));
    out.push_back(backward(i));
  }
  for (int i = total - warmup; i < total; ++i) out.push_back(backward(i));
  return out;
}

constexpr const char* kKindNames = "gpipe, 1f1b, interleaved, zb-h1";

}  // namespace

std::string kind_name(Kind k) {
  switch (k) {
    case Kind::kGPipe:
      return "gpipe";
    case Kind::kOneFOneB:
      return "1f1b";
    case Kind::kInterleaved:
      return "interleaved";
    case Kind::kZeroBubble:
      return "zb-h1";
  }
  NDT_FAIL("kind_name: unknown schedule kind ", static_cast<int>(k));
}

Kind parse_kind(const std::string& name) {
  for (Kind k : {Kind::kGPipe, Kind::kOneFOneB, Kind::kInterleaved, Kind::kZeroBubble})
    if (kind_name(k) == name) return k;
  NDT_FAIL("pipeline schedule '", name, "' is not one of: ", kKindNames);
}

bool continues_micro_step(const std::vector<Action>& actions, size_t i) {
  return i > 0 && i < actions.size() && actions[i].op == Op::kB && actions[i - 1].op == Op::kF &&
         actions[i - 1].micro == actions[i].micro && actions[i - 1].chunk == actions[i].chunk;
}

Schedule make_schedule(Kind k, int p, int m, int v) {
  const std::string what = "pipeline schedule " + kind_name(k) + ": ";
  NDT_CHECK(p >= 1, what, "p (pipeline ranks) must be >= 1, got ", p);
  NDT_CHECK(m >= 1, what, "m (micro-batches) must be >= 1, got ", m);
  if (k == Kind::kInterleaved) {
    NDT_CHECK(p >= 2, what, "needs p (pipeline ranks) >= 2, got ", p);
    NDT_CHECK(v >= 2, what, "needs v (chunks per rank) >= 2, got ", v, "; with one chunk use 1f1b");
    NDT_CHECK(m % p == 0, what,
              "m (micro-batches) must be a multiple of p (pipeline ranks), as in Megatron-LM; got m=", m,
              ", p=", p);
  } else {
    NDT_CHECK(v == 1, what, "v (chunks per rank) must be 1, got ", v,
              "; only interleaved runs several chunks");
  }
  Schedule s{k, p, v, m, k == Kind::kZeroBubble, {}};
  for (int r = 0; r < p; ++r) {
    switch (k) {
      case Kind::kGPipe:
        s.ranks.push_back(gpipe_rank(m));
        break;
      case Kind::kOneFOneB:
      case Kind::kZeroBubble:
        s.ranks.push_back(one_f_one_b_rank(p, m, r, s.split_backward));
        break;
      case Kind::kInterleaved:
        s.ranks.push_back(interleaved_rank(p, m, v, r));
        break;
    }
  }
  return s;
}

}  // namespace ndt::dist::pp
