// The step, replayed in time. Legend: train/planner/shapes.h (B, Tl, N, Ns, C, Cl, H, NHl,
// hd, Vl, L, a for this rank); A accumulation steps, r bytes per element of FSDP's
// reduce-scatters (Plan::reduce_bytes).
//
// Compute: each piece of a block is its matrix products' FLOPs at the cluster's reached
// rate (for the training dtype) plus its element-wise passes (elements read and written, a
// bytes each) at its memory bandwidth. The optimizer's passes are over f32 (the master).
// Communication: each collective's ring time on the link of its dimension,
//   all-reduce of S bytes on n ranks       2 (n-1) (latency + S / n / bandwidth)
//   all-gather, reduce-scatter (S whole)     (n-1) (latency + S / n / bandwidth)
//   ring attention's exchange of b bytes              latency + b / bandwidth
// where the bandwidth is the slowest edge of the ring: inside a host the intra-host link,
// between hosts a host's share of its links (devices_per_host x inter_gbps) among the ring
// edges that leave it at once; collectives in flight between hosts at the same time share
// those links (SharedLink). Ranks sit on hosts in order (rank / devices_per_host), as
// mpirun places them by default; the mesh puts tp innermost, then cp, dp_shard,
// dp_replicate (dist/mesh.h), so the outer dimensions are the ones that cross hosts.
#include "train/planner/time.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <vector>

#include "models/gpt.h"
#include "nn/block_wrapper.h"
#include "train/planner/shapes.h"

