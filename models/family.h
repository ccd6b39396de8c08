// ndtrain: a model family (model.arch), described in one place.
//
// What the model needs to know of an architecture beyond the fields every GPT has: which block
// it stacks, its final norm, whether its positions are learned (wpe) or rotary, whether its head
// is always the embeddings, its MLP's width, the rules between its own fields, and how it is
// named in a description. Each family is one file, models/families/<arch>.cpp, defining a
// `Family`; models/families.h lists them, once, for this table and for what the training tools
// know of each family (train/families/<arch>.cpp: Hugging Face names and the planner's costs).
// A family's own config fields are rows of the field table in models/gpt_config.h
// (`Field::family`).
//
//   const models::Family& f = models::family("llama");     // or cfg.family()
//   auto block = f.make_block(cfg, 0, 0.02f, proj_std);     // the model's first block
//   int64_t I = f.mlp_hidden(cfg);
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "models/gpt_config.h"
#include "nn/layers.h"

namespace ndt::models {

struct Family {
  const char* arch;   // model.arch
  const char* title;  // how GPTConfig::str names the model ("GPT", "Llama")
  // learned positions (wpe, added at the embeddings) or rotary tables handed to every block
  bool learned_positions;
  // the logits always through wte (GPT-2); otherwise only with tie_embeddings
  bool always_tied;
  // the MLP's hidden units, and the key that sets them (for messages)
  int64_t (*mlp_hidden)(const GPTConfig& c);
  const char* mlp_hidden_key;
  // The weights of one block's matrix products (2 FLOPs each per token, forward): the
  // pipeline's balance of the stages and the planner's work; and all of one block's
  // parameters for the model's FLOPs per token (GPT::flops_per_token). Mixture of experts:
  // those a token goes through (the router and its k experts), averaged over the layers.
  double (*linear_weights)(const GPTConfig& c);
  double (*block_params)(const GPTConfig& c);
  bool (*qkv_bias)(const GPTConfig& c);  // whether c_attn has a bias
  // The rules between its own fields (the shared ones, and every other family's fields at
  // their defaults, are GPTConfig::validate's); throws ndt::Error naming the key.
  void (*validate)(const GPTConfig& c);
  // Its own fields for GPTConfig::str, each part where it goes: ", n_kv_head=2" after the heads.
  enum Part { after_heads, after_width, at_end };
  void (*describe)(const GPTConfig& c, Part part, std::ostream& os);
  // Block `layer` (its index in the model), initialised N(0, std) with residual projections
  // N(0, proj_std).
  std::unique_ptr<nn::DecoderBlock> (*make_block)(const GPTConfig& c, int64_t layer, float std,
                                                  float proj_std);
  std::unique_ptr<nn::Norm> (*make_norm)(const GPTConfig& c);  // ln_f
};

// The family of model.arch `arch`; throws ndt::Error naming the known ones.
const Family& family(const std::string& arch);
const Family* find_family(const std::string& arch);  // nullptr for an unknown one
// Every family, in models/families.h's order.
std::vector<const Family*> families();
// "gpt2 or llama": for messages and --help.
std::string family_names();

}  // namespace ndt::models
