#include "train/io/hf_folder.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "tokenizer/json_checked.h"
#include "train/io/files.h"

namespace ndt::io {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* kConfig = "config.json";
const char* kSingle = "model.safetensors";
const char* kIndex = "model.safetensors.index.json";

// ---- config.json: typed access with messages naming the key and the file -------------------

// A JSON value for a message, cut short.
std::string show(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// The keys of one JSON object; `prefix` names a nested object in messages ("rope_scaling.").
// A key whose value is null counts as absent, as transformers treats it.
struct Keys {
  const json& j;
  const std::string& where;
  std::string prefix;

  const json* find(const std::string& k) const {
    auto it = j.find(k);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& k) const { return find(k) != nullptr; }
  [[noreturn]] void wrong(const std::string& k, const char* want, const json& v) const {
    NDT_FAIL(where, ": key '", prefix, k, "' must be ", want, ", got ", show(v));
  }
  const json& need(const std::string& k) const {
    const json* v = find(k);
    NDT_CHECK(v, where, ": required key '", prefix, k, "' is missing", j.contains(k) ? " (it is null)" : "");
    return *v;
  }
  int64_t integer(const json& v, const std::string& k) const {
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
    const json* v = find(k);
    return v ? std::optional<int64_t>(integer(*v, k)) : std::nullopt;
  }
  double number(const json& v, const std::string& k) const {
    if (!v.is_number()) wrong(k, "a number", v);
    return v.get<double>();
  }
  double req_num(const std::string& k) const { return number(need(k), k); }
  std::optional<double> opt_num(const std::string& k) const {
    const json* v = find(k);
    return v ? std::optional<double>(number(*v, k)) : std::nullopt;
  }
  bool opt_bool(const std::string& k, bool def) const {
    const json* v = find(k);
    if (!v) return def;
    if (!v->is_boolean()) wrong(k, "true or false", *v);
    return v->get<bool>();
  }
  std::optional<std::string> opt_str(const std::string& k) const {
    const json* v = find(k);
    if (!v) return std::nullopt;
    if (!v->is_string()) wrong(k, "a string", *v);
    return v->get<std::string>();
  }
};

// config.json's JSON; a key given twice in one object (which would keep only one of them
// silently) is refused.
json parse_json(const std::string& text, const std::string& where) {
  std::string duplicate;
  json j;
  try {
    j = parse_json_checked(text, where, &duplicate);
  } catch (const json::exception& e) {
    NDT_FAIL(where, ": not valid JSON (", e.what(), ")");
  }
  NDT_CHECK(duplicate.empty(), where, ": key '", duplicate, "' is given twice");
  NDT_CHECK(j.is_object(), where, ": not a JSON object");
  return j;
}

// rope_theta and rope_scaling (transformers 4) or rope_parameters (transformers 5) -> c.
// Key names: transformers' modeling_rope_utils.py (_validate_llama3_rope_parameters,
// standardize_rope_params): rope_type ("type" in old files), rope_theta, factor,
// low_freq_factor, high_freq_factor, original_max_position_embeddings.
void parse_rope(const Keys& top, HfConfig& c) {
  const std::string& where = top.where;
  const json* scaling = top.find("rope_scaling");
  const json* params = top.find("rope_parameters");
  NDT_CHECK(!(scaling && params), where,
            ": has both 'rope_scaling' and 'rope_parameters'; transformers 4 "
            "reads the first and 5 the second: keep one");
  const json* r = scaling ? scaling : params;
  const std::string rkey = scaling ? "rope_scaling" : "rope_parameters";
  const std::optional<double> theta_top = top.opt_num("rope_theta");
  if (const std::optional<double> p = top.opt_num("partial_rotary_factor"))
    NDT_CHECK(*p == 1.0, where, ": partial_rotary_factor ", *p,
              " is not supported (ndtrain rotates whole heads)");
  c.rope_theta = theta_top.value_or(10000.0);
  if (!r) return;
  if (!r->is_object()) top.wrong(rkey, "an object or null", *r);
  Keys k{*r, where, rkey + "."};
  for (auto& [name, v] : r->items())
    NDT_CHECK(!v.is_object(), where, ": per-layer-type ", rkey, " ('", name, "') is not supported");

  // the type: "rope_type", or "type" in older files
  const std::optional<std::string> t1 = k.opt_str("rope_type"), t2 = k.opt_str("type");
  NDT_CHECK(!(t1 && t2 && *t1 != *t2), where, ": ", rkey, " gives rope_type '", *t1, "' and type '", *t2,
            "'");
  const std::string type = t1 ? *t1 : t2 ? *t2 : "default";
  NDT_CHECK(type == "default" || type == "llama3", where, ": ", rkey, " rope_type '", type,
            "' is not supported; ndtrain supports the default and llama3 rotary embeddings");

  if (const std::optional<double> theta = k.opt_num("rope_theta")) {
    NDT_CHECK(!theta_top || *theta_top == *theta, where, ": rope_theta ", *theta_top, " and ", rkey,
              ".rope_theta ", *theta, " differ");
    c.rope_theta = *theta;
  }
  if (const std::optional<double> p = k.opt_num("partial_rotary_factor"))
    NDT_CHECK(*p == 1.0, where, ": ", rkey, ".partial_rotary_factor ", *p,
              " is not supported (ndtrain rotates whole heads)");

  std::set<std::string> known = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (type == "llama3") {
    known.insert({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
    c.llama3_scaling = true;
    c.factor = k.req_num("factor");
    c.low_freq_factor = k.req_num("low_freq_factor");
    c.high_freq_factor = k.req_num("high_freq_factor");
    c.original_max_position_embeddings = k.positive("original_max_position_embeddings");
    if (const std::optional<int64_t> o = top.opt_int("original_max_position_embeddings"))
      NDT_CHECK(*o == c.original_max_position_embeddings, where, ": original_max_position_embeddings ", *o,
                " and ", rkey, ".original_max_position_embeddings ", c.original_max_position_embeddings,
                " differ");
  }
  for (auto& [name, v] : r->items())
    NDT_CHECK(known.count(name) || v.is_null(), where, ": key '", rkey, ".", name,
              "' is not used by rope_type '", type,
              "' in ndtrain; it refuses options it would otherwise ignore");
}

// Options ndtrain would otherwise ignore, refused by name.
void refuse_unsupported(const Keys& k, const HfConfig& c) {
  const std::string& where = k.where;
  // a value that switches the option on: anything but null, false, 0 or an empty container
  auto on = [&](const char* key) {
    const json* v = k.find(key);
    if (!v) return false;
    if (v->is_boolean()) return v->get<bool>();
    if (v->is_number()) return v->get<double>() != 0;
    if (v->is_object() || v->is_array() || v->is_string()) return !v->empty();
    return true;
  };
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok",
                          "n_shared_experts", "moe_intermediate_size", "shared_expert_intermediate_size"})
    NDT_CHECK(!on(key), where, ": '", key,
              "' is a mixture-of-experts option; ndtrain reads dense models only");
  NDT_CHECK(!k.has("quantization_config"), where,
            ": quantization_config: quantized checkpoints are not supported; use the unquantized weights");
  if (const json* lt = k.find("layer_types")) {
    if (!lt->is_array()) k.wrong("layer_types", "a list", *lt);
    for (const json& t : *lt)
      NDT_CHECK(t == "full_attention", where, ": layer_types has ", show(t),
                "; ndtrain supports full attention in every layer only");
  }
  if (c.model_type == "mistral") {
    // MistralConfig's sliding_window is 4096 when the key is absent; null turns it off
    const bool absent = !k.j.contains("sliding_window");
    int64_t window = 4096;
    if (!absent) window = k.has("sliding_window") ? k.integer(k.j["sliding_window"], "sliding_window") : 0;
    NDT_CHECK(window == 0 || window >= c.max_position_embeddings, where, ": sliding_window ", window,
              absent ? " (transformers' default for mistral when the key is absent)" : "",
              " is smaller than max_position_embeddings ", c.max_position_embeddings,
              ": sliding-window attention is not supported (null turns it off)");
  }
  if (c.model_type == "qwen2")
    NDT_CHECK(!k.opt_bool("use_sliding_window", false), where,
              ": use_sliding_window true: sliding-window attention is not supported");
  if (c.model_type == "gpt2") {
    NDT_CHECK(k.opt_bool("scale_attn_weights", true), where, ": scale_attn_weights false is not supported");
    NDT_CHECK(!k.opt_bool("scale_attn_by_inverse_layer_idx", false), where,
              ": scale_attn_by_inverse_layer_idx true is not supported");
    NDT_CHECK(!k.opt_bool("add_cross_attention", false), where,
              ": add_cross_attention true is not supported");
  }
}

// The checks every HfConfig must pass, from parse_hf_config and to_json alike; keys are named
// as c.model_type's config.json names them.
void check_consistent(const HfConfig& c, const std::string& where) {
  const bool gpt2 = c.model_type == "gpt2";
  auto key = [&](const char* llama, const char* gpt) { return gpt2 ? gpt : llama; };
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", c.vocab_size},
      {key("hidden_size", "n_embd"), c.hidden_size},
      {key("intermediate_size", "n_inner"), c.intermediate_size},
      {key("num_hidden_layers", "n_layer"), c.num_hidden_layers},
      {key("num_attention_heads", "n_head"), c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {key("max_position_embeddings", "n_positions"), c.max_position_embeddings}};
  for (auto& [name, v] : sizes) NDT_CHECK(v > 0, where, ": ", name, " must be positive, got ", v);
  const char* heads = key("num_attention_heads", "n_head");
  NDT_CHECK(c.hidden_size % c.num_attention_heads == 0, where, ": ", key("hidden_size", "n_embd"), " ",
            c.hidden_size, " is not a multiple of ", heads, " ", c.num_attention_heads);
  NDT_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, where, ": ", heads, " ",
            c.num_attention_heads, " is not a multiple of num_key_value_heads ", c.num_key_value_heads);
  NDT_CHECK(c.head_dim == c.hidden_size / c.num_attention_heads, where, ": head_dim ", c.head_dim,
            " differs from hidden_size / num_attention_heads = ", c.hidden_size / c.num_attention_heads,
            "; ndtrain does not support a separate head_dim");
  NDT_CHECK(c.norm_eps > 0, where, ": ", key("rms_norm_eps", "layer_norm_epsilon"), " must be positive, got ",
            c.norm_eps);
  if (gpt2) {
    NDT_CHECK(c.hidden_act == "gelu_new" || c.hidden_act == "gelu_pytorch_tanh", where,
              ": activation_function '", c.hidden_act,
              "' is not supported; ndtrain's GPT-2 uses the tanh GELU (gelu_new, gelu_pytorch_tanh)");
    NDT_CHECK(c.num_key_value_heads == c.num_attention_heads, where, ": gpt2 has no num_key_value_heads (",
              c.num_key_value_heads, " given for ", c.num_attention_heads, " heads)");
    NDT_CHECK(c.attention_bias && c.mlp_bias, where, ": gpt2 always has attention and MLP biases");
    NDT_CHECK(c.tie_word_embeddings, where,
              ": tie_word_embeddings = false: ndtrain's GPT-2 ties its head to wte; a GPT-2 with a head of "
              "its own (lm_head.weight) cannot be read without dropping it");
    const HfConfig none;
    NDT_CHECK(c.rope_theta == none.rope_theta && !c.llama3_scaling && c.factor == 0 &&
                  c.low_freq_factor == 0 && c.high_freq_factor == 0 &&
                  c.original_max_position_embeddings == 0,
              where, ": gpt2 has no rotary embeddings; leave the rope fields at their defaults");
    return;
  }
  NDT_CHECK(c.hidden_act == "silu", where, ": hidden_act '", c.hidden_act, "' is not supported; ndtrain's ",
            c.model_type, " uses silu");
  NDT_CHECK(!c.mlp_bias, where, ": mlp_bias true is not supported (", c.model_type, " MLPs have no biases)");
  if (c.model_type == "qwen2")
    NDT_CHECK(c.attention_bias, where,
              ": attention_bias false contradicts qwen2, whose q, k and v projections "
              "always have biases in transformers");
  if (c.model_type == "mistral")
    NDT_CHECK(!c.attention_bias, where,
              ": attention_bias true is not supported for mistral (transformers' "
              "Mistral has no attention biases and ignores the key)");
  NDT_CHECK(c.rope_theta > 0, where, ": rope_theta must be positive, got ", c.rope_theta);
  if (c.llama3_scaling) {
    NDT_CHECK(c.factor > 0, where, ": llama3 rope factor must be positive, got ", c.factor);
    NDT_CHECK(c.low_freq_factor > 0 && c.high_freq_factor > c.low_freq_factor, where,
              ": llama3 rope needs 0 < low_freq_factor < high_freq_factor, got ", c.low_freq_factor, " and ",
              c.high_freq_factor);
    NDT_CHECK(c.original_max_position_embeddings > 0, where,
              ": llama3 rope original_max_position_embeddings must be positive, got ",
              c.original_max_position_embeddings);
  } else {
    NDT_CHECK(c.factor == 0 && c.low_freq_factor == 0 && c.high_freq_factor == 0 &&
                  c.original_max_position_embeddings == 0,
              where, ": llama3 rope fields are set but llama3_scaling is false");
  }
}

void parse_llama_family(const Keys& k, HfConfig& c) {
  c.vocab_size = k.positive("vocab_size");
  c.hidden_size = k.positive("hidden_size");
  c.intermediate_size = k.positive("intermediate_size");
  c.num_hidden_layers = k.positive("num_hidden_layers");
  c.num_attention_heads = k.positive("num_attention_heads");
  // absent or null: num_attention_heads for llama. MistralConfig and Qwen2Config default an
  // absent key to 8 and 32 whatever the heads: refused rather than guessed.
  NDT_CHECK(c.model_type == "llama" || k.j.contains("num_key_value_heads"), k.where,
            ": required key 'num_key_value_heads' is missing (transformers would take ",
            c.model_type == "mistral" ? 8 : 32, " for ", c.model_type, ", not num_attention_heads; give it)");
  c.num_key_value_heads = k.opt_int("num_key_value_heads").value_or(c.num_attention_heads);
  c.max_position_embeddings = k.positive("max_position_embeddings");
  c.norm_eps = k.req_num("rms_norm_eps");
  c.hidden_act = k.opt_str("hidden_act").value_or("silu");
  c.tie_word_embeddings = k.opt_bool("tie_word_embeddings", false);
  c.mlp_bias = k.opt_bool("mlp_bias", false);
  // qwen2: q, k, v biases always (Qwen2Attention), whatever the key says; mistral: none
  c.attention_bias = k.opt_bool("attention_bias", c.model_type == "qwen2");
  NDT_CHECK(c.hidden_size % c.num_attention_heads == 0, k.where, ": hidden_size ", c.hidden_size,
            " is not a multiple of num_attention_heads ", c.num_attention_heads);
  c.head_dim = k.opt_int("head_dim").value_or(c.hidden_size / c.num_attention_heads);
  parse_rope(k, c);
}

void parse_gpt2(const Keys& k, HfConfig& c) {
  c.vocab_size = k.positive("vocab_size");
  c.hidden_size = k.positive("n_embd");
  c.num_hidden_layers = k.positive("n_layer");
  c.num_attention_heads = k.positive("n_head");
  c.num_key_value_heads = c.num_attention_heads;
  // n_positions; files from before transformers 4 may give only n_ctx (the same number)
  c.max_position_embeddings =
      k.has("n_positions") || !k.has("n_ctx") ? k.positive("n_positions") : k.positive("n_ctx");
  c.intermediate_size = k.opt_int("n_inner").value_or(4 * c.hidden_size);
  c.norm_eps = k.opt_num("layer_norm_epsilon").value_or(1e-5);
  c.hidden_act = k.opt_str("activation_function").value_or("gelu_new");
  c.tie_word_embeddings = k.opt_bool("tie_word_embeddings", true);
  c.attention_bias = c.mlp_bias = true;
  NDT_CHECK(c.hidden_size % c.num_attention_heads == 0, k.where, ": n_embd ", c.hidden_size,
            " is not a multiple of n_head ", c.num_attention_heads);
  c.head_dim = c.hidden_size / c.num_attention_heads;
}

const char* architecture(const std::string& model_type) {
  if (model_type == "llama") return "LlamaForCausalLM";
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "gpt2") return "GPT2LMHeadModel";
  return nullptr;
}

