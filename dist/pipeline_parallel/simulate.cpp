// ndtrain: the checks of a pipeline schedule (schedule.h): the simulator, validate(), and
// Schedule::str(), which draws the simulation as a table.
//
// The simulator is list scheduling with fixed per-rank orders: an action starts at the
// later of its rank's previous action's end and its inputs' ends. That time does not depend
// on the order in which ranks are visited, so one sweep after another over the ranks,
// advancing each as far as it can, computes it; a sweep that advances nobody while actions
// remain is a deadlock.
#include "dist/pipeline_parallel/schedule.h"

#include <algorithm>
#include <sstream>

#include "tensor/error.h"

namespace ndt::dist::pp {

namespace {

// "F3", or "F3.1" (micro-batch 3, chunk 1) when there are several chunks.
std::string label(const Action& a, int v) {
  std::ostringstream os;
  os << "FBW"[static_cast<int>(a.op)] << a.micro;
  if (v > 1) os << "." << a.chunk;
  return os.str();
}

// An action named by its global stage: what another action waits for.
struct Ref {
  Op op;
  int micro, stage;
};

std::string describe(const Schedule& s, const Ref& x) {
  std::ostringstream os;
  os << "FBW"[static_cast<int>(x.op)] << x.micro << " of stage " << x.stage << " (rank " << x.stage % s.p
     << ")";
  return os.str();
}

// The actions an action waits for (schedule.h's rules), by global stage.
std::vector<Ref> inputs(const Schedule& s, int rank, const Action& a) {
  const int st = s.stage_of(rank, a.chunk);
  switch (a.op) {
    case Op::kF:
      if (st > 0) return {{Op::kF, a.micro, st - 1}};
      return {};
    case Op::kB:
      if (st < s.stages() - 1) return {{Op::kF, a.micro, st}, {Op::kB, a.micro, st + 1}};
      return {{Op::kF, a.micro, st}};
    case Op::kW:
      return {{Op::kB, a.micro, st}};
  }
  return {};
}

// Sizes and indices in range, so that the rest may index by them.
void check_ranges(const Schedule& s, const char* who) {
  NDT_CHECK(s.p >= 1 && s.v >= 1 && s.m >= 1, who, ": p, v, m must be >= 1, got p=", s.p, " v=", s.v,
            " m=", s.m);
  NDT_CHECK(static_cast<int>(s.ranks.size()) == s.p, who, ": ", s.ranks.size(), " rank lists for p=", s.p);
  for (int r = 0; r < s.p; ++r) {
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      NDT_CHECK(a.op == Op::kF || a.op == Op::kB || a.op == Op::kW, who, ": rank ", r, " action ", i,
                " has an unknown op ", static_cast<int>(a.op));
      NDT_CHECK(a.micro >= 0 && a.micro < s.m && a.chunk >= 0 && a.chunk < s.v, who, ": rank ", r, " action ",
                i, " is micro-batch ", a.micro, " chunk ", a.chunk, ", outside m=", s.m, " v=", s.v);
      NDT_CHECK(a.op != Op::kW || s.split_backward, who, ": rank ", r, " action ", i, " is ", label(a, s.v),
                " but this schedule does not split backward (its B's compute the weight gradients)");
    }
  }
}

// One message on a link: an activation leaving stage `from` forward, or a gradient leaving
// it backward.
struct Message {
  bool gradient;
  int micro, from;
  bool operator==(const Message&) const = default;
};

std::string describe(const Message& x) {
  std::ostringstream os;
  os << (x.gradient ? "the gradient" : "the activation") << " of micro-batch " << x.micro << " from stage "
     << x.from << " to stage " << (x.gradient ? x.from - 1 : x.from + 1);
  return os.str();
}

// Rank a's sends to rank b and rank b's receives from rank a, each in list order: the
// executor posts them in that order and the transport matches them in that order.
void check_link(const Schedule& s, int a, int b) {
  const std::string link = "pipeline schedule " + kind_name(s.kind) + ": link rank " + std::to_string(a) +
                           " -> rank " + std::to_string(b);
  const int last = s.stages() - 1;
  auto rank_of = [&](int stage) { return stage % s.p; };
  std::vector<Message> sent, received;
  std::vector<std::string> sender, receiver;  // the actions, for the message
  for (const Action& x : s.ranks[a]) {
    const int st = s.stage_of(a, x.chunk);
    if (x.op == Op::kF && st < last && rank_of(st + 1) == b)
      sent.push_back({false, x.micro, st});
    else if (x.op == Op::kB && st > 0 && rank_of(st - 1) == b)
      sent.push_back({true, x.micro, st});
    else
      continue;
    sender.push_back(label(x, s.v));
  }
  for (const Action& x : s.ranks[b]) {
    const int st = s.stage_of(b, x.chunk);
    if (x.op == Op::kF && st > 0 && rank_of(st - 1) == a)
      received.push_back({false, x.micro, st - 1});
    else if (x.op == Op::kB && st < last && rank_of(st + 1) == a)
      received.push_back({true, x.micro, st + 1});
    else
      continue;
    receiver.push_back(label(x, s.v));
  }
  for (size_t i = 0; i < std::min(sent.size(), received.size()); ++i) {
    NDT_CHECK(sent[i] == received[i], link, ": message ", i, " is sent as ", describe(sent[i]), " (",
              sender[i], " on rank ", a, ") but received as ", describe(received[i]), " (", receiver[i],
              " on rank ", b, "); sends and receives on one link must be in the same order (FIFO, no tags)");
  }
  NDT_CHECK(sent.size() == received.size(), link, ": ", sent.size(), " messages sent, ", received.size(),
            " received");
}

// One cost per stage and one message time per boundary, none negative.
void check_timing(const Schedule& s, const StageTiming& t) {
  NDT_CHECK(
      static_cast<int>(t.stage.size()) == s.stages() && static_cast<int>(t.hop.size()) == s.stages() - 1,
      "simulate: ", t.stage.size(), " stage costs and ", t.hop.size(), " hops for ", s.stages(), " stages");
  for (const Timing& x : t.stage)
    NDT_CHECK(x.f >= 0 && x.b >= 0 && x.w >= 0, "simulate: costs must be >= 0, got f=", x.f, " b=", x.b,
              " w=", x.w);
  for (double h : t.hop) NDT_CHECK(h >= 0, "simulate: message times must be >= 0, got ", h);
}

// The simulator's state between sweeps: when each action ended and where each rank stands.
struct Sweep {
  const Schedule& s;
  const StageTiming& t;
  // finish[slot(x)]: when action x ended, -1 until it has
  std::vector<double> finish;
  std::vector<double> free_at;  // when each rank's latest action ends
  std::vector<size_t> next;     // each rank's next action
  size_t done = 0, total = 0;
  Simulation sim;

