// Pipeline parallelism at the component level, under mpirun, in float64: the world is one
// pipeline of W stages (2, 3 or 4), each rank a models::GPT of its blocks only, run by
// dist::Pipeline under every schedule; the loss and every gradient of the rank's units equal
// the single process's on the same micro-batches (which every rank also runs), to float64
// rounding. The receives are posted both ways the executor knows (ahead of the action
// before, as over MPI; grouped with that action's send, as over NCCL), so the NCCL order
// runs here too. GPT-2's tied wte is held by the first and the last stage: their gradients,
// summed between the two, are the single process's. A mixture-of-experts llama with both
// router losses too: its routers' statistics travel beside every message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "dist/mesh.h"
#include "dist/pipeline_parallel/pipeline.h"
#include "dist/pipeline_parallel/stages.h"
#include "dist_testing.h"
#include "tensor/kernels.h"
#include "train/planner/block_kinds.h"

namespace {

using namespace ndt;

constexpr int64_t kB = 2, kT = 8;

models::GPTConfig pipeline_gpt(int64_t stages) {
  // two blocks a stage: interleaved runs two chunks of one
  return {.n_layer = 2 * stages, .n_head = 2, .n_embd = 16, .vocab_size = 37, .block_size = 16};
}

// A mixture-of-experts llama of as many blocks, with both router losses: their statistics
// travel between the stages beside every message (2 parts each way, grouped pairwise)
models::GPTConfig pipeline_moe(int64_t stages) {
  models::GPTConfig c{
      .arch = "llama", .n_layer = 2 * stages, .n_head = 2, .n_embd = 16, .vocab_size = 37, .block_size = 16};
  c.n_kv_head = 1;
  c.intermediate_size = 20;
  c.rope = {.theta = 100};
  c.n_experts = 4;
  c.n_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.router_aux_loss_coef = 0.3;
  c.router_z_loss_coef = 0.2;
  return c;
}

// Micro-batch m's inputs (which 0) or targets (which 1).
Tensor tokens(int64_t m, uint64_t which) {
  Tensor u = Tensor::empty({kB, kT}, DType::f32);
  kernels::fill_uniform(u, 11, which * 100 + static_cast<uint64_t>(m), 0, 0.0f, 37.0f);
  std::vector<int32_t> v;
  for (float x : u.to_vector<float>()) v.push_back(std::min(36, static_cast<int32_t>(x)));
  return Tensor::from_vector(v, {kB, kT});
}

void check_schedule(dist::pp::Kind kind, bool grouped, bool moe = false) {
  auto world = ndt::testing::world();
  const int p = world->size();
  const int v = kind == dist::pp::Kind::kInterleaved ? 2 : 1;
  SCOPED_TRACE(dist::pp::kind_name(kind) + (grouped ? ", receives grouped with sends" : ", receives ahead"));
  dist::DeviceMesh mesh(dist::ParallelDims::resolve(p, 1, 1, 1, 1, p), world);
  const models::GPTConfig cfg = moe ? pipeline_moe(p) : pipeline_gpt(p);
  const int64_t kMicro =
      2 * p;  // a multiple of p (interleaved's rounds), and more than p (1F1B's steady state)

  // the single process: every micro-batch's backward adds 1/m of its gradient
  models::GPT ref(cfg);
  nn::FlatParams ref_p = nn::materialize(ref.units(), Device::cpu(), DType::f64, 7);
  double ref_loss = 0;
  for (int64_t m = 0; m < kMicro; ++m) {
    Tensor loss = ref.forward(tokens(m, 0), tokens(m, 1)).loss;
    ref_loss += loss.item();
    backward(scale(loss, 1.0 / kMicro));
  }

  // this rank's stage(s)
  const std::vector<int64_t> blocks = dist::stage_blocks(cfg, train::block_cost(cfg, kT), p * v, "");
  models::GPT gpt(cfg, dist::pipeline_part(blocks, p, mesh.coords().pp));
  nn::FlatParams par = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 7);
  dist::NoParallelism strategy(par);
  dist::Pipeline pipe(
      gpt, mesh.pp(), strategy, dist::pp::make_schedule(kind, p, static_cast<int>(kMicro), v),
      [&](const Tensor& idx) {
        return Shape{idx.size(0), idx.size(1), cfg.n_embd};
      },
      DType::f64);
  pipe.set_grouped_exchange(grouped);
  std::vector<dist::Pipeline::Batch> micro;
  for (int64_t m = 0; m < kMicro; ++m) micro.push_back({tokens(m, 0), tokens(m, 1)});
  const double loss = pipe.train(micro, 1.0 / kMicro);
  strategy.end_accumulation();
  EXPECT_NEAR(loss, ref_loss, 1e-12 * ref_loss) << "the sum of the micro-batches' losses, on every stage";
  // the tied embeddings: the first and the last stage's gradients summed
  const bool end = !moe && (gpt.part().first || gpt.part().last);
  std::shared_ptr<dist::Communicator> ends =
      mesh.pp().split(end ? 0 : 1, gpt.part().first ? 0 : 1, "pp_ends");
  if (end) ends->all_reduce(par.units[0].grad, dist::ReduceOp::kSum)->wait();

  int64_t compared = 0;
  for (const nn::FlatUnit& u : par.units)
    for (const nn::FlatParam& fp : u.params) {
      const nn::FlatParam* rp = ref_p.find(fp.spec.name);
      ASSERT_NE(rp, nullptr) << fp.spec.name;
      const std::vector<double> got = fp.value.grad().to_vector<double>(),
                                want = rp->value.grad().to_vector<double>();
      double scale = 1e-30, worst = 0;
      for (double w : want) scale = std::max(scale, std::abs(w));
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
      EXPECT_LT(worst, 1e-12 * scale) << fp.spec.name;
      ++compared;
    }
  EXPECT_GT(compared, 0);
}

class DistPP : public ::testing::TestWithParam<std::tuple<dist::pp::Kind, bool>> {};

TEST_P(DistPP, PipelineGradientsEqualOneProcess) {
  check_schedule(std::get<0>(GetParam()), std::get<1>(GetParam()));
}

// the load-balancing and z losses of every stage's MoE layers, in every schedule, the receives
// posted both ways
TEST_P(DistPP, MixtureOfExpertsGradientsEqualOneProcess) {
  check_schedule(std::get<0>(GetParam()), std::get<1>(GetParam()), /*moe=*/true);
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, DistPP,
    ::testing::Combine(::testing::Values(dist::pp::Kind::kGPipe, dist::pp::Kind::kOneFOneB,
                                         dist::pp::Kind::kInterleaved, dist::pp::Kind::kZeroBubble),
                       ::testing::Bool()),
    [](const auto& info) {
      std::string n = dist::pp::kind_name(std::get<0>(info.param));
      std::replace(n.begin(), n.end(), '-', '_');
      return n + (std::get<1>(info.param) ? "_grouped" : "_ahead");
    });

}  // namespace