// ---- folders ---------------------------------------------------------------------------

// DIR without trailing separators ("out/" -> "out"), so that parent_path() is its parent.
fs::path clean_dir(const std::string& dir) {
  NDT_CHECK(!dir.empty(), "Hugging Face model folder: empty path");
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return p;
}

std::string read_text(const std::string& path, const std::string& what) {
  require_regular_file(path, what);
  std::ifstream f(path, std::ios::binary);
  NDT_CHECK(f, what, " ", path, ": cannot open");
  std::stringstream s;
  s << f.rdbuf();
  NDT_CHECK(!f.bad(), what, " ", path, ": read failed");
  return s.str();
}

// A shard name from an index: a plain file name in the folder (no path, no "..").
bool plain_file_name(const std::string& f) {
  return !f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos &&
         f.find('\0') == std::string::npos;
}

const std::regex& shard_name_pattern() {
  static const std::regex re("model-[0-9]{5}-of-[0-9]{5}\\.safetensors");
  return re;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// Filesystem calls with messages naming what was being done.
template <typename F>
void fs_do(const std::string& what, F&& f) {
  try {
    f();
  } catch (const fs::filesystem_error& e) {
    NDT_FAIL("writing a Hugging Face model folder: ", what, " failed (", e.code().message(), ")");
  }
}

}  // namespace

