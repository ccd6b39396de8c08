// ndtrain: a GPT's description, GPTConfig, and the table of its fields.
//
// Every field is listed once, in visit_fields: its name (the config key model.<name> and
// the key in a sharded checkpoint's "model"), what it means, which family uses it and
// the range a config or a checkpoint may give it. The config's [model] keys and their
// --help (train/config.cpp), their agreement with a Hugging Face folder's config.json, and the
// checkpoint's model JSON (train/checkpoint/sharded.cpp) all walk the table, so a new field
// is one line here (and its meaning in the model's code).
//
//   models::visit_fields([](const models::Field& f, auto& value) {   // one config
//     std::cout << "model." << f.name << " = " << value << "\n";
//   }, cfg);
//   models::visit_fields([](const models::Field& f, auto& ours, const auto& theirs) {...},
//                        mine, theirs);                               // two side by side
#pragma once

#include <cstdint>
#include <string>

#include "models/rope.h"

namespace ndt::models {

struct Family;  // models/family.h: what an architecture adds

struct GPTConfig {
  std::string arch = "gpt2";  // a model family (models/families.h): gpt2 or llama (Qwen2, Qwen3 and
                              // Mistral are llama with options)
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t vocab_size = 50257;
  int64_t block_size = 1024;   // maximum sequence length (positions)
  int64_t vocab_multiple = 1;  // pad the vocab to a multiple of this (e.g. 128); 1 = none
  double norm_eps = 1e-5;      // LayerNorm's (gpt2) or RMSNorm's (llama) epsilon
  // llama only:
  int64_t n_kv_head = 0;          // key/value heads, dividing n_head (0: n_head; 1: multi-query)
  int64_t intermediate_size = 0;  // the SwiGLU MLP's hidden units I
  bool attention_bias = false;    // biases on q, k and v (Qwen2)
  bool tie_embeddings = false;    // lm_head is wte (gpt2 always ties)
  RopeConfig rope;                // rotary embeddings: theta and Llama 3's scaling
  int64_t head_size = 0;          // model.head_dim: channels per head HS (0: n_embd / n_head; Qwen3's differ)
  bool qk_norm = false;           // an RMSNorm over each head's HS channels of q and of k (Qwen3)
  // mixture of experts (Qwen3-MoE, Mixtral; nn/moe.h): the MLP of the MoE layers is a router
  // over n_experts SwiGLU experts of moe_intermediate_size, each token through its top
  // n_experts_per_tok of them; the other layers keep the dense SwiGLU of intermediate_size
  int64_t n_experts = 0;              // 0: no MoE layers
  int64_t n_experts_per_tok = 0;      // k
  int64_t moe_intermediate_size = 0;  // each expert's hidden units
  bool norm_topk_prob = false;        // the k weights divided by their sum (Mixtral always)
  int64_t moe_every = 1;              // layers i with (i + 1) % moe_every == 0 are MoE (decoder_sparse_step)
  std::string dense_layers;           // "0,5": layers that stay dense (mlp_only_layers)
  int64_t shared_expert_intermediate_size = 0;  // Qwen2-MoE's gated shared expert's hidden units (0: none)
  double router_aux_loss_coef = 0;  // the load-balancing loss's weight in the training loss (0: none)
  double router_z_loss_coef = 0;  // the router z-loss's weight in the training loss (0: none; ndtrain's own)

