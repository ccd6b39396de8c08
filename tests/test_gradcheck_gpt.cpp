// The whole GPT in float64: the loss gradient with respect to every parameter against
// central finite differences, with activation checkpointing off, full and selective; and
// in float32, every checkpointing mode gives the same bits and keeps less memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "models/gpt.h"
#include "nn/moe.h"
#include "tensor/kernels.h"
#include "tensor/storage.h"

using namespace ndt;

namespace {

// Small enough for central differences on every parameter: 2 blocks, C 12, 3 heads, 7
// positions; a vocabulary of 11 padded to 12 rows (padded logits must not matter).
models::GPTConfig gradcheck_gpt() {
  return {.n_layer = 2, .n_head = 3, .n_embd = 12, .vocab_size = 11, .block_size = 7, .vocab_multiple = 4};
}

Tensor ids(int64_t B, int64_t T, int64_t V, uint64_t stream) {
  Tensor u = Tensor::empty({B, T}, DType::f32);
  kernels::fill_uniform(u, 7, stream, 0, 0.0f, static_cast<float>(V));
  std::vector<int32_t> v;
  for (float x : u.to_vector<float>()) v.push_back(static_cast<int32_t>(x));
  return Tensor::from_vector(v, {B, T});
}

// The Llama family at the same scale: 4 query heads of size 4 sharing 2 key/value heads,
// rotary embeddings with Llama 3's scaling (its original context short enough that the
// scaling moves some of the frequencies), SwiGLU of 20 hidden units, an untied head, and
// (Qwen2) biases on q, k and v.
models::GPTConfig gradcheck_llama(int64_t n_kv_head, bool qkv_bias) {
  models::GPTConfig c{.arch = "llama",
                      .n_layer = 2,
                      .n_head = 4,
                      .n_embd = 16,
                      .vocab_size = 11,
                      .block_size = 7,
                      .vocab_multiple = 4};
  c.n_kv_head = n_kv_head;
  c.intermediate_size = 20;
  c.attention_bias = qkv_bias;
  c.rope = {.theta = 100, .llama3 = models::Llama3Scaling{4, 1, 2, 4}};
  return c;
}

// tol: the largest relative error of a parameter's gradient against its central difference
void check_gpt(nn::ACMode ac, const models::GPTConfig& cfg = gradcheck_gpt(), double tol = 1e-5) {
  models::GPT gpt(cfg);
  if (ac != nn::ACMode::none) gpt.add_block_wrapper(nn::activation_checkpointing(ac, 1));
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 42);
  // The GPT-2 init puts many parameters at exactly 0 or 1 (biases, LayerNorm): perturb
  // every buffer so every parameter's gradient is generic.
  for (size_t i = 0; i < params.units.size(); ++i) {
    Tensor noise = Tensor::empty(params.units[i].data.shape(), DType::f64);
    kernels::fill_normal(noise, 3, i, 0, 0.0f, 0.1f);
    kernels::add_(params.units[i].data, noise);
  }
  const Tensor x = ids(2, 5, 11, 1), y = ids(2, 5, 11, 2);
  std::vector<Tensor> inputs;
  for (const nn::FlatUnit& u : params.units)
    for (const nn::FlatParam& p : u.params) inputs.push_back(p.value);
  auto fn = [&](const std::vector<Tensor>&) { return std::vector<Tensor>{gpt.forward(x, y).loss}; };
  autograd::GradcheckResult r = autograd::gradcheck(fn, inputs);
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_GT(r.checked, 3000);
  EXPECT_LT(r.max_rel_err, tol);
  std::cout << "checked " << r.checked << " parameters, max abs err " << r.max_abs_err << ", max rel err "
            << r.max_rel_err << "\n";
}

}  // namespace

