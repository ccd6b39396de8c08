// The autograd engine: gradient accumulation, summing over uses, flat gradient buffers,
// grad mode, detach, freeing saved tensors, and the hooks FSDP builds on (GradGroup,
// on_backward) and activation checkpointing.
#include <gtest/gtest.h>

#include "support/testing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/defer.h"
#include "autograd/engine.h"
#include "autograd/hooks.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "autograd/recompute.h"
#include "support/op_cases.h"
#include "tensor/kernels.h"

using namespace ndt;
using ndt::testing::error_of;
using ndt::testing::randn;
using Log = std::vector<std::string>;

namespace {

Tensor param(const Shape& shape, uint64_t stream, DType dt = DType::f64) {
  return randn(shape, dt, Device::cpu(), stream, 0.0f, 0.5f).set_requires_grad(true);
}

// An identity op whose backward appends `tag` to the log: shows when the engine reaches it.
Tensor probe(const Tensor& x, Log& log, std::string tag) {
  Tensor out = x.detach();
  autograd::record("probe", {out}, {x}, [&log, tag](const autograd::Grads& g) -> autograd::Grads {
    log.push_back(tag);
    return {g[0]};
  });
  return out;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

void expect_near(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_TRUE(a.defined()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i) EXPECT_NEAR(va[i], vb[i], tol) << what << " element " << i;
}

}  // namespace

// ---- mixed precision: the loss and backward's seed stay f32 --------------------------------

TEST(MixedPrecision, ABfloat16LossAndItsAccumulationScaleAreFloat32) {
  // bf16 logits (N, V): the loss is f32, as accurate as f32 allows from those logits; 1/3
  // (gradient accumulation 3) scales it in f32, and the logits' gradient carries exactly
  // 1/3, not bf16's 0.333984 (+0.195% on every gradient, and on the clip norm)
  const int64_t N = 64, V = 50;
  std::vector<int32_t> tg(N);
  for (int64_t i = 0; i < N; ++i) tg[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + 11) % V);
  const Tensor targets = Tensor::from_vector(tg, {N});
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "cross_entropy_fused" : "cross_entropy");
    Tensor leaf = randn({N, V}, DType::bf16, Device::cpu(), 5, 0.0f, 2.0f).set_requires_grad(true);
    Tensor logits = scale(leaf, 1.0);  // fused: an intermediate result, as GPT's lm_head output
    Tensor loss = fused ? cross_entropy_fused(logits, targets) : cross_entropy(logits, targets);
    EXPECT_EQ(loss.dtype(), DType::f32);
    // float64 reference from the same bf16 values
    const std::vector<double> x = leaf.to_vector<double>();
    std::vector<double> dref(static_cast<size_t>(N * V));
    double ref = 0;
    for (int64_t i = 0; i < N; ++i) {
      const double* row = &x[static_cast<size_t>(i * V)];
      double mx = row[0], sum = 0;
      for (int64_t j = 0; j < V; ++j) mx = std::max(mx, row[j]);
      for (int64_t j = 0; j < V; ++j) sum += std::exp(row[j] - mx);
      ref += (std::log(sum) + mx - row[tg[static_cast<size_t>(i)]]) / static_cast<double>(N);
      for (int64_t j = 0; j < V; ++j)
        dref[static_cast<size_t>(i * V + j)] =
            (std::exp(row[j] - mx) / sum - (j == tg[static_cast<size_t>(i)] ? 1.0 : 0.0)) / (3.0 * N);
    }
    EXPECT_NEAR(loss.item(), ref, 1e-6 * ref);
    Tensor scaled = scale(loss, 1.0 / 3.0);
    EXPECT_EQ(scaled.dtype(), DType::f32);
    EXPECT_NEAR(scaled.item(), ref / 3.0, 1e-6 * ref);
    backward(scaled);
    // each bf16 gradient is its exact value rounded (relative error up to 2^-9, no bias;
    // fused: rounded twice, as the forward stores the gradient for dloss = 1 in the logits'
    // bf16 memory and backward scales it); a bf16 seed would shift every one by +0.195%
    const double tol = fused ? 1.0 / 128 : 1.0 / 256;
    const std::vector<double> g = leaf.grad().to_vector<double>();
    double bias = 0;
    int n = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      if (std::abs(dref[i]) < 1e-6) continue;
      EXPECT_NEAR(g[i], dref[i], std::abs(dref[i]) * tol + 1e-12) << "element " << i;
      bias += g[i] / dref[i] - 1;
      ++n;
    }
    bias /= n;
    EXPECT_LT(std::abs(bias), 4e-4) << "mean relative error of the gradients over " << n << " elements";
  }
}