// ---- HfConfig ------------------------------------------------------------------------------

HfConfig parse_hf_config(const std::string& text, const std::string& where) {
  const json j = parse_json(text, where);
  Keys k{j, where, ""};
  HfConfig c;
  const std::optional<std::string> mt = k.opt_str("model_type");
  NDT_CHECK(mt, where, ": required key 'model_type' is missing");
  c.model_type = *mt;
  NDT_CHECK(architecture(c.model_type), "unknown model_type '", c.model_type, "' in ", where,
            "; ndtrain reads llama, mistral, qwen2 and gpt2");
  if (c.model_type == "gpt2")
    parse_gpt2(k, c);
  else
    parse_llama_family(k, c);
  // transformers 5 writes dtype, 4 torch_dtype; 5 keeps dtype when both are given
  const std::optional<std::string> dtype = k.opt_str("dtype"), torch_dtype = k.opt_str("torch_dtype");
  c.torch_dtype = dtype ? *dtype : torch_dtype.value_or("");
  c.bos_token_id = k.opt_int("bos_token_id");
  // informational only, and some folders write it oddly (-1, a list): read when it is an id
  if (const json* pad = k.find("pad_token_id"); pad && pad->is_number_unsigned())
    c.pad_token_id = k.integer(*pad, "pad_token_id");
  if (const json* eos = k.find("eos_token_id")) {
    if (eos->is_array()) {
      for (const json& e : *eos) c.eos_token_id.push_back(k.integer(e, "eos_token_id"));
    } else {
      c.eos_token_id.push_back(k.integer(*eos, "eos_token_id"));
    }
  }
  refuse_unsupported(k, c);
  check_consistent(c, where);
  return c;
}