namespace ndt::train {

// ---- SharedLink ---------------------------------------------------------------------------

int SharedLink::add(double t, double alone) {
  advance_to(t);
  ends_.push_back(-1);
  active_.push_back({static_cast<int>(ends_.size()) - 1, alone});
  return active_.back().id;
}

double SharedLink::end(int id) {
  while (ends_[static_cast<size_t>(id)] < 0) step(std::numeric_limits<double>::infinity());
  return ends_[static_cast<size_t>(id)];
}

void SharedLink::advance_to(double t) {
  while (!active_.empty() && clock_ < t) step(t);
  clock_ = std::max(clock_, t);
}

void SharedLink::step(double until) {
  const double k = double(active_.size());
  double first = std::numeric_limits<double>::infinity();
  for (const Flow& f : active_) first = std::min(first, f.left);
  const double dt = std::min(first * k, until - clock_);
  clock_ += dt;
  for (Flow& f : active_) f.left -= dt / k;
  const double eps = 1e-12 * std::max(1.0, clock_);
  for (const Flow& f : active_)
    if (f.left <= eps) ends_[static_cast<size_t>(f.id)] = clock_;
  std::erase_if(active_, [&](const Flow& f) { return f.left <= eps; });
}

namespace {

constexpr double kF = 4;  // bytes of a float32: the master, its gradient, AdamW's moments

// ---- links ------------------------------------------------------------------------------

enum class Dim { replicate, fsdp, cp, tp, dp };

// The next member of `rank`'s ring in dimension d (the communicator's order).
int64_t successor(const dist::ParallelDims& D, int64_t rank, Dim d) {
  dist::ParallelDims::Coords c = D.coords(rank);
  switch (d) {
    case Dim::replicate:
      c.replicate = (c.replicate + 1) % D.dp_replicate;
      break;
    case Dim::tp:
      c.tp = (c.tp + 1) % D.tp;
      break;
    case Dim::cp:
      c.cp = (c.cp + 1) % D.cp;
      break;
    case Dim::fsdp: {  // shard x cp, cp inner
      const int64_t i = (c.shard * D.cp + c.cp + 1) % D.fsdp();
      c.shard = i / D.cp;
      c.cp = i % D.cp;
      break;
    }
    case Dim::dp: {  // replicate x shard, shard inner
      const int64_t i = (c.replicate * D.dp_shard + c.shard + 1) % D.dp();
      c.replicate = i / D.dp_shard;
      c.shard = i % D.dp_shard;
      break;
    }
  }
  return D.rank_of(c);
}

struct Link {
  double bps = std::numeric_limits<double>::infinity(), latency = 0;
  double cpu_share = 0;    // of a transfer's time, what it takes from the computation under it
  bool crosses = false;    // some ring of this dimension leaves a host
  double cross_share = 0;  // of a host's ranks, the share whose ring successor is on another host
};

// The link a dimension's rings run on. Host 0 stands for every host: the layouts are
// regular, so each host has as many ring edges leaving it.
Link link_of(const dist::ParallelDims& D, const Cluster& k, Dim d) {
  Link l;
  int64_t leaving = 0, members = 0;
  bool intra_edge = false;
  const int64_t first_host = std::min(k.devices_per_host, D.world());
  for (int64_t r = 0; r < first_host; ++r) {
    const int64_t s = successor(D, r, d);
    if (s == r) continue;
    ++members;
    if (k.host_of(s) != k.host_of(r)) {
      ++leaving;
    } else {
      intra_edge = true;
    }
  }
  if (leaving == 0 && !intra_edge) return l;  // a group of one
  if (leaving == 0) {
    l.bps = k.intra_bps;
    l.latency = k.intra_latency_s;
    l.cpu_share = k.intra_cpu_share;
    return l;
  }
  l.crosses = true;
  l.cross_share = double(leaving) / double(members);
  l.cpu_share = l.cross_share * k.inter_cpu_share + (1 - l.cross_share) * k.intra_cpu_share;
  const double host_share = k.inter_bps * double(k.devices_per_host) / double(leaving);
  l.bps = intra_edge ? std::min(k.intra_bps, host_share) : host_share;
  l.latency = k.inter_latency_s;
  return l;
}

double all_reduce_s(double bytes, int64_t n, const Link& l) {
  return n > 1 ? 2.0 * double(n - 1) * (l.latency + bytes / double(n) / l.bps) : 0.0;
}
double gather_s(double whole_bytes, int64_t n, const Link& l) {  // all-gather or reduce-scatter
  return n > 1 ? double(n - 1) * (l.latency + whole_bytes / double(n) / l.bps) : 0.0;
}
double exchange_s(double bytes, const Link& l) { return l.latency + bytes / l.bps; }

// ---- compute ----------------------------------------------------------------------------

// A piece of compute: matrix-product FLOPs and element-wise floats moved.
struct Work {
  double flops = 0, floats = 0;
};
struct Piece {
  double s = 0, gemm_s = 0;
};

// One block's pieces, forward and backward (the ops of nn::Block and autograd/ops/*.cpp).
struct BlockWork {
  Work attn_in, core, attn_out, mlp;          // forward: ln_1 + c_attn + split; core; c_proj + residual; MLP
  Work attn_in_b, core_b, attn_out_b, mlp_b;  // their backward, up to c_attn's and c_fc's input gradients
  Work attn_in_dw, mlp_dw;                    // ... c_attn's and c_fc's weight gradients
  Work ln_1_b, ln_2_b;                        // ... and the LayerNorms' (with the residual's sum)
  double scores = 0;                          // the attention scores the core computes
};

// The fused kernel's query x key pairs on a diagonal block of T queries: blocks of 64
// queries against the keys up to the block's last.
double causal_pairs(int64_t T) {
  double pairs = 0;
  for (int64_t r0 = 0; r0 < T; r0 += 64)
    pairs += double(std::min<int64_t>(64, T - r0)) * double(std::min<int64_t>(T, r0 + 64));
  return pairs;
}

// The attention scores one block computes (all query-key pairs it evaluates): one process
// evaluates the causal half (cuDNN skips masked tiles; the CPU's fused kernel takes blocks
// of 64 queries against the keys up to the block's last; the composed path on a GPU is
// counted as half too); the ring evaluates 2 cp + 1 pairs of chunks of Tc = Tl / 2 on every
// rank, two of them diagonal (the fused kernel's blocks there, as in one process), the
// others whole.
double attention_scores(const Shapes& s) {
  const double B = double(s.B), NHl = double(s.NHl), Tl = double(s.Tl);
  if (s.cp == 1) return B * NHl * (s.core == AttentionCore::cpu_fused ? causal_pairs(s.Tl) : Tl * Tl * 0.5);
  const double Tc = Tl / 2;
  const double diagonal = fused(s.core) ? causal_pairs(static_cast<int64_t>(Tc)) : Tc * Tc;
  return B * NHl * (2 * diagonal + Tc * Tc * double(2 * s.cp - 1));
}

BlockWork block_work(const Shapes& d) {
  const double N = d.N, Ns = d.Ns, C = d.C, Cl = d.Cl, H = d.H, S = attention_scores(d);
  BlockWork w;
  w.scores = S;
  // forward: ln_1 (read, write Ns C); c_attn 2 N C 3Cl; split_last's copies of q, k, v
  // (not when the fused core reads them in place)
  const double copies = d.core == AttentionCore::cpu_fused ? 0.0 : 1.0;
  w.attn_in = {2 * N * C * 3 * Cl, 2 * Ns * C + copies * 6 * N * Cl};
  // q k^T and p v: 2 hd FLOPs per score each; the masked softmax reads and writes the scores.
  // The ring also copies (each read and written once, in units of N Cl): q into its halves
  // (2), k and v into one message (4), each step's K/V into halves and each of the 2 cp key
  // chunks into K and V (4 cp + 4 cp), the output halves joined (2), and each of the 2 cp - 1
  // merges reads two partial outputs and writes one (3/2 each); backward copies as much
  const double cp = double(d.cp);
  const double ring_copies = d.cp == 1 ? 0.0 : (8 + 8 * cp + 1.5 * (2 * cp - 1)) * N * Cl;
  w.core = {4 * S * double(d.hd), 2 * S + ring_copies};
  // heads_to_back's copy; c_proj 2 N Cl C; the residual add
  w.attn_out = {2 * N * Cl * C, copies * 2 * N * Cl + 3 * Ns * C};
  // ln_2, c_fc 2 N C H with GELU (N H written again), c_proj 2 N H C, the residual add
  w.mlp = {4 * N * C * H, 2 * Ns * C + 2 * N * H + 3 * Ns * C};
  // backward: twice the FLOPs (input and weight gradients); LayerNorm's backward reads
  // three tensors and writes one, each bias gradient reads its output gradient, each weight
  // gradient is made and then added into the unit's gradient (3 passes of its size). The
  // column-parallel c_attn and c_fc are split at their input gradient: under TP the
  // trainer sums it over tp while their weight gradient is made (ops::linear_shared_input)
  w.attn_in_b = {2 * N * C * 3 * Cl, 6 * N * Cl + 3 * N * Cl};
  w.attn_in_dw = {2 * N * C * 3 * Cl, 3 * (3 * C * Cl)};
  w.ln_1_b = {0, 4 * Ns * C};
  // (fused: q k^T once more, to make the probabilities again, 2.5x the forward's FLOPs)
  w.core_b = {(fused(d.core) ? 2.5 : 2.0) * w.core.flops, 3 * S + ring_copies};
  w.attn_out_b = {2 * w.attn_out.flops, 2 * N * Cl + 2 * N * C + Ns * C + 3 * Cl * C};
  // c_proj's both gradients, GELU's, c_fc's input gradient; then c_fc's weight gradient
  w.mlp_b = {6 * N * C * H, 3 * N * H + N * (H + C) + 3 * (C * H)};
  w.mlp_dw = {2 * N * C * H, 3 * (C * H)};
  w.ln_2_b = {0, 4 * Ns * C + 2 * Ns * C};
  return w;
}

// ---- the replay -------------------------------------------------------------------------

// A collective in flight: its end on a queue inside the host, or its flow between hosts;
// its time alone, and how long the compute thread had run when it was issued.
struct Ticket {
  double done = 0;
  int flow = -1;
  double alone = 0, busy_at_start = 0;
};

// One rank's step: the compute thread's clock and where collectives run. Inside a host each
// communicator is a queue (a collective starts when the thread has issued it and the one
// before it on that communicator is done); between hosts every dimension that crosses them
// shares the host's links (SharedLink). On CPU ranks a collective also takes its link's
// cpu_share of its time from the computation that runs under it (the cores that compute
// copy its bytes): charged when it is waited for, on the compute that ran since it was
// issued, up to its time alone.
struct Replay {
  double now = 0, compute = 0, recompute = 0, gemm = 0;
  double busy = 0;  // the compute thread's time running: pieces and what transfers took of it
  std::map<std::string, double> queue_free, exposed;
  std::map<std::string, bool> crosses;         // the dimensions whose rings leave the host
  std::map<std::string, double> cpu_share;     // their links' (Link::cpu_share)
  SharedLink between_hosts;