// ---- the engine --------------------------------------------------------------------------

TEST(Engine, LeafGradientsAccumulateAcrossBackwards) {
  Tensor w = param({3, 4}, 1);
  Tensor x = randn({3, 4}, DType::f64, Device::cpu(), 2);
  backward(sum(mul(w, x)));  // d/dw sum(w*x) = x
  expect_near(w.grad(), x, 0, "first backward");
  Tensor first = w.grad();
  backward(sum(mul(w, x)));  // a new graph: += x
  expect_near(w.grad(), scale(x, 2.0), 1e-15, "second backward");
  EXPECT_TRUE(w.grad().shares_storage(first)) << "accumulated in place, not replaced";
}

TEST(Engine, UsesOfOneTensorAreSummed) {
  Tensor w = param({5}, 1);
  backward(sum(mul(w, w)));  // d/dw sum(w^2) = 2w
  expect_near(w.grad(), scale(w.detach(), 2.0), 1e-15, "w*w");
  w.set_grad(Tensor());
  backward(sum(add(w, scale(w, 3.0))));  // = 4 everywhere
  expect_near(w.grad(), Tensor::full({5}, 4.0, DType::f64), 1e-15, "w + 3w");

  // an intermediate used by two consumers: its gradient is the sum of theirs
  Tensor c = randn({5}, DType::f64, Device::cpu(), 3);
  w.set_grad(Tensor());
  backward(sum(mul(gelu(w), c)));
  Tensor g1 = w.grad().clone();
  w.set_grad(Tensor());
  backward(sum(scale(gelu(w), 3.0)));
  Tensor g2 = w.grad().clone();
  w.set_grad(Tensor());
  Tensor y = gelu(w);
  backward(sum(add(mul(y, c), scale(y, 3.0))));
  expect_near(w.grad(), add(g1, g2), 1e-14, "two uses of gelu(w)");
}

TEST(Engine, GradientViewIntoAFlatBufferAccumulatesThere) {
  // parameters are views of one flat buffer, their gradients views of a twin buffer
  Tensor params = randn({30}, DType::f32, Device::cpu(), 1);
  Tensor grads = Tensor::full({30}, 1.0);  // pre-existing values: gradients add to them
  Tensor w = params.view_at(2, {3, 4}).set_requires_grad(true);
  Tensor b = params.view_at(20, {4}).set_requires_grad(true);
  w.set_grad(grads.view_at(2, {3, 4}));
  b.set_grad(grads.view_at(20, {4}));
  Tensor x = randn({5, 3}, DType::f32, Device::cpu(), 2);
  backward(sum(linear(x, w, b)));  // dw[c][o] = sum_n x[n][c], db[o] = 5
  EXPECT_TRUE(w.grad().shares_storage(grads));
  EXPECT_TRUE(b.grad().shares_storage(grads));
  std::vector<float> xv = x.to_vector<float>(), g = grads.to_vector<float>();
  for (int i = 0; i < 30; ++i) {
    float expect = 1.0f;
    if (i >= 2 && i < 14) {
      const int c = (i - 2) / 4;
      for (int n = 0; n < 5; ++n) expect += xv[n * 3 + c];
    } else if (i >= 20 && i < 24) {
      expect += 5.0f;
    }
    EXPECT_NEAR(g[i], expect, 1e-5) << i;
  }
  backward(sum(linear(x, w, b)));  // twice: the buffer holds 1 + 2 * grad
  EXPECT_NEAR(grads.to_vector<float>()[20], 11.0f, 1e-5);
  EXPECT_EQ(grads.to_vector<float>()[0], 1.0f);  // outside every parameter: untouched
  EXPECT_EQ(grads.to_vector<float>()[29], 1.0f);
}

