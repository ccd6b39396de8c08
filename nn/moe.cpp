// Mixture-of-experts layers (see moe.h). Legend: N tokens, C channels, E experts, k choices per
// token, I an expert's hidden units, M = N k routed rows.
#include "nn/moe.h"

#include <cmath>

#include "autograd/node.h"
#include "tensor/kernels.h"

namespace ndt::nn {

double RouterLoss::value() const {
  int64_t R = 0;
  std::vector<double> C(static_cast<size_t>(E), 0.0), S(static_cast<size_t>(E), 0.0);
  for (const auto& [i, l] : layers) {
    R += l.rows;
    for (size_t e = 0; e < C.size(); ++e) C[e] += static_cast<double>(l.counts[e]), S[e] += l.prob_sums[e];
  }
  if (R == 0) return 0.0;
  double sum = 0;
  for (size_t e = 0; e < C.size(); ++e) sum += C[e] * S[e];
  return static_cast<double>(E) * sum / (static_cast<double>(R) * static_cast<double>(R));
}

std::vector<double> RouterLoss::row_gradient() const {
  int64_t R = 0;
  std::vector<double> g(static_cast<size_t>(E), 0.0);
  for (const auto& [i, l] : layers) {
    R += l.rows;
    for (size_t e = 0; e < g.size(); ++e) g[e] += static_cast<double>(l.counts[e]);
  }
  for (double& v : g)
    v *= grad_scale * static_cast<double>(E) / (static_cast<double>(R) * static_cast<double>(R));
  return g;
}

std::vector<double> RouterLoss::totals() const {
  std::vector<double> t(static_cast<size_t>(2 * E + 2), 0.0);  // rows, C (E), S (E), grad
  for (const auto& [i, l] : layers) {
    t[0] += static_cast<double>(l.rows);
    for (size_t e = 0; e < static_cast<size_t>(E); ++e)
      t[1 + e] += static_cast<double>(l.counts[e]), t[1 + E + e] += l.prob_sums[e];
  }
  t.back() = grad;
  return t;
}

void RouterLoss::carry(const std::vector<double>& t) {
  NDT_CHECK(t.size() == static_cast<size_t>(2 * E + 2), "RouterLoss: ", t.size(), " totals for ", E,
            " experts");
  Layer& l = layers[kCarried];
  l.rows = std::llround(t[0]);
  l.counts.assign(static_cast<size_t>(E), 0);
  l.prob_sums.assign(static_cast<size_t>(E), 0.0);
  for (size_t e = 0; e < static_cast<size_t>(E); ++e)
    l.counts[e] = std::llround(t[1 + e]), l.prob_sums[e] = t[1 + E + e];
}

void RouterLoss::take_totals(const std::vector<double>& t) {
  layers.clear();
  carry(t);
  grad = t.back();
  sealed = true;  // a recompute in this backward leaves them
}

Tensor aux_loss(const Tensor& anchor, const std::shared_ptr<RouterLoss>& stats) {
  if (stats->reduce) stats->reduce(*stats);  // the whole batch's rows, counts and sums
  stats->sealed = true;
  const DType dt = anchor.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = Tensor::scalar(stats->value(), dt, anchor.device());
  // backward: nothing flows into the anchor; d loss / d aux waits for the layers' balance()
  autograd::record("moe_aux_loss", {out}, {anchor}, [stats](const autograd::Grads& g) -> autograd::Grads {
    stats->grad = g[0].item();
    return {Tensor()};
  });
  return out;
}

namespace {

// p (N, E) -> p, and in backward dp + grad * d aux / d p (every row alike): the load-balancing
// loss's gradient in this layer's router probabilities (RouterLoss).
Tensor balance(const Tensor& p, const std::shared_ptr<RouterLoss>& stats) {
  Tensor out = p.detach();
  autograd::record(
      "moe_balance", {out}, {p}, [stats, E = p.size(1), dev = p.device()](const autograd::Grads& g) {
        std::vector<double> row = stats->row_gradient();
        for (double& v : row) v *= stats->grad;
        const Tensor add = Tensor::from_vector(row, {E}).to(g[0].dtype()).to(dev);  // (E) f64 -> p's
        Tensor dp = Tensor::empty(g[0].shape(), g[0].dtype(), g[0].device());
        kernels::add(g[0].contiguous(), add, dp);  // every row + d aux / d p
        return autograd::Grads{dp};
      });
  return out;
}

// Layer `layer`'s counts and probability sums into stats: experts (N, k) i32, p (N, E)
void record_routing(RouterLoss& stats, int64_t layer, const Tensor& experts, const Tensor& p) {
  if (stats.sealed) return;  // a recompute in backward: the forward's statistics stand
  RouterLoss::Layer& l = stats.layers[layer];
  const int64_t N = p.size(0), E = p.size(1);
  l.rows = N;
  l.counts.assign(static_cast<size_t>(E), 0);
  for (int32_t e : experts.to_vector<int32_t>()) ++l.counts[static_cast<size_t>(e)];
  const std::vector<double> probs = p.to_vector<double>();
  l.prob_sums.assign(static_cast<size_t>(E), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e)
      l.prob_sums[static_cast<size_t>(e)] += probs[static_cast<size_t>(n * E + e)];
}

}  // namespace

Experts::Experts(int64_t E_, int64_t C_, int64_t I_, float std, float proj_std) : E(E_), C(C_), I(I_) {
  param("gate_proj", &gate_proj, {E, C, I}, Init::normal(std), true);
  param("up_proj", &up_proj, {E, C, I}, Init::normal(std), true);
  param("down_proj", &down_proj, {E, I, C}, Init::normal(proj_std), true);
}

// x (M, C) sorted by expert -> gate, up (M, I) -> silu(gate) * up -> down (M, C)
Tensor Experts::forward(const Tensor& x, const std::vector<int64_t>& counts) const {
  return swiglu(x, gate_proj, up_proj, down_proj, counts);
}

Tensor Experts::swiglu(const Tensor& x, const Tensor& gate, const Tensor& up, const Tensor& down,
                       const std::vector<int64_t>& counts) {
  const Tensor h = silu_mul(grouped_matmul(x, gate, counts), grouped_matmul(x, up, counts));
  return grouped_matmul(h, down, counts);
}

MoeMLP::MoeMLP(const MoeDims& d, float std, float proj_std)
    : gate(d.C, d.experts, false, std),
      experts(d.experts, d.C, d.intermediate, std, proj_std),
      k(d.k),
      normalize(d.normalize) {
  NDT_CHECK(d.k >= 1 && d.k <= d.experts, "MoE: ", d.k, " experts per token of ", d.experts);
  child("gate", &gate);
  child("experts", &experts);
}

Tensor MoeMLP::forward(const Tensor& x, const std::shared_ptr<RouterLoss>& stats, int64_t layer) const {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), N = B * T;
  const Tensor xf = view(x, {N, C});
  // the router in f32 at least, as transformers' softmax(dtype=float)
  Tensor logits = gate.forward(xf);  // (N, E)
  if (logits.dtype() == DType::bf16) logits = cast(logits, DType::f32);
  Tensor p = softmax(logits);  // (N, E)
  if (stats) p = balance(p, stats);
  TopK top = moe_topk(p, k, normalize);  // weights, experts (N, k)
  if (stats) record_routing(*stats, layer, top.experts, p);
  const Tensor w = top.values.dtype() == x.dtype() ? top.values : cast(top.values, x.dtype());
  const Tensor y =
      run_experts ? run_experts(experts, xf, w, top.experts) : local_experts(experts, xf, w, top.experts);
  return view(y, {B, T, C});
}