  const Family& family() const;  // of arch; throws ndt::Error for an unknown one
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // HS: model.head_dim, or n_embd / n_head when it is 0 (gpt2 always); q has NH HS channels
  int64_t head_dim() const { return head_size > 0 ? head_size : n_embd / n_head; }
  bool tied() const;           // logits through wte (gpt2 always; llama with tie_embeddings)
  int64_t mlp_hidden() const;  // the MLP's hidden units: 4C (gpt2) or intermediate_size
  bool moe() const { return n_experts > 0; }
  // Whether layer i's MLP is a mixture of experts: n_experts > 0, (i + 1) % moe_every == 0 and
  // i not in dense_layers (throws ndt::Error for a malformed dense_layers)
  bool moe_layer(int64_t i) const;
  int64_t moe_layers() const;  // how many
  int64_t padded_vocab() const { return (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple; }
  void validate() const;  // throws ndt::Error naming the bad key
  std::string str() const;
};

// One row of the table: what visit_fields tells the visitor beside the value.
struct Field {
  const char* name;       // model.<name>; the checkpoint's model.<name>
  const char* help;       // for --help
  const char* family;     // the one model.arch whose field it is (the others keep its default); nullptr: all
  double lo, hi;          // the range a config or a checkpoint may give a number (a bool or text: unused)
  bool hf = true;         // a Hugging Face config.json gives it (vocab_multiple is ndtrain's own padding)
  bool optional = false;  // checkpoints write it only when not the default (older ones lack it)
  bool of(const GPTConfig& c) const { return !family || c.arch == family; }  // c's model has it
};

// Throws ndt::Error naming the first whole-number field outside its range in the table
// ("model.n_layer = 2147483648 is outside [1, 1024]"): train_gpt's config and a model folder
// read by any program are held to the same ranges, before anything is built from them.
void check_field_ranges(const GPTConfig& c);

// Calls visit(field, c.<member>...) for every field of each config in cs, in the table's order.
template <class Visit, class... C>
void visit_fields(Visit&& visit, C&... cs) {
  constexpr double kMaxI = 1 << 20;
  visit(Field{"n_layer", "transformer blocks", nullptr, 1, 1024}, cs.n_layer...);
  visit(Field{"n_head", "attention heads (must divide n_embd)", nullptr, 1, 1024}, cs.n_head...);
  visit(Field{"n_embd", "channels C", nullptr, 1, 65536}, cs.n_embd...);
  visit(Field{"vocab_size", "vocabulary size V (every token in the data must be < V; 50257 for GPT-2)",
              nullptr, 1, 1 << 24},  // Llama 3: 128256
        cs.vocab_size...);
  visit(Field{"block_size", "maximum sequence length (positions)", nullptr, 1, kMaxI}, cs.block_size...);
  visit(Field{"vocab_multiple",
              "pad the vocabulary to a multiple of this (e.g. 128) for speed; padded logits never affect the "
              "loss",
              nullptr, 1, 65536, /*hf=*/false},
        cs.vocab_multiple...);
  visit(Field{"arch",
              "gpt2 or llama (Llama 3, Qwen2, Mistral: RMSNorm, grouped-query attention with rotary "
              "embeddings, SwiGLU)",
              nullptr, 0, 0, true, /*optional=*/true},
        cs.arch...);
  visit(Field{"norm_eps", "epsilon of the LayerNorms (gpt2) or RMSNorms (llama)", nullptr, 0, 1, true,
              /*optional=*/true},
        cs.norm_eps...);
  visit(Field{"n_kv_head", "llama: key/value heads, dividing n_head (0: n_head; 1: multi-query attention)",
              "llama", 0, 1024},
        cs.n_kv_head...);
  visit(Field{"intermediate_size", "llama: the SwiGLU MLP's hidden units", "llama", 0, kMaxI},
        cs.intermediate_size...);
  visit(Field{"attention_bias", "llama: biases on q, k and v (Qwen2)", "llama", 0, 0}, cs.attention_bias...);
  visit(Field{"tie_embeddings", "llama: the logits through wte instead of an own lm_head", "llama", 0, 0},
        cs.tie_embeddings...);
  visit(Field{"rope_theta", "llama: the rotary embeddings' base (Llama 3: 500000)", "llama", 1, 1e12},
        cs.rope.theta...);
  visit(Field{"head_dim", "llama: channels per attention head (0: n_embd / n_head; Qwen3-0.6B: 128)", "llama",
              0, 65536, true, /*optional=*/true},
        cs.head_size...);
  visit(Field{"qk_norm", "llama: RMSNorms over each head of q and k before the rotary embeddings (Qwen3)",
              "llama", 0, 0, true, /*optional=*/true},
        cs.qk_norm...);
  visit(Field{"n_experts", "llama: routed experts of every MoE layer (0: dense MLPs; Qwen3-MoE, Mixtral)",
              "llama", 0, 1 << 16, true, /*optional=*/true},
        cs.n_experts...);
  visit(Field{"n_experts_per_tok", "llama: experts each token goes through (top k of the router)", "llama", 0,
              1 << 16, true, /*optional=*/true},
        cs.n_experts_per_tok...);
  visit(Field{"moe_intermediate_size", "llama: each expert's SwiGLU hidden units", "llama", 0, kMaxI, true,
              /*optional=*/true},
        cs.moe_intermediate_size...);
  visit(Field{"norm_topk_prob", "llama: the k routing weights divided by their sum (Mixtral: always)",
              "llama", 0, 0, true, /*optional=*/true},
        cs.norm_topk_prob...);
  visit(Field{"moe_every", "llama: every moe_every-th layer is MoE (decoder_sparse_step)", "llama", 1, 1024,
              true,
              /*optional=*/true},
        cs.moe_every...);
  visit(Field{"dense_layers", "llama: layers that keep a dense MLP, \"0,5\" (mlp_only_layers)", "llama", 0, 0,
              true, /*optional=*/true},
        cs.dense_layers...);
  visit(
      Field{"shared_expert_intermediate_size",
            "llama: hidden units of the MoE layers' shared expert, a SwiGLU every token goes through, gated "
            "by sigmoid(x Wg) (Qwen2-MoE; 0: none)",
            "llama", 0, kMaxI, true, /*optional=*/true},
      cs.shared_expert_intermediate_size...);
  visit(Field{"router_aux_loss_coef",
              "llama: weight of the routers' load-balancing loss in the training loss (0: none)", "llama", 0,
              1e3, true, /*optional=*/true},
        cs.router_aux_loss_coef...);
  visit(
      Field{
          "router_z_loss_coef",
          "llama: weight of the router z-loss (ST-MoE: the mean squared log-sum-exp of the router's logits, "
          "averaged over the MoE layers) in the training loss (0: none; not in Hugging Face folders)",
          "llama", 0, 1e3, /*hf=*/false, /*optional=*/true},
      cs.router_z_loss_coef...);
}

}  // namespace ndt::models
