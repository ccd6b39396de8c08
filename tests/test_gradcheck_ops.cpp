// Every op case of tests/support/op_cases: float64 finite-difference gradient checks, and
// the same case in f32 against f64 and in bf16 against f32 (outputs and gradients).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "support/op_cases.h"
#include "support/testing.h"
#include "tensor/cpu/fastmath.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/onednn_gemm.h"
#include "tensor/kernels.h"
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

// Case c in f32 on one thread and on two: every output and gradient bit for bit.
void expect_same_bits_on_one_and_two_threads(const OpCase& c) {
  const int before = num_threads();
  set_num_threads(1);
  CaseRun one = run_case(c, case_inputs(c, DType::f32, Device::cpu()));
  set_num_threads(2);
  CaseRun two = run_case(c, case_inputs(c, DType::f32, Device::cpu()));
  set_num_threads(before);
  for (size_t i = 0; i < one.outputs.size(); ++i)
    EXPECT_EQ(rel_error(one.outputs[i], two.outputs[i]), 0.0) << c.name << ": output " << i;
  for (size_t i = 0; i < one.grads.size(); ++i)
    EXPECT_EQ(rel_error(one.grads[i], two.grads[i]), 0.0) << c.name << ": gradient " << i;
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
  for (const char* op :
       {"matmul",      "add",           "sub",           "mul",         "scale",           "gelu",
        "cast",        "sum",           "dropout",       "mean",        "sum_squares",     "layernorm",
        "softmax",     "cross_entropy", "embedding",     "attention",   "merge_attention", "self_attention",
        "view",        "permute",       "split_last",    "concat_last", "split",           "concat",
        "on_backward", "recompute",     "AccumulateGrad"})
    EXPECT_TRUE(seen.count(op)) << "no op case records a '" << op << "' node";
  for (const char* op : {"moe_topk", "moe_dispatch", "grouped_matmul", "moe_combine"})
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
// docs: packed rows (B, T), or undefined.
OpCase self_attention_case(bool fused, int64_t B, int64_t T, int64_t C, int64_t nh, const Tensor& docs = {}) {
  return {fused ? "fused" : "composed",
          [=](DType dt, Device dev) {
            Tensor x = randn({B, T, 3 * C}, dt, dev, 900, 0.0f, 1.5f);
            x.set_requires_grad(true);
            return std::vector<Tensor>{x};
          },
          [fused, nh, docs](const std::vector<Tensor>& x) {
            return std::vector<Tensor>{fused ? self_attention(x[0], nh, docs)
                                             : self_attention_composed(x[0], nh, docs)};
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

// Rows of B documents of the given lengths (each row's lengths sum to T) -> docs (B, T).
Tensor docs_of(const std::vector<std::vector<int64_t>>& lengths) {
  std::vector<int32_t> d;
  for (const auto& row : lengths)
    for (size_t i = 0; i < row.size(); ++i)
      d.insert(d.end(), static_cast<size_t>(row[i]), static_cast<int32_t>(i));
  const int64_t B = static_cast<int64_t>(lengths.size());
  return Tensor::from_vector(d, {B, static_cast<int64_t>(d.size()) / B});
}

// Packed rows: documents of 1 to 130 tokens that begin and end inside and across the fused
// kernel's blocks of 64 queries; both paths in f32 and f64.
TEST(SelfAttention, FusedCpuKernelMatchesTheComposedPathOnPackedRows) {
  const Tensor docs = docs_of({{1, 70, 3, 64, 62}, {130, 1, 69}});
  const OpCase fused = self_attention_case(true, 2, 200, 48, 4, docs),
               composed = self_attention_case(false, 2, 200, 48, 4, docs);
  for (DType dt : {DType::f32, DType::f64}) {
    std::vector<Tensor> in = case_inputs(fused, dt, Device::cpu());
    CaseRun a = run_case(fused, in), b = run_case(composed, convert_inputs(composed, in, dt, Device::cpu()));
    expect_close(fused, a, b, dt == DType::f64 ? 1e-12 : 2e-6, dtype_name(dt));
  }
  // and the packed rows differ from causal ones (the mask is not lost on the way)
  const OpCase causal = self_attention_case(true, 2, 200, 48, 4);
  std::vector<Tensor> in = case_inputs(fused, DType::f64, Device::cpu());
  EXPECT_GT(rel_error(run_case(fused, in).outputs[0], run_case(causal, in).outputs[0]), 1e-3);
}

// Tasks write disjoint outputs and sum in a fixed order: one thread and two give the same bits.
TEST(SelfAttention, SameBitsOnOneThreadAndTwo) {
  expect_same_bits_on_one_and_two_threads(self_attention_case(true, 3, 150, 32, 2));
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

// ---- attention() on the CPU: the fused kernel against the composed path -------------------

namespace {

// attention(q, k, v, q_off, k_off) with q (B,NH,tq,HS), k, v (B,NKV,tk,HS), fused or composed,
// both outputs (the lse of the leading `masked` queries, which see no key, is -inf: left out).
struct AttBlock {
  int64_t tq, tk, q_off, k_off, masked;
};
// Both outputs of r but the masked queries' lse.
std::vector<Tensor> outputs_of(const AttentionOut& r, const AttBlock& a) {
  if (a.masked == a.tq) return {r.out};
  Tensor lse = a.masked ? split_last(r.lse, {a.masked, a.tq - a.masked})[1] : r.lse;
  return {r.out, lse};
}
OpCase attention_case(bool fused, const AttBlock& a, int64_t NH = 3, int64_t NKV = 3,
                      const Tensor& docs = {}) {
  const int64_t B = 2, HS = 16;
  return {fused ? "fused" : "composed",
          [=](DType dt, Device dev) {
            std::vector<Tensor> x = {randn({B, NH, a.tq, HS}, dt, dev, 910, 0.0f, 1.5f),
                                     randn({B, NKV, a.tk, HS}, dt, dev, 911, 0.0f, 1.5f),
                                     randn({B, NKV, a.tk, HS}, dt, dev, 912)};
            for (Tensor& t : x) t.set_requires_grad(true);
            return x;
          },
          [fused, a, docs](const std::vector<Tensor>& x) {
            return outputs_of(fused ? attention(x[0], x[1], x[2], a.q_off, a.k_off, 0.0, docs)
                                    : attention_composed(x[0], x[1], x[2], a.q_off, a.k_off, 0.0, docs),
                              a);
          },
          {true, true, true}};
}

// Hugging Face's repeat_kv from the shape ops alone (split and concat, differentiable, no
// attention code): t (B,NKV,T,HS) -> (B,NKV*G,T,HS), kv head g at heads g G .. g G + G-1.
// Its backward sums the G copies' gradients, so dk of a kv head is the sum over its group.
Tensor repeat_kv(const Tensor& t, int64_t G) {
  const int64_t NKV = t.size(1);
  const std::vector<Tensor> heads = split(t, 1, std::vector<int64_t>(static_cast<size_t>(NKV), 1));
  std::vector<Tensor> repeated;
  for (int64_t g = 0; g < NKV; ++g)
    for (int64_t j = 0; j < G; ++j) repeated.push_back(heads[static_cast<size_t>(g)]);
  return concat(repeated, 1);
}

// The GQA inputs of attention_case, through multi-head attention on k, v repeated G times.
OpCase mha_on_repeated_kv_case(bool fused, const AttBlock& a, int64_t NH, int64_t NKV) {
  OpCase c = attention_case(fused, a, NH, NKV);
  c.name += "_on_repeated_kv";
  c.fn = [fused, a, G = NH / NKV](const std::vector<Tensor>& x) {
    const Tensor k = repeat_kv(x[1], G), v = repeat_kv(x[2], G);
    return outputs_of(
        fused ? attention(x[0], k, v, a.q_off, a.k_off) : attention_composed(x[0], k, v, a.q_off, a.k_off),
        a);
  };
  return c;
}

// The blocks ring attention computes and the edges of the mask, at sizes with several
// blocks of 64 queries (the last partial)
const AttBlock kBlocks[] = {
    {150, 150, 0, 0, 0},     // a diagonal block: causal from the top-left
    {150, 130, 300, 40, 0},  // every key before every query: nothing masked
    {150, 130, 0, 20, 20},   // queries 0..19 see no key; key rows past 149 no query sees
    {70, 200, 100, 0, 0},    // queries see 101..170 of the 200 keys
    {64, 64, 0, 100, 64},    // no query sees any key: out 0, every gradient 0
};

}  // namespace

TEST(Attention, FusedCpuKernelMatchesTheComposedPath) {
  for (const AttBlock& blk : kBlocks) {
    const OpCase fused = attention_case(true, blk), composed = attention_case(false, blk);
    for (DType dt : {DType::f64, DType::f32, DType::bf16}) {
      std::vector<Tensor> in = case_inputs(fused, dt, Device::cpu());
      CaseRun a = run_case(fused, in),
              b = run_case(composed, convert_inputs(composed, in, dt, Device::cpu()));
      // the same arithmetic but for the order of the exp-sums and where the scale and the
      // lse's gradient enter; bf16 outputs and gradients round both results to 8 bits
      const double tol = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 2e-6 : 1e-2;
      SCOPED_TRACE("tq " + std::to_string(blk.tq) + " tk " + std::to_string(blk.tk) + " q_off " +
                   std::to_string(blk.q_off) + " k_off " + std::to_string(blk.k_off));
      expect_close(fused, a, b, tol, dtype_name(dt));
      if (blk.masked == blk.tq)  // nothing visible: the fused kernel writes exact zeros
        for (const Tensor& g : a.grads) EXPECT_EQ(rel_error(g, Tensor::zeros(g.shape(), DType::f64)), 0.0);
    }
  }
}

// Grouped-query attention, 4 query heads over 2 and over 1 kv heads: the fused kernel (kv
// head h/G read in place, dk and dv summed over the group in one task) against the composed
// path (each group's query heads as one matrix), on the same blocks.
TEST(Attention, GqaFusedCpuKernelMatchesTheComposedPath) {
  for (const int64_t nkv : {2, 1})
    for (const AttBlock& blk : kBlocks) {
      const OpCase fused = attention_case(true, blk, 4, nkv), composed = attention_case(false, blk, 4, nkv);
      for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
        std::vector<Tensor> in = case_inputs(fused, dt, Device::cpu());
        ASSERT_EQ(in[1].size(1), nkv);
        CaseRun a = run_case(fused, in),
                b = run_case(composed, convert_inputs(composed, in, dt, Device::cpu()));
        const double tol = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 2e-6 : 1e-2;
        SCOPED_TRACE("NH 4 NKV " + std::to_string(nkv) + " tq " + std::to_string(blk.tq) + " tk " +
                     std::to_string(blk.tk) + " q_off " + std::to_string(blk.q_off) + " k_off " +
                     std::to_string(blk.k_off));
        expect_close(fused, a, b, tol, dtype_name(dt));
        if (blk.masked == blk.tq)  // nothing visible: exact zeros
          for (const Tensor& g : a.grads) EXPECT_EQ(rel_error(g, Tensor::zeros(g.shape(), DType::f64)), 0.0);
      }
    }
}

// The convention, checked independently of both implementations: GQA equals multi-head
// attention on k and v with each kv head repeated G times (Hugging Face's repeat_kv, built
// here from split and concat), in outputs and in dq, dk, dv (dk, dv: the repeats' gradients
// summed by autograd), for the fused kernel and the composed path, G = 2, 3 and 6.
TEST(Attention, GqaEqualsMultiHeadAttentionOnRepeatedKv) {
  for (const bool fused : {true, false})
    for (const int64_t nkv : {3, 2, 1})
      for (const AttBlock& blk : kBlocks) {
        const OpCase gqa = attention_case(fused, blk, 6, nkv),
                     mha = mha_on_repeated_kv_case(fused, blk, 6, nkv);
        std::vector<Tensor> in = case_inputs(gqa, DType::f64, Device::cpu());
        CaseRun a = run_case(gqa, in), b = run_case(mha, convert_inputs(mha, in, DType::f64, Device::cpu()));
        SCOPED_TRACE(std::string(fused ? "fused" : "composed") + " NH 6 NKV " + std::to_string(nkv) + " tq " +
                     std::to_string(blk.tq) + " tk " + std::to_string(blk.tk) + " q_off " +
                     std::to_string(blk.q_off) + " k_off " + std::to_string(blk.k_off));
        ASSERT_EQ(b.grads[1].shape(), a.grads[1].shape());
        expect_close(gqa, a, b, 1e-12, "f64");
      }
}

// Packed rows through attention(): GQA (4 query heads over 2 kv heads), a whole row and a
// block of queries 100..199 over keys 0..199; documents across the blocks of 64 queries.
TEST(Attention, FusedCpuKernelMatchesTheComposedPathOnPackedRows) {
  const Tensor docs = docs_of({{1, 70, 3, 64, 62}, {130, 1, 69}});
  for (const AttBlock& blk : {AttBlock{200, 200, 0, 0, 0}, AttBlock{100, 200, 100, 0, 0}})
    for (DType dt : {DType::f32, DType::f64}) {
      const OpCase fused = attention_case(true, blk, 4, 2, docs),
                   composed = attention_case(false, blk, 4, 2, docs);
      std::vector<Tensor> in = case_inputs(fused, dt, Device::cpu());
      CaseRun a = run_case(fused, in),
              b = run_case(composed, convert_inputs(composed, in, dt, Device::cpu()));
      expect_close(fused, a, b, dt == DType::f64 ? 1e-12 : 2e-6, dtype_name(dt));
    }
}

// A head count that does not divide, or k and v that differ, is refused naming the counts.
TEST(Attention, RefusesKvHeadsThatDoNotDivideTheQueryHeads) {
  const Tensor q = randn({1, 4, 5, 8}, DType::f32, Device::cpu(), 1);
  for (const int64_t nkv : {3, 8, 0}) {
    const Tensor k = Tensor::zeros({1, nkv, 5, 8});
    for (const bool fused : {true, false}) {
      auto att = fused ? attention : attention_composed;
      try {
        att(q, k, k, 0, 0, 0.0, Tensor());
        ADD_FAILURE() << "attention with 4 query heads and " << nkv << " kv heads was accepted";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("q has 4 heads and k, v " + std::to_string(nkv)), std::string::npos) << msg;
        EXPECT_NE(msg.find("grouped-query"), std::string::npos) << msg;
      }
    }
  }
  EXPECT_THROW(attention(q, Tensor::zeros({1, 2, 5, 8}), Tensor::zeros({1, 1, 5, 8})), Error);  // k != v
  // and the CPU kernel itself
  Tensor k3 = Tensor::zeros({1, 3, 5, 8}), y = Tensor::empty({1, 4, 5, 8}), lse = Tensor::empty({1, 4, 5});
  EXPECT_THROW(kernels::attention_fused_forward(q, k3, k3, 0, 0, 0.5, y, lse), Error);
}

// A grouped GEMM with two groups or more per thread runs each group whole on one thread, the
// groups spread over the threads (cpu::grouped_gemm): its product and both gradients are the same
// bits on one thread and two, and within f32 of float64's at two threads.
TEST(GroupedMatmul, GroupsOverTheThreadsSameBitsOnOneThreadAndTwo) {
  const std::vector<int64_t> counts = {60, 0, 45, 70, 33, 52, 80, 60};  // 7 groups with rows
  const OpCase c{"grouped_matmul_over_threads",
                 [](DType dt, Device dev) {
                   std::vector<Tensor> x = {randn({400, 32}, dt, dev, 930),
                                            randn({8, 32, 24}, dt, dev, 931, 0.0f, 0.3f)};
                   for (Tensor& t : x) t.set_requires_grad(true);
                   return x;
                 },
                 [counts](const std::vector<Tensor>& x) {
                   return std::vector<Tensor>{grouped_matmul(x[0], x[1], counts)};
                 },
                 {true, true}};
  expect_same_bits_on_one_and_two_threads(c);
  const int before = num_threads();
  set_num_threads(2);
  expect_consistent(c, DType::f32, DType::f64, 1e-5, "f32 at two threads");
  set_num_threads(before);
}

// One thread and two give the same bits; q, k, v read through strides (a transposed view of
// (B, T, NH, HS), as heads lie in c_attn's output) give the same bits as contiguous copies.
TEST(Attention, FusedCpuKernelSameBitsOnThreadsAndStrides) {
  const AttBlock blk = {150, 130, 0, 20, 20};
  expect_same_bits_on_one_and_two_threads(attention_case(true, blk));
  expect_same_bits_on_one_and_two_threads(attention_case(true, blk, 4, 2));  // GQA: dk, dv summed per group

  const int64_t B = 2, HS = 16;
  // (B, H, T, HS) as a view of (B, T, H, HS)
  auto strided = [&](int64_t H, int64_t T, uint64_t stream) {
    return randn({B, T, H, HS}, DType::f32, Device::cpu(), stream).transpose(1, 2);
  };
  for (const std::pair<int64_t, int64_t>& heads : {std::pair<int64_t, int64_t>{3, 3}, {4, 2}, {4, 1}}) {
    const int64_t NH = heads.first, NKV = heads.second;  // query heads, kv heads
    const Tensor q = strided(NH, blk.tq, 1), k = strided(NKV, blk.tk, 2), v = strided(NKV, blk.tk, 3),
                 dy = strided(NH, blk.tq, 4), dlse = randn({B, NH, blk.tq}, DType::f32, Device::cpu(), 5);
    ASSERT_FALSE(q.is_contiguous());
    auto run = [&](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dy) {
      Tensor y = Tensor::empty({B, NH, blk.tq, HS}), lse = Tensor::empty({B, NH, blk.tq});
      kernels::attention_fused_forward(q, k, v, blk.q_off, blk.k_off, 0.25, y, lse);
      Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()), dv = Tensor::empty(k.shape());
      kernels::attention_fused_backward(q, k, v, y, lse, dy, dlse, blk.q_off, blk.k_off, 0.25, dq, dk, dv);
      return std::vector<Tensor>{y, lse, dq, dk, dv};
    };
    const std::vector<Tensor> views = run(q, k, v, dy),
                              copies = run(q.contiguous(), k.contiguous(), v.contiguous(), dy.contiguous());
    for (size_t i = 0; i < views.size(); ++i)  // bit for bit (the masked rows' lse: -inf in both)
      EXPECT_EQ(views[i].to_vector<float>(), copies[i].to_vector<float>())
          << "NH " << NH << " NKV " << NKV << " result " << i;
  }
}

// ---- bf16 GEMMs on the CPU: oneDNN's kernels and the f32 path (tensor/cpu/matmul) ----------

namespace {

// NDT_BF16_GEMM or NDT_F32_GEMM for one scope (the CPU gemm reads them at each call).
struct GemmChoice {
  GemmChoice(const char* var, const char* value) : var(var) { setenv(var, value, 1); }
  ~GemmChoice() { unsetenv(var); }
  const char* var;
};

// alpha op(a) op(b) + beta c0 (+ bias) in f64 from the same bf16 values: what a bf16 GEMM
// with f32 accumulation approximates to within one bf16 rounding of the result.
Tensor gemm_f64(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c0, double alpha,
                double beta) {
  Tensor c = c0.to(DType::f64);
  kernels::gemm(a.to(DType::f64), ta, b.to(DType::f64), tb, c, alpha, beta);
  return c;
}

// Every shape the CPU gemm takes (2-D, batched, a 2-D b shared by the batch; each operand
// transposed or not; alpha and beta) in dtype, on each value of the variable env
// (NDT_BF16_GEMM or NDT_F32_GEMM), against f64 from the same values.
void check_every_gemm_shape(DType dtype, const char* env, std::initializer_list<const char*> choices,
                            double tol, uint64_t stream) {
  const int64_t m = 37, n = 29, k = 53;
  for (auto [batch, b_shared] : {std::pair<int64_t, bool>{0, false}, {3, false}, {3, true}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        if (b_shared && ta) continue;  // not a shape matmul makes
        auto shape = [&, batch = batch](int64_t r, int64_t c, bool batched) {
          return batched && batch > 0 ? ndt::Shape{batch, r, c} : ndt::Shape{r, c};
        };
        const Tensor a = randn(ta ? shape(k, m, true) : shape(m, k, true), dtype, Device::cpu(), stream++);
        const Tensor b =
            randn(tb ? shape(n, k, !b_shared) : shape(k, n, !b_shared), dtype, Device::cpu(), stream++);
        const Tensor c0 = randn(shape(m, n, true), dtype, Device::cpu(), stream++);
        for (auto [alpha, beta] : {std::pair{1.0, 0.0}, std::pair{0.5, 1.0}}) {
          const Tensor want = gemm_f64(a, ta, b, tb, c0, alpha, beta);
          for (const char* choice : choices) {
            GemmChoice scoped(env, choice);
            Tensor c = c0.clone();
            kernels::gemm(a, ta, b, tb, c, alpha, beta);
            EXPECT_LT(rel_error(c.to(DType::f64), want), tol)
                << env << "=" << choice << " batch " << batch << (b_shared ? " shared b" : "") << " ta " << ta
                << " tb " << tb << " alpha " << alpha << " beta " << beta;
          }
        }
      }
}

// linear_forward in dtype with a bias, and with GELU, on each value of the variable env
// (NDT_BF16_GEMM or NDT_F32_GEMM), against f64 from the same values.
void check_linear_with_bias(DType dtype, const char* env, std::initializer_list<const char*> choices,
                            double tol, double tol_gelu, uint64_t seed) {
  const Tensor x = randn({70, 48}, dtype, Device::cpu(), seed),
               w = randn({48, 40}, dtype, Device::cpu(), seed + 1);
  const Tensor bias = randn({40}, dtype, Device::cpu(), seed + 2, 0.0f, 3.0f);
  Tensor want = Tensor::empty({70, 40}, DType::f64), want_gelu = Tensor::empty({70, 40}, DType::f64);
  kernels::linear_forward(x.to(DType::f64), w.to(DType::f64), bias.to(DType::f64), false, want, Tensor());
  kernels::gelu_forward(want, want_gelu);
  for (const char* choice : choices) {
    GemmChoice scoped(env, choice);
    Tensor y = Tensor::empty({70, 40}, dtype), out = Tensor::empty({70, 40}, dtype),
           pre = Tensor::empty({70, 40}, dtype);
    kernels::linear_forward(x, w, bias, false, y, Tensor());
    kernels::linear_forward(x, w, bias, true, out, pre);
    EXPECT_LT(rel_error(y.to(DType::f64), want), tol) << env << "=" << choice;
    EXPECT_LT(rel_error(pre.to(DType::f64), want), tol) << env << "=" << choice;
    EXPECT_LT(rel_error(out.to(DType::f64), want_gelu), tol_gelu) << env << "=" << choice;
  }
}

}  // namespace

// Every shape the CPU gemm takes, in bf16 through oneDNN and through f32, against f64.
TEST(Bf16Gemm, OneDnnAndTheF32PathAgreeWithFloat64) {
  if (cpu::bf16_gemm_library().rfind("none", 0) == 0) GTEST_SKIP() << cpu::bf16_gemm_library();
  check_every_gemm_shape(DType::bf16, "NDT_BF16_GEMM", {"onednn", "f32"}, 5e-3, 1000);
}

// linear_forward with a bias, and with GELU: oneDNN adds the bias before the one rounding.
TEST(Bf16Gemm, LinearWithBiasOnBothPaths) {
  if (cpu::bf16_gemm_library().rfind("none", 0) == 0) GTEST_SKIP() << cpu::bf16_gemm_library();
  check_linear_with_bias(DType::bf16, "NDT_BF16_GEMM", {"onednn", "f32"}, 5e-3, 1e-2, 1100);
}

// auto takes oneDNN exactly where the CPU has bf16 dot products; a wrong value is refused.
TEST(Bf16Gemm, AutoFollowsTheCpuAndBadChoicesAreRefused) {
#if defined(__x86_64__)
  if (cpu::bf16_gemm_library().rfind("none", 0) != 0) {
    __builtin_cpu_init();
    EXPECT_EQ(cpu::bf16_gemm_native(), __builtin_cpu_supports("avx512bf16") != 0) << cpu::bf16_gemm_library();
  }
#endif
  GemmChoice scoped("NDT_BF16_GEMM", "fast");
  const Tensor a = randn({4, 4}, DType::bf16, Device::cpu(), 1200);
  Tensor c = Tensor::empty({4, 4}, DType::bf16);
  const std::string e = ndt::testing::error_of([&] { kernels::gemm(a, false, a, false, c); });
  EXPECT_NE(e.find("NDT_BF16_GEMM=fast"), std::string::npos) << e;
}

// ---- f32 GEMMs on the CPU: OpenBLAS and oneDNN's f32 matmul (NDT_F32_GEMM) --------------------

namespace {

bool have_onednn() { return cpu::bf16_gemm_library().find("without oneDNN") == std::string::npos; }

}  // namespace

// Every shape the CPU gemm takes, in f32 on both libraries, against f64 from the same values.
TEST(F32Gemm, OneDnnAndOpenBlasAgreeWithFloat64) {
  if (!have_onednn()) GTEST_SKIP() << cpu::bf16_gemm_library();
  check_every_gemm_shape(DType::f32, "NDT_F32_GEMM", {"onednn", "openblas"}, 1e-6, 2000);
}

// linear_forward with a bias (oneDNN adds it in the accumulator) and with GELU, on both.
TEST(F32Gemm, LinearWithBiasOnBothLibraries) {
  if (!have_onednn()) GTEST_SKIP() << cpu::bf16_gemm_library();
  check_linear_with_bias(DType::f32, "NDT_F32_GEMM", {"onednn", "openblas"}, 1e-6, 1e-6, 2100);
}

// A grouped GEMM's groups (cpu::gemm_any_rows, one oneDNN primitive for every row count):
// every transpose, row counts that change from call to call (a's rows: m, or k where a is
// transposed), beta 0 and 1, on both libraries, against f64 from the same values.
TEST(F32Gemm, AnyRowsOnBothLibrariesAgreeWithFloat64) {
  if (!have_onednn()) GTEST_SKIP() << cpu::bf16_gemm_library();
  for (const char* lib : {"onednn", "openblas"}) {
    GemmChoice scoped("NDT_F32_GEMM", lib);
    uint64_t seed = 2200;
    for (int64_t rows : {1, 7, 40, 33, 7})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (double beta : {0.0, 1.0}) {
            const int64_t m = ta ? 6 : rows, k = ta ? rows : 6, n = 5;  // op(a) (m,k) @ op(b) (k,n)
            const Tensor a = randn(ta ? Shape{k, m} : Shape{m, k}, DType::f32, Device::cpu(), ++seed);
            const Tensor b = randn(tb ? Shape{n, k} : Shape{k, n}, DType::f32, Device::cpu(), ++seed);
            const Tensor c0 = randn({m, n}, DType::f32, Device::cpu(), ++seed);
            const Tensor c = c0.clone();
            cpu::gemm_any_rows(a, ta, b, tb, c, 1.0, beta);
            ASSERT_LT(rel_error(c.to(DType::f64), gemm_f64(a, ta, b, tb, c0, 1.0, beta)), 1e-6)
                << lib << " rows " << rows << " ta " << ta << " tb " << tb << " beta " << beta;
          }
  }
}

// The same in bf16 (oneDNN's bf16 kernels where this CPU has them): a bf16 product of the bf16
// operands, against f64 from the same (bf16) values, within bf16's rounding of the result.
TEST(Bf16Gemm, AnyRowsAgreeWithFloat64) {
  if (!have_onednn() || !cpu::bf16_gemm_native()) GTEST_SKIP() << cpu::bf16_gemm_library();
  uint64_t seed = 2300;
  for (int64_t rows : {1, 7, 40, 33, 7})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (double beta : {0.0, 1.0}) {
          const int64_t m = ta ? 6 : rows, k = ta ? rows : 6, n = 5;
          const Tensor a =
              randn(ta ? Shape{k, m} : Shape{m, k}, DType::f32, Device::cpu(), ++seed).to(DType::bf16);
          const Tensor b =
              randn(tb ? Shape{n, k} : Shape{k, n}, DType::f32, Device::cpu(), ++seed).to(DType::bf16);
          const Tensor c0 = randn({m, n}, DType::f32, Device::cpu(), ++seed).to(DType::bf16);
          const Tensor c = c0.clone();
          cpu::gemm_any_rows(a, ta, b, tb, c, 1.0, beta);
          ASSERT_LT(rel_error(c.to(DType::f64), gemm_f64(a, ta, b, tb, c0, 1.0, beta)), 1e-2)
              << "rows " << rows << " ta " << ta << " tb " << tb << " beta " << beta;
        }
}

// More shapes than oneDNN's primitive table keeps (1024): the table empties and refills, and
// every product stays right (a program that multiplies prompts of every length).
TEST(F32Gemm, MoreShapesThanTheTableKeeps) {
  if (!have_onednn()) GTEST_SKIP() << cpu::bf16_gemm_library();
  GemmChoice scoped("NDT_F32_GEMM", "onednn");
  const Tensor b = randn({5, 3}, DType::f32, Device::cpu(), 2300);
  for (int64_t m = 1; m <= 1100; ++m) {
    const Tensor a = randn({m, 5}, DType::f32, Device::cpu(), 2301 + m);
    Tensor c = Tensor::empty({m, 3}, DType::f32);
    kernels::gemm(a, false, b, false, c);
    const Tensor want = gemm_f64(a, false, b, false, Tensor::zeros({m, 3}, DType::f32), 1.0, 0.0);
    ASSERT_LT(rel_error(c.to(DType::f64), want), 1e-6) << "m " << m;
  }
}

// auto takes oneDNN only on an AMD CPU where oneDNN's f32 matmul is an AVX-512 brgemm kernel
// (where it was measured faster); the library in words says which; a wrong value is refused.
TEST(F32Gemm, AutoFollowsTheCpuAndBadChoicesAreRefused) {
  {
    GemmChoice scoped("NDT_F32_GEMM", "auto");
#if defined(__x86_64__)
    __builtin_cpu_init();
    const bool amd_avx512 = __builtin_cpu_is("amd") && __builtin_cpu_supports("avx512f");
    if (have_onednn()) {
      EXPECT_EQ(cpu::f32_gemm_on_onednn(), amd_avx512) << cpu::f32_gemm_library();
    } else {
      EXPECT_FALSE(cpu::f32_gemm_on_onednn());
    }
#endif
    EXPECT_EQ(cpu::f32_gemm_library().rfind(cpu::f32_gemm_on_onednn() ? "oneDNN " : "OpenBLAS kernel ", 0),
              0u)
        << cpu::f32_gemm_library();
  }
  {
    GemmChoice scoped("NDT_F32_GEMM", "openblas");
    EXPECT_FALSE(cpu::f32_gemm_on_onednn());
    EXPECT_EQ(cpu::f32_gemm_library(), "OpenBLAS kernel " + blas_core());
  }
  GemmChoice scoped("NDT_F32_GEMM", "mkl");
  const Tensor a = randn({4, 4}, DType::f32, Device::cpu(), 2200);
  Tensor c = Tensor::empty({4, 4}, DType::f32);
  const std::string e = ndt::testing::error_of([&] { kernels::gemm(a, false, a, false, c); });
  EXPECT_NE(e.find("NDT_F32_GEMM=mkl"), std::string::npos) << e;
}

// ---- the CPU's vectorized loops keep their plain loops' bits ----------------------------------
//
// GELU on bf16, the fused cross-entropy and AdamW run as AVX-512 / AVX2 clones of loops whose
// every operation is IEEE (no reassociation, no contraction): the results below are the plain
// element-by-element definitions, compared bit for bit, on random inputs and special values.

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<float> floats_of(const Tensor& t) { return t.to(DType::f32).to_vector<float>(); }

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (bits_of(got[i]) != bits_of(want[i]) && bad++ < 3)
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
  EXPECT_EQ(bad, 0) << what;
}

}  // namespace

TEST(VectorKernels, Bf16ConversionsKeepTheScalarBits) {
  std::vector<bf16> every(65536);  // every bf16 pattern, NaNs included
  for (uint32_t b = 0; b < 65536; ++b) every[b].bits = static_cast<uint16_t>(b);
  std::vector<float> wide(65536);
  cpu::bf16_to_f32(every.data(), wide.data(), 65536);
  for (uint32_t b = 0; b < 65536; ++b) ASSERT_EQ(bits_of(wide[b]), bits_of(bf16_to_float(every[b]))) << b;
  // rounding: random floats, ties both ways, the largest finite, infinities, NaNs, denormals
  std::vector<float> f = randn({4001}, DType::f32, Device::cpu(), 1300, 0.0f, 100.0f).to_vector<float>();
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                     0x7f800001u, 0xffffffffu, 0x00000001u, 0x80008000u, 0x00000000u, 0x80000000u}) {
    float x;
    std::memcpy(&x, &u, 4);
    f.push_back(x);
  }
  std::vector<bf16> narrow(f.size());
  cpu::f32_to_bf16(f.data(), narrow.data(), static_cast<int64_t>(f.size()));
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(narrow[i].bits, float_to_bf16(f[i]).bits) << f[i];
}

