// The whole GPT in float64: the loss gradient with respect to every parameter against
// central finite differences, with activation checkpointing off and on.
#include <gtest/gtest.h>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "models/gpt.h"
#include "tensor/kernels.h"

using namespace ndt;

namespace {

models::GPTConfig tiny() {
  models::GPTConfig c;
  c.n_layer = 2;
  c.n_head = 3;
  c.n_embd = 12;
  c.vocab_size = 11;
  c.block_size = 7;
  c.vocab_multiple = 4;  // padded to 12: padded logits must not matter
  return c;
}

Tensor ids(int64_t B, int64_t T, int64_t V, uint64_t stream) {
  Tensor u = Tensor::empty({B, T}, DType::f32);
  kernels::fill_uniform(u, 7, stream, 0, 0.0f, static_cast<float>(V));
  std::vector<int32_t> v;
  for (float x : u.to_vector<float>()) v.push_back(static_cast<int32_t>(x));
  return Tensor::from_vector(v, {B, T});
}

void check_gpt(bool ckpt) {
  models::GPT gpt(tiny());
  if (ckpt) gpt.add_unit_wrapper(nn::activation_checkpointing());
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
  EXPECT_LT(r.max_rel_err, 1e-5);
  std::cout << "checked " << r.checked << " parameters, max abs err " << r.max_abs_err << ", max rel err "
            << r.max_rel_err << "\n";
}

}  // namespace

TEST(GradcheckGPT, EveryParameter) { check_gpt(false); }
TEST(GradcheckGPT, EveryParameterWithActivationCheckpointing) { check_gpt(true); }

TEST(GradcheckGPT, PaddedVocabRowsGetNoGradient) {
  models::GPT gpt(tiny());
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 42);
  backward(gpt.forward(ids(2, 5, 11, 1), ids(2, 5, 11, 2)).loss);
  std::vector<double> g = gpt.wte.weight.grad().narrow(0, 11, 1).to_vector<double>();
  for (double v : g) EXPECT_EQ(v, 0.0);
  std::vector<double> w = gpt.wte.weight.narrow(0, 11, 1).to_vector<double>();
  for (double v : w) EXPECT_EQ(v, 0.0);  // padded rows start at zero
}

TEST(GPTUnits, WrappersLeaveLossAndGradientsBitIdentical) {
  // The seam the trainer uses (activation checkpointing, FSDP) must not change a number:
  // no wrapper, a pass-through wrapper, and checkpointing give the same bits.
  auto run = [](int mode) {
    models::GPTConfig c = tiny();
    models::GPT gpt(c);
    if (mode == 1) gpt.add_unit_wrapper([](int64_t, const nn::UnitFn& fn, const Tensor& x) { return fn(x); });
    if (mode == 2) gpt.add_unit_wrapper(nn::activation_checkpointing());
    nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f32, 42);
    Tensor loss = gpt.forward(ids(2, 5, 11, 1), ids(2, 5, 11, 2)).loss;
    backward(loss);
    std::vector<float> out = {static_cast<float>(loss.item())};
    for (const nn::FlatUnit& u : params.units)
      for (float g : u.grad.to_vector<float>()) out.push_back(g);
    return out;
  };
  const std::vector<float> plain = run(0);
  EXPECT_EQ(run(1), plain);
  EXPECT_EQ(run(2), plain);
}

TEST(GPTUnits, PositionOffsetShiftsThePositionEmbeddings) {
  // tokens at positions 2..4 see the same causal context as at 0..2 but other wpe rows:
  // the loss differs, and offset 0 is the default
  models::GPT gpt(tiny());
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 42);
  const Tensor x = ids(2, 3, 11, 1), y = ids(2, 3, 11, 2);
  const double l0 = gpt.forward(x, y).loss.item(), l0b = gpt.forward(x, y, 0).loss.item();
  const double l2 = gpt.forward(x, y, 2).loss.item();
  EXPECT_EQ(l0, l0b);
  EXPECT_NE(l0, l2);
  EXPECT_THROW(gpt.forward(x, y, 5), Error);  // 5 + 3 > block_size 7
}