HfConfig read_hf_config(const std::string& path) {
  return parse_hf_config(read_text(path, "config file"), path);
}

std::string to_json(const HfConfig& c) {
  NDT_CHECK(architecture(c.model_type), "to_json: unknown model_type '", c.model_type,
            "'; ndtrain writes llama, mistral, qwen2 and gpt2");
  check_consistent(c, "to_json(HfConfig)");
  json j;
  j["architectures"] = {architecture(c.model_type)};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.model_type == "gpt2") {
    j["n_embd"] = c.hidden_size;
    j["n_layer"] = c.num_hidden_layers;
    j["n_head"] = c.num_attention_heads;
    j["n_positions"] = c.max_position_embeddings;
    j["n_inner"] = c.intermediate_size == 4 * c.hidden_size ? json(nullptr) : json(c.intermediate_size);
    j["layer_norm_epsilon"] = c.norm_eps;
    j["activation_function"] = c.hidden_act;
  } else {
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
    if (c.model_type != "qwen2") j["head_dim"] = c.head_dim;
    if (c.model_type == "llama") {
      j["attention_bias"] = c.attention_bias;
      j["mlp_bias"] = false;
    }
    if (c.model_type == "qwen2") j["use_sliding_window"] = false;
    if (c.model_type == "mistral") j["sliding_window"] = nullptr;  // absent would mean 4096
  }
  // transformers 4 reads torch_dtype, 5 dtype (and warns about torch_dtype)
  if (!c.torch_dtype.empty()) j["torch_dtype"] = j["dtype"] = c.torch_dtype;
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_id.size() == 1) j["eos_token_id"] = c.eos_token_id[0];
  if (c.eos_token_id.size() > 1) j["eos_token_id"] = c.eos_token_id;
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  return j.dump(2) + "\n";
}