TEST(GradcheckGPT, EveryParameter) { check_gpt(nn::ACMode::none); }
TEST(GradcheckGPT, EveryParameterWithActivationCheckpointing) { check_gpt(nn::ACMode::full); }
TEST(GradcheckGPT, EveryParameterWithSelectiveCheckpointing) { check_gpt(nn::ACMode::selective); }
TEST(GradcheckGPT, LlamaEveryParameter) { check_gpt(nn::ACMode::none, gradcheck_llama(4, false)); }
TEST(GradcheckGPT, LlamaGroupedQueryAttentionWithQkvBias) {
  check_gpt(nn::ACMode::none, gradcheck_llama(2, true));
}
TEST(GradcheckGPT, LlamaMultiQueryAttentionCheckpointed) {
  check_gpt(nn::ACMode::full, gradcheck_llama(1, false));
}
TEST(GradcheckGPT, LlamaSelectiveCheckpointing) {
  check_gpt(nn::ACMode::selective, gradcheck_llama(2, false));
}

// Qwen3: q_norm and k_norm over heads of 6 channels (4 heads x 6 = 24 query channels from a
// width of 16: the head size is not n_embd / n_head), 2 key/value heads, a tied head; the
// norms' weights perturbed off 1 with the rest. Plain, and with the core (and the norms in
// it) recomputed in backward.
models::GPTConfig gradcheck_qwen3() {
  models::GPTConfig c = gradcheck_llama(2, false);
  c.head_size = 6;
  c.qk_norm = true;
  c.tie_embeddings = true;
  c.rope = {.theta = 1e4};
  return c;
}
TEST(GradcheckGPT, Qwen3QkNormsAndAHeadSizeOfItsOwn) { check_gpt(nn::ACMode::none, gradcheck_qwen3()); }
TEST(GradcheckGPT, Qwen3SelectiveCheckpointing) { check_gpt(nn::ACMode::selective, gradcheck_qwen3()); }

TEST(GradcheckGPT, PaddedVocabRowsGetNoGradient) {
  models::GPT gpt(gradcheck_gpt());
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 42);
  backward(gpt.forward(ids(2, 5, 11, 1), ids(2, 5, 11, 2)).loss);
  std::vector<double> g = gpt.wte.weight.grad().narrow(0, 11, 1).to_vector<double>();
  for (double v : g) EXPECT_EQ(v, 0.0);
  std::vector<double> w = gpt.wte.weight.narrow(0, 11, 1).to_vector<double>();
  for (double v : w) EXPECT_EQ(v, 0.0);  // padded rows start at zero
}

// The loss and then every gradient of gpt (a gradcheck_gpt(), its wrappers added), f32:
// its parameters drawn with seed 42, one forward and backward on a seeded (2, 5) batch.
std::vector<float> loss_and_grads(models::GPT& gpt) {
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f32, 42);
  Tensor loss = gpt.forward(ids(2, 5, 11, 1), ids(2, 5, 11, 2)).loss;
  backward(loss);
  std::vector<float> out = {static_cast<float>(loss.item())};
  for (const nn::FlatUnit& u : params.units)
    for (float g : u.grad.to_vector<float>()) out.push_back(g);
  return out;
}

// A mixture of experts (Qwen3-MoE's block): layer 0 dense, layers 1 and 2 routers over 4 SwiGLU
// experts of 8 hidden units, each token through its top 2 (renormalised or not), and the
// load-balancing loss over both MoE layers in the loss (its gradient reaches the routers through
// every layer's probabilities, nn/moe.h). Plain, and with whole blocks recomputed in backward
// (the routers' statistics recorded again).
models::GPTConfig gradcheck_moe(bool normalize) {
  models::GPTConfig c = gradcheck_qwen3();
  c.n_layer = 3;
  c.n_experts = 4;
  c.n_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.norm_topk_prob = normalize;
  c.dense_layers = "0";
  c.router_aux_loss_coef = 0.3;
  return c;
}
TEST(GradcheckGPT, MixtureOfExpertsWithTheLoadBalancingLoss) {
  check_gpt(nn::ACMode::none, gradcheck_moe(false));
}
TEST(GradcheckGPT, MixtureOfExpertsRenormalisedAndCheckpointed) {
  check_gpt(nn::ACMode::full, gradcheck_moe(true));
}

