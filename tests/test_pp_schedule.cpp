// Pipeline-parallel schedules as data (dist/pipeline_parallel/schedule.h), checked in one
// process without MPI (label unit):
//   - every kind over p, m (and v) validates: counts, per-rank order, FIFO links, no deadlock;
//   - the simulated bubbles equal the papers' formulas: GPipe and 1F1B (p-1)/(m+p-1) of the
//     time, i.e. (p-1)/m of the compute; interleaved (p-1)/(v m) of the compute; ZB-H1 a
//     third of 1F1B's idle time;
//   - the micro-batches held at the peak: GPipe m, 1F1B min(p - r, m) on rank r;
//   - corrupted schedules (a deadlock, a dropped action, a link out of order) are refused
//     with a message naming the problem, so the checks can fail;
//   - str() draws 1f1b p=2 m=4 as the expected table;
//   - the simulation with each stage's own costs and the messages' times (the planner's).
// Legend: p pipeline ranks, v chunks per rank, m micro-batches, r a rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "dist/pipeline_parallel/schedule.h"
#include "tensor/error.h"

using namespace ndt::dist::pp;

namespace {

struct Config {
  Kind kind;
  int p, m, v;
  std::string name() const {
    return kind_name(kind) + " p=" + std::to_string(p) + " m=" + std::to_string(m) +
           " v=" + std::to_string(v);
  }
};

// Every valid combination the brief asks for: p in {1,2,4}, m in {1,2,4,8}; interleaved on
// p in {2,4}, v in {2,3}, m a multiple of p.
std::vector<Config> all_configs() {
  std::vector<Config> out;
  for (Kind k : {Kind::kGPipe, Kind::kOneFOneB, Kind::kZeroBubble})
    for (int p : {1, 2, 4})
      for (int m : {1, 2, 4, 8}) out.push_back({k, p, m, 1});
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int m : {1, 2, 4, 8})
        if (m % p == 0) out.push_back({Kind::kInterleaved, p, m, v});
  return out;
}

// The message of the ndt::Error that fn throws ("" when it throws none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ndt::Error& e) {
    return e.what();
  }
  return "";
}

double work(const Simulation& sim) {
  double sum = 0;
  for (double b : sim.busy) sum += b;
  return sum;
}
double idle(const Simulation& sim) { return sim.makespan * static_cast<double>(sim.busy.size()) - work(sim); }

}  // namespace

TEST(PpSchedule, EveryKindValidates) {
  for (const Config& c : all_configs()) {
    SCOPED_TRACE(c.name());
    const Schedule s = make_schedule(c.kind, c.p, c.m, c.v);
    EXPECT_NO_THROW(validate(s));
    ASSERT_EQ(static_cast<int>(s.ranks.size()), c.p);
    for (const auto& actions : s.ranks)
      EXPECT_EQ(static_cast<int>(actions.size()), (s.split_backward ? 3 : 2) * c.m * c.v);
  }
}

// GPipe and 1F1B differ in memory, not in time: with f = 1 and an unsplit B of b + w = 2,
// the makespan is 3 (m + p - 1), so idle / total = (p-1)/(m+p-1) and idle / compute =
// (p-1)/m (the paper's form, compute being 3m per rank).
TEST(PpSchedule, GPipeAnd1F1BBubble) {
  for (Kind k : {Kind::kGPipe, Kind::kOneFOneB})
    for (int p : {1, 2, 4})
      for (int m : {1, 2, 4, 8}) {
        SCOPED_TRACE(kind_name(k) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const Simulation sim = simulate(make_schedule(k, p, m), Timing{1, 1, 1});
        EXPECT_EQ(sim.makespan, 3.0 * (m + p - 1));
        EXPECT_DOUBLE_EQ(sim.bubble, (p - 1.0) / (m + p - 1.0));
        EXPECT_DOUBLE_EQ(idle(sim) / work(sim), (p - 1.0) / m);
      }
}

// Megatron's interleaved schedule gives exactly the paper's bubble under these timings:
// idle / compute = (p-1)/(v m) with f = 1, b = 2 per chunk, the makespan 3 (v m + p - 1).
TEST(PpSchedule, InterleavedBubble) {
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m));
        const Simulation sim = simulate(make_schedule(Kind::kInterleaved, p, m, v), Timing{1, 1, 1});
        EXPECT_EQ(sim.makespan, 3.0 * (v * m + p - 1));
        EXPECT_DOUBLE_EQ(idle(sim) / work(sim), (p - 1.0) / (v * m));
        EXPECT_LT(sim.bubble, simulate(make_schedule(Kind::kOneFOneB, p, m), Timing{1, 1, 1}).bubble);
      }
}

