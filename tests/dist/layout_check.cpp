// The data-parallel layout check of tests/dist/layout_check.h.
#include "layout_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "dist/data_parallel.h"
#include "dist/fsdp/fsdp.h"
#include "dist/mesh.h"
#include "dist_testing.h"
#include "optim/adamw.h"
#include "tensor/kernels.h"

namespace ndt::testing {
namespace {

constexpr int64_t kB = 2, kT = 8, kAccum = 2;

// Micro-batch m of the global batch: rows [0, rows) of a seeded token table.
Tensor tokens(int64_t rows, int64_t m, uint64_t which) {
  Tensor u = Tensor::empty({rows, kT}, DType::f32);
  kernels::fill_uniform(u, 5, which * 100 + static_cast<uint64_t>(m), 0, 0.0f, 37.0f);
  std::vector<int32_t> v;
  for (float x : u.to_vector<float>()) v.push_back(std::min(36, static_cast<int32_t>(x)));
  return Tensor::from_vector(v, {rows, kT});
}

int64_t rounded(int64_t bytes) { return std::max<int64_t>(64, (bytes + 63) / 64 * 64); }

}  // namespace

models::GPTConfig odd_sized_gpt() {
  return {.n_layer = 3, .n_head = 2, .n_embd = 16, .vocab_size = 37, .block_size = 16};
}

void check_layout(const DataParallelLayout& L, bool checkpointing) {
  auto world = ndt::testing::world();
  const int64_t R = L.replicate < 0 ? world->size() : L.replicate;  // -1: every rank a replica
  const dist::ParallelDims dims = dist::ParallelDims::resolve(1, R, L.shard, 1, 1, world->size());
  dist::DeviceMesh mesh(dims, world);
  const int64_t dp = dims.dp(), B = kB;
  SCOPED_TRACE(std::string(L.name) + (checkpointing ? " + activation checkpointing" : ""));

  // ---- the single process on the whole batch (dp * B rows), every rank
  models::GPT ref(odd_sized_gpt());
  nn::FlatParams ref_p = nn::materialize(ref.units(), Device::cpu(), DType::f64, 7);
  optim::AdamW ref_opt(ref_p, {0.9, 0.95, 1e-8, 0.1});

  // ---- the layout: this rank's shard (or replica) only
  models::GPT gpt(odd_sized_gpt());
  if (checkpointing) gpt.add_block_wrapper(nn::activation_checkpointing());
  const MemoryStats before = memory_stats(Device::cpu());
  nn::FlatParams par = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 7,
                                       nn::ShardSpec{mesh.fsdp_rank(), dims.fsdp()});
  optim::AdamW opt(par, {0.9, 0.95, 1e-8, 0.1});
  const int64_t allocated = memory_stats(Device::cpu()).in_use - before.in_use;
  int64_t want_bytes = 0;
  for (const nn::FlatUnit& u : par.units) want_bytes += 4 * rounded(u.shard_numel * 8);  // data, grad, m, v
  EXPECT_EQ(allocated, want_bytes) << "parameter + gradient + optimizer bytes of this rank";

  std::unique_ptr<dist::Strategy> strategy;
  dist::FullyShardedDataParallel* fsdp = nullptr;
  if (dims.sharded()) {
    auto f = std::make_unique<dist::FullyShardedDataParallel>(par, mesh.fsdp(), &mesh.replicate());
    fsdp = f.get();
    gpt.add_block_wrapper(f->wrapper());
    strategy = std::move(f);
  } else {
    strategy = std::make_unique<dist::DataParallel>(par, mesh.replicate());
  }
  mesh.reset_stats();