// The router z-loss (nn/moe.h) at a weight large enough that its gradient in the routers, 2 lse p
// per token and layer, is far above the check's tolerance (without it the check fails): alone, and
// beside the load-balancing loss with whole blocks recomputed in backward.
models::GPTConfig gradcheck_moe_z(bool balance) {
  models::GPTConfig c = gradcheck_moe(false);
  c.router_aux_loss_coef = balance ? 0.3 : 0.0;
  c.router_z_loss_coef = 0.5;
  return c;
}
TEST(GradcheckGPT, MixtureOfExpertsWithTheRouterZLoss) {
  check_gpt(nn::ACMode::none, gradcheck_moe_z(false));
}
TEST(GradcheckGPT, MixtureOfExpertsWithBothRouterLossesCheckpointed) {
  // the z-loss's squared logsumexp curves more than the other terms: the central differences'
  // own error reaches 1e-5 relative on the smallest gradients (a dropped z-loss gradient is 2.0)
  check_gpt(nn::ACMode::full, gradcheck_moe_z(true), 2e-5);
}

// Qwen2-MoE: q, k, v biases, the routed experts (layers 1 and 2) beside a shared expert of 6
// hidden units gated per token by sigmoid(x Wg): every gradient of it and of its gate; plain, and
// with the load-balancing and z losses and whole blocks recomputed in backward.
models::GPTConfig gradcheck_qwen2_moe(bool losses) {
  models::GPTConfig c = gradcheck_llama(2, true);
  c.rope = {.theta = 1e4};
  c.n_layer = 3;
  c.n_experts = 4;
  c.n_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.dense_layers = "0";
  c.shared_expert_intermediate_size = 6;
  c.router_aux_loss_coef = losses ? 0.3 : 0.0;
  c.router_z_loss_coef = losses ? 0.5 : 0.0;
  return c;
}
TEST(GradcheckGPT, Qwen2MoeWithASharedExpert) { check_gpt(nn::ACMode::none, gradcheck_qwen2_moe(false)); }
TEST(GradcheckGPT, Qwen2MoeWithASharedExpertBothRouterLossesCheckpointed) {
  check_gpt(nn::ACMode::full, gradcheck_qwen2_moe(true));
}

// LoRA reaches the shared expert's linears (nn.Linear modules, which PEFT's targets name), never
// the router or the routed experts, nor the shared expert's gate (C -> 1: no rank above 1 fits).
TEST(GPTLora, Qwen2MoeSharedExpertLinearsTakeAdapters) {
  models::GPT gpt(gradcheck_qwen2_moe(false));
  gpt.add_lora({.rank = 2, .targets = {"all-linear"}});
  std::vector<std::string> names;
  for (const nn::UnitSpec& u : gpt.adapter_units())
    for (const auto& p : u.params) names.push_back(p.name);
  for (const char* site : {"h.1.mlp.shared_expert.gate_proj.lora_A", "h.2.mlp.shared_expert.down_proj.lora_B",
                           "h.0.mlp.gate_proj.lora_A"})
    EXPECT_NE(std::find(names.begin(), names.end(), site), names.end()) << site;
  for (const std::string& n : names) EXPECT_EQ(n.find("experts."), std::string::npos) << n;
  EXPECT_EQ(std::find(names.begin(), names.end(), "h.1.mlp.gate.lora_A"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "h.1.mlp.shared_expert_gate.lora_A"), names.end());
}

// z = 1/L sum_l 1/N_l sum_n lse(logits_l[n])^2, over two MoE layers of different token counts,
// against the routers' logits computed here; no load-balancing statistics without its weight.
TEST(MoeRouterZLoss, IsTheLayersMeanOfTheTokensSquaredLogSumExp) {
  const int64_t C = 6, E = 4;
  nn::MoeMLP mlp({.C = C, .experts = E, .k = 2, .intermediate = 5, .normalize = false}, 0.5f, 0.5f);
  nn::FlatParams params = nn::materialize({{"mlp", mlp.parameters("mlp")}}, Device::cpu(), DType::f64, 3);
  auto stats = std::make_shared<nn::RouterLoss>(E);
  stats->balance = false;
  stats->z = true;
  // two layers of one forward route the same tokens: N = 3 each
  const Tensor x0 = Tensor::empty({1, 3, C}, DType::f64), x1 = Tensor::empty({3, 1, C}, DType::f64);
  kernels::fill_normal(x0, 5, 0, 0, 0.0f, 1.0f);
  kernels::fill_normal(x1, 5, 1, 0, 0.0f, 1.0f);
  mlp.forward(x0, stats, 0);
  mlp.forward(x1, stats, 2);
  double want = 0;
  for (const Tensor& x : {x0, x1}) {
    const int64_t N = x.size(0) * x.size(1);
    const std::vector<double> logits = mlp.gate.forward(x.view({N, C})).to_vector<double>();
    double sum = 0;
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += std::exp(logits[n * E + e]);
      sum += std::log(s) * std::log(s);
    }
    want += sum / static_cast<double>(N) / 2.0;  // the token mean, averaged over the 2 layers
  }
  EXPECT_NEAR(nn::z_loss(x0, stats).item(), want, 1e-12 * want);
  EXPECT_TRUE(stats->layers.at(0).counts.empty() && stats->layers.at(2).counts.empty());
}