TEST(Engine, ALinearAddsItsWeightGradientIntoTheLeafsGrad) {
  // a linear's dw is added onto w.grad by the GEMM (beta 1) instead of returned and added:
  // the same gradients, with w used by other ops before and after, and w.grad kept in place
  Tensor x = randn({5, 3}, DType::f64, Device::cpu(), 2), x2 = randn({6, 3}, DType::f64, Device::cpu(), 3);
  Tensor c = randn({3, 4}, DType::f64, Device::cpu(), 4);
  Tensor w = param({3, 4}, 1);
  auto grad_of = [&](const std::function<Tensor()>& loss) {  // from zero, each use on its own
    w.set_grad(Tensor());
    backward(loss());
    return w.grad().clone();
  };
  const Tensor g_lin = grad_of([&] { return sum_squares(linear(x, w, Tensor())); });
  const Tensor g_gelu = grad_of([&] { return sum(linear_gelu(x2, w, Tensor())); });
  const Tensor g_mul = grad_of([&] { return sum(mul(w, c)); });
  // the same dw through matmul, which returns its gradient
  w.set_grad(Tensor());
  backward(sum_squares(matmul(x, w)));
  expect_near(g_lin, w.grad(), 1e-14, "linear's dw against matmul's");

  for (int order = 0; order < 2; ++order) {  // mul's gradient reaching w.grad's node before or after
    w.set_grad(Tensor::full({3, 4}, 0.25, DType::f64));
    const Tensor grad = w.grad();
    Tensor loss;
    if (order == 0)
      loss = add(add(sum(mul(w, c)), sum_squares(linear(x, w, Tensor()))), sum(linear_gelu(x2, w, Tensor())));
    else
      loss = add(add(sum_squares(linear(x, w, Tensor())), sum(linear_gelu(x2, w, Tensor()))), sum(mul(w, c)));
    int fired = 0;
    auto group = autograd::GradGroup::create({w}, [&] { ++fired; });
    backward(loss);
    EXPECT_TRUE(w.grad().same(grad)) << "w.grad stays the tensor it was";
    expect_near(w.grad(), add(add(add(g_lin, g_gelu), g_mul), Tensor::full({3, 4}, 0.25, DType::f64)), 1e-13,
                "three uses onto 0.25");
    EXPECT_EQ(fired, 1) << "order " << order;
    group.reset();
    w.impl().group = nullptr;
  }

  // a caller's gradient that is the leaf's own .grad is added, not taken as already there
  w.set_grad(Tensor::full({3, 4}, 1.5, DType::f64));
  backward({w}, {w.grad()});
  expect_near(w.grad(), Tensor::full({3, 4}, 3.0, DType::f64), 0, "w.grad + w.grad");
}

TEST(Engine, ASharedInputsSumRunsWhileTheWeightGradientIsMade) {
  // linear_shared_input with the collectives of a tensor-parallel group of two ranks played
  // by functions: gather puts the other rank's part o after ours, reduce_grad adds the other
  // rank's input gradient e and keeps our positions. Backward must start the gather before
  // reduce_grad, wait for it before the weight gradient, and wait for reduce_grad only after
  // the weight gradient is made, and give the gradients of the same ops done by hand.
  const int64_t B = 2, Ts = 3, C = 4, OC = 5;
  const Tensor o = randn({B, Ts, C}, DType::f64, Device::cpu(), 7),
               e = randn({B, 2 * Ts, C}, DType::f64, Device::cpu(), 8);
  for (const bool sequence_parallel : {false, true}) {
    for (const bool gelu : {false, true}) {
      SCOPED_TRACE(std::string(sequence_parallel ? "gathered" : "whole") + (gelu ? ", gelu" : ""));
      Tensor x = param({B, Ts, C}, 1), w = param({C, OC}, 2), b = param({OC}, 3);
      auto run = [&](const Tensor& whole) {
        return sum_squares(gelu ? linear_gelu(whole, w, b) : linear(whole, w, b));
      };
      // by hand: the gathered input as an op, the other rank's gradient added at the end
      for (Tensor* t : {&x, &w, &b}) t->set_grad(Tensor());
      backward(run(sequence_parallel ? concat({x, o}, 1) : x));
      const Tensor e_ours = split(e, 1, {Ts, Ts})[0];  // the other rank's gradient of our positions
      const Tensor dx_ref = add(x.grad(), e_ours).clone(), dw_ref = w.grad().clone(),
                   db_ref = b.grad().clone();

      Log log;
      Tensor w_grad_at_the_wait;
      SharedInput comm;
      if (sequence_parallel)
        comm.gather = [&](const Tensor& part) -> Pending {
          log.push_back("gather start");
          return [&log, part, &o] {
            log.push_back("gather wait");
            return concat({part, o}, 1);
          };
        };
      comm.reduce_grad = [&](const Tensor& dx) -> Pending {
        log.push_back("reduce start");
        return [&, dx] {
          log.push_back("reduce wait");
          w_grad_at_the_wait = w.grad().clone();
          const Tensor sum = add(dx, sequence_parallel ? e : e_ours);
          return sequence_parallel ? split(sum, 1, {Ts, Ts})[0] : sum;
        };
      };
      x.set_grad(Tensor());
      w.set_grad(Tensor::zeros({C, OC}, DType::f64));  // the GEMM adds dw here, so the wait can see it
      b.set_grad(Tensor());
      const Tensor loss = sum_squares(linear_shared_input(x, w, b, gelu, comm));
      const Log forward_log = sequence_parallel ? Log{"gather start", "gather wait"} : Log{};
      EXPECT_EQ(log, forward_log);
      backward(loss);
      Log expected = forward_log;
      if (sequence_parallel)
        expected.insert(expected.end(), {"gather start", "reduce start", "gather wait", "reduce wait"});
      else
        expected.insert(expected.end(), {"reduce start", "reduce wait"});
      EXPECT_EQ(log, expected);
      expect_near(w_grad_at_the_wait, dw_ref, 1e-12, "w.grad when reduce_grad is waited for");
      expect_near(x.grad(), dx_ref, 1e-12, "dx");
      expect_near(w.grad(), dw_ref, 1e-12, "dw");
      expect_near(b.grad(), db_ref, 1e-12, "db");
    }
  }
}