TEST(VectorKernels, Bf16GeluIsTheFloatFormulaRoundedOnce) {
  const int64_t n = 2000;  // several blocks, the last partial
  const Tensor x = randn({n}, DType::bf16, Device::cpu(), 1310, 0.0f, 3.0f);
  const Tensor dy = randn({n}, DType::bf16, Device::cpu(), 1311);
  Tensor y = Tensor::empty({n}, DType::bf16), dx = Tensor::empty({n}, DType::bf16);
  kernels::gelu_forward(x, y);
  kernels::gelu_backward(x, dy, dx);
  const float k = std::sqrt(2.0f / static_cast<float>(M_PI));
  std::vector<float> want_y, want_dx;
  const std::vector<float> xs = floats_of(x), ds = floats_of(dy);
  for (int64_t i = 0; i < n; ++i) {
    const float v = xs[i], t = cpu::fast_tanh(k * (v + 0.044715f * v * v * v));
    want_y.push_back(bf16_to_float(float_to_bf16(0.5f * v * (1.0f + t))));
    const float grad =
        0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * k * (1.0f + float(3 * 0.044715) * v * v);
    want_dx.push_back(bf16_to_float(float_to_bf16(grad * ds[i])));
  }
  expect_same_bits(floats_of(y), want_y, "gelu_forward bf16");
  expect_same_bits(floats_of(dx), want_dx, "gelu_backward bf16");
}