  Sweep(const Schedule& schedule, const StageTiming& timing)
      : s(schedule), t(timing), finish(3 * s.stages() * s.m, -1.0), free_at(s.p, 0.0), next(s.p, 0) {
    sim.busy.assign(s.p, 0.0);
    sim.start.resize(s.p);
    for (int r = 0; r < s.p; ++r) {
      sim.start[r].assign(s.ranks[r].size(), 0.0);
      total += s.ranks[r].size();
    }
  }

  // (op * stages + stage) * m + micro
  int slot(const Ref& x) const { return (static_cast<int>(x.op) * s.stages() + x.stage) * s.m + x.micro; }

  // an action's cost on its stage; an unsplit schedule's B is the whole backward
  double cost(Op op, int stage) const {
    const Timing& x = t.stage[static_cast<size_t>(stage)];
    return op == Op::kF ? x.f : op == Op::kW ? x.w : s.split_backward ? x.b : x.b + x.w;
  }

  // when an input is there for an action on `stage`: another stage's output after its hop
  double arrival(const Ref& x, int stage) const {
    return x.stage == stage ? 0.0 : t.hop[static_cast<size_t>(std::min(x.stage, stage))];
  }

  // Runs rank r's next actions while their inputs have ended; true when it ran any.
  bool advance(int r) {
    bool advanced = false;
    for (; next[r] < s.ranks[r].size(); ++next[r], ++done, advanced = true) {
      const Action& a = s.ranks[r][next[r]];
      const int stage = s.stage_of(r, a.chunk);
      double begin = free_at[r];
      bool ready = true;
      for (const Ref& x : inputs(s, r, a)) {
        if (finish[slot(x)] < 0) ready = false;
        begin = std::max(begin, finish[slot(x)] + arrival(x, stage));
      }
      if (!ready) break;
      const double c = cost(a.op, stage);
      sim.start[r][next[r]] = begin;
      sim.busy[r] += c;
      free_at[r] = finish[slot({a.op, a.micro, stage})] = begin + c;
    }
    return advanced;
  }

  // A sweep advanced nobody: each blocked rank's next action and the inputs it waits for.
  [[noreturn]] void fail_deadlock() const {
    std::ostringstream os;
    os << "pipeline schedule " << kind_name(s.kind) << ": deadlock after " << done << " of " << total
       << " actions:";
    const char* sep = " ";
    for (int r = 0; r < s.p; ++r) {
      if (next[r] == s.ranks[r].size()) continue;
      const Action& a = s.ranks[r][next[r]];
      os << sep << "rank " << r << " blocked at " << label(a, s.v) << " (action " << next[r]
         << ") waiting for";
      for (const Ref& x : inputs(s, r, a))
        if (finish[slot(x)] < 0) os << " " << describe(s, x);
      sep = "; ";
    }
    NDT_FAIL(os.str());
  }