  for (int step = 0; step < 3; ++step) {
    ref_p.zero_grad();
    par.zero_grad();
    for (int64_t m = 0; m < kAccum; ++m) {
      const int64_t id = step * kAccum + m;
      Tensor x = tokens(dp * B, id, 1), y = tokens(dp * B, id, 2);
      backward(scale(ref.forward(x, y).loss, 1.0 / kAccum));
      strategy->begin_micro(m == kAccum - 1);
      const int64_t r0 = mesh.dp_rank() * B;
      backward(scale(gpt.forward(x.narrow(0, r0, B).contiguous(), y.narrow(0, r0, B).contiguous()).loss,
                     1.0 / kAccum));
      strategy->end_micro();
    }
    strategy->end_accumulation();
    const double ref_norm = optim::grad_norm(ref_p), norm = strategy->grad_norm();
    EXPECT_NEAR(norm, ref_norm, 1e-12 * ref_norm) << "step " << step;
    for (size_t i = 0; i < par.units.size(); ++i) {
      const nn::FlatUnit& u = par.units[i];
      const int64_t n = std::max<int64_t>(0, std::min(u.shard_numel, u.numel - u.shard_offset));
      std::vector<double> g = u.grad.to_vector<double>(),
                          want = ref_p.units[i].grad.narrow(0, u.shard_offset, n).to_vector<double>();
      double worst = 0;
      for (int64_t k = 0; k < n; ++k)
        worst = std::max(worst, std::abs(g[k] - want[k]) / (1e-6 + std::abs(want[k])));
      for (int64_t k = n; k < u.shard_numel; ++k) EXPECT_EQ(g[k], 0.0) << "padding of " << u.name;
      EXPECT_LT(worst, 1e-9) << "gradients of " << u.name << " at step " << step;
    }
    ref_opt.step(1e-2, optim::clip_scale(ref_norm, 0.5));
    opt.step(1e-2, optim::clip_scale(norm, 0.5));
    strategy->end_step();
  }
  for (size_t i = 0; i < par.units.size(); ++i) {
    const nn::FlatUnit& u = par.units[i];
    const int64_t n = std::max<int64_t>(0, std::min(u.shard_numel, u.numel - u.shard_offset));
    std::vector<double> p = u.data.narrow(0, 0, n).to_vector<double>(),
                        want = ref_p.units[i].data.narrow(0, u.shard_offset, n).to_vector<double>();
    double worst = 0;
    for (int64_t k = 0; k < n; ++k) worst = std::max(worst, std::abs(p[k] - want[k]));
    EXPECT_LT(worst, 1e-12) << "parameters of " << u.name << " after 3 steps";
  }

  // ---- communication: the analytic volume of 3 steps
  const int64_t steps = 3;
  if (fsdp) {
    EXPECT_LE(fsdp->max_gathered(), 2) << "blocks gathered at once";
    const int64_t n = dims.fsdp();
    int64_t ag = 0, rs = 0, ar = 0;
    const size_t units = par.units.size();
    for (size_t i = 0; i < units; ++i) {
      const int64_t P = par.units[i].padded_numel * 8;
      const bool emb = i == 0, last = i + 1 == units;
      // gathers: the embeddings once a step; a block in each forward, and again in each
      // backward except the last block (kept gathered from its forward)
      ag += (n - 1) * P / n * (emb ? 1 : kAccum * (last ? 1 : 2));
      rs += (n - 1) * P / n * (emb ? 1 : kAccum);
      if (dims.dp_replicate > 1) ar += 2 * (dims.dp_replicate - 1) * (P / n) / dims.dp_replicate;
    }
    EXPECT_EQ(mesh.fsdp().stats()[dist::CommKind::kAllGather], steps * ag);
    EXPECT_EQ(mesh.fsdp().stats()[dist::CommKind::kReduceScatter], steps * rs);
    EXPECT_EQ(mesh.replicate().stats()[dist::CommKind::kAllReduce], steps * ar);
  } else {
    const int64_t n = dims.dp_replicate;
    int64_t ar = 0;
    for (const nn::FlatUnit& u : par.units) ar += 2 * (n - 1) * (u.numel * 8) / n;
    EXPECT_EQ(mesh.replicate().stats()[dist::CommKind::kAllReduce], steps * ar);
    EXPECT_EQ(mesh.replicate().stats().calls[static_cast<size_t>(dist::CommKind::kAllReduce)],
              steps * static_cast<int64_t>(par.units.size()))
        << "one all-reduce per unit per step, none in the accumulation micro-steps";
  }
}

}  // namespace ndt::testing
