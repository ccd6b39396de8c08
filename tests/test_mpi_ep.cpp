// Expert parallelism at the layer level, under mpirun (2, 3 and 4 ranks), in float64: the
// all-to-all-v of the communicator (contents and bytes), and an MoE MLP whose experts are split
// over the world (2 experts per rank, top 2) against the whole layer on the same inputs: each
// rank's outputs and input gradients, the router's gradient summed over the ranks, and each
// rank's expert slices' gradients against the whole layer's over every rank's tokens; the bytes
// of the exchanges against the routing's count; a combine that forgets the routing weights fails.
#include <gtest/gtest.h>

#include <vector>

#include "autograd/engine.h"
#include "autograd/hooks.h"
#include "autograd/ops.h"
#include "dist/expert_parallel/comm.h"
#include "dist/expert_parallel/expert_parallel.h"
#include "dist/mesh.h"
#include "dist/tensor_parallel/comm.h"
#include "dist_testing.h"
#include "nn/flat.h"
#include "nn/moe.h"

using namespace ndt;
using namespace ndt::testing;  // world, randn, max_diff (tests/dist/dist_testing.h)

namespace {

// rank r sends r + j + 1 values to member j, each value 1000 r + 100 j + i
TEST(AllToAllV, ExchangesBlocksOfEveryLengthAndCountsTheBytes) {
  auto& c = *world();
  const int64_t n = c.size(), r = c.rank();
  std::vector<int64_t> send, recv;
  std::vector<double> values;
  for (int64_t j = 0; j < n; ++j) {
    send.push_back(r + j + 1);
    recv.push_back(j + r + 1);
    for (int64_t i = 0; i < r + j + 1; ++i) values.push_back(1000.0 * r + 100.0 * j + i);
  }
  int64_t R = 0;
  for (int64_t v : recv) R += v;
  c.reset_stats();
  Tensor out = Tensor::zeros({R}, DType::f64);
  c.all_to_all_v(out, recv, Tensor::from_vector(values, {static_cast<int64_t>(values.size())}), send)->wait();
  const std::vector<double> got = out.to_vector<double>();
  size_t at = 0;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < j + r + 1; ++i) EXPECT_EQ(got[at++], 1000.0 * j + 100.0 * r + i) << "from " << j;
  const int64_t sent = static_cast<int64_t>(values.size()) - send[static_cast<size_t>(r)];
  EXPECT_EQ(c.stats()[dist::CommKind::kAllToAll], sent * 8);
  // mismatched counts: one line naming the call
  EXPECT_THROW(c.all_to_all_v(out, recv, out, std::vector<int64_t>(static_cast<size_t>(n), 0)), Error);
}

// The world ranks of c's members, in its order
std::vector<int32_t> members(dist::Communicator& c) {
  Tensor all = Tensor::zeros({c.size()}, DType::i32);
  c.all_gather(all, Tensor::from_vector(std::vector<int32_t>{world()->rank()}, {1}))->wait();
  return all.to_vector<int32_t>();
}

// The ep groups are consecutive data ranks inside a shard group (or the replicas when dp_shard
// is 1); ep_data joins the ranks of one ep rank across the groups.
TEST(ExpertParallel, MeshGroups) {
  auto w = world();
  if (w->size() != 4) GTEST_SKIP() << "4 ranks";
  const int me = w->rank();
  for (const bool sharded : {true, false}) {
    dist::ParallelDims dims = dist::ParallelDims::resolve(1, sharded ? 2 : 4, sharded ? 2 : 1, 1, 1, 4);
    dims.set_expert_parallel(2);
    dist::DeviceMesh mesh(dims, w);
    EXPECT_EQ(members(mesh.ep()), (std::vector<int32_t>{me / 2 * 2, me / 2 * 2 + 1}));
    EXPECT_EQ(members(mesh.ep_data()), (std::vector<int32_t>{me % 2, me % 2 + 2}));
    EXPECT_EQ(mesh.ep_rank(), me % 2);
  }
  dist::ParallelDims odd = dist::ParallelDims::resolve(1, 1, 4, 1, 1, 4);
  EXPECT_THROW(odd.set_expert_parallel(3), Error);
}