// ZB-H1 with f = b = w = 1: (p - 1) idle ticks per rank against 1F1B's 3 (p - 1), the paper's
// "about a third", exactly a third here; the makespan 3m + p - 1 once m >= p.
TEST(PpSchedule, ZeroBubbleH1Bubble) {
  const Simulation zb = simulate(make_schedule(Kind::kZeroBubble, 4, 8));
  const Simulation ob = simulate(make_schedule(Kind::kOneFOneB, 4, 8));
  std::cout << "p=4 m=8, f=b=w=1: zb-h1 makespan " << zb.makespan << " bubble " << zb.bubble
            << "; 1f1b makespan " << ob.makespan << " bubble " << ob.bubble << "\n";
  EXPECT_EQ(zb.makespan, 27.0);
  EXPECT_DOUBLE_EQ(zb.bubble, 1.0 / 9);  // 1 - 24/27
  EXPECT_EQ(ob.makespan, 33.0);
  EXPECT_DOUBLE_EQ(ob.bubble, 3.0 / 11);  // 1 - 24/33
  EXPECT_DOUBLE_EQ(idle(zb) / idle(ob), 1.0 / 3);
  for (int p : {2, 4, 8})
    for (int m : {1, 2, 4, 8, 16}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Simulation z = simulate(make_schedule(Kind::kZeroBubble, p, m));
      EXPECT_LT(z.bubble, simulate(make_schedule(Kind::kOneFOneB, p, m)).bubble);
      if (m >= p) EXPECT_EQ(z.makespan, 3.0 * m + p - 1);
    }
}

// ZB-H1's W's: each after its B on the same rank; rank r runs the W's of micro-batches
// 0..r-1 last (its cooldown bubble), every other W right after its B.
TEST(PpSchedule, ZeroBubbleDefersWeightGradients) {
  const int p = 4, m = 8;
  const Schedule s = make_schedule(Kind::kZeroBubble, p, m);
  ASSERT_TRUE(s.split_backward);
  for (int r = 0; r < p; ++r) {
    const auto& a = s.ranks[r];
    for (int i = 0; i < r; ++i) EXPECT_EQ(a[a.size() - r + i], (Action{Op::kW, i, 0})) << "rank " << r;
    for (size_t i = 0; i + 1 < a.size(); ++i)
      if (a[i].op == Op::kB && a[i].micro >= r)
        EXPECT_EQ(a[i + 1], (Action{Op::kW, a[i].micro, 0})) << "rank " << r;
  }
}

// Forward k on a rank runs chunk (k / p) % v, backward k the reverse; micro-batches go
// through each chunk in groups of p (Megatron's get_model_chunk_id).
TEST(PpSchedule, InterleavedChunkOrder) {
  const Schedule s = make_schedule(Kind::kInterleaved, 2, 4, 2);
  std::vector<std::pair<int, int>> fwd, bwd;  // (micro, chunk) in rank 0's order
  for (const Action& a : s.ranks[0]) (a.op == Op::kF ? fwd : bwd).push_back({a.micro, a.chunk});
  const std::vector<std::pair<int, int>> want_fwd = {{0, 0}, {1, 0}, {0, 1}, {1, 1},
                                                     {2, 0}, {3, 0}, {2, 1}, {3, 1}};
  const std::vector<std::pair<int, int>> want_bwd = {{0, 1}, {1, 1}, {0, 0}, {1, 0},
                                                     {2, 1}, {3, 1}, {2, 0}, {3, 0}};
  EXPECT_EQ(fwd, want_fwd);
  EXPECT_EQ(bwd, want_bwd);
}

TEST(PpSchedule, PeakInFlight) {
  for (int p : {1, 2, 4})
    for (int m : {1, 2, 4, 8}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const Simulation gp = simulate(make_schedule(Kind::kGPipe, p, m));
      const Simulation ob = simulate(make_schedule(Kind::kOneFOneB, p, m));
      const Simulation zb = simulate(make_schedule(Kind::kZeroBubble, p, m));
      EXPECT_EQ(ob.peak_in_flight[0], std::min(p, m));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(gp.peak_in_flight[r], m);
        EXPECT_EQ(ob.peak_in_flight[r], std::min(p - r, m));
      }
      EXPECT_EQ(zb.peak_in_flight, ob.peak_in_flight);  // ZB-H1: 1F1B's memory
    }
  // interleaved: the warmup forwards plus the first steady one, counted per (micro, chunk)
  for (int p : {2, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p}) {
        const Simulation sim = simulate(make_schedule(Kind::kInterleaved, p, m, v));
        for (int r = 0; r < p; ++r)
          EXPECT_EQ(sim.peak_in_flight[r], std::min((p - r - 1) * 2 + (v - 1) * p + 1, v * m))
              << "p=" << p << " v=" << v << " m=" << m << " rank " << r;
      }
}

