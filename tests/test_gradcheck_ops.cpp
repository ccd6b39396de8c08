// Every op case of tests/support/op_cases: float64 finite-difference gradient checks, and
// the same case in f32 against f64 and in bf16 against f32 (outputs and gradients).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "support/op_cases.h"
#include "tensor/threads.h"

using namespace ndt;
using namespace ndt::testing;

namespace {

std::string param_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

// Compares two runs of case c output by output and gradient by gradient.
void expect_close(const OpCase& c, const CaseRun& got, const CaseRun& ref, double tol, const char* what) {
  ASSERT_EQ(got.outputs.size(), ref.outputs.size());
  for (size_t k = 0; k < ref.outputs.size(); ++k) {
    const double e = rel_error(got.outputs[k], ref.outputs[k]);
    EXPECT_LT(e, tol) << c.name << " " << what << ": output " << k << " " << ref.outputs[k].shape_str()
                      << " relative error " << e;
  }
  ASSERT_EQ(got.grads.size(), ref.grads.size());
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    if (!ref.grads[i].defined()) {
      EXPECT_FALSE(got.grads[i].defined());
      continue;
    }
    const double e = rel_error(got.grads[i], ref.grads[i]);
    EXPECT_LT(e, tol) << c.name << " " << what << ": gradient of input " << i << " "
                      << ref.grads[i].shape_str() << " relative error " << e;
  }
}

// Case c on inputs drawn in dtype `low` against the same values converted to `high`
// (outputs and gradients within tol).
void expect_consistent(const OpCase& c, DType low, DType high, double tol, const char* what) {
  std::vector<Tensor> in_low = case_inputs(c, low, Device::cpu());
  std::vector<Tensor> in_high = convert_inputs(c, in_low, high, Device::cpu());
  CaseRun r_low = run_case(c, in_low), r_high = run_case(c, in_high);
  expect_close(c, r_low, r_high, tol, what);
}

}  // namespace

// ---- float64 finite differences ------------------------------------------------------

class Gradcheck : public ::testing::TestWithParam<std::string> {};

TEST_P(Gradcheck, F64) {
  const OpCase& c = op_case(GetParam());
  std::vector<Tensor> in = case_inputs(c, DType::f64, Device::cpu());
  autograd::GradcheckResult r = autograd::gradcheck(c.fn, in, c.gradcheck);
  EXPECT_TRUE(r.ok) << c.name << ": " << r.message << " (max abs err " << r.max_abs_err << ", max rel err "
                    << r.max_rel_err << ")";
  int64_t expected = 0;
  for (size_t i = 0; i < in.size(); ++i)
    if (c.requires_grad[i]) expected += in[i].numel();
  EXPECT_EQ(r.checked, expected) << "every element of every input requiring grad is checked";
}

INSTANTIATE_TEST_SUITE_P(Ops, Gradcheck, ::testing::ValuesIn(op_case_names()), param_name);

// ---- f32 vs f64 and bf16 vs f32 on the same input values --------------------------------

class Consistency : public ::testing::TestWithParam<std::string> {};

TEST_P(Consistency, F32VsF64) {
  const OpCase& c = op_case(GetParam());
  expect_consistent(c, DType::f32, DType::f64, c.f32_tol, "f32 vs f64");
}

TEST_P(Consistency, Bf16VsF32) {
  const OpCase& c = op_case(GetParam());
  expect_consistent(c, DType::bf16, DType::f32, c.bf16_tol, "bf16 vs f32");
}

INSTANTIATE_TEST_SUITE_P(Ops, Consistency, ::testing::ValuesIn(op_case_names()), param_name);

// ---- the harness itself ----------------------------------------------------------------

// Every op that records a backward node appears in some case's graph: a new op without a
// case fails here.
TEST(OpCases, CoverEveryDifferentiableOp) {
  std::set<std::string> seen;
  for (const OpCase& c : op_cases()) {
    std::vector<Tensor> in = case_inputs(c, DType::f64, Device::cpu());
    std::vector<Tensor> outs = c.fn(in);
    std::vector<std::shared_ptr<autograd::Node>> stack;
    std::set<autograd::Node*> visited;
    for (const Tensor& o : outs)
      if (o.grad_fn()) stack.push_back(o.grad_fn());
    while (!stack.empty()) {
      auto n = stack.back();
      stack.pop_back();
      if (!visited.insert(n.get()).second) continue;
      seen.insert(n->name());
      for (const autograd::Edge& e : n->next())
        if (e.node) stack.push_back(e.node);
    }
  }
  for (const char* op : {"matmul",         "add",         "sub",       "mul",
                         "scale",          "gelu",        "cast",      "sum",
                         "mean",           "sum_squares", "layernorm", "softmax",
                         "cross_entropy",  "embedding",   "attention", "merge_attention",
                         "self_attention", "view",        "permute",   "split_last",
                         "concat_last",    "on_backward", "recompute", "AccumulateGrad"})
    EXPECT_TRUE(seen.count(op)) << "no op case records a '" << op << "' node";
  // composed ops (they record matmul/add/view/permute nodes) are covered by name
  std::set<std::string> names;
  for (const OpCase& c : op_cases()) names.insert(c.name);
  for (const char* n : {"linear_bias", "linear_no_bias", "transpose", "heads_to_front", "heads_to_back"})
    EXPECT_TRUE(names.count(n)) << "no op case named " << n;
}

