// bench_pipeline: the pipeline schedules side by side, as tables and as simulated bubbles
// against the formulas of their papers.
//
//   build/bench_pipeline             # p = 4 stages, m = 8 micro-batches, v = 2 chunks
//   build/bench_pipeline 2 4 2       # p, m, v
//
// Each schedule (dist/pipeline_parallel/schedule.h) is printed one column per action, then
// simulated with a stage's forward costing 1 and its backward 2 (split: input gradient 1,
// weight gradient 1; an interleaved chunk, 1/v of a stage, 1/v of that), zero communication time: the bubble
// is the idle share of p x makespan, and idle / compute is the figure the papers give ((p-1)/m for GPipe and
// 1F1B, (p-1)/(v m) interleaved; the zero-bubble H1 schedule a third of 1F1B's). The peak column is how many
// micro-batches' activations the busiest rank holds at once (1F1B: p on the first stage,
// GPipe: m). Measured step times and memory of real runs are in docs/parallel/pipeline-parallel.md.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

#include "dist/pipeline_parallel/schedule.h"

using namespace ndt::dist::pp;

namespace {
int integer(const char* what, const char* s) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (!*s || *end || v < 1 || v > 1024)
    throw std::runtime_error(std::string(what) + " must be a number in 1..1024, got '" + s + "'");
  return static_cast<int>(v);
}
}  // namespace

int main(int argc, char** argv) {
  int p = 4, m = 8, v = 2;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::printf(
            "usage: bench_pipeline [P [M [V]]]\n"
            "  P pipeline stages (4), M micro-batches per step (8), V model chunks per rank for the "
            "interleaved schedule (2)\n");
        return 0;
      }
      if (!a.empty() && a[0] == '-') throw std::runtime_error("unknown option " + a + " (see --help)");
      if (i > 3) throw std::runtime_error("at most three numbers: P M V (see --help)");
      (i == 1 ? p : i == 2 ? m : v) = integer(i == 1 ? "P" : i == 2 ? "M" : "V", argv[i]);
    }
    std::printf("%-12s %9s %8s %13s %13s %6s\n", "schedule", "makespan", "bubble", "idle/compute", "formula",
                "peak");
    std::string tables;
    for (Kind k : {Kind::kGPipe, Kind::kOneFOneB, Kind::kInterleaved, Kind::kZeroBubble}) {
      if (k == Kind::kInterleaved && (p < 2 || m % p != 0)) {
        std::printf("%-12s (needs P >= 2 and M a multiple of P)\n", kind_name(k).c_str());
        continue;
      }
      const Schedule s = make_schedule(k, p, m, k == Kind::kInterleaved ? v : 1);
      validate(s);
      // a chunk of the interleaved schedule holds 1/v of a stage's blocks: it costs 1/v
      const double c = 1.0 / s.v;
      const Timing t = s.split_backward ? Timing{1, 1, 1} : Timing{c, 2 * c, 0};
      const Simulation sim = simulate(s, t);
      double busy = 0;
      for (double b : sim.busy) busy += b;
      const double idle = p * sim.makespan - busy;
      const double formula = k == Kind::kInterleaved  ? (p - 1.0) / (v * m)
                             : k == Kind::kZeroBubble ? (p - 1.0) / m / 3.0
                                                      : (p - 1.0) / m;
      int peak = 0;
      for (int x : sim.peak_in_flight) peak = std::max(peak, x);
      std::printf("%-12s %9.1f %8.3f %13.4f %13.4f %6d\n", kind_name(k).c_str(), sim.makespan, sim.bubble,
                  idle / busy, formula, peak);
      tables += s.str() + "\n";
    }
    std::printf("\n%s", tables.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipeline: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
