// Mixture-of-experts layers (see moe.h). Legend: N tokens, C channels, E experts, k choices per
// token, I an expert's hidden units, M = N k routed rows.
#include "nn/moe.h"

#include <algorithm>
#include <cmath>

#include "autograd/node.h"
#include "tensor/kernels.h"

namespace ndt::nn {

void RouterLoss::seal() {
  if (sealed) return;
  if (reduce) reduce(*this);  // the whole batch's rows, counts and sums
  sealed = true;
}

// Every MoE layer routes the same R_l rows (the micro-step's tokens), so the layers' mean of
// their means, 1/L sum_l z_sum_l / R_l, is sum_l z_sum_l / R with R = L R_l, all layers' rows:
// sums alone, which reduce and a pipeline's stages can add up.
double RouterLoss::z_value() const {
  int64_t R = 0;
  double sum = 0;
  for (const auto& [i, l] : layers) R += l.rows, sum += l.z_sum;
  return R > 0 ? sum / static_cast<double>(R) : 0.0;
}

int64_t RouterLoss::rows() const {
  int64_t R = 0;
  for (const auto& [i, l] : layers) R += l.rows;
  return R;
}

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
  // rows, C (E), S (E), z_sum, grad, z_grad
  std::vector<double> t(static_cast<size_t>(2 * E + 4), 0.0);
  for (const auto& [i, l] : layers) {
    t[0] += static_cast<double>(l.rows);
    for (size_t e = 0; e < l.counts.size(); ++e) t[1 + e] += static_cast<double>(l.counts[e]);
    for (size_t e = 0; e < l.prob_sums.size(); ++e) t[1 + E + e] += l.prob_sums[e];
    t[1 + 2 * E] += l.z_sum;
  }
  t[2 + 2 * E] = grad, t[3 + 2 * E] = z_grad;
  return t;
}

void RouterLoss::carry(const std::vector<double>& t) {
  NDT_CHECK(t.size() == static_cast<size_t>(2 * E + 4), "RouterLoss: ", t.size(), " totals for ", E,
            " experts");
  Layer& l = layers[kCarried];
  l.rows = std::llround(t[0]);
  l.counts.assign(static_cast<size_t>(E), 0);
  l.prob_sums.assign(static_cast<size_t>(E), 0.0);
  for (size_t e = 0; e < static_cast<size_t>(E); ++e)
    l.counts[e] = std::llround(t[1 + e]), l.prob_sums[e] = t[1 + E + e];
  l.z_sum = t[1 + 2 * E];
}

void RouterLoss::take_totals(const std::vector<double>& t) {
  layers.clear();
  carry(t);
  grad = t[2 + 2 * E], z_grad = t[3 + 2 * E];
  sealed = true;  // a recompute in this backward leaves them
}

Tensor aux_loss(const Tensor& anchor, const std::shared_ptr<RouterLoss>& stats) {
  stats->seal();
  const DType dt = anchor.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = Tensor::scalar(stats->value(), dt, anchor.device());
  // backward: nothing flows into the anchor; d loss / d aux waits for the layers' balance()
  autograd::record("moe_aux_loss", {out}, {anchor}, [stats](const autograd::Grads& g) -> autograd::Grads {
    stats->grad = g[0].item();
    return {Tensor()};
  });
  return out;
}

Tensor z_loss(const Tensor& anchor, const std::shared_ptr<RouterLoss>& stats) {
  stats->seal();
  const DType dt = anchor.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = Tensor::scalar(stats->z_value(), dt, anchor.device());
  // backward: nothing flows into the anchor; d loss / d z waits for the layers' zloss_penalty()
  autograd::record("moe_z_loss", {out}, {anchor}, [stats](const autograd::Grads& g) -> autograd::Grads {
    stats->z_grad = g[0].item();
    return {Tensor()};
  });
  return out;
}