// ---- HfFolder ----------------------------------------------------------------------------

HfFolder::HfFolder(const std::string& dir) : dir_(clean_dir(dir).string()) {
  const fs::path d(dir_);
  std::error_code ec;
  NDT_CHECK(fs::is_directory(d, ec), dir_, " is not a Hugging Face model folder: ",
            fs::exists(d, ec) ? "not a directory" : "it does not exist");
  NDT_CHECK(fs::exists(d / kConfig, ec), dir_, " is not a Hugging Face model folder: no config.json");
  config_ = read_hf_config((d / kConfig).string());

  const bool single = fs::exists(d / kSingle, ec), indexed = fs::exists(d / kIndex, ec);
  NDT_CHECK(!(single && indexed), dir_, " has both ", kSingle, " and ", kIndex,
            "; one of them is left from another export: remove it (transformers would read ", kSingle, ")");
  if (!single && !indexed) {
    const bool bin =
        fs::exists(d / "pytorch_model.bin", ec) || fs::exists(d / "pytorch_model.bin.index.json", ec);
    NDT_FAIL(dir_, " has no weights: neither ", kSingle, " nor ", kIndex,
             bin ? " (it has pytorch_model.bin: ndtrain reads safetensors only; convert the folder with "
                   "transformers' save_pretrained(..., safe_serialization=True))"
                 : "");
  }
  if (single) {
    shards_.push_back(std::make_unique<SafeTensorsReader>((d / kSingle).string()));
    for (auto& [name, e] : shards_[0]->entries()) where_[name] = 0;
    return;
  }

  // sharded: the index's weight_map names each tensor's file
  const std::string index_path = (d / kIndex).string();
  const json index = parse_json(read_text(index_path, "weight index"), index_path);
  auto it = index.find("weight_map");
  NDT_CHECK(it != index.end() && it->is_object(), index_path,
            ": no \"weight_map\" object (tensor name -> file)");
  std::map<std::string, std::string> listed;  // tensor -> shard file
  std::map<std::string, size_t> file_no;      // shard file -> index in shards_ (sorted: shard order)
  for (auto& [name, f] : it->items()) {
    NDT_CHECK(f.is_string(), index_path, ": weight_map['", name, "'] must be a file name, got ", show(f));
    const std::string file = f.get<std::string>();
    NDT_CHECK(plain_file_name(file), index_path, ": weight_map['", name, "'] = '", file,
              "' is not a file name in the folder");
    NDT_CHECK(file_no.count(file) || fs::exists(d / file, ec), index_path, " lists ", file, " (for '", name,
              "'), which is not in ", dir_);
    listed[name] = file;
    file_no[file] = 0;
  }
  for (auto& [file, no] : file_no) {
    no = shards_.size();
    shards_.push_back(std::make_unique<SafeTensorsReader>((d / file).string()));
  }
  // every tensor of every shard once, and where the index says it is
  for (size_t s = 0; s < shards_.size(); ++s) {
    for (auto& [name, e] : shards_[s]->entries()) {
      NDT_CHECK(!where_.count(name), dir_, ": tensor '", name, "' is in both ", shards_[where_[name]]->path(),
                " and ", shards_[s]->path());
      auto l = listed.find(name);
      NDT_CHECK(l != listed.end(), shards_[s]->path(), " holds '", name, "', which ", index_path,
                " does not list");
      NDT_CHECK(file_no[l->second] == s, index_path, " puts '", name, "' in ", l->second, " but it is in ",
                shards_[s]->path());
      where_[name] = s;
    }
  }
  for (auto& [name, file] : listed)
    NDT_CHECK(where_.count(name), index_path, " puts '", name, "' in ", file, ", which does not contain it");
}