// The training loss is the cross-entropy + router_z_loss_coef x z; evaluation's the cross-entropy.
TEST(MoeRouterZLoss, IsAddedToTheTrainingLossOnly) {
  models::GPTConfig with = gradcheck_moe_z(false), without = with;
  without.router_z_loss_coef = 0;
  models::GPT a(with), b(without);
  nn::FlatParams pa = nn::materialize(a.units(), Device::cpu(), DType::f64, 42);
  nn::FlatParams pb = nn::materialize(b.units(), Device::cpu(), DType::f64, 42);
  const Tensor x = ids(2, 5, 11, 1), y = ids(2, 5, 11, 2);
  const models::GPTOutput oa = a.forward(x, y), ob = b.forward(x, y);
  ASSERT_TRUE(oa.z_loss.defined());
  EXPECT_FALSE(ob.z_loss.defined());
  EXPECT_GT(oa.z_loss.item(), 1.0);  // lse of 4 near-uniform logits is about log 4
  EXPECT_NEAR(oa.loss.item(), ob.loss.item() + 0.5 * oa.z_loss.item(), 1e-12);
  EXPECT_NEAR(a.take_z_loss(), oa.z_loss.item(), 1e-15);
  EXPECT_EQ(a.take_z_loss(), -1);  // taken
  a.training = false;
  EXPECT_NEAR(a.forward(x, y).loss.item(), ob.loss.item(), 1e-12);
}

TEST(GPTUnits, WrappersLeaveLossAndGradientsBitIdentical) {
  // The seam the trainer uses (activation checkpointing, FSDP) must not change a number:
  // no wrapper, a pass-through wrapper, and checkpointing give the same bits.
  auto run = [](int mode) {
    models::GPT gpt(gradcheck_gpt());
    if (mode == 1)
      gpt.add_block_wrapper([](int64_t, const nn::BlockFn& fn, const Tensor& x) { return fn(x); });
    if (mode == 2) gpt.add_block_wrapper(nn::activation_checkpointing());
    return loss_and_grads(gpt);
  };
  const std::vector<float> plain = run(0);
  EXPECT_EQ(run(1), plain);
  EXPECT_EQ(run(2), plain);
}

// loss_and_grads with train.activation_checkpointing = `ac` on blocks 0, every, 2*every, ...
std::vector<float> loss_and_grads(nn::ACMode ac, int64_t every) {
  models::GPT gpt(gradcheck_gpt());
  if (ac != nn::ACMode::none) gpt.add_block_wrapper(nn::activation_checkpointing(ac, every));
  return loss_and_grads(gpt);
}

TEST(GPTUnits, EveryCheckpointingModeGivesBitIdenticalGradients) {
  const std::vector<float> none = loss_and_grads(nn::ACMode::none, 1);
  ASSERT_GT(none.size(), 1000u);
  for (nn::ACMode ac : {nn::ACMode::none, nn::ACMode::full, nn::ACMode::selective})
    for (int64_t every : {1, 2}) {
      const std::vector<float> got = loss_and_grads(ac, every);
      ASSERT_EQ(got.size(), none.size());
      // bit for bit: memcmp, not ==, so -0 against +0 would count as a difference
      EXPECT_EQ(std::memcmp(got.data(), none.data(), none.size() * sizeof(float)), 0)
          << "mode " << static_cast<int>(ac) << " every " << every;
    }
}

