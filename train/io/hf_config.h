// ndtrain: a Hugging Face model folder's config.json, read and written as transformers reads
// and writes it, strictly: a missing required key, a key of the wrong JSON type, an unknown
// model_type and every option ndtrain would otherwise ignore (a sliding window in use, rope
// types other than default and llama3, MoE keys, quantization_config, a head_dim other than
// hidden_size / num_attention_heads where the model_type has no such key, ...) is one ndt::Error naming the
// key and the file. Keys transformers gives a sensible default keep it (rope_theta 10000,
// tie_word_embeddings, attention_bias, hidden_act silu, ...).
//
// The keys every config.json has are read here; each model_type's own (their names, their
// defaults, the options refused) are its model family's (train/families/<arch>.cpp,
// FamilyTools::read_config, check_config and write_config), through HfKeys.
//
//   io::HfConfig c = io::read_hf_config("Llama-3.2-1B/config.json");   // c.hidden_size, c.rope_theta
//   io::write_file_atomic("out/config.json", io::to_json(c));         // parse_hf_config(to_json(c)) == c
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>
#include "tensor/error.h"

namespace ndt::io {

// What ndtrain needs from config.json. GPT-2's keys land under the Llama names: n_embd ->
// hidden_size, n_layer -> num_hidden_layers, n_head -> num_attention_heads, n_positions (n_ctx
// in old files) -> max_position_embeddings, n_inner (null: 4 * n_embd) -> intermediate_size,
// layer_norm_epsilon -> norm_eps, activation_function -> hidden_act.
struct HfConfig {
  std::string
      model_type;  // "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral" or "gpt2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // null: num_attention_heads; absent: that too for llama, refused
                                    // for mistral/qwen2 (transformers: 8, 32); gpt2: num_attention_heads
  int64_t head_dim = 0;             // hidden_size / num_attention_heads unless given (llama, mistral, qwen3)
  int64_t max_position_embeddings = 0;
  double norm_eps = 0;               // rms_norm_eps (required); gpt2: layer_norm_epsilon (default 1e-5)
  std::string hidden_act;            // "silu"; gpt2: "gelu_new" or "gelu_pytorch_tanh" (the same tanh GELU)
  bool tie_word_embeddings = false;  // transformers' defaults: false for llama/mistral/qwen2, true for gpt2
  // Biases on q, k and v: llama's attention_bias (default false; it puts one on o_proj too),
  // always on qwen2 (but none on o_proj), never on mistral, always on gpt2 (c_attn, c_proj).
  bool attention_bias = false;
  bool mlp_bias = false;  // false for the llama family (true is refused), true for gpt2
  bool o_proj_bias() const { return attention_bias && model_type != "qwen2" && model_type != "qwen2_moe"; }

  // Rotary embeddings (llama family; gpt2 leaves these at their defaults). From rope_theta and
  // rope_scaling (transformers 4) or rope_parameters (transformers 5): the same fields either way.
  double rope_theta = 10000;
  bool llama3_scaling = false;  // rope_type "llama3"; the four below are set only then
  double factor = 0, low_freq_factor = 0, high_freq_factor = 0;
  int64_t original_max_position_embeddings = 0;

  // Mixture of experts (qwen3_moe, qwen2_moe, mixtral; none for the others).
  int64_t num_experts = 0;            // qwen3_moe: num_experts; mixtral: num_local_experts
  int64_t num_experts_per_tok = 0;    // k
  int64_t moe_intermediate_size = 0;  // mixtral: its intermediate_size (it has no dense MLPs)
  bool norm_topk_prob = false;        // mixtral: always
  int64_t decoder_sparse_step = 1;    // qwen3_moe
  std::vector<int64_t> mlp_only_layers;
  int64_t shared_expert_intermediate_size = 0;  // qwen2_moe's shared expert (required there; 0: none)
  // router_aux_loss_coef when output_router_logits is true, else 0: transformers adds the
  // load-balancing loss to the loss only then
  double router_aux_loss_coef = 0;

  // Informational, kept when read and written back.
  std::string torch_dtype;  // torch_dtype (or transformers 5's dtype): "bfloat16", ...; "" if absent
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_id;    // one id or several (Llama 3 instruct); empty if absent
  std::optional<int64_t> pad_token_id;  // kept only when an integer >= 0 (else as if absent)