// The gradient check catches a wrong backward: y = x^2 recorded with dx = 2.001 x dy.
TEST(OpCases, GradcheckCatchesAWrongBackward) {
  auto square = [](double factor) {
    return [factor](const std::vector<Tensor>& in) {
      Tensor out = mul(in[0].detach(), in[0].detach());
      autograd::record("bad_square", {out}, {in[0]}, [x = in[0].detach(), factor](const autograd::Grads& g) {
        Tensor dx = mul(x, g[0]);
        return autograd::Grads{scale(dx, factor)};
      });
      return std::vector<Tensor>{out};
    };
  };
  Tensor x = randn({4, 3}, DType::f64, Device::cpu(), 7).set_requires_grad(true);
  EXPECT_TRUE(autograd::gradcheck(square(2.0), {x}).ok);
  autograd::GradcheckResult r = autograd::gradcheck(square(2.001), {x});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("element"), std::string::npos) << r.message;
}

// The consistency comparison fails on a real difference (rounding x to bf16 in an f32 run
// is far outside the f32 tolerance).
TEST(OpCases, RelErrorSeesDifferences) {
  Tensor a = randn({100}, DType::f32, Device::cpu(), 3);
  EXPECT_EQ(rel_error(a, a), 0.0);
  EXPECT_GT(rel_error(a.to(DType::bf16), a), 1e-4);
  EXPECT_LT(rel_error(a.to(DType::bf16), a), 2e-2);
  EXPECT_EQ(rel_error(Tensor::zeros({3}), Tensor::zeros({3})), 0.0);
  EXPECT_TRUE(std::isinf(rel_error(Tensor::full({3}, 1.0), Tensor::zeros({3}))));
}

// A loss whose every target is ignored is 0 with a zero gradient (no division by zero).
TEST(OpCases, CrossEntropyAllIgnored) {
  Tensor logits = randn({3, 5}, DType::f64, Device::cpu(), 4).set_requires_grad(true);
  Tensor targets = Tensor::from_vector<int32_t>({-1, -1, -1}, {3});
  Tensor loss = cross_entropy(logits, targets);
  EXPECT_EQ(loss.item(), 0.0);
  backward(loss);
  for (double g : logits.grad().to_vector<double>()) EXPECT_EQ(g, 0.0);
}

// ---- the CPU's fused self-attention against the composed path -----------------------------

namespace {

// self_attention (fused on CPU) and self_attention_composed as two cases on the same inputs:
// qkv (B,T,3C) at GPT-like sizes, several query blocks, the last one partial.
OpCase self_attention_case(bool fused, int64_t B, int64_t T, int64_t C, int64_t nh) {
  return {fused ? "fused" : "composed",
          [=](DType dt, Device dev) {
            Tensor x = randn({B, T, 3 * C}, dt, dev, 900, 0.0f, 1.5f);
            x.set_requires_grad(true);
            return std::vector<Tensor>{x};
          },
          [fused, nh](const std::vector<Tensor>& x) {
            return std::vector<Tensor>{fused ? self_attention(x[0], nh) : self_attention_composed(x[0], nh)};
          },
          {true}};
}

}  // namespace

TEST(SelfAttention, FusedCpuKernelMatchesTheComposedPath) {
  const OpCase fused = self_attention_case(true, 2, 200, 48, 4),
               composed = self_attention_case(false, 2, 200, 48, 4);
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    std::vector<Tensor> in = case_inputs(fused, dt, Device::cpu());
    CaseRun a = run_case(fused, in), b = run_case(composed, convert_inputs(composed, in, dt, Device::cpu()));
    // the same arithmetic but for the order of the exp-sums and where the scale is applied;
    // bf16 outputs and gradients round both results to 8 bits
    const double tol = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 2e-6 : 1e-2;
    expect_close(fused, a, b, tol, dtype_name(dt));
  }
}

// Tasks write disjoint outputs and sum in a fixed order: one thread and two give the same bits.
TEST(SelfAttention, SameBitsOnOneThreadAndTwo) {
  const OpCase c = self_attention_case(true, 3, 150, 32, 2);
  const int before = num_threads();
  set_num_threads(1);
  CaseRun one = run_case(c, case_inputs(c, DType::f32, Device::cpu()));
  set_num_threads(2);
  CaseRun two = run_case(c, case_inputs(c, DType::f32, Device::cpu()));
  set_num_threads(before);
  EXPECT_EQ(rel_error(one.outputs[0], two.outputs[0]), 0.0);
  EXPECT_EQ(rel_error(one.grads[0], two.grads[0]), 0.0);
}

// Bad shapes are refused with the op named.
TEST(SelfAttention, RefusesBadShapes) {
  EXPECT_THROW(
      {
        try {
          self_attention(Tensor::zeros({2, 5, 10}), 2);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("self_attention"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  EXPECT_THROW(self_attention(Tensor::zeros({2, 5, 12}), 3), Error);  // 4 channels into 3 heads
}