TEST(Engine, NoGradGuardRecordsNothing) {
  Tensor w = param({3, 3}, 1);
  EXPECT_TRUE(autograd::grad_enabled());
  {
    autograd::NoGradGuard no_grad;
    EXPECT_FALSE(autograd::grad_enabled());
    Tensor y = gelu(matmul(w, w));
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
    EXPECT_EQ(y.grad_fn(), nullptr);
    {
      autograd::EnableGradGuard grad_on;
      EXPECT_TRUE(autograd::grad_enabled());
      EXPECT_TRUE(gelu(w).requires_grad());
      {
        autograd::NoGradGuard again;
        EXPECT_FALSE(autograd::grad_enabled());
      }
      EXPECT_TRUE(autograd::grad_enabled());
    }
    EXPECT_FALSE(autograd::grad_enabled());
    // a tensor made without grad is a constant afterwards
    Tensor c = scale(w, 2.0);
    autograd::EnableGradGuard grad_on;
    Tensor w2 = param({3, 3}, 2);
    backward(sum(mul(c, w2)));
    EXPECT_FALSE(w.grad().defined());
    expect_near(w2.grad(), scale(w.detach(), 2.0), 1e-15, "w2");
  }
  EXPECT_TRUE(autograd::grad_enabled());
}

TEST(Engine, DetachCutsTheGraph) {
  Tensor w = param({6}, 1);
  Tensor y = gelu(w);
  Tensor d = y.detach();
  EXPECT_TRUE(d.shares_storage(y));
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_TRUE(y.requires_grad());  // the original keeps its history
  backward(sum(mul(y, d)));        // d/dw = gelu'(w) * y, not 2 y gelu'(w)
  Tensor g_detached = w.grad().clone();
  w.set_grad(Tensor());
  backward(sum(mul(gelu(w), y.detach().clone())));  // the same with a copied constant
  expect_near(g_detached, w.grad(), 1e-15, "detach");
  w.set_grad(Tensor());
  Tensor y2 = gelu(w);
  backward(sum(mul(y2, y2)));
  EXPECT_GT(std::abs(w.grad().to_vector<double>()[0] - g_detached.to_vector<double>()[0]), 1e-6)
      << "without detach the gradient differs";
}

TEST(Engine, SavedTensorsAreFreedAfterBackward) {
  Tensor w = param({3, 4}, 1), x = randn({4, 5}, DType::f64, Device::cpu(), 2);
  Tensor loss = sum(gelu(matmul(w, x)));
  backward(loss);
  const std::string m = error_of([&] { backward(loss); });
  EXPECT_NE(m.find("retain_graph"), std::string::npos) << m;

  // with retain_graph the graph can run again, and gradients add up
  w.set_grad(Tensor());
  Tensor loss2 = sum(gelu(matmul(w, x)));
  backward(loss2, /*retain_graph=*/true);
  Tensor once = w.grad().clone();
  backward(loss2);
  expect_near(w.grad(), scale(once, 2.0), 1e-14, "retained graph, second backward");
}

