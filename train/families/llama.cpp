// What the training tools know of the Llama family (train/families/family_tools.h): its
// Hugging Face folders (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM;
// the names and layouts train/checkpoint/hf.h lists), and its block (nn::LlamaBlock: RMSNorms,
// grouped-query attention with rotary q and k, a SwiGLU MLP, no biases but q, k and v's under
// model.attention_bias, Qwen3's q_norm and k_norm under model.qk_norm; and its mixture-of-experts
// block, nn::MoeBlock, whose MLP the same description covers when Shapes::moe is set) for the
// planner: train/planner/block_kinds.h. Legend:
// train/planner/shapes.h (here Q = Cl + 2 KVl and H = intermediate_size / tp); bytes: a per
// activation (the compute dtype's), 4 per statistic (kF).
#include <algorithm>

#include "train/families/family_tools.h"
#include "train/planner/block_kinds.h"

namespace ndt::train {
namespace {

// ---- Hugging Face folders

// Sliding-window attention, which ndtrain does not have, refused where it would apply.
void refuse_sliding_window(const io::HfKeys& k, const io::HfConfig& c) {
  if (c.model_type == "mistral") {
    // MistralConfig's sliding_window is 4096 when the key is absent; null turns it off
    const bool absent = !k.j.contains("sliding_window");
    int64_t window = 4096;
    if (!absent) window = k.has("sliding_window") ? k.integer(k.j["sliding_window"], "sliding_window") : 0;
    NDT_CHECK(window == 0 || window >= c.max_position_embeddings, k.where, ": sliding_window ", window,
              absent ? " (transformers' default for mistral when the key is absent)" : "",
              " is smaller than max_position_embeddings ", c.max_position_embeddings,
              ": sliding-window attention is not supported (null turns it off)");
  }
  if (c.model_type == "qwen2" || c.model_type == "qwen3_moe" || c.model_type == "qwen2_moe")
    NDT_CHECK(!k.opt_bool("use_sliding_window", false), k.where,
              ": use_sliding_window true: sliding-window attention is not supported");
  if (c.model_type == "mixtral") {  // MixtralConfig's sliding_window: null (none) unless given
    const int64_t window = k.has("sliding_window") ? k.integer(k.j["sliding_window"], "sliding_window") : 0;
    NDT_CHECK(window == 0 || window >= c.max_position_embeddings, k.where, ": sliding_window ", window,
              " is smaller than max_position_embeddings ", c.max_position_embeddings,
              ": sliding-window attention is not supported (null turns it off)");
  }
  if (c.model_type == "qwen3" && k.opt_bool("use_sliding_window", false)) {
    // Qwen3Config: with use_sliding_window and a sliding_window (default 4096), the layers
    // from max_window_layers (default 28) on slide; sliding off, both keys are ignored
    const bool window = !k.j.contains("sliding_window") || k.has("sliding_window");
    const int64_t from = k.opt_int("max_window_layers").value_or(28);
    NDT_CHECK(!window || from >= c.num_hidden_layers, k.where, ": use_sliding_window true makes layers ",
              from, " to ", c.num_hidden_layers - 1,
              " (max_window_layers on) sliding-window attention, which is not supported");
  }
}

// The mixture of experts: Qwen3MoeConfig's, Qwen2MoeConfig's and MixtralConfig's names and defaults
void read_experts(const io::HfKeys& k, io::HfConfig& c) {
  const bool mixtral = c.model_type == "mixtral";
  // qwen3_moe: num_experts on the Hub, num_local_experts as transformers 5 saves it (its alias)
  const bool both = k.has("num_experts") && k.has("num_local_experts");
  NDT_CHECK(mixtral || !both || k.req_int("num_experts") == k.req_int("num_local_experts"), k.where,
            ": num_experts and num_local_experts differ; they name the same count, keep one");
  c.num_experts = k.positive(mixtral || !k.has("num_experts") ? "num_local_experts" : "num_experts");
  c.num_experts_per_tok = k.positive("num_experts_per_tok");
  c.moe_intermediate_size = mixtral ? c.intermediate_size : k.positive("moe_intermediate_size");
  c.norm_topk_prob = mixtral || k.opt_bool("norm_topk_prob", false);
  // qwen2_moe: transformers would take 5632 for an absent key whatever the sizes: refused rather than guessed
  if (c.model_type == "qwen2_moe")
    c.shared_expert_intermediate_size = k.positive("shared_expert_intermediate_size");
  if (!mixtral) {
    c.decoder_sparse_step = k.opt_int("decoder_sparse_step").value_or(1);
    if (k.has("mlp_only_layers"))
      for (const nlohmann::json& v : k.j["mlp_only_layers"])
        c.mlp_only_layers.push_back(k.integer(v, "mlp_only_layers"));
  }
  if (k.opt_bool("output_router_logits", false))
    c.router_aux_loss_coef = k.opt_num("router_aux_loss_coef").value_or(0.001);
  if (mixtral)
    NDT_CHECK(k.opt_num("router_jitter_noise").value_or(0.0) == 0.0, k.where, ": router_jitter_noise ",
              k.opt_num("router_jitter_noise").value_or(0.0),
              " is not supported (ndtrain's router has no noise; set it to 0)");
}

// config.json: LlamaConfig's, MistralConfig's and Qwen2Config's names and defaults
void read_config(const io::HfKeys& k, io::HfConfig& c) {
  c.vocab_size = k.positive("vocab_size");
  c.hidden_size = k.positive("hidden_size");
  c.intermediate_size = k.positive("intermediate_size");
  c.num_hidden_layers = k.positive("num_hidden_layers");
  c.num_attention_heads = k.positive("num_attention_heads");
  // absent or null: num_attention_heads for llama. MistralConfig and Qwen2Config default an
  // absent key to 8 and 32 whatever the heads: refused rather than guessed.
  NDT_CHECK(c.model_type == "llama" || k.j.contains("num_key_value_heads"), k.where,
            ": required key 'num_key_value_heads' is missing (transformers would take ",
            c.model_type == "mistral" || c.model_type == "mixtral" ? 8
            : c.model_type == "qwen3_moe"                          ? 4
            : c.model_type == "qwen2_moe"                          ? 16
                                                                   : 32,
            " for ", c.model_type, ", not num_attention_heads; give it)");
  c.num_key_value_heads = k.opt_int("num_key_value_heads").value_or(c.num_attention_heads);
  c.max_position_embeddings = k.positive("max_position_embeddings");
  c.norm_eps = k.req_num("rms_norm_eps");
  c.hidden_act = k.opt_str("hidden_act").value_or("silu");
  c.tie_word_embeddings = k.opt_bool("tie_word_embeddings", false);
  c.mlp_bias = k.opt_bool("mlp_bias", false);
  // qwen2: q, k, v biases always (Qwen2Attention), whatever the key says; mistral: none;
  // qwen2_moe: its qkv_bias key (default true)
  c.attention_bias = c.model_type == "qwen2_moe" ? k.opt_bool("qkv_bias", true)
                                                 : k.opt_bool("attention_bias", c.model_type == "qwen2");
  // head_dim: absent or null, hidden_size / num_attention_heads; Qwen3Config's default is 128
  // whatever the sizes: refused rather than guessed
  NDT_CHECK(c.model_type != "qwen3" || k.has("head_dim"), k.where,
            ": required key 'head_dim' is missing (transformers would take 128 for qwen3; give it)");
  const std::optional<int64_t> head_dim = k.opt_int("head_dim");
  NDT_CHECK(head_dim || c.hidden_size % c.num_attention_heads == 0, k.where, ": hidden_size ", c.hidden_size,
            " is not a multiple of num_attention_heads ", c.num_attention_heads,
            " (and no head_dim is given)");
  c.head_dim = head_dim.value_or(c.hidden_size / c.num_attention_heads);
  io::parse_rope(k, c);
  refuse_sliding_window(k, c);
  if (c.model_type == "qwen3_moe" || c.model_type == "qwen2_moe" || c.model_type == "mixtral")
    read_experts(k, c);
}

void check_experts(const io::HfConfig& c, const std::string& where) {
  NDT_CHECK(c.num_experts_per_tok <= c.num_experts, where, ": num_experts_per_tok ", c.num_experts_per_tok,
            " is more than the ", c.num_experts, " experts");
  NDT_CHECK(c.decoder_sparse_step >= 1, where, ": decoder_sparse_step ", c.decoder_sparse_step,
            " must be >= 1");
  for (int64_t l : c.mlp_only_layers)
    NDT_CHECK(l >= 0 && l < c.num_hidden_layers, where, ": mlp_only_layers holds ", l, ", not a layer 0..",
              c.num_hidden_layers - 1);
  NDT_CHECK(c.model_type != "mixtral" ||
                (c.norm_topk_prob && c.decoder_sparse_step == 1 && c.mlp_only_layers.empty() &&
                 c.moe_intermediate_size == c.intermediate_size),
            where, ": a mixtral has experts in every layer, of intermediate_size, and renormalised weights");
  NDT_CHECK(c.router_aux_loss_coef >= 0, where, ": router_aux_loss_coef ", c.router_aux_loss_coef,
            " must be >= 0");
}

void check_config(const io::HfConfig& c, const std::string& where) {
  // head_dim: llama, mistral and qwen3 read it; Qwen2Config and Qwen2MoeConfig have no such key
  const bool qwen2 = c.model_type == "qwen2" || c.model_type == "qwen2_moe";
  io::check_sizes(c, where,
                  {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "max_position_embeddings", "rms_norm_eps", qwen2 ? nullptr : "head_dim"});
  NDT_CHECK(c.hidden_act == "silu", where, ": hidden_act '", c.hidden_act, "' is not supported; ndtrain's ",
            c.model_type, " uses silu");
  NDT_CHECK(!c.mlp_bias, where, ": mlp_bias true is not supported (", c.model_type, " MLPs have no biases)");
  NDT_CHECK(c.head_dim % 2 == 0, where, ": head_dim ", c.head_dim,
            " is odd; rotary embeddings turn pairs of channels");
  if (c.model_type == "qwen2")
    NDT_CHECK(c.attention_bias, where,
              ": attention_bias false contradicts qwen2, whose q, k and v projections always have biases in "
              "transformers");
  if (c.model_type == "mistral")
    NDT_CHECK(
        !c.attention_bias, where,
        ": attention_bias true is not supported for mistral (transformers' Mistral has no attention biases "
        "and ignores the key)");
  io::check_rope(c, where);
  if (c.num_experts > 0) check_experts(c, where);
}

void write_experts(const io::HfConfig& c, nlohmann::json& j) {
  if (c.model_type == "mixtral") {
    j["num_local_experts"] = c.num_experts;
    j["router_jitter_noise"] = 0.0;
  } else {
    j["num_experts"] = c.num_experts;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
  }
  if (c.model_type == "qwen2_moe") j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  // transformers adds the load-balancing loss only with output_router_logits
  j["output_router_logits"] = c.router_aux_loss_coef > 0;
  j["router_aux_loss_coef"] = c.router_aux_loss_coef > 0 ? c.router_aux_loss_coef : 0.001;
}

void write_config(const io::HfConfig& c, nlohmann::json& j) {
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.norm_eps;
  j["hidden_act"] = c.hidden_act;
  j["rope_theta"] = c.rope_theta;
  if (c.llama3_scaling)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.factor},
                         {"low_freq_factor", c.low_freq_factor},
                         {"high_freq_factor", c.high_freq_factor},
                         {"original_max_position_embeddings", c.original_max_position_embeddings}};
  // each model's own keys only (qwen2's q, k, v biases and mistral's none are implied)
  if (c.model_type != "qwen2" && c.model_type != "qwen2_moe") j["head_dim"] = c.head_dim;
  if (c.model_type == "qwen2_moe") j["qkv_bias"] = c.attention_bias;
  if (c.model_type == "llama") {
    j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = false;
  }
  if (c.model_type == "qwen2" || c.model_type == "qwen3" || c.model_type == "qwen3_moe" ||
      c.model_type == "qwen2_moe")
    j["use_sliding_window"] = false;
  if (c.model_type == "qwen3" || c.model_type == "qwen3_moe") j["attention_bias"] = false;
  if (c.model_type == "mistral" || c.model_type == "mixtral") j["sliding_window"] = nullptr;  // mistral: 4096
  if (c.num_experts > 0) write_experts(c, j);
}