struct Layer {
  static constexpr int64_t C = 6, I = 5, k = 2, B = 2, T = 7;
  explicit Layer(int64_t E) : mlp(nn::MoeDims{C, E, k, I, true}, 0.6f, 0.5f) {}
  nn::MoeMLP mlp;
  nn::FlatParams params;
  void materialize() { params = nn::materialize({{"m", mlp.parameters("m")}}, Device::cpu(), DType::f64, 9); }
  const nn::FlatParam& p(const std::string& name) const { return *params.find("m." + name); }
};

// y = mlp(x_q); loss sum(y * w_q) for rank q's inputs
Tensor run(const Layer& l, int64_t q, Tensor* x_out = nullptr) {
  Tensor x = randn({Layer::B, Layer::T, Layer::C}, 100 + static_cast<uint64_t>(q), true);
  Tensor y = l.mlp.forward(x, nullptr, 0);
  backward(sum(mul(y, randn({Layer::B, Layer::T, Layer::C}, 200 + static_cast<uint64_t>(q)))));
  if (x_out) *x_out = x;
  return y;
}

// Rows rank q's tokens send to another rank's experts (E / n experts per rank)
int64_t rows_leaving(const Layer& whole, int64_t q, int64_t n) {
  const int64_t E = whole.mlp.experts.E, N = Layer::B * Layer::T;
  Tensor x = randn({N, Layer::C}, 100 + static_cast<uint64_t>(q));
  const TopK t = moe_topk(softmax(whole.mlp.gate.forward(x)), Layer::k, true);
  int64_t rows = 0;
  for (int32_t e : t.experts.to_vector<int32_t>()) rows += (e / (E / n)) != q;
  return rows;
}

// slice: each rank's parameters are its 2 experts (DP); otherwise all E, of which it uses its 2 (FSDP)
void check_layer(bool slice) {
  auto& ep = *world();
  const int64_t n = ep.size(), r = ep.rank(), E = 2 * n;
  Layer whole(E), part(E);
  dist::apply_expert_parallel(part.mlp, ep, slice);
  whole.materialize();
  part.materialize();
  EXPECT_EQ(part.p("experts.gate_proj").value.size(0), slice ? 2 : E);
  // this rank's experts 2r, 2r + 1, with the whole layer's values (rows of dim 0)
  auto mine = [&](const Tensor& t) { return slice ? t : t.narrow(0, 2 * r, 2); };
  for (const char* name : {"experts.gate_proj", "experts.down_proj"})
    EXPECT_EQ(max_diff(whole.p(name).value.narrow(0, 2 * r, 2), mine(part.p(name).value)), 0) << name;
  // the whole layer on every rank's tokens (its gradients: the sum over them), this rank's output
  Tensor y_whole, x_whole;
  for (int64_t q = 0; q < n; ++q) {
    Tensor xq;
    Tensor yq = run(whole, q, &xq);
    if (q == r) y_whole = yq, x_whole = xq;
  }
  ep.reset_stats();
  Tensor x_part;
  const Tensor y_part = run(part, r, &x_part);
  EXPECT_LT(max_diff(y_whole, y_part), 1e-12);
  EXPECT_LT(max_diff(x_whole.grad(), x_part.grad()), 1e-12);
  for (const char* name : {"experts.gate_proj", "experts.up_proj", "experts.down_proj"}) {
    const nn::FlatParam& w = whole.p(name);
    const Tensor g = part.p(name).value.grad();
    EXPECT_LT(max_diff(w.value.grad().narrow(0, 2 * r, 2), mine(g)), 1e-12) << name;
    if (!slice)  // the other experts' rows: no gradient from this rank
      EXPECT_NEAR(sum(mul(g, g)).item(), sum(mul(mine(g), mine(g))).item(), 1e-12 * sum(mul(g, g)).item())
          << name;
  }
  Tensor gate = part.p("gate.weight").value.grad().contiguous();
  ep.all_reduce(gate, dist::ReduceOp::kSum)->wait();
  EXPECT_LT(max_diff(whole.p("gate.weight").value.grad(), gate), 1e-12);
  // dispatch and combine, forward and backward: each of this rank's rows that leaves, and each
  // that comes in, crosses once in each of the four exchanges' directions
  int64_t in = 0;
  for (int64_t q = 0; q < n; ++q)
    if (q != r) {
      Tensor x = randn({Layer::B * Layer::T, Layer::C}, 100 + static_cast<uint64_t>(q));
      const TopK t = moe_topk(softmax(whole.mlp.gate.forward(x)), Layer::k, true);
      for (int32_t e : t.experts.to_vector<int32_t>()) in += e / 2 == r;
    }
  EXPECT_EQ(ep.stats()[dist::CommKind::kAllToAll], (rows_leaving(whole, r, n) + in) * Layer::C * 8 * 2);
}