TEST(Engine, BackwardReleasesSavedActivations) {
  // x (512,64) @ w (64,64) -> gelu -> gelu -> sum: the two gelus save 128 KiB each
  const int64_t act = 512 * 64 * 4;
  Tensor w = param({64, 64}, 1, DType::f32), x = randn({512, 64}, DType::f32, Device::cpu(), 2);
  for (bool retain : {false, true}) {
    w.set_grad(Tensor());
    Tensor loss = sum(gelu(gelu(matmul(x, w))));  // only the graph holds the activations
    const int64_t before = memory_stats(Device::cpu()).in_use;
    backward(loss, retain);
    const int64_t after = memory_stats(Device::cpu()).in_use;
    const int64_t grad = 64 * 64 * 4;  // w.grad stays
    if (!retain)
      EXPECT_LE(after, before - 2 * act + grad) << "both saved activations are freed";
    else
      EXPECT_GE(after, before + grad) << "retain_graph keeps them";
  }
}

TEST(Engine, ReductionsDoNotKeepTheirInputAlive) {
  // sum and mean need only the shape of their input for the backward
  Tensor w = param({256, 256}, 1, DType::f32);
  const int64_t bytes = 256 * 256 * 4;
  for (int which = 0; which < 2; ++which) {
    const int64_t base = memory_stats(Device::cpu()).in_use;
    Tensor loss = which == 0 ? sum(scale(w, 2.0)) : mean(scale(w, 2.0));
    EXPECT_LT(memory_stats(Device::cpu()).in_use, base + bytes)
        << (which ? "mean" : "sum") << " saved its input";
    backward(loss);
    w.set_grad(Tensor());
  }
}

TEST(Engine, BackwardArgumentErrors) {
  Tensor w = param({2, 2}, 1);
  Tensor y = matmul(w, w);
  std::string m = error_of([&] { backward(y); });
  EXPECT_NE(m.find("one element"), std::string::npos) << m;
  EXPECT_NE(m.find("(2, 2)"), std::string::npos) << m;
  m = error_of([&] { backward(sum(randn({3}, DType::f64, Device::cpu(), 5))); });
  EXPECT_NE(m.find("does not require grad"), std::string::npos) << m;
  m = error_of([&] { backward({y}, {Tensor::zeros({3}, DType::f64)}); });
  EXPECT_NE(m.find("(3)"), std::string::npos) << m;
  // a non-scalar output with an explicit gradient is fine: d sum(y*g) / dw
  Tensor g = randn({2, 2}, DType::f64, Device::cpu(), 6);
  backward({y}, {g});
  Tensor direct = w.grad().clone();
  w.set_grad(Tensor());
  backward(sum(mul(matmul(w, w), g)));
  expect_near(direct, w.grad(), 1e-14, "explicit output gradient");
}

// ---- GradGroup -------------------------------------------------------------------------------

// A two-layer net: layer 1 (w1, b1) -> probe "mid" -> layer 2 (w2, b2) -> sum of squares.
struct TwoLayers {
  Tensor x = randn({4, 5}, DType::f64, Device::cpu(), 10);
  Tensor w1 = param({5, 6}, 11), b1 = param({6}, 12), w2 = param({6, 3}, 13), b2 = param({3}, 14);
  Tensor loss(Log& log) {
    Tensor h = probe(gelu(linear(x, w1, b1)), log, "mid");
    return sum_squares(linear(h, w2, b2));
  }
};

TEST(Hooks, GradGroupFiresOnceRightAfterItsLastParameter) {
  TwoLayers net;
  Log log;
  Tensor seen_w1, seen_b1;
  auto g2 = autograd::GradGroup::create({net.w2, net.b2}, [&] {
    log.push_back("group2");
    EXPECT_TRUE(net.w2.grad().defined() && net.b2.grad().defined());
  });
  auto g1 = autograd::GradGroup::create({net.w1, net.b1}, [&] {
    log.push_back("group1");
    seen_w1 = net.w1.grad().clone();  // what the callback sees must be the final gradient
    seen_b1 = net.b1.grad().clone();
  });
  backward(net.loss(log));
  log.push_back("returned");
  // layer 2's group fires as soon as its grads are in, before the engine reaches layer 1
  EXPECT_EQ(log, (Log{"group2", "mid", "group1", "returned"}));
  EXPECT_EQ(g1->fired(), 1);
  EXPECT_EQ(g2->fired(), 1);
  EXPECT_EQ(g1->received(), 0);
  EXPECT_TRUE(bitwise_equal(seen_w1, net.w1.grad()));
  EXPECT_TRUE(bitwise_equal(seen_b1, net.b1.grad()));

  log.clear();
  backward(net.loss(log));  // once per backward
  EXPECT_EQ(log, (Log{"group2", "mid", "group1"}));
  EXPECT_EQ(g1->fired(), 2);
  EXPECT_EQ(g2->fired(), 2);
}