// The fused cross-entropy against its row-by-row definition: f32 and bf16, the gradient in a
// separate buffer and in place, padded columns (v_limit < V), one ignored row.
TEST(VectorKernels, CrossEntropyKeepsThePlainLoopsBits) {
  const int64_t N = 9, V = 301, v_limit = 290, ignore = -100;
  std::vector<int32_t> tg =
      random_ids({N}, static_cast<int32_t>(v_limit), Device::cpu(), 1320).to_vector<int32_t>();
  tg[4] = ignore;
  const Tensor targets = Tensor::from_vector(tg, {N});
  Tensor kept = Tensor::empty({1}, DType::i32);
  kernels::count_not_equal(targets, ignore, kept);
  for (DType dt : {DType::f32, DType::bf16})
    for (bool in_place : {false, true}) {
      const Tensor logits = randn({N, V}, dt, Device::cpu(), 1321, 0.0f, 4.0f);
      const std::vector<float> x = floats_of(logits);
      Tensor work = logits.clone();
      Tensor grad = in_place ? work : Tensor::empty({N, V}, dt);
      Tensor losses = Tensor::empty({N}, DType::f32), lse = Tensor::empty({N}, DType::f32);
      kernels::cross_entropy_forward(work, targets, kept, v_limit, ignore, losses, lse, grad);
      std::vector<float> want_loss, want_lse, want_grad;
      const float inv_kept = 1.0f / float(N - 1);
      for (int64_t r = 0; r < N; ++r) {
        const float* row = x.data() + r * V;
        float mx = -INFINITY, s = 0;
        for (int64_t c = 0; c < v_limit; ++c) mx = std::max(mx, row[c]);
        for (int64_t c = 0; c < v_limit; ++c) s += cpu::fast_exp(row[c] - mx);
        const float l = mx + std::log(s);
        const bool ignored = tg[r] == ignore;
        want_lse.push_back(l);
        want_loss.push_back(ignored ? 0.0f : l - row[tg[r]]);
        for (int64_t c = 0; c < V; ++c) {
          float g = 0;
          if (!ignored && c < v_limit)
            g = (cpu::fast_exp(row[c] - l) - (c == tg[r] ? 1.0f : 0.0f)) * inv_kept;
          want_grad.push_back(dt == DType::bf16 ? bf16_to_float(float_to_bf16(g)) : g);
        }
      }
      const std::string what = std::string(dtype_name(dt)) + (in_place ? " in place" : "");
      expect_same_bits(floats_of(losses), want_loss, ("losses " + what).c_str());
      expect_same_bits(floats_of(lse), want_lse, ("lse " + what).c_str());
      expect_same_bits(floats_of(grad), want_grad, ("dlogits " + what).c_str());
    }
}