  Ticket start(const std::string& dim, double dur) {
    Ticket t{0, -1, dur, busy};
    if (crosses[dim]) {
      t.flow = between_hosts.add(now, dur);
      return t;
    }
    double& f = queue_free[dim];
    f = std::max(f, now) + dur;
    t.done = f;
    return t;
  }
  void wait(const std::string& dim, const Ticket& t) {
    const double taken = cpu_share[dim] * std::min(t.alone, busy - t.busy_at_start);
    if (taken > 0) {
      now += taken;
      busy += taken;
      exposed[dim] += taken;
    }
    const double done = t.flow >= 0 ? between_hosts.end(t.flow) : t.done;
    if (done > now) {
      exposed[dim] += done - now;
      now = done;
    }
  }
  void sync(const std::string& dim, double dur) {
    if (dur > 0) wait(dim, start(dim, dur));
  }
  void run(const Piece& p, bool again) {
    now += p.s;
    busy += p.s;
    (again ? recompute : compute) += p.s;
    gemm += p.gemm_s;
  }
};

// The plan's checkpointing mode (Plan::ac, a train.activation_checkpointing word).
nn::ACMode ac_mode_of(const Plan& p) {
  TrainSection t;
  t.activation_checkpointing = p.ac;
  return ac_mode(t);
}

}  // namespace

StepTime predict_time(const Config& c, const Plan& p, const Cluster& k) {
  const dist::ParallelDims& D = p.dims;
  NDT_CHECK(D.world() == k.devices(), "internal: a plan of ", D.world(), " ranks on a cluster of ",
            k.devices(), " devices");
  const Shapes d = shapes_of(p, c.train.device);
  const double a = double(p.act_bytes);
  const double bf16_bps = k.bf16_memory_bps > 0 ? k.bf16_memory_bps : k.memory_bps;
  // an element-wise pass over bf16 values runs at its own rate: a CPU computes each in f32
  // (a conversion in, one out) and moves half the bytes in about the time of an f32 pass
  auto piece_of = [&](const Work& w, double bytes_each) {
    Piece q;
    q.gemm_s = w.flops / k.flops;
    q.s = q.gemm_s + w.floats * bytes_each / (bytes_each < kF ? bf16_bps : k.memory_bps);
    return q;
  };
  auto piece = [&](const Work& w) { return piece_of(w, a); };
  auto scaled = [&](const Work& w, double f) { return piece(Work{w.flops * f, w.floats * f}); };
  const BlockWork bw = block_work(d);
  const double N = double(d.N), C = double(d.C), Vl = double(d.Vl);
  // embeddings: wte(idx) + wpe(pos); backward scatters into their gradients
  const Piece emb_f = piece({0, 3 * N * C}), emb_b = piece({0, 3 * N * C});
  // ln_f, lm_head 2 N C Vl, the fused cross-entropy's passes over the logits (max,
  // exponentials, the gradient written)
  const Piece head_f = piece({2 * N * C * Vl, 2 * N * C + 3 * N * Vl});
  // lm_head's backward, and its weight gradient added into the tied embeddings' (3 Vl C)
  const Piece head_b = piece({4 * N * C * Vl, 3 * Vl * C + N * C});
  // AdamW on this rank's shard (read p g m v, write p m v), the norm and the clip's scale;
  // under bf16 also the copies made again from the master (read f32, write bf16) and, per
  // micro-step without FSDP, the bf16 gradients folded into the f32 ones (nn::fold_grad:
  // read both, write the f32 and zero the bf16)
  const bool mixed = p.act_bytes != int64_t(kF);
  double owned = 0, whole = 0;
  for (int64_t s : p.unit_shard_numel) owned += double(s);
  for (int64_t s : p.unit_numel) whole += double(s);
  const Piece optimizer = piece_of({0, 12 * owned + (mixed ? owned * (kF + a) / kF : 0.0)}, kF);
  const Piece fold = piece_of({0, mixed && !D.sharded() ? whole * (2 * a + 2 * kF) / kF : 0.0}, kF);

  const Link tp_link = link_of(D, k, Dim::tp), cp_link = link_of(D, k, Dim::cp),
             fsdp_link = link_of(D, k, Dim::fsdp), rep_link = link_of(D, k, Dim::replicate),
             dp_link = link_of(D, k, Dim::dp);
  // TP's all-reduces: one activation (or its gradient), in the dtype the reduction moves
  const double act_bytes = N * C * double(p.wire_act_reduce_bytes);
  const double kv_bytes = 2 * N * double(d.Cl) * a;  // the ring's K and V of this rank's two chunks
  const int64_t A = p.accum;
  const nn::ACMode ac = ac_mode_of(p);
  Replay r;
  r.crosses = {{"tp", tp_link.crosses},
               {"cp", cp_link.crosses},
               {"fsdp", fsdp_link.crosses},
               {"replicate", rep_link.crosses},
               {"scalars", false}};  // a few bytes: latency, not the queue
  r.cpu_share = {{"tp", tp_link.cpu_share},
                 {"cp", cp_link.cpu_share},
                 {"fsdp", fsdp_link.cpu_share},
                 {"replicate", rep_link.cpu_share},
                 {"scalars", 0.0}};

  // ring attention (dist/context_parallel): cp steps, each computing on one rank's K/V
  // while the next travels
  auto core = [&](const Work& w, bool again) {
    if (D.cp == 1) return r.run(piece(w), again);
    for (int64_t s = 0; s < D.cp; ++s) {
      const Ticket done = s + 1 < D.cp ? r.start("cp", exchange_s(kv_bytes, cp_link)) : Ticket{};
      r.run(scaled(w, 1.0 / double(D.cp)), again);
      if (s + 1 < D.cp) r.wait("cp", done);
    }
  };
  // its backward: each pass's K/V gradient goes back to the rank it came from (the other
  // way round the ring), waited for at once by the pass's backward node; the K/V were kept
  // (off the CPU's fused kernel each pair's attention runs again first: autograd::recompute)
  auto core_backward = [&](const Work& w) {
    if (D.cp == 1) return r.run(piece(w), false);
    for (int64_t s = 0; s < D.cp; ++s) {
      if (!fused(d.core))
        r.run(scaled(Work{bw.core.flops, 2 * bw.scores}, 1.0 / double(D.cp)), true);  // not the ring's copies
      r.run(scaled(w, 1.0 / double(D.cp)), false);
      if (s + 1 < D.cp) r.sync("cp", exchange_s(kv_bytes, cp_link));
    }
  };
  // TP's f and g: plain TP, g's all-reduce in forward and f's in backward; sequence
  // parallel, f all-gathers in forward and reduce-scatters in backward, g the other way
  // round (the same bytes, at twice the places). Each is waited for where it runs, but f's
  // backward in a block's column-parallel linears (column_backward below)
  const bool sp = p.sequence_parallel;
  const double gather_bytes = N * C * a;  // an all-gather moves the raw values
  auto tp_sync = [&](bool reduce) {
    if (D.tp == 1) return;
    if (!sp) return r.sync("tp", all_reduce_s(act_bytes, D.tp, tp_link));
    r.sync("tp", gather_s(reduce ? act_bytes : gather_bytes, D.tp, tp_link));
  };
  auto f_forward = [&]() { if (sp) tp_sync(false); };
  auto g_forward = [&]() { tp_sync(true); };
  auto f_backward = [&]() { tp_sync(true); };  // lm_head's: the tied wte's gradient waits for it
  auto g_backward = [&]() { if (sp) tp_sync(false); };
  // A column-parallel linear's backward (ops::linear_shared_input): with sequence parallel
  // its input is gathered again (for dW) while its input gradient is made; that gradient's
  // sum over tp (f's backward) runs while the weight gradient is made, waited for after it
  auto column_backward = [&](const Work& dx, const Work& dw) {
    if (D.tp == 1) {
      r.run(piece(dx), false);
      return r.run(piece(dw), false);
    }
    Ticket gathered_x;
    if (sp) gathered_x = r.start("tp", gather_s(gather_bytes, D.tp, tp_link));
    r.run(piece(dx), false);
    const Ticket summed = r.start("tp", sp ? gather_s(act_bytes, D.tp, tp_link) : all_reduce_s(act_bytes, D.tp, tp_link));
    if (sp) r.wait("tp", gathered_x);
    r.run(piece(dw), false);
    r.wait("tp", summed);
  };
  auto block_forward = [&](bool again) {
    f_forward();  // before c_attn
    r.run(piece(bw.attn_in), again);
    core(bw.core, again);
    r.run(piece(bw.attn_out), again);
    g_forward();  // after the attention
    f_forward();  // before c_fc
    r.run(piece(bw.mlp), again);
    g_forward();  // after the MLP
  };
  auto block_backward = [&](nn::ACMode mode) {
    if (mode == nn::ACMode::full) block_forward(true);
    g_backward();  // the MLP's output gradient
    column_backward(bw.mlp_b, bw.mlp_dw);  // and the MLP's input gradient summed
    r.run(piece(bw.ln_2_b), false);
    g_backward();  // the attention's output gradient
    r.run(piece(bw.attn_out_b), false);
    if (mode == nn::ACMode::selective) core(bw.core, true);
    core_backward(bw.core_b);
    column_backward(bw.attn_in_b, bw.attn_in_dw);  // and the attention's input gradient summed
    r.run(piece(bw.ln_1_b), false);
  };

  // FSDP (dist/fsdp/fsdp.cpp): unit u's all-gather and reduce-scatter on the shard group
  const bool sharded = D.sharded();
  const int64_t U = static_cast<int64_t>(p.unit_numel.size());
  std::vector<Ticket> gathered(static_cast<size_t>(U));
  // bytes of unit u's whole buffer in the dtype of a collective, and of its f32 gradient shard
  auto unit_bytes = [&](int64_t u, double each) { return double(p.unit_numel[static_cast<size_t>(u)]) * each; };
  auto shard_bytes = [&](int64_t u) { return double(p.unit_shard_numel[static_cast<size_t>(u)]) * kF; };
  auto start_gather = [&](int64_t u) {
    gathered[static_cast<size_t>(u)] = r.start("fsdp", gather_s(unit_bytes(u, a), D.fsdp(), fsdp_link));
  };
  std::deque<std::pair<int64_t, Ticket>> reducing;  // (unit, collective) of the reduce-scatters
  std::vector<Ticket> replica_done;
  auto drain = [&](size_t keep, bool sync) {  // FullyShardedDataParallel::drain
    while (reducing.size() > keep) {
      const auto [u, done] = reducing.front();
      reducing.pop_front();
      r.wait("fsdp", done);
      if (sync && D.dp_replicate > 1)
        replica_done.push_back(r.start("replicate", all_reduce_s(shard_bytes(u), D.dp_replicate, rep_link)));
    }
  };
  auto reduce = [&](int64_t u) {
    if (sharded) {
      reducing.emplace_back(
          u, r.start("fsdp", gather_s(unit_bytes(u, double(p.wire_reduce_bytes)), D.fsdp(), fsdp_link)));
    } else if (D.dp_replicate > 1) {  // DP: each unit's all-reduce (f32) as its gradient is ready
      replica_done.push_back(r.start("replicate", all_reduce_s(unit_bytes(u, kF), D.dp_replicate, rep_link)));
    }
  };

  for (int64_t m = 0; m < A; ++m) {
    const bool sync = m + 1 == A;
    if (sharded) {
      if (m == 0) {
        start_gather(0);  // the embeddings, gathered once for the whole step
        r.wait("fsdp", gathered[0]);
      }
      if (U > 1) start_gather(1);
    }
    r.run(emb_f, false);
    g_forward();  // the vocabulary-parallel embedding's sum
    for (int64_t u = 1; u < U; ++u) {
      if (sharded) {
        r.wait("fsdp", gathered[static_cast<size_t>(u)]);
        if (u + 1 < U) start_gather(u + 1);
      }
      block_forward(false);
    }
    f_forward();  // before lm_head
    r.run(head_f, false);
    if (D.tp > 1)
      for (int i = 0; i < 3; ++i) r.sync("tp", all_reduce_s(N * kF, D.tp, tp_link));  // max, sum, target
    r.run(head_b, false);
    f_backward();  // lm_head's input gradient
    for (int64_t u = U - 1; u >= 1; --u) {
      if (sharded) {
        drain(1, sync);
        if (u + 1 < U) r.wait("fsdp", gathered[static_cast<size_t>(u)]);  // the last stayed whole
        if (u > 1) start_gather(u - 1);
      }
      block_backward(nn::block_checkpointing(ac, p.ac_every, u - 1));
      if (sharded || sync) reduce(u);
    }
    g_backward();  // the embedding's output gradient
    r.run(emb_b, false);
    r.run(fold, false);
    if (sync) reduce(0);
    if (sharded) drain(0, sync);
    for (const Ticket& done : replica_done) r.wait("replicate", done);
    replica_done.clear();
  }
  // sequence parallel: the unsplit parameters' partial gradients summed over tp
  if (sp) r.sync("tp", all_reduce_s(double(p.sp_grad_numel) * kF, D.tp, tp_link));
  // the step: the loss over dp and cp, the gradient norm over the shards and tp, AdamW
  r.sync("scalars", all_reduce_s(8, D.dp(), dp_link) + all_reduce_s(8, D.cp, cp_link));
  r.sync("scalars", (sharded ? all_reduce_s(8, D.fsdp(), fsdp_link) : 0) + all_reduce_s(8, D.tp, tp_link));
  r.run(optimizer, false);

  StepTime t;
  t.step_s = r.now;
  t.compute_s = r.compute;
  t.recompute_s = r.recompute;
  t.gemm_s = r.gemm;
  t.exposed_by_dim = r.exposed;
  for (const auto& [dim, s] : r.exposed) t.exposed_s += s;
  t.tokens_per_s = double(p.tokens) / t.step_s;
  models::GPTConfig mc = c.model;
  const double model_flops = models::GPT(mc).flops_per_token(p.seq_len) * double(p.tokens);
  t.mfu = k.peak_flops > 0 ? model_flops / t.step_s / double(D.world()) / k.peak_flops : 0;
  auto link_for = [&](const std::string& dim) -> const Link& {
    return dim == "tp"        ? tp_link
           : dim == "cp"      ? cp_link
           : dim == "fsdp"    ? fsdp_link
           : dim == "scalars" ? dp_link
                              : rep_link;
  };
  for (const PlanComm& x : p.comm) {  // a rank's bytes go to its ring successor (the ring model)
    const int64_t inter = static_cast<int64_t>(std::llround(double(x.bytes) * link_for(x.dim).cross_share));
    t.bytes_inter += inter;
    t.bytes_intra += x.bytes - inter;
  }
  const std::pair<const char*, const Link*> named[] = {
      {"dp_replicate", &rep_link}, {"dp_shard", &fsdp_link}, {"cp", &cp_link}, {"tp", &tp_link}};
  for (const auto& [name, l] : named)
    if (l->crosses) t.across_hosts.emplace_back(name);

  // the bottleneck: the largest share of the step
  auto pct = [&](double s) { return static_cast<int>(std::lround(100 * s / t.step_s)); };
  std::string worst_dim;
  double worst = 0;
  for (const auto& [dim, s] : t.exposed_by_dim)
    if (s > worst) worst = s, worst_dim = dim;
  const std::map<std::string, std::string> words = {
      {"fsdp", "FSDP's all-gathers and reduce-scatters"},
      {"replicate", D.sharded() ? "HSDP's all-reduce of the gradient shards" : "DP's gradient all-reduce"},
      {"tp", "tensor parallelism's all-reduces (each waited for)"},
      {"cp", "ring attention's K/V exchange"},
      {"scalars", "the loss and norm all-reduces (latency)"}};
  if (worst > 0.2 * t.step_s) {
    t.bottleneck = "communication: " + words.at(worst_dim) + " not hidden, " + std::to_string(pct(worst)) +
                   "% of the step" + (link_for(worst_dim).crosses ? ", across hosts" : ", inside a host");
  } else if (t.recompute_s > 0.2 * t.step_s) {
    t.bottleneck = "recomputation: activation checkpointing's forward again, " +
                   std::to_string(pct(t.recompute_s)) + "% of the step";
  } else {
    const double ew = t.compute_s + t.recompute_s - t.gemm_s;
    t.bottleneck =
        t.gemm_s >= ew
            ? "compute: matrix products, " + std::to_string(pct(t.gemm_s)) + "% of the step"
            : "compute: element-wise passes over memory, " + std::to_string(pct(ew)) + "% of the step";
  }
  return t;
}

void print_cluster(const Cluster& k, std::ostream& o) {
  char line[320];
  std::snprintf(line, sizeof(line),
                "cluster: %s, %lld hosts x %lld devices; %.3g TFLOP/s reached per device (peak %.3g), memory "
                "%.3g GB/s, "
                "%.3g GB per device\n",
                k.name.c_str(), (long long)k.hosts, (long long)k.devices_per_host, k.flops / 1e12,
                k.peak_flops / 1e12, k.memory_bps / 1e9, k.memory_bytes / 1e9);
  o << line;
  if (k.dtype == "bfloat16" && k.bf16_memory_bps != k.memory_bps) {
    std::snprintf(line, sizeof(line), "  element-wise on bfloat16 values: %.3g GB/s (their 2 bytes each)\n",
                  k.bf16_memory_bps / 1e9);
    o << line;
  }
  std::snprintf(
      line, sizeof(line),
      "  links per device and direction: inside a host %.3g GB/s (%.3g us), between hosts %.3g GB/s "
      "(%.3g us)\n",
      k.intra_bps / 1e9, k.intra_latency_s * 1e6, k.inter_bps / 1e9, k.inter_latency_s * 1e6);
  o << line;
  if (k.intra_cpu_share > 0 || k.inter_cpu_share > 0) {
    std::snprintf(line, sizeof(line),
                  "  a transfer takes from the computation under it: %.2g of its time inside a host, %.2g between "
                  "hosts\n",
                  k.intra_cpu_share, k.inter_cpu_share);
    o << line;
  }
}

void print_time(const Plan& p, const StepTime& t, const Cluster& k, std::ostream& o) {
  (void)p;
  char line[320];
  print_cluster(k, o);
  o << "time per step (predicted):\n";
  auto ms = [](double s) { return s * 1e3; };
  std::snprintf(line, sizeof(line), "  step           %10.1f ms  %.0f tokens/s, MFU %.1f%%\n", ms(t.step_s),
                t.tokens_per_s, 100 * t.mfu);
  o << line;
  std::snprintf(line, sizeof(line),
                "  compute        %10.1f ms  (matrix products %.1f ms of compute and recompute)\n",
                ms(t.compute_s), ms(t.gemm_s));
  o << line;
  std::snprintf(line, sizeof(line), "  recompute      %10.1f ms\n", ms(t.recompute_s));
  o << line;
  std::string by;
  for (const auto& [dim, s] : t.exposed_by_dim) {
    char b[64];
    std::snprintf(b, sizeof(b), "%s%s %.1f ms", by.empty() ? "" : ", ", dim.c_str(), ms(s));
    by += b;
  }
  std::snprintf(line, sizeof(line), "  exposed comm   %10.1f ms  %s\n", ms(t.exposed_s), by.c_str());
  o << line;
  std::string across;
  for (const std::string& a : t.across_hosts) across += (across.empty() ? "" : ", ") + a;
  std::snprintf(
      line, sizeof(line),
      "  sent per step  %10.2f MiB inside a host, %.2f MiB to other hosts, a rank on average (%s)\n",
      double(t.bytes_intra) / (1 << 20), double(t.bytes_inter) / (1 << 20),
      across.empty() ? "no dimension crosses hosts" : ("across hosts: " + across).c_str());
  o << line;
  o << "  bottleneck: " << t.bottleneck << "\n";
}

nlohmann::json time_to_json(const StepTime& t) {
  return {{"step_s", t.step_s},
          {"compute_s", t.compute_s},
          {"recompute_s", t.recompute_s},
          {"exposed_s", t.exposed_s},
          {"gemm_s", t.gemm_s},
          {"exposed_by_dim", t.exposed_by_dim},
          {"tokens_per_s", t.tokens_per_s},
          {"mfu", t.mfu},
          {"bytes_intra", t.bytes_intra},
          {"bytes_inter", t.bytes_inter},
          {"across_hosts", t.across_hosts},
          {"bottleneck", t.bottleneck}};
}

nlohmann::json cluster_to_json(const Cluster& k) {
  return {{"name", k.name},
          {"hosts", k.hosts},
          {"devices_per_host", k.devices_per_host},
          {"flops", k.flops},
          {"peak_flops", k.peak_flops},
          {"memory_bps", k.memory_bps},
          {"bf16_memory_bps", k.bf16_memory_bps},
          {"memory_bytes", k.memory_bytes},
          {"intra_bps", k.intra_bps},
          {"intra_latency_s", k.intra_latency_s},
          {"inter_bps", k.inter_bps},
          {"inter_latency_s", k.inter_latency_s},
          {"intra_cpu_share", k.intra_cpu_share},
          {"inter_cpu_share", k.inter_cpu_share}};
}

}  // namespace ndt::train