// ---- deferred weight gradients (zero-bubble schedules) ------------------------------------

TEST(DeferredWeightGrads, InputThenWeightPassesEqualOneBackwardBitForBit) {
  // unsplit: one backward
  TwoLayers ref;
  Log log;
  Tensor xin = ref.x.clone().set_requires_grad(true);
  ref.x = xin;
  backward(ref.loss(log));
  // split: B computes x's and the biases' gradients, queues the weights' GEMMs; W runs them
  TwoLayers net;
  Tensor x = net.x.clone().set_requires_grad(true);
  net.x = x;
  int fired1 = 0, fired2 = 0;
  auto g1 = autograd::GradGroup::create({net.w1, net.b1}, [&] { ++fired1; });
  auto g2 = autograd::GradGroup::create({net.w2, net.b2}, [&] { ++fired2; });
  autograd::DeferredWeightGrads w;
  {
    autograd::DeferredWeightGrads::Scope defer(w);
    backward(net.loss(log));
  }
  EXPECT_EQ(w.size(), 2u);  // w1's and w2's
  EXPECT_FALSE(net.w1.grad().defined());
  EXPECT_FALSE(net.w2.grad().defined());
  EXPECT_TRUE(bitwise_equal(x.grad(), xin.grad()));  // what the previous stage waits for: ready
  EXPECT_TRUE(bitwise_equal(net.b1.grad(), ref.b1.grad()));
  EXPECT_EQ(fired1 + fired2, 0);  // each group waits for its deferred weight
  w.run();
  EXPECT_TRUE(w.empty());
  EXPECT_EQ(fired1, 1);
  EXPECT_EQ(fired2, 1);
  EXPECT_TRUE(bitwise_equal(net.w1.grad(), ref.w1.grad()));
  EXPECT_TRUE(bitwise_equal(net.w2.grad(), ref.w2.grad()));
  EXPECT_TRUE(bitwise_equal(net.b2.grad(), ref.b2.grad()));
}

TEST(DeferredWeightGrads, AGroupWaitsForEveryMicroBatchsWeightPass) {
  // B0, B1, W1, W0 (zero-bubble's order on a later stage): the group fires once, after W0,
  // and holds the sum of both micro-batches' gradients
  TwoLayers net;
  Log log;
  int fired = 0;
  Tensor at_fire;
  auto g2 = autograd::GradGroup::create({net.w2, net.b2}, [&] {
    ++fired;
    at_fire = net.w2.grad().clone();
  });
  autograd::DeferredWeightGrads w0, w1;
  for (autograd::DeferredWeightGrads* q : {&w0, &w1}) {
    autograd::DeferredWeightGrads::Scope defer(*q);
    backward(net.loss(log));
  }
  w1.run();
  EXPECT_EQ(fired, 0) << "micro-batch 0's weight gradient is still to come";
  w0.run();
  EXPECT_EQ(fired, 1);
  TwoLayers ref;
  backward(ref.loss(log));
  backward(ref.loss(log));
  expect_near(at_fire, ref.w2.grad(), 1e-14, "both micro-batches' w2 gradients");
  // a queue never run forgets its gradients and frees its group for the next backward
  {
    autograd::DeferredWeightGrads dropped;
    autograd::DeferredWeightGrads::Scope defer(dropped);
    backward(net.loss(log));
  }
  backward(net.loss(log));
  EXPECT_EQ(fired, 2);
}

TEST(Hooks, GradGroupWithAParameterUsedTwiceFiresOnce) {
  Tensor w = param({4}, 1), b = param({4}, 2);
  int fired = 0;
  auto g = autograd::GradGroup::create({w, b}, [&] { ++fired; });
  backward(sum(add(mul(w, w), add(w, b))));  // w reaches the loss three times
  EXPECT_EQ(fired, 1);
  EXPECT_EQ(g->received(), 0);
}

TEST(Hooks, GradGroupWithAnUnusedParameterFiresAtTheEnd) {
  Tensor used = param({4}, 1), unused = param({4}, 2), other = param({4}, 3);
  Tensor c = randn({4}, DType::f64, Device::cpu(), 4);
  Log log;
  auto g = autograd::GradGroup::create({used, unused}, [&] { log.push_back("group"); });
  for (int step = 1; step <= 2; ++step) {
    log.clear();
    // `early` is recorded first, so the engine reaches it after `used`'s gradient is in
    Tensor early = probe(mul(other, c), log, "early");
    backward(sum(add(early, mul(used, c))));
    log.push_back("returned");
    EXPECT_EQ(log, (Log{"early", "group", "returned"})) << "step " << step;
    EXPECT_EQ(g->fired(), step);
    EXPECT_EQ(g->received(), 0);
    EXPECT_FALSE(unused.grad().defined());
  }
}