void from_hf(const io::HfConfig& hf, models::GPTConfig& c) {
  NDT_CHECK(!hf.o_proj_bias(), "a ", hf.model_type,
            " with attention_bias = true has a bias on o_proj too, which ndtrain's llama blocks do not have "
            "(Qwen2's biases on q, k and v only are supported)");
  c.n_kv_head = hf.num_key_value_heads;
  // model.head_dim only where it is not hidden / heads (0 means that)
  const bool own_head_dim =
      hf.hidden_size % hf.num_attention_heads != 0 || hf.head_dim != hf.hidden_size / hf.num_attention_heads;
  c.head_size = own_head_dim ? hf.head_dim : 0;
  c.qk_norm = hf.model_type == "qwen3" || hf.model_type == "qwen3_moe";  // Qwen3Attention's q_norm and k_norm
  c.n_experts = hf.num_experts;
  if (hf.num_experts > 0) {
    c.n_experts_per_tok = hf.num_experts_per_tok;
    c.moe_intermediate_size = hf.moe_intermediate_size;
    c.norm_topk_prob = hf.norm_topk_prob;
    c.moe_every = hf.decoder_sparse_step;
    for (size_t i = 0; i < hf.mlp_only_layers.size(); ++i)
      c.dense_layers += (i ? "," : "") + std::to_string(hf.mlp_only_layers[i]);
    c.router_aux_loss_coef = hf.router_aux_loss_coef;
    c.shared_expert_intermediate_size = hf.shared_expert_intermediate_size;
  }
  c.intermediate_size = hf.intermediate_size;
  c.attention_bias = hf.attention_bias;
  c.tie_embeddings = hf.tie_word_embeddings;
  c.rope.theta = hf.rope_theta;
  if (hf.llama3_scaling)
    c.rope.llama3 = models::Llama3Scaling{hf.factor, hf.low_freq_factor, hf.high_freq_factor,
                                          hf.original_max_position_embeddings};
}

