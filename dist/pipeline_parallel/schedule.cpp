// TEMPORARY
#include "dist/pipeline_parallel/schedule.h"
#include <algorithm>
#include "tensor/error.h"
namespace ndt::dist::pp {
Kind parse_kind(const std::string& n) {
  if (n == "gpipe") return Kind::kGPipe;
  if (n == "1f1b") return Kind::kOneFOneB;
  NDT_FAIL("temp: unknown ", n);
}
Schedule make_schedule(Kind k, int p, int m, int v) {
  Schedule s{k, p, v, m, false, {}};
  s.ranks.resize(p);
  for (int r = 0; r < p; ++r) {
    auto& a = s.ranks[r];
    if (k == Kind::kGPipe) {
      for (int j = 0; j < m; ++j) a.push_back({Op::kF, j, 0});
      for (int j = 0; j < m; ++j) a.push_back({Op::kB, j, 0});
    } else {
      int w = std::min(p - r - 1, m), f = 0, b = 0;
      for (; f < w; ++f) a.push_back({Op::kF, f, 0});
      while (f < m) { a.push_back({Op::kF, f++, 0}); a.push_back({Op::kB, b++, 0}); }
      while (b < m) a.push_back({Op::kB, b++, 0});
    }
  }
  return s;
}
}
