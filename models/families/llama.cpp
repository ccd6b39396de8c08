// The Llama family (Llama 3, Qwen2, Qwen3, Mistral): rotary positions (with Llama 3's
// scaling), pre-norm blocks of RMSNorm, grouped-query attention and a SwiGLU MLP of
// intermediate_size, no biases but Qwen2's on q, k and v (nn::LlamaBlock), a final RMSNorm,
// and lm_head (its own weight unless tie_embeddings). Its fields: n_kv_head,
// intermediate_size, attention_bias, tie_embeddings, rope_theta (and the rope scaling,
// models/rope.h), head_dim and qk_norm.
//
// Qwen3 is this family with options (model.head_dim, model.qk_norm), as Qwen2 is with
// attention_bias, not a family of its own: its block is Llama's with two RMSNorms inside the
// attention, and it shares every other field, the Hugging Face tensor names and the planner's
// description of the block; a family of its own would repeat all of them.
#include "models/family.h"
#include "nn/moe.h"

namespace ndt::models {
namespace {

int64_t mlp_hidden(const GPTConfig& c) { return c.intermediate_size; }

// c_attn C x (q + 2 kv) (q = NH HS, kv = n_kv_head HS: grouped-query attention), c_proj
// q x C, gate, up and down C x I (q = C unless model.head_dim says otherwise); an MoE layer's
// router C x E and the k experts a token goes through, 3 C I_moe each, and the shared expert's
// 3 C I_shared and its gate's C (averaged over the layers)
double linear_weights(const GPTConfig& c) {
  const double C = static_cast<double>(c.n_embd), HS = static_cast<double>(c.head_dim());
  const double q = static_cast<double>(c.n_head) * HS, kv = static_cast<double>(c.kv_heads()) * HS;
  const double dense = 3 * C * static_cast<double>(c.intermediate_size);
  const double moe = C * static_cast<double>(c.n_experts) +
                     3 * C * static_cast<double>(c.moe_intermediate_size * c.n_experts_per_tok) +
                     (c.shared_expert_intermediate_size > 0
                          ? 3 * C * static_cast<double>(c.shared_expert_intermediate_size) + C
                          : 0.0);
  const double moe_share = static_cast<double>(c.moe_layers()) / static_cast<double>(c.n_layer);
  return C * (q + 2 * kv) + q * C + (1 - moe_share) * dense + moe_share * moe;
}

// ... and the two RMSNorms' weights (2C), and q_norm's and k_norm's (2 HS)
double block_params(const GPTConfig& c) {
  return linear_weights(c) + 2.0 * static_cast<double>(c.n_embd) +
         (c.qk_norm ? 2.0 * static_cast<double>(c.head_dim()) : 0.0);
}

bool qkv_bias(const GPTConfig& c) { return c.attention_bias; }

// The mixture-of-experts fields: all at their defaults without experts
void validate_moe(const GPTConfig& c) {
  if (!c.moe()) {
    NDT_CHECK(c.n_experts_per_tok == 0 && c.moe_intermediate_size == 0 && !c.norm_topk_prob &&
                  c.moe_every == 1 && c.dense_layers.empty() && c.router_aux_loss_coef == 0 &&
                  c.router_z_loss_coef == 0,
              "model.n_experts_per_tok, moe_intermediate_size, norm_topk_prob, moe_every, dense_layers, "
              "router_aux_loss_coef and router_z_loss_coef are for mixture-of-experts models: set "
              "model.n_experts > 0 or leave them out");
    return;
  }
  NDT_CHECK(c.n_experts_per_tok >= 1 && c.n_experts_per_tok <= c.n_experts, "model.n_experts_per_tok (",
            c.n_experts_per_tok, ") must be 1..model.n_experts (", c.n_experts,
            "): the experts each token goes through");
  NDT_CHECK(c.moe_intermediate_size >= 1,
            "model.moe_intermediate_size (each expert's hidden units) must be >= 1 "
            "with model.n_experts = ",
            c.n_experts);
  c.moe_layer(0);  // throws naming a malformed model.dense_layers
}

void validate(const GPTConfig& c) {
  NDT_CHECK(c.n_kv_head >= 0 && c.n_head % c.kv_heads() == 0, "model.n_kv_head (", c.n_kv_head,
            ") must divide model.n_head (", c.n_head,
            "): each key/value head serves n_head / n_kv_head query heads");
  NDT_CHECK(
      c.intermediate_size >= 1,
      "model.intermediate_size (the SwiGLU MLP's hidden units) must be >= 1 for model.arch = llama, got ",
      c.intermediate_size);
  NDT_CHECK(c.head_dim() % 2 == 0, "rotary embeddings turn pairs of channels: the head size ",
            c.head_size > 0 ? "model.head_dim = " : "n_embd / n_head = ", c.head_dim(), " must be even");
  rope_inv_freq(c.head_dim(), c.rope);  // throws naming a bad theta or scaling
  validate_moe(c);
}

void describe(const GPTConfig& c, Family::Part part, std::ostream& os) {
  if (part == Family::after_heads) os << ", n_kv_head=" << c.kv_heads();
  if (part == Family::after_heads && c.head_size > 0) os << ", head_dim=" << c.head_size;
  if (part == Family::after_width) os << ", intermediate_size=" << c.intermediate_size;
  if (part != Family::at_end) return;
  os << ", rope_theta=" << c.rope.theta;
  if (c.rope.llama3) os << " (llama3 scaling x" << c.rope.llama3->factor << ")";
  if (c.attention_bias) os << ", qkv bias";
  if (c.qk_norm) os << ", q/k norms";
  if (c.moe())
    os << ", " << c.moe_layers() << " MoE layers of " << c.n_experts << " experts (top "
       << c.n_experts_per_tok << (c.norm_topk_prob ? ", renormalised" : "")
       << ", I=" << c.moe_intermediate_size
       << (c.shared_expert_intermediate_size > 0
               ? ", a shared expert of " + std::to_string(c.shared_expert_intermediate_size)
               : std::string())
       << ")";
  os << (c.tie_embeddings ? ", tied" : ", untied") << " head";
}

// nn::LlamaBlock, or nn::MoeBlock where layer's MLP is a mixture of experts
std::unique_ptr<nn::DecoderBlock> make_block(const GPTConfig& c, int64_t layer, float std, float proj_std) {
  const nn::LlamaDims d{c.n_embd,         c.n_head,   c.kv_heads(), c.intermediate_size,
                        c.attention_bias, c.norm_eps, c.head_dim(), c.qk_norm};
  if (!c.moe_layer(layer)) return std::make_unique<nn::LlamaBlock>(d, std, proj_std);
  const nn::MoeDims moe{c.n_embd,
                        c.n_experts,
                        c.n_experts_per_tok,
                        c.moe_intermediate_size,
                        c.norm_topk_prob,
                        c.shared_expert_intermediate_size};
  return std::make_unique<nn::MoeBlock>(d, moe, layer, std, proj_std);
}

std::unique_ptr<nn::Norm> make_norm(const GPTConfig& c) {
  return std::make_unique<nn::RMSNorm>(c.n_embd, c.norm_eps);
}

}  // namespace

extern const Family kFamily_llama = {
    .arch = "llama",
    .title = "Llama",
    .learned_positions = false,
    .always_tied = false,
    .mlp_hidden = mlp_hidden,
    .mlp_hidden_key = "model.intermediate_size",
    .linear_weights = linear_weights,
    .block_params = block_params,
    .qkv_bias = qkv_bias,
    .validate = validate,
    .describe = describe,
    .make_block = make_block,
    .make_norm = make_norm,
};

}  // namespace ndt::models