TEST(GPTUnits, CheckpointingKeepsLessActivationMemory) {
  // Bytes the forward leaves allocated for backward (in use after it minus before), and the
  // allocator's peak during it, on a GPT where the attention probabilities (B*NH, T, T)
  // of the composed attention are a large part of a block's activations.
  models::GPTConfig c;
  c.n_layer = 4, c.n_head = 4, c.n_embd = 32, c.vocab_size = 64, c.block_size = 32;
  const Tensor x = ids(4, 32, 64, 1), y = ids(4, 32, 64, 2);
  struct Bytes {
    int64_t held, peak;
  };
  // the composed attention (NDT_SDPA=0), which keeps p; the CPU's fused kernel keeps none
  auto measure = [&](nn::ACMode ac, int64_t every, bool fused = false) {
    if (!fused) setenv("NDT_SDPA", "0", 1);
    struct Unset {
      ~Unset() { unsetenv("NDT_SDPA"); }
    } unset;
    models::GPT gpt(c);
    if (ac != nn::ACMode::none) gpt.add_block_wrapper(nn::activation_checkpointing(ac, every));
    nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f32, 42);
    backward(gpt.forward(x, y).loss);  // gradient buffers allocated before measuring
    const int64_t before = memory_stats(Device::cpu()).in_use;
    reset_peak_memory(Device::cpu());
    Tensor loss = gpt.forward(x, y).loss;
    const MemoryStats after = memory_stats(Device::cpu());
    backward(loss);
    return Bytes{after.in_use - before, after.peak - before};
  };
  const Bytes none = measure(nn::ACMode::none, 1), full = measure(nn::ACMode::full, 1),
              sel = measure(nn::ACMode::selective, 1), full2 = measure(nn::ACMode::full, 2),
              sel2 = measure(nn::ACMode::selective, 2);
  std::cout << "held after forward / peak during forward, bytes: none " << none.held << " / " << none.peak
            << ", selective " << sel.held << " / " << sel.peak << ", full " << full.held << " / " << full.peak
            << "; every 2: selective " << sel2.held << " / " << sel2.peak << ", full " << full2.held << " / "
            << full2.peak << "\n";
  // the probabilities of one block: B * NH * T * T floats
  const int64_t probs = 4 * 4 * 32 * 32 * 4;
  EXPECT_LT(full.held, sel.held);
  EXPECT_LT(sel.held + c.n_layer * probs, none.held);  // selective drops at least p in every block
  EXPECT_LT(full.peak, sel.peak);
  EXPECT_LT(sel.peak, none.peak);
  // every 2nd block: between every block and none
  EXPECT_LT(full.held, full2.held);
  EXPECT_LT(full2.held, none.held);
  EXPECT_LT(sel.held, sel2.held);
  EXPECT_LT(sel2.held, none.held);
  // the fused CPU attention keeps no probabilities at all, so less than selective does
  const Bytes fused = measure(nn::ACMode::none, 1, true);
  std::cout << "fused attention, none: " << fused.held << " / " << fused.peak << "\n";
  EXPECT_LT(fused.held + c.n_layer * probs, none.held);
  EXPECT_LT(fused.peak, none.peak);
}

TEST(GPTUnits, PositionOffsetShiftsThePositionEmbeddings) {
  // tokens at positions 2..4 see the same causal context as at 0..2 but other wpe rows:
  // the loss differs, and offset 0 is the default
  models::GPT gpt(gradcheck_gpt());
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 42);
  const Tensor x = ids(2, 3, 11, 1), y = ids(2, 3, 11, 2);
  const double l0 = gpt.forward(x, y).loss.item(), l0b = gpt.forward(x, y, 0).loss.item();
  const double l2 = gpt.forward(x, y, 2).loss.item();
  EXPECT_EQ(l0, l0b);
  EXPECT_NE(l0, l2);
  EXPECT_THROW(gpt.forward(x, y, 5), Error);  // 5 + 3 > block_size 7
}