  // Sweeps over the ranks until every action has run.
  void run() {
    while (done < total) {
      bool advanced = false;
      for (int r = 0; r < s.p; ++r)
        if (advance(r)) advanced = true;
      if (!advanced) fail_deadlock();
    }
  }
};

// The totals of a finished simulation: makespan, finish, peak micro-batches held, bubble.
Simulation summarize(const Schedule& s, Simulation sim, const std::vector<double>& free_at) {
  // Micro-batches held: from F to B. (After B a micro-batch keeps only what its W needs,
  // the ZB paper's M_W, less than the M_B it held; that is how ZB-H1 matches 1F1B's peak.)
  double work = 0;
  sim.finish = free_at;
  for (int r = 0; r < s.p; ++r) {
    sim.makespan = std::max(sim.makespan, free_at[r]);
    work += sim.busy[r];
    int held = 0, peak = 0;
    for (const Action& a : s.ranks[r]) {
      if (a.op == Op::kF) peak = std::max(peak, ++held);
      if (a.op == Op::kB) --held;
    }
    sim.peak_in_flight.push_back(peak);
  }
  sim.bubble = sim.makespan > 0 ? 1.0 - work / (s.p * sim.makespan) : 0.0;
  return sim;
}

}  // namespace

Simulation simulate(const Schedule& s, Timing t) {
  check_ranges(s, "simulate");
  return simulate(s, StageTiming{std::vector<Timing>(static_cast<size_t>(s.stages()), t),
                                 std::vector<double>(static_cast<size_t>(s.stages() - 1), 0.0)});
}

Simulation simulate(const Schedule& s, const StageTiming& t) {
  check_ranges(s, "simulate");
  check_timing(s, t);
  Sweep sweep(s, t);
  sweep.run();
  return summarize(s, std::move(sweep.sim), sweep.free_at);
}

void validate(const Schedule& s) {
  check_ranges(s, "validate");
  const std::string what = "pipeline schedule " + kind_name(s.kind) + ": ";
  // Exactly one F, one B (one W when split) per (micro, chunk) on every rank, each after the
  // one it needs on the same rank: seen[op][chunk * m + micro] counts them in list order.
  for (int r = 0; r < s.p; ++r) {
    std::vector<std::vector<int>> seen(3, std::vector<int>(s.v * s.m, 0));
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      const int k = a.chunk * s.m + a.micro;
      const int op = static_cast<int>(a.op);
      NDT_CHECK(seen[op][k] == 0, what, "rank ", r, " runs ", label(a, s.v), " twice (again at action ", i,
                ")");
      NDT_CHECK(a.op != Op::kB || seen[0][k] == 1, what, "rank ", r, " runs ", label(a, s.v), " (action ", i,
                ") before its forward");
      NDT_CHECK(a.op != Op::kW || seen[1][k] == 1, what, "rank ", r, " runs ", label(a, s.v), " (action ", i,
                ") before its B");
      ++seen[op][k];
    }
    for (int op = 0; op < (s.split_backward ? 3 : 2); ++op) {
      for (int k = 0; k < s.v * s.m; ++k) {
        const Action a{static_cast<Op>(op), k % s.m, k / s.m};
        NDT_CHECK(seen[op][k] == 1, what, "rank ", r, " never runs ", label(a, s.v), " (micro-batch ",
                  a.micro, ", chunk ", a.chunk, ")");
      }
    }
  }
  for (int a = 0; a < s.p; ++a)
    for (int b = 0; b < s.p; ++b)
      if (a != b) check_link(s, a, b);
  simulate(s);  // throws on a deadlock
}

std::string Schedule::str() const {
  // Unit costs: one column per action, whatever the timing a caller would simulate with.
  const Simulation sim = simulate(*this, Timing{1, 1, split_backward ? 1.0 : 0.0});
  const int ticks = static_cast<int>(sim.makespan);
  std::vector<std::vector<std::string>> cells(p, std::vector<std::string>(ticks, "."));
  size_t width = 1;
  for (int r = 0; r < p; ++r) {
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      const Action& a = ranks[r][i];
      const std::string c = label(a, v);
      width = std::max(width, c.size());
      cells[r][static_cast<int>(sim.start[r][i])] = c;
    }
  }
  std::ostringstream os;
  os << kind_name(kind) << " p=" << p << " v=" << v << " m=" << m
     << " (one column per tick, every action one tick)\n";
  const size_t digits = std::to_string(p - 1).size();  // rank numbers right-aligned
  for (int r = 0; r < p; ++r) {
    std::string row = "rank " + std::string(digits - std::to_string(r).size(), ' ') + std::to_string(r) + ":";
    for (const std::string& c : cells[r]) row += " " + c + std::string(width - c.size(), ' ');
    row.erase(row.find_last_not_of(' ') + 1);
    os << row << "\n";
  }
  return os.str();
}

}  // namespace ndt::dist::pp