TEST(PpSchedule, StrDraws1F1B) {
  const std::string want =
      "1f1b p=2 v=1 m=4 (one column per tick, every action one tick)\n"
      "rank 0: F0 F1 .  B0 F2 B1 F3 B2 .  B3\n"
      "rank 1: .  F0 B0 F1 B1 F2 B2 F3 B3 .\n";
  EXPECT_EQ(make_schedule(Kind::kOneFOneB, 2, 4).str(), want);
}

// The start times behind that table, with an unsplit B costing b + w = 2.
TEST(PpSchedule, SimulateStartTimes) {
  const Simulation sim = simulate(make_schedule(Kind::kOneFOneB, 2, 2), Timing{1, 1, 1});
  // rank 0: F0 F1 B0 B1; rank 1: F0 B0 F1 B1
  EXPECT_EQ(sim.start[0], (std::vector<double>{0, 1, 4, 7}));
  EXPECT_EQ(sim.start[1], (std::vector<double>{1, 2, 4, 5}));
  EXPECT_EQ(sim.makespan, 9.0);
  EXPECT_EQ(sim.busy, (std::vector<double>{6, 6}));
}

// ---- corrupted schedules are refused ----------------------------------------------

// GPipe p=2 m=2 with rank 0's F1 and B0 swapped: rank 0 waits for B0 from rank 1, which
// waits for F1 from rank 0. Every link is still in order; only the simulation finds it.
// Each stage's own costs and the messages' times (the planner's simulation): one
// micro-batch through two stages runs F0 on rank 0, the hop, F0 and B0 on rank 1, the hop
// back, B0 on rank 0; the same costs everywhere and no hops are the one-Timing simulation.
TEST(PpSchedule, SimulatesStageCostsAndMessageTimes) {
  const Schedule one = make_schedule(Kind::kGPipe, 2, 1);
  const StageTiming t{{Timing{1, 2, 1}, Timing{3, 1, 1}}, {0.5}};  // B is b + w unsplit
  const Simulation sim = simulate(one, t);
  EXPECT_DOUBLE_EQ(sim.finish[1], 1 + 0.5 + 3 + 2);
  EXPECT_DOUBLE_EQ(sim.finish[0], 1 + 0.5 + 3 + 2 + 0.5 + 3);
  EXPECT_DOUBLE_EQ(sim.makespan, sim.finish[0]);
  for (const Kind k : {Kind::kOneFOneB, Kind::kZeroBubble, Kind::kGPipe}) {
    const Schedule s = make_schedule(k, 4, 8);
    const Simulation a = simulate(s, Timing{1, 2, 1});
    const Simulation b =
        simulate(s, StageTiming{std::vector<Timing>(4, Timing{1, 2, 1}), std::vector<double>(3, 0)});
    EXPECT_DOUBLE_EQ(a.makespan, b.makespan);
    EXPECT_EQ(a.peak_in_flight, b.peak_in_flight);
    // a message time delays every dependent action, the makespan grows by at least 2 (p-1) hops
    const Simulation c =
        simulate(s, StageTiming{std::vector<Timing>(4, Timing{1, 2, 1}), std::vector<double>(3, 0.25)});
    EXPECT_GE(c.makespan, a.makespan + 2 * 3 * 0.25 - 1e-12) << kind_name(k);
  }
  EXPECT_THROW(simulate(one, StageTiming{{Timing{}}, {}}), ndt::Error);  // costs for 1 of 2 stages
}