size_t HfFolder::shard_of(const std::string& name) const {
  auto it = where_.find(name);
  NDT_CHECK(it != where_.end(), "no tensor '", name, "' in the Hugging Face model folder ", dir_, " (",
            where_.size(), " tensors)");
  return it->second;
}

const SafeTensorsReader::Entry& HfFolder::entry(const std::string& name) const {
  return shards_[shard_of(name)]->entries().at(name);
}

const SafeTensorsReader& HfFolder::reader(const std::string& name) const { return *shards_[shard_of(name)]; }

std::vector<std::string> HfFolder::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (auto& [name, s] : where_) out.push_back(name);
  return out;
}

std::vector<std::string> HfFolder::files() const {
  std::vector<std::string> out;
  for (auto& s : shards_) out.push_back(s->path());
  return out;
}

// ---- HfFolderWriter ------------------------------------------------------------------------

namespace {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// One export's files: the tensors of each shard (indices into the writer's list) and its file.
struct ShardPlan {
  std::vector<std::vector<size_t>> shards;
  std::vector<std::string> files;  // one per shard
  int64_t total = 0;               // bytes of all tensors
  bool sharded() const { return shards.size() > 1; }
};

// Shards as huggingface_hub's split_state_dict_into_shards_factory cuts them.
ShardPlan plan_shards(const NamedTensors& tensors, int64_t max_shard_bytes) {
  ShardPlan p;
  std::vector<size_t> current;
  int64_t current_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t b = static_cast<int64_t>(tensors[i].second.nbytes());
    p.total += b;
    if (b > max_shard_bytes) {
      p.shards.push_back({i});
      continue;
    }
    if (current_bytes + b > max_shard_bytes) {
      p.shards.push_back(current);
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += b;
  }
  if (!current.empty() || p.shards.empty()) p.shards.push_back(current);
  for (size_t s = 0; s < p.shards.size(); ++s)
    p.files.push_back(p.sharded() ? shard_name(s, p.shards.size()) : kSingle);
  return p;
}

// model.safetensors.index.json's text; empty when there is one shard.
std::string index_json(const ShardPlan& p, const NamedTensors& tensors) {
  if (!p.sharded()) return "";
  json wm = json::object();
  for (size_t s = 0; s < p.shards.size(); ++s)
    for (size_t i : p.shards[s]) wm[tensors[i].first] = p.files[s];
  // as transformers' save_pretrained: json.dumps(index, indent=2, sort_keys=True) + "\n"
  return json{{"metadata", {{"total_size", p.total}}}, {"weight_map", wm}}.dump(2) + "\n";
}

// Everything one export writes, ready to go to disk.
struct Export {
  const NamedTensors& tensors;
  ShardPlan plan;
  std::string config_text, index_text;
  const std::map<std::string, std::string>& files;  // HfFolderWriter::add_file's