TEST(ExpertParallel, MoeLayerEqualsTheWholeLayer) { check_layer(/*slice=*/true); }
TEST(ExpertParallel, MoeLayerOverWholeExpertsEqualsTheWholeLayer) { check_layer(/*slice=*/false); }

// A router of zeros: every token's probabilities tie and its top 2 are experts 0 and 1 (the
// lowest on ties), rank 0's; the other ranks' experts get no rows, yet every rank takes part in
// both exchanges, forward and backward, and every rank's experts get their (zero) gradient:
// FSDP reduces a unit of experts when its gradient group fires, in step with the other ranks
// holding those experts, so a group that never fired would leave them waiting.
TEST(ExpertParallel, RanksWhoseExpertsGetNoRows) {
  auto& ep = *world();
  const int64_t n = ep.size(), r = ep.rank(), E = 2 * n;
  Layer whole(E), part(E);
  dist::apply_expert_parallel(part.mlp, ep);
  whole.materialize();
  part.materialize();
  for (const Layer* l : {&whole, &part})
    l->p("gate.weight").value.copy_(Tensor::zeros({Layer::C, E}, DType::f64));
  std::vector<Tensor> experts;
  for (const char* name : {"experts.gate_proj", "experts.up_proj", "experts.down_proj"})
    experts.push_back(part.p(name).value);
  const auto arrived = autograd::GradGroup::create(experts, [] {});
  Tensor y_whole, x_whole;
  for (int64_t q = 0; q < n; ++q) {
    Tensor xq;
    Tensor yq = run(whole, q, &xq);
    if (q == r) y_whole = yq, x_whole = xq;
  }
  Tensor x_part;
  EXPECT_LT(max_diff(y_whole, run(part, r, &x_part)), 1e-12);
  EXPECT_LT(max_diff(x_whole.grad(), x_part.grad()), 1e-12);
  const Tensor g = part.p("experts.down_proj").value.grad();
  EXPECT_LT(max_diff(whole.p("experts.down_proj").value.grad().narrow(0, 2 * r, 2), g), 1e-12);
  if (r > 0) EXPECT_EQ(sum(mul(g, g)).item(), 0.0) << "no rows, no gradient";
  EXPECT_EQ(arrived->fired(), 1) << "the experts' gradients arrived on rank " << r;
}

// The same layer with the routing weights forgotten in the combine (every weight 1): the
// comparison above must catch it.
TEST(ExpertParallel, AWrongCombineFailsTheComparison) {
  auto& ep = *world();
  const int64_t n = ep.size(), r = ep.rank(), E = 2 * n;
  Layer whole(E), part(E);
  dist::apply_expert_parallel(part.mlp, ep);
  part.mlp.run_experts = [&ep](const nn::Experts& ex, const Tensor& xf, const Tensor& w,
                               const Tensor& choices) {
    return dist::expert_parallel_mlp(ex, xf, Tensor::full(w.shape(), 1.0, w.dtype(), w.device()), choices,
                                     ep);
  };
  whole.materialize();
  part.materialize();
  Tensor y_whole;
  for (int64_t q = 0; q < n; ++q) {
    Tensor yq = run(whole, q);
    if (q == r) y_whole = yq;
  }
  EXPECT_GT(max_diff(y_whole, run(part, r)), 1e-3);
}

}  // namespace