namespace {

// logits (N, E) -> lse (N) = log sum_e exp(logits[n,e]), and p (N, E) = softmax(logits) when asked
std::vector<double> logsumexp_rows(const std::vector<double>& logits, int64_t N, int64_t E,
                                   std::vector<double>* p = nullptr) {
  std::vector<double> lse(static_cast<size_t>(N));
  if (p) p->resize(logits.size());
  for (int64_t n = 0; n < N; ++n) {
    const double* row = logits.data() + n * E;
    double m = row[0], s = 0;
    for (int64_t e = 1; e < E; ++e) m = std::max(m, row[e]);
    for (int64_t e = 0; e < E; ++e) s += std::exp(row[e] - m);
    lse[static_cast<size_t>(n)] = m + std::log(s);
    if (p)
      for (int64_t e = 0; e < E; ++e) (*p)[static_cast<size_t>(n * E + e)] = std::exp(row[e] - lse[n]);
  }
  return lse;
}

// logits (N, E) -> logits; layer `layer`'s rows and sum of lse^2 into stats (not in a recompute),
// and in backward dlogits + z_grad grad_scale 2 lse[n] p[n,e] / R: the z-loss's gradient.
// (On the host, as the load-balancing statistics: the router's (N, E) is small.)
Tensor zloss_penalty(const Tensor& logits, const std::shared_ptr<RouterLoss>& stats, int64_t layer) {
  const int64_t N = logits.size(0), E = logits.size(1);
  if (!stats->sealed) {
    const std::vector<double> lse = logsumexp_rows(logits.to_vector<double>(), N, E);
    RouterLoss::Layer& l = stats->layers[layer];
    l.rows = N;
    l.z_sum = 0;
    for (double v : lse) l.z_sum += v * v;
  }
  Tensor out = logits.detach();
  autograd::record("moe_z_penalty", {out}, {logits},
                   [stats, saved = logits.detach()](const autograd::Grads& g) {
                     const int64_t N = saved.size(0), E = saved.size(1);
                     std::vector<double> p;
                     const std::vector<double> lse = logsumexp_rows(saved.to_vector<double>(), N, E, &p);
                     // in the forward z += 1/R sum_n lse[n]^2 (R: every layer's rows, z_value),
                     // and d lse[n] / d logits[n,e] = p[n,e]
                     const double R = static_cast<double>(stats->rows());
                     const double s = stats->z_grad * stats->grad_scale * 2.0 / R;
                     for (int64_t n = 0; n < N; ++n)
                       for (int64_t e = 0; e < E; ++e)
                         p[static_cast<size_t>(n * E + e)] *= s * lse[static_cast<size_t>(n)];
                     const Tensor add = Tensor::from_vector(p, {N, E}).to(g[0].dtype()).to(g[0].device());
                     Tensor dl = Tensor::empty(g[0].shape(), g[0].dtype(), g[0].device());
                     kernels::add(g[0].contiguous(), add, dl);
                     return autograd::Grads{dl};
                   });
  return out;
}

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
  if (d.shared > 0) {
    shared_expert = std::make_unique<SwiGLU>(d.C, d.shared, std, proj_std);
    shared_expert_gate = std::make_unique<Linear>(d.C, 1, false, std);
    child("shared_expert", shared_expert.get());
    child("shared_expert_gate", shared_expert_gate.get());
  }
}

namespace {

// g (N, 1), y (N, C) -> sigmoid(g) * y (N, C), from ops that have their backward: sigmoid(g) is
// softmax([g, 0])'s first column, spread over the C columns by a product with a row of ones.
Tensor sigmoid_gate(const Tensor& g, const Tensor& y) {
  const int64_t N = g.size(0), C = y.size(1);
  const Tensor g32 = g.dtype() == DType::bf16 ? cast(g, DType::f32) : g;  // the softmax in f32 at least
  const Tensor pair = concat_last({g32, Tensor::zeros({N, 1}, g32.dtype(), g32.device())});  // (N, 2)
  Tensor s = split_last(softmax(pair), {1, 1})[0];                                           // (N, 1)
  if (s.dtype() != y.dtype()) s = cast(s, y.dtype());
  const Tensor ones = Tensor::full({1, C}, 1.0, y.dtype(), y.device());
  return mul(matmul(s, ones), y);  // (N, 1) @ (1, C) -> every column sigmoid(g), times y
}

}  // namespace

Tensor MoeMLP::forward(const Tensor& x, const std::shared_ptr<RouterLoss>& stats, int64_t layer) const {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), N = B * T;
  const Tensor xf = view(x, {N, C});
  // the router in f32 at least, as transformers' softmax(dtype=float)
  Tensor logits = gate.forward(xf);  // (N, E)
  if (logits.dtype() == DType::bf16) logits = cast(logits, DType::f32);
  if (stats && stats->z) logits = zloss_penalty(logits, stats, layer);  // the z-loss's gradient
  Tensor p = softmax(logits);                                           // (N, E)
  const bool balancing = stats && stats->balance;
  if (balancing) p = balance(p, stats);
  TopK top = moe_topk(p, k, normalize);  // weights, experts (N, k)
  if (balancing) record_routing(*stats, layer, top.experts, p);
  const Tensor w = top.values.dtype() == x.dtype() ? top.values : cast(top.values, x.dtype());
  Tensor y =
      run_experts ? run_experts(experts, xf, w, top.experts) : local_experts(experts, xf, w, top.experts);
  if (shared_expert) {  // + sigmoid(x Wg) SwiGLU_shared(x), every token; the SwiGLU on x (B, T, C),
                        // whose sequence dim tensor parallelism's sequence parallelism gathers
    const Tensor shared = view(shared_expert->forward(x), {N, C});
    y = add(y, sigmoid_gate(shared_expert_gate->forward(xf), shared));
  }
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

// The attention's split (and the shared expert's); the router and the experts whole on every rank, which
// without sequence parallelism all route every token alike, and with it each its part of the sequence (their
// gradients then summed over the group, as every whole parameter's: dist/strategy.h)
TensorParallelPlan MoeBlock::tensor_parallel_plan() {
  TensorParallelPlan p = attn.tensor_parallel_plan();
  if (mlp.shared_expert) p += mlp.shared_expert->tensor_parallel_plan();  // split as the llama MLP
  return p;
}

// the attention's, and the shared expert's: nn.Linear modules in transformers, which PEFT's targets
// reach (the router and the routed experts are parameters there). The shared expert's gate, a
// linear C -> 1, takes none: no rank above 1 fits it, so all-linear could never run.
std::vector<LinearSite> MoeBlock::linear_sites() {
  std::vector<LinearSite> s = attn.linear_sites();
  if (SwiGLU* e = mlp.shared_expert.get())
    s.insert(s.end(), {{"mlp.shared_expert.gate_proj", &e->gate_proj},
                       {"mlp.shared_expert.up_proj", &e->up_proj},
                       {"mlp.shared_expert.down_proj", &e->down_proj}});
  return s;
}

}  // namespace ndt::nn
