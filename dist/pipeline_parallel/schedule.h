// TEMPORARY stand-in until the schedule branch merges (same API)
#pragma once
#include <string>
#include <vector>
namespace ndt::dist::pp {
enum class Op { kF, kB, kW };
struct Action { Op op; int micro; int chunk; };
enum class Kind { kGPipe, kOneFOneB, kInterleaved, kZeroBubble };
struct Schedule {
  Kind kind; int p, v, m;
  bool split_backward = false;
  std::vector<std::vector<Action>> ranks;
  int stage_of(int rank, int chunk) const { return chunk * p + rank; }
};
}
namespace ndt::dist::pp {
Kind parse_kind(const std::string& name);
Schedule make_schedule(Kind k, int p, int m, int v = 1);
inline void validate(const Schedule&) {}
}