// A parameter used inside a checkpoint and outside it reaches its AccumulateGrad twice (once
// from the recompute's backward, once from the outer one): the group still fires once,
// and only when every parameter has a gradient.
TEST(Hooks, GradGroupCountsParametersNotGradientArrivals) {
  Tensor w = param({4}, 1), b = param({4}, 2), x = param({4}, 3);
  Log log;
  auto g = autograd::GradGroup::create({w, b}, [&] {
    log.push_back("group");
    EXPECT_TRUE(w.grad().defined() && b.grad().defined()) << "fired before every parameter had a gradient";
  });
  auto scaled = [w](const std::vector<Tensor>& in) { return std::vector<Tensor>{mul(in[0], w)}; };
  for (int step = 1; step <= 2; ++step) {
    log.clear();
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    Tensor y = autograd::recompute(scaled, {add(x, b)})[0];
    backward(sum(add(y, mul(w, w))));
    EXPECT_EQ(log, (Log{"group"})) << "step " << step;
    EXPECT_EQ(g->fired(), step);
    EXPECT_EQ(g->received(), 0);
  }
}

// A backward that fails half-way leaves no stale count behind.
TEST(Hooks, GradGroupRecoversFromAFailedBackward) {
  Tensor w = param({4}, 1), b = param({4}, 2);
  Tensor c = randn({4}, DType::f64, Device::cpu(), 3);
  Log log;
  auto g = autograd::GradGroup::create({w, b}, [&] { log.push_back("group"); });
  {
    Tensor bad = mul(b, c).detach();  // recorded first, so w's gradient arrives before it throws
    autograd::record("throws", {bad}, {mul(b, c)}, [](const autograd::Grads&) -> autograd::Grads {
      NDT_FAIL("backward failed on purpose");
    });
    EXPECT_THROW(backward(sum(add(bad, mul(w, c)))), Error);
  }
  EXPECT_EQ(g->fired(), 0);
  EXPECT_EQ(g->received(), 0) << "the failed backward's partial count is discarded";
  Tensor probe_b = probe(mul(b, c), log, "b side");
  backward(sum(add(probe_b, mul(w, c))));
  EXPECT_EQ(log, (Log{"b side", "group"})) << "fires after b, not when w alone arrives";
  EXPECT_EQ(g->fired(), 1);
}

TEST(Hooks, GradGroupRejectsNonLeavesAndDoubleMembership) {
  Tensor w = param({2}, 1);
  Tensor y = gelu(w);
  EXPECT_THROW(autograd::GradGroup::create({y}, [] {}), Error);
  EXPECT_THROW(autograd::GradGroup::create({randn({2}, DType::f64, Device::cpu(), 2)}, [] {}), Error);
  auto g = autograd::GradGroup::create({w}, [] {});
  EXPECT_THROW(autograd::GradGroup::create({w}, [] {}), Error);
  EXPECT_EQ(g->size(), 1);
}

// ---- on_backward -------------------------------------------------------------------------------

TEST(Hooks, OnBackwardRunsBeforeTheRegionItWraps) {
  Tensor x = randn({4, 5}, DType::f64, Device::cpu(), 1);
  Tensor w = param({5, 5}, 2);
  Log log;
  int calls = 0;
  auto run = [&](bool hooked) {
    Tensor region = probe(gelu(matmul(x, w)), log, "inside");  // the region's own backward
    Tensor out = hooked ? autograd::on_backward(region,
                                                [&] {
                                                  log.push_back("hook");
                                                  ++calls;
                                                })
                        : region;
    backward(sum_squares(probe(out, log, "after")));
  };
  run(true);
  EXPECT_EQ(log, (Log{"after", "hook", "inside"}));
  EXPECT_EQ(calls, 1);
  Tensor hooked = w.grad().clone();
  w.set_grad(Tensor());
  log.clear();
  run(false);
  EXPECT_TRUE(bitwise_equal(hooked, w.grad())) << "on_backward is the identity for gradients";
  EXPECT_EQ(calls, 1);
}

// ---- recompute in backward (activation checkpointing) ------------------------------------