  bool operator==(const HfConfig&) const = default;
};

// `text` is a config.json's contents; `where` names it in messages ("DIR/config.json").
HfConfig parse_hf_config(const std::string& text, const std::string& where);
HfConfig read_hf_config(const std::string& path);
// A config.json that transformers (4.x and 5.x) loads for c.model_type: architectures,
// model_type, the keys above under that model's names, rope_theta and rope_scaling (the form
// both versions read), torch_dtype and dtype. parse_hf_config(to_json(c), ...) == c. Throws ndt::Error
// for a config that parse_hf_config would refuse (head_dim, biases, rope fields on gpt2, ...).
std::string to_json(const HfConfig& c);

// A config.json's sizes under a model_type's names, for check_sizes' messages.
struct HfSizeKeys {
  const char *hidden, *intermediate, *layers, *heads, *positions, *norm_eps;
  const char* head_dim = nullptr;  // nullptr: the model_type has no head_dim of its own
};
// The checks every HfConfig passes (sizes positive, heads dividing, head_dim hidden / heads
// or, where the model_type has the key, positive; norm_eps positive), named as the
// model_type names its keys.
void check_sizes(const HfConfig& c, const std::string& where, const HfSizeKeys& names);
// Rotary embeddings from rope_theta and rope_scaling (transformers 4) or rope_parameters
// (transformers 5): the default and llama3 types, anything else refused by name.
struct HfKeys;
void parse_rope(const HfKeys& top, HfConfig& c);
// A rotary config's fields checked (theta positive; llama3's four set together, and sane).
void check_rope(const HfConfig& c, const std::string& where);

// ---- reading JSON with messages naming the key and the file

// A JSON value for a message, cut short.
inline std::string show(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// The keys of one JSON object; `prefix` names a nested object in messages ("rope_scaling.").
// A key whose value is null counts as absent, as transformers treats it.
struct HfKeys {
  const nlohmann::json& j;
  const std::string& where;
  std::string prefix;

  const nlohmann::json* find(const std::string& k) const {
    auto it = j.find(k);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& k) const { return find(k) != nullptr; }
  [[noreturn]] void wrong(const std::string& k, const char* want, const nlohmann::json& v) const {
    NDT_FAIL(where, ": key '", prefix, k, "' must be ", want, ", got ", show(v));
  }
  const nlohmann::json& need(const std::string& k) const {
    const nlohmann::json* v = find(k);
    NDT_CHECK(v, where, ": required key '", prefix, k, "' is missing", j.contains(k) ? " (it is null)" : "");
    return *v;
  }
  int64_t integer(const nlohmann::json& v, const std::string& k) const {
    if (!v.is_number_integer()) wrong(k, "an integer", v);
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      wrong(k, "an integer", v);
    return v.get<int64_t>();
  }
  int64_t req_int(const std::string& k) const { return integer(need(k), k); }
  int64_t positive(const std::string& k) const {
    const int64_t v = req_int(k);
    NDT_CHECK(v > 0, where, ": key '", prefix, k, "' must be positive, got ", v);
    return v;
  }
  std::optional<int64_t> opt_int(const std::string& k) const {
    const nlohmann::json* v = find(k);
    return v ? std::optional<int64_t>(integer(*v, k)) : std::nullopt;
  }
  double number(const nlohmann::json& v, const std::string& k) const {
    if (!v.is_number()) wrong(k, "a number", v);
    return v.get<double>();
  }
  double req_num(const std::string& k) const { return number(need(k), k); }
  std::optional<double> opt_num(const std::string& k) const {
    const nlohmann::json* v = find(k);
    return v ? std::optional<double>(number(*v, k)) : std::nullopt;
  }
  bool opt_bool(const std::string& k, bool def) const {
    const nlohmann::json* v = find(k);
    if (!v) return def;
    if (!v->is_boolean()) wrong(k, "true or false", *v);
    return v->get<bool>();
  }
  std::optional<std::string> opt_str(const std::string& k) const {
    const nlohmann::json* v = find(k);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong(k, "a string", *v);
    return v->get<std::string>();
  }
};

// A JSON object from text; a key given twice in one object (which would keep only one of
// them silently) is refused.
nlohmann::json parse_json_object(const std::string& text, const std::string& where);
// A regular file's bytes; `what` names it in messages ("config file").
std::string read_text(const std::string& path, const std::string& what);

}  // namespace ndt::io