// Qwen3-MoE (q/k norms), Qwen2-MoE (a shared expert) or Mixtral (experts everywhere, renormalised,
// neither). model.router_z_loss_coef is a training option of ndtrain's that no folder has: ignored.
const char* moe_model_type(const models::GPTConfig& c) {
  if (c.qk_norm) {
    NDT_CHECK(c.shared_expert_intermediate_size == 0,
              "a qwen3_moe has no shared expert (model.shared_expert_intermediate_size = 0; without "
              "model.qk_norm a model with one is exported as a qwen2_moe)");
    NDT_CHECK(!c.attention_bias, "a qwen3_moe has no q, k, v biases (model.attention_bias = false)");
    return "qwen3_moe";
  }
  if (c.shared_expert_intermediate_size > 0) return "qwen2_moe";
  NDT_CHECK(
      c.norm_topk_prob && c.moe_layers() == c.n_layer && !c.attention_bias,
      "a mixture-of-experts llama without model.qk_norm or a shared expert is a Mixtral, which has "
      "experts in every layer (model.moe_every = 1, no model.dense_layers), model.norm_topk_prob = true "
      "and no q, k, v biases; this one has no Hugging Face model_type (a qwen2_moe needs "
      "model.shared_expert_intermediate_size)");
  return "mixtral";
}

