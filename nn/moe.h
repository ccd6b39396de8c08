// ndtrain: mixture-of-experts layers (Qwen3-MoE, Qwen2-MoE, Mixtral), as transformers computes them.
//
// An MoE layer's MLP sends each token through k of E experts, SwiGLU MLPs of their own:
//
//   logits = x Wr                     (N, E)  the router, a linear without bias
//   p      = softmax(logits)          (N, E)
//   w, e   = top k of p per token     (N, k)  weights (divided by their sum: norm_topk_prob)
//                                             and experts
//   y[n]   = sum_j w[n,j] SwiGLU_{e[n,j]}(x[n])
//
// Qwen2-MoE adds a shared expert, a SwiGLU of its own that every token goes through, gated per
// token by a linear C -> 1 (shared_expert_gate, no bias):
//
//   y[n] += sigmoid(x[n] Wg) SwiGLU_shared(x[n])
//
// Dropless and without a loop over experts on masks: the N k choices are sorted by expert
// (moe_sort), the tokens copied into that order (moe_dispatch), each projection is one grouped
// GEMM over the experts' row blocks (grouped_matmul), and the rows are weighted and added back
// to their tokens (moe_combine): autograd/ops.h.
//
// The load-balancing loss (Switch Transformer; transformers' load_balancing_loss_func), over
// every MoE layer l of one forward, with R = the rows of all of them (N per layer):
//
//   aux = E / R^2 sum_e C_e S_e,   C_e = the choices of expert e,  S_e = sum_{l,n} p_l[n,e]
//
// C is a count (no gradient) summed over the layers, so aux couples every layer: its gradient
// in p_l[n,e] is E C_e / R^2, known only when the whole forward has run. RouterLoss collects C
// and S as the layers run; the model adds coef * aux(RouterLoss) to the loss after its last
// block, and that op's backward, which runs before any block's (it is created after them), leaves
// its incoming gradient in the RouterLoss; each layer's p passed through balance() then gets
// its share in backward. Activation checkpointing's recompute does not record them again.
//
// The router z-loss (ST-MoE, Zoph et al. 2022), which keeps the router's logits small: per MoE
// layer l the mean over its R_l rows of the squared log-sum-exp of the logits, averaged over the
// L MoE layers (Megatron-Core's moe_z_loss_coeff convention):
//
//   z = 1/L sum_l 1/R_l sum_n lse_l[n]^2,   lse_l[n] = log sum_e exp(logits_l[n,e])
//
// Its gradient in logits_l[n,e] is 2 lse_l[n] p_l[n,e] / (L R_l), one token's alone, but R_l and
// L are the whole batch's: the same RouterLoss collects the sums (zloss_penalty), z_loss() takes
// the value after the last block and its backward leaves d loss / d z for the layers.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "nn/layers.h"

namespace ndt::nn {

// The routers' statistics of one forward, for the load-balancing loss.
struct RouterLoss {
  explicit RouterLoss(int64_t experts) : E(experts) {}
  int64_t E;
  // per MoE layer (by block index): its rows N, choices per expert C_l (E) and p's column sums S_l (E)
  struct Layer {
    int64_t rows = 0;
    std::vector<int64_t> counts;
    std::vector<double> prob_sums;
    double z_sum = 0;  // sum over the rows of lse(logits)^2 (the z-loss)
  };
  bool balance = true;  // collect the load-balancing statistics (router_aux_loss_coef > 0)
  bool z = false;       // collect the z-loss's (router_z_loss_coef > 0)
  std::map<int64_t, Layer> layers;
  double grad = 0;    // d loss / d aux, left by aux_loss's backward for the layers' balance()
  double z_grad = 0;  // d loss / d z, left by z_loss's backward for the layers' logits
  // Data, context and Ulysses parallelism (and tensor parallelism's sequence parallelism): reduce
  // sums every layer's rows, counts and probability sums over the ranks that hold the parts of
  // one micro-step's batch (run by aux_loss before the value), so that aux is the whole batch's
  // as one process sees it; each rank's share of the gradient is then multiplied by grad_scale
  // (the ranks whose gradients are averaged), which their mean divides again.
  std::function<void(RouterLoss&)> reduce;
  double grad_scale = 1;
  // set once aux_loss has taken its value: activation checkpointing's recompute then leaves the
  // statistics as they are (the whole batch's, after reduce)
  bool sealed = false;
  // reduce (once) and seal: aux_loss and z_loss call it before their values
  void seal();
  // aux = E / R^2 sum_e C_e S_e over the layers so far
  double value() const;
  // z = 1/L sum_l z_sum_l / R_l over the layers so far (= sum_l z_sum_l / R: z_value)
  double z_value() const;
  int64_t rows() const;  // R, every layer's rows
  // d aux / d p[n,e] = E C_e / R^2, for every row (E)
  std::vector<double> row_gradient() const;