  // Every file into `to`, each written atomically.
  void write_all(const fs::path& to) const {
    for (size_t s = 0; s < plan.shards.size(); ++s) {
      SafeTensorsWriter w;
      w.metadata["format"] = "pt";  // transformers refuses safetensors files without it
      for (size_t i : plan.shards[s]) w.add(tensors[i].first, tensors[i].second);
      w.write((to / plan.files[s]).string());
    }
    write_file_atomic((to / kConfig).string(), config_text);
    for (const auto& [name, bytes] : files) write_file_atomic((to / name).string(), bytes);
    if (plan.sharded()) write_file_atomic((to / kIndex).string(), index_text);
    fsync_dir(to.string());
  }

  // Every file into a fresh folder `tmp`, which is removed if that fails.
  void stage(const fs::path& tmp) const {
    fs_do("preparing " + tmp.string(), [&] {
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    });
    try {
      write_all(tmp);
    } catch (...) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      throw;
    }
  }
};

// A new folder: built whole beside its final name, then renamed into place.
void write_new_folder(const fs::path& d, const Export& out) {
  fs::path tmp = d;
  tmp += ".ndt-partial";
  if (d.has_parent_path())
    fs_do("creating " + d.parent_path().string(), [&] { fs::create_directories(d.parent_path()); });
  out.stage(tmp);
  fs_do("renaming " + tmp.string() + " to " + d.string(), [&] { fs::rename(tmp, d); });
  fsync_dir(d.has_parent_path() ? d.parent_path().string() : ".");
}