namespace {

// An MLP block with a residual: x + c_proj(gelu(c_fc(x))), parameters captured by the fn.
struct Mlp {
  int64_t N, C;
  Tensor w1, b1, w2, b2;
  Mlp(int64_t n, int64_t c)
      : N(n),
        C(c),
        w1(param({c, 4 * c}, 21, DType::f32)),
        b1(param({4 * c}, 22, DType::f32)),
        w2(param({4 * c, c}, 23, DType::f32)),
        b2(param({c}, 24, DType::f32)) {}
  autograd::RecomputeFn fn() const {
    return [w1 = w1, b1 = b1, w2 = w2, b2 = b2](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{add(in[0], linear(gelu(linear(in[0], w1, b1)), w2, b2))};
    };
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }
  void zero_grads() const {
    for (const Tensor& p : params()) p.set_grad(Tensor());
  }
};

}  // namespace

TEST(Recompute, GradientsAreBitForBitThoseOfThePlainRun) {
  Mlp mlp(33, 12);
  Tensor x = randn({33, 12}, DType::f32, Device::cpu(), 30).set_requires_grad(true);
  Tensor plain_out = mlp.fn()({x})[0];
  backward(sum_squares(plain_out));
  std::vector<Tensor> plain;
  for (const Tensor& p : mlp.params()) plain.push_back(p.grad().clone());
  Tensor plain_dx = x.grad().clone();

  mlp.zero_grads();
  x.set_grad(Tensor());
  Tensor ck_out = autograd::recompute(mlp.fn(), {x})[0];
  EXPECT_TRUE(bitwise_equal(ck_out, plain_out));
  backward(sum_squares(ck_out));
  EXPECT_TRUE(bitwise_equal(x.grad(), plain_dx)) << "input gradient";
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_TRUE(bitwise_equal(mlp.params()[i].grad(), plain[i])) << "param " << i;
}

TEST(Recompute, ParametersGetGradientsWhenNoInputRequiresGrad) {
  Mlp mlp(9, 12);
  Tensor x = randn({9, 12}, DType::f32, Device::cpu(), 31);
  backward(mean(mlp.fn()({x})[0]));
  std::vector<Tensor> plain;
  for (const Tensor& p : mlp.params()) plain.push_back(p.grad().clone());
  mlp.zero_grads();
  backward(mean(autograd::recompute(mlp.fn(), {x})[0]));
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_TRUE(bitwise_equal(mlp.params()[i].grad(), plain[i])) << "param " << i;
}

TEST(Recompute, HoldsLessMemoryAfterForward) {
  Mlp mlp(256, 32);
  Tensor x = randn({256, 32}, DType::f32, Device::cpu(), 32).set_requires_grad(true);
  const int64_t hidden = 256 * 128 * 4;  // one (N, 4C) f32 activation
  auto forward_bytes = [&](bool ckpt) {
    const int64_t before = memory_stats(Device::cpu()).in_use;
    Tensor loss = sum_squares(ckpt ? autograd::recompute(mlp.fn(), {x})[0] : mlp.fn()({x})[0]);
    const int64_t held = memory_stats(Device::cpu()).in_use - before;
    backward(loss);
    mlp.zero_grads();
    x.set_grad(Tensor());
    return held;
  };
  const int64_t plain = forward_bytes(false), ckpt = forward_bytes(true);
  // the plain graph keeps c_fc's output and gelu's output (2 x hidden); the checkpoint
  // keeps only its output (N, C), which sum_squares saves
  EXPECT_GE(plain, 2 * hidden);
  EXPECT_LE(ckpt, plain - 2 * hidden + 1024) << "plain " << plain << " bytes, checkpoint " << ckpt;
  EXPECT_LE(ckpt, 256 * 32 * 4 + 1024);
}

TEST(Recompute, GradGroupOverRecomputedParamsFires) {
  Mlp mlp(7, 12);
  Tensor x = randn({7, 12}, DType::f32, Device::cpu(), 33).set_requires_grad(true);
  Log log;
  auto g = autograd::GradGroup::create(mlp.params(), [&] {
    log.push_back("group");
    for (const Tensor& p : mlp.params()) EXPECT_TRUE(p.grad().defined());
  });
  for (int step = 1; step <= 2; ++step) {
    log.clear();
    Tensor upstream = probe(x, log, "upstream");  // runs after the checkpoint's backward
    backward(sum_squares(autograd::recompute(mlp.fn(), {upstream})[0]));
    log.push_back("returned");
    // it fires inside the recompute's backward, not deferred to the end
    EXPECT_EQ(log, (Log{"group", "upstream", "returned"})) << "step " << step;
    EXPECT_EQ(g->fired(), step);
    EXPECT_EQ(g->received(), 0);
  }
}