TEST(VectorKernels, AdamWKeepsThePlainLoopsBits) {
  const int64_t n = 100003;  // two threads' chunks, a remainder for the vector loop
  Tensor p = randn({n}, DType::f32, Device::cpu(), 1330), g = randn({n}, DType::f32, Device::cpu(), 1331);
  Tensor m = randn({n}, DType::f32, Device::cpu(), 1332, 0.0f, 0.1f);
  Tensor v = randu({n}, DType::f32, Device::cpu(), 1333, 0.0f, 0.01f);
  std::vector<float> P = p.to_vector<float>(), G = g.to_vector<float>(), M = m.to_vector<float>(),
                     S = v.to_vector<float>();
  kernels::AdamWArgs a;
  a.lr = 3e-4;
  a.beta1 = 0.9;
  a.beta2 = 0.95;
  a.weight_decay = 0.1;
  a.grad_scale = 0.7;
  a.step = 7;
  a.decay_end = 60001;
  a.index_offset = 10;
  kernels::adamw_step(p, g, m, v, a);
  const float b1 = a.beta1, b2 = a.beta2, gs = a.grad_scale, eps = a.eps;
  const float step_size = a.lr / static_cast<float>(1 - std::pow(a.beta1, 7.0));
  const float bc2_sqrt = std::sqrt(1 - std::pow(a.beta2, 7.0));
  for (int64_t i = 0; i < n; ++i) {
    const float decay =
        i < a.decay_end - a.index_offset ? static_cast<float>(1 - a.lr * a.weight_decay) : 1.0f;
    const float gi = G[i] * gs, mi = b1 * M[i] + (1 - b1) * gi, vi = b2 * S[i] + (1 - b2) * gi * gi;
    P[i] = P[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    M[i] = mi;
    S[i] = vi;
  }
  expect_same_bits(p.to_vector<float>(), P, "param");
  expect_same_bits(m.to_vector<float>(), M, "m");
  expect_same_bits(v.to_vector<float>(), S, "v");
}