void experts_to_hf(const models::GPTConfig& c, io::HfConfig& hf) {
  hf.num_experts = c.n_experts;
  hf.num_experts_per_tok = c.n_experts_per_tok;
  hf.moe_intermediate_size = c.moe_intermediate_size;
  if (hf.model_type == "mixtral") hf.intermediate_size = c.moe_intermediate_size;  // its experts' size
  hf.norm_topk_prob = c.norm_topk_prob;
  hf.decoder_sparse_step = c.moe_every;
  for (int64_t i = 0; i < c.n_layer; ++i)
    if (!c.moe_layer(i) && (i + 1) % c.moe_every == 0) hf.mlp_only_layers.push_back(i);
  hf.shared_expert_intermediate_size = c.shared_expert_intermediate_size;
  hf.router_aux_loss_coef = c.router_aux_loss_coef;
}

void to_hf(const models::GPTConfig& c, io::HfConfig& hf) {
  NDT_CHECK(!(c.qk_norm && c.attention_bias),
            "a llama model with both model.qk_norm and model.attention_bias has no Hugging Face model_type "
            "(qwen3's attention_bias puts a bias on o_proj too); export one without q, k, v biases");
  hf.model_type = c.moe() ? moe_model_type(c) : c.qk_norm ? "qwen3" : c.attention_bias ? "qwen2" : "llama";
  if (c.moe()) experts_to_hf(c, hf);
  hf.hidden_act = "silu";
  hf.tie_word_embeddings = c.tie_embeddings;
  hf.attention_bias = c.attention_bias;
  hf.rope_theta = c.rope.theta;
  if (c.rope.llama3) {
    hf.llama3_scaling = true;
    hf.factor = c.rope.llama3->factor;
    hf.low_freq_factor = c.rope.llama3->low_freq_factor;
    hf.high_freq_factor = c.rope.llama3->high_freq_factor;
    hf.original_max_position_embeddings = c.rope.llama3->original_max_position;
  }
}

// An MoE layer's router and experts: Qwen3-MoE's (and Qwen2-MoE's) mlp.gate,
// mlp.experts.<e>.{gate,up,down}_proj, Qwen2-MoE's mlp.shared_expert.{gate,up,down}_proj and
// mlp.shared_expert_gate (C -> 1);
// Mixtral's block_sparse_moe.gate, block_sparse_moe.experts.<e>.{w1,w3,w2} (as transformers 5
// saves them: one (out, in) matrix per expert, which our (E, in, out) stacks transposed)
void experts_sources(const models::GPTConfig& c, const std::string& ours, const std::string& hf,
                     std::map<std::string, HfSource>& s) {
  const bool mixtral = !c.qk_norm && c.shared_expert_intermediate_size == 0;
  const std::string m = hf + (mixtral ? "block_sparse_moe." : "mlp.");
  if (c.shared_expert_intermediate_size > 0) {
    for (const char* p : {"gate_proj", "up_proj", "down_proj"})
      s[ours + "mlp.shared_expert." + p + ".weight"] = {HfSource::transposed,
                                                        {m + "shared_expert." + p + ".weight"}};
    s[ours + "mlp.shared_expert_gate.weight"] = {HfSource::transposed, {m + "shared_expert_gate.weight"}};
  }
  s[ours + "mlp.gate.weight"] = {HfSource::transposed, {m + "gate.weight"}};
  const char* names[3][2] = {{"gate_proj", "w1"}, {"up_proj", "w3"}, {"down_proj", "w2"}};
  for (const auto& [our, theirs] : names) {
    HfSource& src = s[ours + "mlp.experts." + our] = {HfSource::experts, {}};
    for (int64_t e = 0; e < c.n_experts; ++e)
      src.names.push_back(m + "experts." + std::to_string(e) + "." + (mixtral ? theirs : our) + ".weight");
  }
}