// the N k choices sorted by expert, each expert's rows through its SwiGLU, back to their tokens
Tensor MoeMLP::local_experts(const Experts& experts, const Tensor& xf, const Tensor& w,
                             const Tensor& choices) {
  const MoeRouting r = moe_sort(choices, experts.E);
  const Tensor y = experts.forward(moe_dispatch(xf, r), r.counts);  // (N k, C)
  return moe_combine(y, w, r);                                      // (N, C)
}

MoeBlock::MoeBlock(const LlamaDims& d, const MoeDims& moe, int64_t layer_, float std, float proj_std)
    : ln_1(d.C, d.norm_eps),
      attn(d, std, proj_std),
      ln_2(d.C, d.norm_eps),
      mlp(moe, std, proj_std),
      layer(layer_) {
  child("ln_1", &ln_1);
  child("attn", &attn);
  child("ln_2", &ln_2);
  child("mlp", &mlp);
}

// x + attn(ln_1(x)) -> h;  h + moe(ln_2(h)) -> out
Tensor MoeBlock::forward(const Tensor& x, const Positions& pos) const {
  const Tensor h = add(x, attn.forward(ln_1.forward(x), pos));
  return add(h, mlp.forward(ln_2.forward(h), pos.router, layer));
}

// The attention's split; the router and the experts whole on every rank, which without sequence
// parallelism all route every token alike, and with it each its part of the sequence (their
// gradients then summed over the group, as every whole parameter's: dist/strategy.h)
TensorParallelPlan MoeBlock::tensor_parallel_plan() { return attn.tensor_parallel_plan(); }

std::vector<LinearSite> MoeBlock::linear_sites() { return attn.linear_sites(); }

}  // namespace ndt::nn
