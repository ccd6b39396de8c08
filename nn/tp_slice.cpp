#include "nn/tp_slice.h"

#include <algorithm>

#include "nn/module.h"

namespace ndt::nn {

std::pair<int64_t, int64_t> tp_global_run(const ParamSpec& s, int64_t i) {
  const int64_t n = numel_of(s.shape);
  if (!s.tp.split()) return {i, n - i};
  const Shape& g = s.tp.global;
  // a row: every element of one index along dim 0 (an expert's matrix when there are 3 dims)
  const int64_t cols = s.tp.dim == 0 ? n / s.shape[0] : s.shape.size() > 1 ? s.shape[1] : 1;
  const int64_t gcols = s.tp.dim == 0 ? cols : g.size() > 1 ? g[1] : 1;
  const int64_t r = i / cols, c = i % cols;
  const int64_t block = g[s.tp.dim] / (s.tp.groups * s.tp.parts);  // local elements per group
  // local index j along the split dimension -> global index
  auto global_of = [&](int64_t j) {
    return j / block * (g[s.tp.dim] / s.tp.groups) + s.tp.rank * block + j % block;
  };
  if (s.tp.dim == 0) {  // whole rows; a run ends with the rank's block of rows
    const int64_t rows_left = block - r % block;
    return {global_of(r) * gcols + c, rows_left * cols - c};
  }
  // dim 1: a run ends with the block of columns (or the row)
  return {r * gcols + global_of(c), block - c % block};
}

std::pair<int64_t, int64_t> tp_local_of(const ParamSpec& s, int64_t g) {
  if (!s.tp.split()) return {0, g};
  const Shape& gs = s.tp.global;
  const int64_t gcols = s.tp.dim == 0 ? numel_of(gs) / gs[0] : gs.size() > 1 ? gs[1] : 1;
  const int64_t L = gs[s.tp.dim], G = L / s.tp.groups, b = G / s.tp.parts;  // per group, per rank in it
  // the index along the split dimension -> (rank, local index along it)
  auto local_of = [&](int64_t x) {
    const int64_t group = x / G, w = x % G;
    return std::pair<int64_t, int64_t>{w / b, group * b + w % b};
  };
  if (s.tp.dim == 0) {
    const auto [rank, row] = local_of(g / gcols);
    return {rank, row * gcols + g % gcols};
  }
  const auto [rank, col] = local_of(g % gcols);
  return {rank, g / gcols * (L / s.tp.parts) + col};
}

void for_each_tp_run(const ParamSpec& s, int64_t begin, int64_t end,
                     const std::function<void(int64_t local, int64_t global, int64_t len)>& fn) {
  for (int64_t i = begin; i < end;) {
    const auto [g, run] = tp_global_run(s, i);
    const int64_t len = std::min(run, end - i);
    fn(i, g, len);
    i += len;
  }
}

}  // namespace ndt::nn