std::map<std::string, HfSource> sources(const models::GPTConfig& c) {
  std::map<std::string, HfSource> s;
  s["wte.weight"] = {HfSource::renamed, {"model.embed_tokens.weight"}};
  if (!c.tied()) s["lm_head.weight"] = {HfSource::renamed, {"lm_head.weight"}};
  s["ln_f.weight"] = {HfSource::renamed, {"model.norm.weight"}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string ours = "h." + std::to_string(i) + ".", hf = "model.layers." + std::to_string(i) + ".";
    s[ours + "ln_1.weight"] = {HfSource::renamed, {hf + "input_layernorm.weight"}};
    s[ours + "ln_2.weight"] = {HfSource::renamed, {hf + "post_attention_layernorm.weight"}};
    const std::string a = hf + "self_attn.";
    s[ours + "attn.c_attn.weight"] = {HfSource::packed_qkv,
                                      {a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"}};
    if (c.attention_bias)
      s[ours + "attn.c_attn.bias"] = {HfSource::packed_qkv,
                                      {a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"}};
    s[ours + "attn.c_proj.weight"] = {HfSource::transposed, {a + "o_proj.weight"}};
    if (c.qk_norm) {
      s[ours + "attn.q_norm.weight"] = {HfSource::renamed, {a + "q_norm.weight"}};
      s[ours + "attn.k_norm.weight"] = {HfSource::renamed, {a + "k_norm.weight"}};
    }
    if (c.moe_layer(i)) {
      experts_sources(c, ours, hf, s);
      continue;
    }
    for (const char* m : {"gate_proj", "up_proj", "down_proj"})
      s[ours + "mlp." + m + ".weight"] = {HfSource::transposed, {hf + "mlp." + m + ".weight"}};
  }
  return s;
}

// ---- the planner

// The CPU's fused kernel of attention() on the rotated q, k, v: those (N Q, as they came),
// its output o in f32 (N Cl: in f32 the output itself, which heads_to_back copies for
// c_proj) and lse (N NHl).
Count fused_core_saved(const Shapes& s) {
  const Count N = s.N, Cl = s.Cl, Q = s.Q, NHl = s.NHl, a = s.act_bytes, w = kF;
  return N * Q * a + N * Cl * w + N * NHl * kF;
}

// nn::LlamaBlock::forward (llama) with the same ops, per mode:
//   none       ln_1: rstd (N; RMSNorm has no mean); c_attn keeps its input ln_1(x) (N C);
//              c_attn's output qkv (N Q) dies: split_last copies q, k and v out of it,
//              rotary turns q and k into new tensors keeping only the angle tables (cos
//              and sin, B Tl hd, counted with the positions: one pair for every block) and
//              heads_to_front copies them for the core; the core (core_saved) and c_proj's input
//              (N Cl, heads_to_back's copy of the core's output); h = x + attn (N C, kept by
//              ln_2) and ln_2's rstd (N); gate and up keep their one input, ln_2(h) (N C);
//              silu_mul keeps gate's and up's outputs (2 N H), down its product (N H); the
//              block's output (N C, kept by the next block).
//   selective  the same but the core (split, rotary, attention, heads_to_back) keeps only
//              its input qkv (N Q) and its output (N Cl, c_proj's input); in backward it runs
//              again beside them: its saved set, its output and its output's gradient
//              (2 N Cl).
//   full       the output only (N C), as gpt2.
// With model.qk_norm (Qwen3), q_norm and k_norm between split_last and rotary keep their
// inputs (N (Cl + KVl)) and rstd (N (NHl + KVl / hd)), counted with the core (qk_saved): kept
// (none, full's recompute) or made again in backward (selective).
// During backward, on top of the earlier blocks (the block's output released, its gradient
// N C arrived): the MLP's largest moment of down's backward (dm, N H; sequence parallel,
// the incoming gradient gathered, N C), silu_mul's (down's input released; dm, dgate and
// dup, 3 N H), up's and gate's (gate, up and down's input released; dgate, dup, an input
// gradient of N C, the gathered input; then the two input gradients and their sum); then
// the attention's: ln_1's output and rstd, the residual's gradient and the largest of
// c_proj's backward (its input and dy, 2 N Cl; the gathered incoming gradient), the
// core's (the core, its output's gradient N Cl, its backward) and after it the gradients
// of q, k and v on their way back through heads_to_front, rotary and split_last (2 N Q)
// and c_attn's (its output's gradient N Q, its input gradient N C, the gathered input).
// The SwiGLU MLP's backward on top of `saved` (the block's forward set, its output gone and
// its gradient come), as above.
Count dense_mlp_moment(const Shapes& s, Count saved) {
  const Count N = s.N, Ns = s.Ns, C = s.C, H = s.H, a = s.act_bytes;
  const Count sp = Ns == N ? Count(0) : N * C * a;  // a gathered incoming gradient or input
  const Count down = saved + N * H * a + sp, silu = saved + 2 * N * H * a;
  const Count released = saved - 3 * N * H * a;  // gate, up and their product
  const Count up_gate =
      released + std::max(2 * N * H * a + N * C * a + sp, N * H * a + N * C * a + Ns * C * a + sp);
  return std::max({down, silu, up_gate, released + 3 * Ns * C * a});
}

// nn::MoeMLP::forward's kept tensors after ln_2 (legend: shapes.h; i32 indices 4 bytes):
// the router's probabilities p (Nr E, f32: its softmax runs in f32 at least), kept by softmax
// and moe_topk, with the z-loss its logits too; moe_topk's choices (M i32); the weights
// moe_combine keeps (M, a); moe_sort's order and moe_combine's slots (2 M i32). One process
// (MoeMLP::local_experts): moe_dispatch's rows (M C), kept by gate's and up's grouped GEMMs,
// their outputs (2 M Ie) kept by silu_mul, its product (M Ie) kept by down, down's output
// (M C) kept by moe_combine. Expert parallelism (dist::expert_parallel_mlp): the dispatched
// rows die in the all-to-all; kept are the R rows received, permuted by expert (R C), gate's,
// up's and silu_mul's outputs on them (3 R Ie), the two permutations' orders (2 R i32), the
// rows combined back (M C). The shared expert (Hs):
// the llama MLP's on its N rows (3 N Hs), its output and the gate's sigmoid spread over C
// (2 N C) kept by their product, the gate's softmax of (g, 0) (N 2 f32) and its column (N a).
Count moe_mlp_saved(const Shapes& s) {
  const Count N = s.N, Nr = s.Nr(), M = s.M(), R = s.R(), C = s.C, E = s.E, Ie = s.Ie, a = s.act_bytes;
  const Count router = Nr * E * kF * (s.router_z ? 2 : 1) + M * 4 /*choices*/ + M * a + 2 * M * 4;
  Count experts = M * C * a + 3 * M * Ie * a + M * C * a;
  if (s.ep > 1) experts = R * C * a + 3 * R * Ie * a + 2 * R * 4 + M * C * a;
  const Count shared = s.Hs > 0 ? 3 * N * s.Hs * a + 2 * N * C * a + N * 2 * kF + N * a : Count(0);
  return router + experts + shared;
}

// Its backward on top of `saved`: moe_combine's backward (the rows' gradient M C in the place
// of the rows it kept, and the weights'), then down's (dh R Ie; its weight gradient El Ie C),
// silu_mul's (dgate, dup 2 R Ie beside dh, down's input released) and gate's and up's (two
// input gradients R C, a weight gradient); under ep the exchanges' gradients of the R rows
// (R C) beside them. The shared expert's backward runs before, as the llama MLP's.
Count moe_mlp_moment(const Shapes& s, Count saved) {
  const Count M = s.M(), R = s.R(), C = s.C, Ie = s.Ie, a = s.act_bytes;
  const Count w = Count(s.El()) * Ie * C * a;
  const Count rows = s.ep > 1 ? R * C * a : Count(0);                         // an exchange's gradient
  const Count down = saved - M * C * a + M * C * a + rows + R * Ie * a + w;   // dy in y's place
  const Count silu = saved - M * C * a - R * Ie * a + rows + 3 * R * Ie * a;  // h gone: dh, dgate, dup
  const Count released = saved - M * C * a - 3 * R * Ie * a;
  const Count gate_up = released + 2 * R * Ie * a + 2 * R * C * a + w;
  Count moment = std::max({down, silu, gate_up});
  if (s.Hs > 0) {
    Shapes dense = s;
    dense.H = s.Hs;
    moment = std::max(moment, dense_mlp_moment(dense, saved));
  }
  return moment;
}

BlockMem block_memory(const Shapes& s, nn::ACMode mode) {
  const Count N = s.N, Ns = s.Ns, C = s.C, Cl = s.Cl, Q = s.Q, H = s.H, a = s.act_bytes, stat = Ns * kF;
  const Count qk_saved = s.qk_norm ? N * (Cl + s.KVl) * a + N * (s.NHl + s.KVl / s.hd) * kF : Count(0);
  const Count core = core_saved(s) + qk_saved;
  const Count sp = Ns == N ? Count(0) : N * C * a;  // a gathered incoming gradient or input
  const Count mlp_part = (Ns * C /*h*/ + Ns * C /*ln_2 out*/) * a + stat +
                         (s.moe ? moe_mlp_saved(s) : 3 * N * H * a /*gate, up, their product*/);
  const Count none_saved =
      Ns * C * a /*ln_1 out*/ + stat + core + N * Cl * a /*c_proj in*/ + mlp_part + Ns * C * a;
  // saved: the block's forward set; its output has gone and the output's gradient (Ns C) come
  auto mlp_moment = [&](Count saved) {
    return s.moe ? moe_mlp_moment(s, saved) : dense_mlp_moment(s, saved);
  };
  // core_kept: the core's tensors before its backward; core_again: those it makes again
  auto attn_moment = [&](Count core_kept, Count core_again) {
    const Count common = Ns * C * a /*ln_1 out*/ + stat + Ns * C * a /*the residual's gradient*/;
    const Count c_proj = core_kept + 2 * N * Cl * a + sp;
    const Count core = core_kept + core_again + N * Cl * a + core_backward(s);
    const Count after = std::max(2 * N * Q * a, (N * Q + N * C) * a + sp);
    return common + std::max({c_proj, core, after});
  };
  BlockMem m;
  switch (mode) {
    case nn::ACMode::none:
      m.saved = none_saved;
      m.mlp = mlp_moment(none_saved);
      m.attn = attn_moment(core, 0);
      break;
    case nn::ACMode::selective:
      m.saved = Ns * C * a + stat + N * Q * a /*qkv*/ + N * Cl * a /*c_proj in*/ + mlp_part + Ns * C * a;
      m.mlp = mlp_moment(m.saved);
      m.attn = attn_moment(N * Q * a, core + 2 * N * Cl * a);
      break;
    case nn::ACMode::full:
      m.saved = Ns * C * a;
      m.mlp = Ns * C * a /*incoming gradient*/ + mlp_moment(none_saved);
      m.attn = Ns * C * a + attn_moment(core, 0);
      break;
  }
  m.during_backward = std::max(m.mlp, m.attn);
  return m;
}

// zb-h1: gate and up (their one input Ns C, an output gradient N H each) and down (N H, N C).
// A MoE block: the router's (its input Ns C, dy Nr E) and the shared expert's (as the llama
// MLP's, and its gate's dy N); the grouped GEMMs make their weight gradients at once.
Count deferred_mlp(const Shapes& s) {
  const Count N = s.N, Ns = s.Ns, C = s.C, H = s.moe ? s.Hs : s.H;
  const Count dense = H > 0 ? Ns * C + N * H + N * C + 2 * N * H : Count(0);
  return s.moe ? Ns * C + Count(s.Nr()) * s.E + dense + (H > 0 ? N : Count(0)) : dense;
}

// A MoE block's MLP (nn::MoeMLP), forward: the router 2 Nr C E, its softmax and top k (read
// and write Nr E, twice), moe_dispatch's copy of M rows, the grouped GEMMs on this rank's R
// rows (gate and up 2 R C Ie each, down 2 R Ie C), silu_mul (3 R Ie), moe_combine (reads M C,
// writes Nr C), the residual; the shared expert as the llama MLP (6 N C Hs) and its gate
// (2 N C, the sigmoid spread over C, N C). Backward: the same products twice (input and
// weight gradients), the element-wise passes about twice; under ep the permutations of the
// R rows (read, write, each way). The grouped GEMMs' FLOPs apart (Work::grouped_flops).
std::pair<Work, std::pair<Work, Work>> moe_mlp_work(const Shapes& s) {
  const double N = s.N, Nr = double(s.Nr()), M = double(s.M()), R = double(s.R()), C = s.C, E = s.E,
               Ie = s.Ie, Hs = s.Hs;
  const double gemm = 2 * Nr * C * E + (Hs > 0 ? 6 * N * C * Hs + 2 * N * C : 0.0), grouped = 6 * R * C * Ie;
  const double floats = 4 * Nr * E + 2 * M * C + 3 * R * Ie + M * C + Nr * C + 3 * Nr * C +
                        (s.ep > 1 ? 4 * R * C : 0.0) + (Hs > 0 ? 3 * N * Hs + 3 * N * C : 0.0);
  const double weights = 3 * double(s.El()) * C * Ie + C * E + (Hs > 0 ? 3 * C * Hs + C : 0.0);
  return {{gemm, floats, 0, 0, grouped},
          {{gemm, 2 * floats, 0, 0, grouped}, {gemm, 3 * weights, 0, 0, grouped}}};
}

// A MoE block's work (s.moe; model.moe_every and model.dense_layers leave others dense, each
// replayed as its own kind): the MoE MLP's pieces in the place of the SwiGLU's, its backward one
// piece (the grouped GEMMs' input and weight gradients), no column-parallel linear of its own.
void moe_mlp(const Shapes& s, BlockWork& w) {
  const auto [forward, backward] = moe_mlp_work(s);
  w.mlp = forward;
  w.mlp_in = {backward};
}

// llama's block (nn::LlamaBlock): RMSNorms (read, write), c_attn of Q = Cl + 2 KVl columns,
// rotary q and k, grouped-query attention (the same scores as multi-head: each query head
// against its kv head's keys), c_proj without a bias, SwiGLU's gate, up and down
BlockWork block_work(const Shapes& shapes) {
  const double N = shapes.N, Ns = shapes.Ns, C = shapes.C, Cl = shapes.Cl, KVl = shapes.KVl, Q = shapes.Q,
               H = shapes.H;
  const double S = attention_scores(shapes);
  BlockWork work;
  work.scores = S;
  // forward: ln_1; c_attn 2 N C Q; split_last's copies of q, k, v (N Q), rotary on q and k
  // (N (Cl + KVl)) and heads_to_front's copies (N Q), each read and written
  // (q_norm and k_norm, model.qk_norm: read and write q and k once more)
  const double qkv_copies = 4 * N * Q + (shapes.qk_norm ? 4.0 : 2.0) * N * (Cl + KVl);
  work.attn_in = {2 * N * C * Q, 2 * Ns * C + qkv_copies};
  work.core = {0, ring_copies(shapes), 4 * S * double(shapes.hd), 2 * S};
  // heads_to_back's copy (every core: the output is (B, NHl, Tl, hd)); c_proj 2 N Cl C; the residual add
  work.attn_out = {2 * N * Cl * C, 2 * N * Cl + 3 * Ns * C};
  // ln_2, gate and up 2 N C H each, silu_mul (reads two, writes one), down 2 N H C, the residual add
  work.mlp = {6 * N * C * H, 2 * Ns * C + 3 * N * H + 3 * Ns * C};
  // backward (as gpt2's): the copies of q, k, v's gradients back (rotary's inverse turn
  // included) and, with attention_bias, its gradient's read of N Q
  work.attn_in_b = {2 * N * C * Q, qkv_copies + (shapes.qkv_bias ? N * Q : 0.0)};
  work.attn_in_dw = {2 * N * C * Q, 3 * (C * Q)};
  work.ln_1_b = {0, 4 * Ns * C};
  work.core_b = {0, ring_copies(shapes), (fused(shapes.inner) ? 2.5 : 2.0) * work.core.core_flops, 3 * S};
  work.attn_out_b = {2 * work.attn_out.flops, 2 * N * Cl + 2 * N * C + 3 * Cl * C};
  // down's both gradients, silu_mul's (reads gate, up and dm, writes dgate and dup), up's
  // input gradient, then up's weight gradient; gate's input gradient (and the sum of the
  // two, N C read twice and written), then gate's weight gradient
  work.mlp_in = {{{6 * N * C * H, 5 * N * H + N * C + 3 * (C * H)}, {2 * N * C * H, 3 * (C * H)}},
                 {{2 * N * C * H, 3 * N * C}, {2 * N * C * H, 3 * (C * H)}}};
  work.ln_2_b = {0, 4 * Ns * C + 2 * Ns * C};
  if (shapes.moe) moe_mlp(shapes, work);
  return work;
}

// wte(idx) alone (rotary positions are in the blocks); backward scatters into its gradient.
EmbeddingsWork embeddings(const Shapes& shapes) {
  const double N = double(shapes.N), C = double(shapes.C);
  return {{0, N * C}, {0, 2 * N * C}};
}

// gate and up (C x I each), down (I x C)
std::vector<Gemm> mlp_gemms(int64_t N, int64_t C, int64_t I, int64_t L, DType w) {
  return {{"gate, up", 1, N, C, I, 2 * L, w}, {"down", 1, N, I, C, L, w}};
}

// Rotary's tables, cos and sin (B Tl hd/2 each, in the compute dtype): every block's rotary
// keeps them; models::GPT keeps them between steps but under CP.
Count position_tables(const Shapes& s) { return Count(s.N) * s.hd * s.act_bytes; }

const BlockKind kBlock = {
    .name = "llama",
    .memory = block_memory,
    .fused_core_saved = fused_core_saved,
    .deferred_mlp = deferred_mlp,
    .position_tables = position_tables,
    .norm_stats = 1,  // RMSNorm's rstd
    .work = block_work,
    .embeddings = embeddings,
    .mlp_inputs = 2,  // gate and up
    .mlp_gemms = mlp_gemms,
};

}  // namespace

extern const FamilyTools kTools_llama = {
    .arch = "llama",
    .model_types = {{"llama", "LlamaForCausalLM"},
                    {"mistral", "MistralForCausalLM"},
                    {"qwen2", "Qwen2ForCausalLM"},
                    {"qwen3", "Qwen3ForCausalLM"},
                    {"qwen3_moe", "Qwen3MoeForCausalLM"},
                    {"qwen2_moe", "Qwen2MoeForCausalLM"},
                    {"mixtral", "MixtralForCausalLM"}},
    .read_config = read_config,
    .check_config = check_config,
    .write_config = write_config,
    .from_hf = from_hf,
    .to_hf = to_hf,
    .sources = sources,
    .optional_prefix = "",
    .planner = &kBlock,
};

}  // namespace ndt::train