// An existing folder: stage inside it, then swap the files of our names in, entry point last.
void replace_in_folder(const fs::path& d, const Export& out) {
  const fs::path tmp = d / ".ndt-partial";
  out.stage(tmp);
  const std::vector<std::string>& files = out.plan.files;
  const std::string entry = out.plan.sharded() ? kIndex : kSingle;
  // a file of the folder that is a symlink (a Hugging Face cache snapshot) keeps its link: its
  // target is replaced
  auto at = [&](const std::string& f) { return fs::path(output_target((d / f).string())); };
  fs_do("replacing the weights in " + d.string(), [&] {
    fs::remove(at(kIndex));
    fs::remove(at(kSingle));
    for (const std::string& f : files)
      if (f != entry) fs::rename(tmp / f, at(f));
    fs::rename(tmp / kConfig, at(kConfig));
    for (const auto& [name, bytes] : out.files) fs::rename(tmp / name, at(name));
    fsync_dir(d.string());
    fs::rename(tmp / entry, at(entry));
    fsync_dir(d.string());
    // shards of an earlier export that this one does not use
    const std::set<std::string> ours(files.begin(), files.end());
    for (const auto& e : fs::directory_iterator(d)) {
      const std::string name = e.path().filename().string();
      if (!ours.count(name) && std::regex_match(name, shard_name_pattern())) fs::remove(e.path());
    }
    fs::remove_all(tmp);
    fsync_dir(d.string());
  });
}

}  // namespace

void HfFolderWriter::add(const std::string& name, const Tensor& t) {
  NDT_CHECK(!name.empty() && name != "__metadata__", "HfFolderWriter: tensor name '", name, "' is reserved");
  for (auto& [n, _] : tensors_) NDT_CHECK(n != name, "HfFolderWriter: tensor '", name, "' added twice");
  tensors_.emplace_back(name, t.to(Device::cpu()).contiguous());
}

void HfFolderWriter::add_file(const std::string& name, const std::string& bytes) {
  const bool weights = name == kSingle || name == kIndex || std::regex_match(name, shard_name_pattern());
  NDT_CHECK(plain_file_name(name) && name != kConfig && !weights && name != ".ndt-partial",
            "HfFolderWriter: '", name, "' cannot be added as a file of the folder");
  NDT_CHECK(files_.emplace(name, bytes).second, "HfFolderWriter: file '", name, "' added twice");
}

void HfFolderWriter::write(const std::string& dir, const HfConfig& config, int64_t max_shard_bytes) const {
  NDT_CHECK(max_shard_bytes > 0, "HfFolderWriter::write: max_shard_bytes must be positive, got ",
            max_shard_bytes);
  const fs::path d = output_target(clean_dir(dir).string());  // a link to a folder: the folder
  const std::string config_text = to_json(config);  // refuses a bad config before anything is written
  const ShardPlan plan = plan_shards(tensors_, max_shard_bytes);
  const Export out{tensors_, plan, config_text, index_json(plan, tensors_), files_};

  std::error_code ec;
  if (!fs::exists(d, ec)) {
    write_new_folder(d, out);
    return;
  }
  NDT_CHECK(fs::is_directory(d, ec), "cannot write a Hugging Face model folder at ", d.string(),
            ": it exists and is not a directory");
  replace_in_folder(d, out);
}

}  // namespace ndt::io