  // Pipeline parallelism: a stage holds some of the layers, so the statistics travel with the
  // activations. totals(): (2E + 4) the rows, counts (E), probability sums (E) and z_sum of
  // every layer so far, grad and z_grad. Forward: a stage carry()s what the stages before it recorded
  // (kept as one more layer, key kCarried), and its totals go on to the next. Backward: the
  // last stage's totals (the whole model's, reduced), d loss / d aux and d loss / d z come
  // back through every stage, which take_totals() before its layers' backward needs them.
  static constexpr int64_t kCarried = -1;
  std::vector<double> totals() const;
  void carry(const std::vector<double>& t);
  void take_totals(const std::vector<double>& t);
};

// The load-balancing loss of stats: a scalar of anchor's dtype and device. anchor, the model's
// last hidden state (B, T, C), only ties the op into the graph after every layer (it gets no
// gradient); backward leaves d loss / d aux in stats.grad.
Tensor aux_loss(const Tensor& anchor, const std::shared_ptr<RouterLoss>& stats);
// The router z-loss of stats, as aux_loss: backward leaves d loss / d z in stats.z_grad.
Tensor z_loss(const Tensor& anchor, const std::shared_ptr<RouterLoss>& stats);

// The SwiGLU experts of one MoE layer, stacked: gate_proj, up_proj (E, C, I), down_proj (E, I, C)
// (each expert's matrices in the (in, out) layout of nn::Linear). Expert parallelism keeps a
// slice of them along dim 0 (E / ep experts; E stays the layer's count of experts).
class Experts : public Module {
 public:
  Experts(int64_t E, int64_t C, int64_t I, float std, float proj_std);
  // x (M, C) rows sorted by expert, counts (E) rows each -> (M, C): expert e's SwiGLU on its rows
  Tensor forward(const Tensor& x, const std::vector<int64_t>& counts) const;
  // the same with given matrices: gate, up (G, C, I), down (G, I, C) for G groups of rows
  static Tensor swiglu(const Tensor& x, const Tensor& gate, const Tensor& up, const Tensor& down,
                       const std::vector<int64_t>& counts);
  Tensor gate_proj, up_proj, down_proj;
  int64_t E, C, I;
};

struct MoeDims {
  int64_t C, experts, k, intermediate;
  bool normalize;      // norm_topk_prob
  int64_t shared = 0;  // the shared expert's hidden units (Qwen2-MoE; 0: none)
};

// Runs the experts on the routed tokens: xf (N, C), weights (N, k) in x's dtype, choices (N, k) i32
// -> (N, C). Unset: every expert here (MoeMLP::local_experts); expert parallelism
// (dist/expert_parallel/) installs one that sends each row to the rank that holds its expert.
using ExpertsFn = std::function<Tensor(const Experts& experts, const Tensor& xf, const Tensor& weights,
                                       const Tensor& choices)>;

// The MoE MLP: router ("gate", C -> E), top k, the experts; and Qwen2-MoE's gated shared expert.
class MoeMLP : public Module {
 public:
  MoeMLP(const MoeDims& d, float std, float proj_std);
  // x (B, T, C) -> (B, T, C). stats: this forward's RouterLoss (nullptr: no load-balancing loss);
  // layer: this block's index in the model, its key there.
  Tensor forward(const Tensor& x, const std::shared_ptr<RouterLoss>& stats, int64_t layer) const;
  // sorted by expert, through the experts, back to their tokens: the ExpertsFn of one process
  static Tensor local_experts(const Experts& experts, const Tensor& xf, const Tensor& weights,
                              const Tensor& choices);
  Linear gate;
  Experts experts;
  std::unique_ptr<SwiGLU> shared_expert;       // C -> shared -> C (nullptr: none)
  std::unique_ptr<Linear> shared_expert_gate;  // C -> 1, no bias (with shared_expert)
  int64_t k;
  bool normalize;
  ExpertsFn run_experts;  // unset: local_experts
};

// A Llama-family block whose MLP is a mixture of experts (Qwen3-MoE, Qwen2-MoE, Mixtral): x + attn(ln_1(x)),
// then + moe(ln_2(x)), the attention nn::LlamaBlock's.
class MoeBlock : public DecoderBlock {
 public:
  MoeBlock(const LlamaDims& d, const MoeDims& moe, int64_t layer, float std, float proj_std);
  Tensor forward(const Tensor& x, const Positions& pos) const override;
  AttendFn& attend() override { return attn.attend; }
  // Tensor parallelism splits the attention and the shared expert (as the llama MLP): the router,
  // the shared expert's gate and the routed experts are whole on every rank (expert parallelism,
  // not tensor parallelism, is how routed experts are split)
  TensorParallelPlan tensor_parallel_plan() override;
  // self_attn.{q,k,v,o}_proj, and Qwen2-MoE's mlp.shared_expert.{gate,up,down}_proj (the router
  // and the routed experts carry no LoRA adapters, as in PEFT, whose targets are nn.Linear
  // modules: transformers keeps experts and router as parameters; nor does the shared expert's
  // gate, C -> 1, which PEFT's all-linear would adapt)
  std::vector<LinearSite> linear_sites() override;
  RMSNorm ln_1;
  GroupedQueryAttention attn;
  RMSNorm ln_2;
  MoeMLP mlp;
  int64_t layer;
};

}  // namespace ndt::nn