TEST(PpSchedule, RefusesDeadlock) {
  Schedule s = make_schedule(Kind::kGPipe, 2, 2);
  std::swap(s.ranks[0][1], s.ranks[0][2]);  // F0 B0 F1 B1
  const std::string msg = error_of([&] { validate(s); });
  EXPECT_NE(msg.find("deadlock"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0 blocked at B0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1 blocked at F1"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { simulate(s); }).find("deadlock"), std::string::npos);
}

TEST(PpSchedule, RefusesMissingAction) {
  Schedule s = make_schedule(Kind::kOneFOneB, 2, 4);
  s.ranks[1].pop_back();  // B3
  const std::string msg = error_of([&] { validate(s); });
  EXPECT_NE(msg.find("rank 1 never runs B3"), std::string::npos) << msg;

  Schedule z = make_schedule(Kind::kZeroBubble, 2, 4);
  z.ranks[1].pop_back();  // the deferred W0
  EXPECT_NE(error_of([&] { validate(z); }).find("rank 1 never runs W0"), std::string::npos);
}

// Rank 1 takes micro-batch 1's activation before micro-batch 0's: no deadlock (the
// simulator waits for each by name), but a transport without tags would hand F1 the
// activation of micro-batch 0.
TEST(PpSchedule, RefusesLinkOutOfOrder) {
  Schedule s = make_schedule(Kind::kGPipe, 2, 2);
  std::swap(s.ranks[1][0], s.ranks[1][1]);  // rank 1: F1 F0 B0 B1
  EXPECT_NO_THROW(simulate(s));
  const std::string msg = error_of([&] { validate(s); });
  EXPECT_NE(msg.find("link rank 0 -> rank 1: message 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("FIFO"), std::string::npos) << msg;

  // interleaved p=2: activations and gradients share each link. Rank 0's F2.0 (the
  // activation for stage 1) and the B0.1 after it (the gradient for stage 1) both go to
  // rank 1; swapped, the gradient would arrive where rank 1 waits for the activation.
  Schedule in = make_schedule(Kind::kInterleaved, 2, 4, 2);
  ASSERT_EQ(in.ranks[0][4], (Action{Op::kF, 2, 0}));
  ASSERT_EQ(in.ranks[0][5], (Action{Op::kB, 0, 1}));
  std::swap(in.ranks[0][4], in.ranks[0][5]);
  EXPECT_NE(error_of([&] { validate(in); }).find("link rank 0 -> rank 1"), std::string::npos);
}

// GPipe's backwards may run in either micro-batch order as long as every rank runs the same
// one (schedule.cpp): reversed on every rank it validates, reversed on one rank it does not.
TEST(PpSchedule, GPipeBackwardOrder) {
  const int p = 4, m = 4;
  Schedule s = make_schedule(Kind::kGPipe, p, m);
  for (auto& actions : s.ranks) std::reverse(actions.begin() + m, actions.end());
  EXPECT_NO_THROW(validate(s));
  EXPECT_EQ(simulate(s).makespan, simulate(make_schedule(Kind::kGPipe, p, m)).makespan);
  std::reverse(s.ranks[1].begin() + m, s.ranks[1].end());  // rank 1 back to 0..m-1
  const std::string msg = error_of([&] { validate(s); });
  EXPECT_NE(msg.find("link rank 1 -> rank 0: message 0 is sent as the gradient of micro-batch 0"),
            std::string::npos)
      << msg;
}

TEST(PpSchedule, RefusesBadOrderOnOneRank) {
  Schedule s = make_schedule(Kind::kOneFOneB, 2, 2);
  std::swap(s.ranks[1][0], s.ranks[1][1]);  // rank 1: B0 F0 F1 B1
  EXPECT_NE(error_of([&] { validate(s); }).find("rank 1 runs B0 (action 0) before its forward"),
            std::string::npos);

  Schedule z = make_schedule(Kind::kZeroBubble, 2, 2);
  z.ranks[0].push_back(z.ranks[0][0]);  // F0 twice
  EXPECT_NE(error_of([&] { validate(z); }).find("rank 0 runs F0 twice"), std::string::npos);

  Schedule u = make_schedule(Kind::kOneFOneB, 2, 2);
  u.ranks[0].push_back({Op::kW, 0, 0});
  EXPECT_NE(error_of([&] { validate(u); }).find("does not split backward"), std::string::npos);
}

TEST(PpSchedule, RefusesBadParameters) {
  auto msg = [](Kind k, int p, int m, int v) { return error_of([&] { make_schedule(k, p, m, v); }); };
  EXPECT_NE(msg(Kind::kOneFOneB, 0, 4, 1).find("p (pipeline ranks) must be >= 1"), std::string::npos);
  EXPECT_NE(msg(Kind::kGPipe, 2, 0, 1).find("m (micro-batches) must be >= 1"), std::string::npos);
  EXPECT_NE(msg(Kind::kZeroBubble, 2, 4, 2).find("v (chunks per rank) must be 1"), std::string::npos);
  EXPECT_NE(msg(Kind::kInterleaved, 2, 4, 1).find("needs v (chunks per rank) >= 2"), std::string::npos);
  EXPECT_NE(msg(Kind::kInterleaved, 1, 4, 2).find("needs p (pipeline ranks) >= 2"), std::string::npos);
  EXPECT_NE(msg(Kind::kInterleaved, 4, 6, 2).find("m (micro-batches) must be a multiple of p"),
            std::string::npos);
  EXPECT_EQ(msg(Kind::kInterleaved, 4, 8, 2), "");
}

TEST(PpSchedule, KindNames) {
  for (Kind k : {Kind::kGPipe, Kind::kOneFOneB, Kind::kInterleaved, Kind::kZeroBubble})
    EXPECT_EQ(parse_kind(kind_name(k)), k);
  EXPECT_EQ(kind_name(Kind::kZeroBubble), "zb-h1");
  const std::string msg = error_of([] { parse_kind("pipedream"); });
  EXPECT_NE(msg.find("'pipedream' is not one of: gpipe, 1f1b, interleaved, zb-h1"), std::string::npos) << msg;
}
