// ndtrain: pipeline-parallel schedules as data, and the simulator that checks them.
//
// A schedule is a table: for each pipeline rank, the ordered list of actions it runs in one
// optimizer step. The executor runs each rank's list in order; for each action it posts the
// receive of its input (activations for F, the output gradient for B) and, after computing,
// a non-blocking send of its output. It knows nothing about GPipe or 1F1B: all of that is here.
//
//   auto s = pp::make_schedule(pp::parse_kind("1f1b"), /*p=*/4, /*m=*/8);
//   pp::validate(s);                        // counts, FIFO order of every link, no deadlock
//   for (const pp::Action& a : s.ranks[my_rank]) run(a);
//   std::cout << s.str();                   // the table, one row per rank
//   pp::simulate(s, {1, 2, 0}).bubble;      // 3/11: idle over total time, p=4 m=8
//
// Layout (Megatron-LM's): p ranks, v model chunks per rank (v > 1 only for interleaved),
// m micro-batches. Virtual stage s in [0, p*v) lives on rank s % p as its chunk s / p, so
// rank r holds stages r, p + r, 2p + r, ... Stage 0 holds the embedding, stage p*v - 1
// the loss. An action's chunk is the local one (0..v-1); stage_of gives the global stage.
//
// Kinds (each cited in schedule.cpp where it is built):
//   gpipe        all F, then all B (Huang et al. 2019)
//   1f1b         PipeDream-Flush: warmup F's, then one F one B, then cooldown B's
//                (Narayanan et al. 2021); same bubble as GPipe, at most p micro-batches held
//   interleaved  Megatron's interleaved 1F1B over v chunks per rank (Narayanan et al. 2021):
//                bubble divided by v; needs v >= 2, p >= 2, m % p == 0
//   zb-h1        ZB-H1 (Qi et al. 2023): 1F1B with backward split into B (input gradient)
//                and W (weight gradient); rank r defers r W's into its cooldown bubble
//
// Communication contract (what validate checks, so the executor needs no tags): on every
// ordered pair of ranks a -> b, the order in which a's list sends (activations from F,
// gradients from B, one stream) equals the order in which b's list consumes them: NCCL, and
// MPI with one tag, match sends and receives in posting order. The simulator takes sends as
// non-blocking (a send never delays its rank's next action), so the executor must not let a
// posted send hold back a later receive (an NCCL send waits for its receive: keep sends off
// the stream that receives, or group them with it).
#pragma once

#include <string>
#include <vector>

namespace ndt::dist::pp {

// F: forward. B: backward; the full backward, or only the input gradient when the schedule
// splits backward. W: the weight gradient (split schedules only).
enum class Op { kF, kB, kW };

struct Action {
  Op op;
  int micro;  // 0..m-1
  int chunk;  // the local model chunk, 0..v-1
  bool operator==(const Action&) const = default;
};

enum class Kind { kGPipe, kOneFOneB, kInterleaved, kZeroBubble };

struct Schedule {
  Kind kind;
  int p, v, m;
  bool split_backward;                     // zb-h1: every B is followed later by its W
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions, in order

  int stages() const { return p * v; }
  int stage_of(int rank, int chunk) const { return chunk * p + rank; }
  // A readable table: one row per rank, one column per tick of simulate() with every action
  // costing one tick; cells "F3", "B3", "W3" ("F3.1": micro-batch 3, chunk 1, when v > 1),
  // "." idle. The 1f1b table for p=2, m=4:
  //   1f1b p=2 v=1 m=4 (one column per tick, every action one tick)
  //   rank 0: F0 F1 .  B0 F2 B1 F3 B2 .  B3
  //   rank 1: .  F0 B0 F1 B1 F2 B2 F3 B3 .
  // Throws like simulate() when the schedule deadlocks.
  std::string str() const;
};

// "gpipe", "1f1b", "interleaved", "zb-h1"; parse_kind throws ndt::Error listing them.
Kind parse_kind(const std::string& name);
std::string kind_name(Kind k);

// Throws ndt::Error, one line naming the parameter and the rule, for p < 1, m < 1, v != 1
// outside interleaved, and interleaved with p < 2, v < 2 or m % p != 0.
Schedule make_schedule(Kind k, int p, int m, int v = 1);

// Cost of one action on one chunk. An unsplit schedule's B is the whole backward: b + w.
struct Timing {
  double f = 1, b = 1, w = 1;
};

// Costs that differ by stage, and the time a message takes between two stages (the
// planner's: each stage's blocks at its own cost, each boundary on the link it crosses).
struct StageTiming {
  std::vector<Timing> stage;  // per virtual stage (p x v of them)
  std::vector<double> hop;    // hop[s]: stage s's activation to s + 1, or its gradient back (p x v - 1)
};

struct Simulation {
  double makespan = 0;
  std::vector<double> busy;                // per rank: the sum of its actions' costs
  std::vector<double> finish;              // per rank: when its last action ends
  double bubble = 0;                       // idle over total time: 1 - sum(busy) / (p * makespan)
  std::vector<int> peak_in_flight;         // per rank: most (micro, chunk) with F run, B not yet
  std::vector<std::vector<double>> start;  // start[r][i]: when ranks[r][i] starts
};

// Event-driven, zero communication latency: each rank runs its list strictly in order, an
// action starting when its rank is free and its inputs exist:
//   F(micro, stage s > 0)   after F(micro, s - 1), on whichever rank holds s - 1
//   B(micro, stage s)       after F(micro, s) and, unless s is the last stage, B(micro, s + 1)
//   W(micro, stage s)       after B(micro, s)
// Throws ndt::Error on a deadlock (no rank can proceed), naming each blocked action and
// what it waits for.
Simulation simulate(const Schedule& s, Timing t = {});
// The same with each stage's own costs, and a message from stage s to its neighbour arriving
// hop[s] after the action that sent it ended (the sender does not wait for it).
Simulation simulate(const Schedule& s, const StageTiming& t);

// Whether actions[i] continues the micro-step of actions[i - 1]: a B right after the F of its
// own micro-batch and chunk (one stage runs F0 B0 F1 B1 ..., plain gradient accumulation).
// The executor tells the strategy that a micro-step begins before every other action.
bool continues_micro_step(const std::vector<Action>& actions, size_t i);

// Throws ndt::Error naming the first problem: a rank count or action out of range; a
// (micro, chunk) without exactly one F and one B on its rank (and one W when split, none
// otherwise); a B before its F or a W before its B on the same rank; a link whose sends and
// receives are in different orders; a deadlock in simulate().
void validate(const Schedule& s);

}  // namespace ndt::dist::pp
