// GPT-2 (Radford et al. 2019, as in llm.c): learned positions, pre-LN blocks of LayerNorm,
// multi-head attention and a GELU MLP of 4C with biases everywhere (nn::Block), a final
// LayerNorm and the logits through the token embeddings. It has no fields of its own.
#include "models/family.h"

namespace ndt::models {
namespace {

int64_t mlp_hidden(const GPTConfig& c) { return 4 * c.n_embd; }

// c_attn C x 3C, c_proj C x C, c_fc C x 4C, the MLP's c_proj 4C x C
double linear_weights(const GPTConfig& c) {
  const double C = static_cast<double>(c.n_embd);
  return 12.0 * C * C;
}

// ... and their biases (3C, C, 4C, C) and the two LayerNorms' (4C)
double block_params(const GPTConfig& c) { return linear_weights(c) + 13.0 * static_cast<double>(c.n_embd); }

bool qkv_bias(const GPTConfig&) { return true; }

void validate(const GPTConfig& c) {
  NDT_CHECK(
      c.rope.theta == RopeConfig{}.theta && !c.rope.llama3,
      "model.rope_theta and model.rope_scaling are for model.arch = llama; GPT-2 learns its positions (wpe)");
}

void describe(const GPTConfig&, Family::Part, std::ostream&) {}

std::unique_ptr<nn::DecoderBlock> make_block(const GPTConfig& c, int64_t /*layer*/, float std,
                                             float proj_std) {
  return std::make_unique<nn::Block>(c.n_embd, c.n_head, std, proj_std, c.norm_eps);
}

std::unique_ptr<nn::Norm> make_norm(const GPTConfig& c) {
  return std::make_unique<nn::LayerNorm>(c.n_embd, c.norm_eps);
}

}  // namespace

extern const Family kFamily_gpt2 = {
    .arch = "gpt2",
    .title = "GPT",
    .learned_positions = true,
    .always_tied = true,
    .mlp_hidden = mlp_hidden,
    .mlp_hidden_key = "4 x model.n_embd",
    .linear_weights = linear_weights,
    .block_params = block_params,
    .qkv_bias = qkv_bias,
    .validate = validate,
    .describe = describe,
    .make_block = make_block,
    .make_norm = make_norm,
};

}  // namespace ndt::models
