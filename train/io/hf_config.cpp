// config.json, read and written (train/io/hf_config.h); each model_type's own keys are its
// family's (train/families/<arch>.cpp).
#include "train/io/hf_config.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string_view>

#include "tensor/error.h"
#include "tokenizer/json_checked.h"
#include "train/families/family_tools.h"
#include "train/io/files.h"

namespace ndt::io {

using json = nlohmann::json;

json parse_json_object(const std::string& text, const std::string& where) {
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

std::string read_text(const std::string& path, const std::string& what) {
  require_regular_file(path, what);
  std::ifstream f(path, std::ios::binary);
  NDT_CHECK(f, what, " ", path, ": cannot open");
  std::stringstream s;
  s << f.rdbuf();
  NDT_CHECK(!f.bad(), what, " ", path, ": read failed");
  return s.str();
}

// rope_theta and rope_scaling (transformers 4) or rope_parameters (transformers 5) -> c.
// Key names: transformers' modeling_rope_utils.py (_validate_llama3_rope_parameters,
// standardize_rope_params): rope_type ("type" in old files), rope_theta, factor,
// low_freq_factor, high_freq_factor, original_max_position_embeddings.
void parse_rope(const HfKeys& top, HfConfig& c) {
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
  HfKeys k{*r, where, rkey + "."};
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

namespace {

// Options no family of ndtrain has, refused by name whatever the model_type (the experts'
// keys but for the mixtures of experts ndtrain reads).
void refuse_unsupported(const HfKeys& k, const std::string& model_type) {
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
  const bool moe = model_type == "qwen3_moe" || model_type == "qwen2_moe" || model_type == "mixtral";
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok",
                          "n_shared_experts", "moe_intermediate_size", "shared_expert_intermediate_size"}) {
    // qwen2_moe's one gated shared expert is read; other shared experts (DeepSeek's n_shared_experts) not
    const bool read = std::string_view(key) != "n_routed_experts" &&
                      !std::string_view(key).starts_with("n_shared") &&
                      (!std::string_view(key).starts_with("shared") || model_type == "qwen2_moe");
    NDT_CHECK(!on(key) || (moe && read), where, ": '", key,
              moe ? "' (shared experts) is not supported; ndtrain's experts are all routed"
                  : "' is a mixture-of-experts option; ndtrain reads the experts of qwen3_moe, qwen2_moe and "
                    "mixtral "
                    "models only");
  }
  NDT_CHECK(!k.has("quantization_config"), where,
            ": quantization_config: quantized checkpoints are not supported; use the unquantized weights");
  if (const json* lt = k.find("layer_types")) {
    if (!lt->is_array()) k.wrong("layer_types", "a list", *lt);
    for (const json& t : *lt)
      NDT_CHECK(t == "full_attention", where, ": layer_types has ", show(t),
                "; ndtrain supports full attention in every layer only");
  }
}

// The family that reads a model_type, with the message an unknown one gets.
const train::FamilyTools& tools_of(const std::string& model_type, const std::string& where) {
  const train::FamilyTools* t = train::find_tools_for_model_type(model_type);
  NDT_CHECK(t, "unknown model_type '", model_type, "' in ", where, "; ndtrain reads ",
            train::model_type_names());
  return *t;
}

}  // namespace

void check_sizes(const HfConfig& c, const std::string& where, const HfSizeKeys& names) {
  const std::pair<const char*, int64_t> sizes[] = {{"vocab_size", c.vocab_size},
                                                   {names.hidden, c.hidden_size},
                                                   {names.intermediate, c.intermediate_size},
                                                   {names.layers, c.num_hidden_layers},
                                                   {names.heads, c.num_attention_heads},
                                                   {"num_key_value_heads", c.num_key_value_heads},
                                                   {names.positions, c.max_position_embeddings}};
  for (auto& [name, v] : sizes) NDT_CHECK(v > 0, where, ": ", name, " must be positive, got ", v);
  NDT_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, where, ": ", names.heads, " ",
            c.num_attention_heads, " is not a multiple of num_key_value_heads ", c.num_key_value_heads);
  if (names.head_dim) {
    NDT_CHECK(c.head_dim > 0, where, ": ", names.head_dim, " must be positive, got ", c.head_dim);
  } else {
    NDT_CHECK(c.hidden_size % c.num_attention_heads == 0, where, ": ", names.hidden, " ", c.hidden_size,
              " is not a multiple of ", names.heads, " ", c.num_attention_heads);
    NDT_CHECK(c.head_dim == c.hidden_size / c.num_attention_heads, where, ": head_dim ", c.head_dim,
              " differs from hidden_size / num_attention_heads = ", c.hidden_size / c.num_attention_heads,
              "; ", c.model_type, " has no head_dim of its own");
  }
  NDT_CHECK(c.norm_eps > 0, where, ": ", names.norm_eps, " must be positive, got ", c.norm_eps);
}

void check_rope(const HfConfig& c, const std::string& where) {
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

HfConfig parse_hf_config(const std::string& text, const std::string& where) {
  const json j = parse_json_object(text, where);
  HfKeys k{j, where, ""};
  HfConfig c;
  const std::optional<std::string> mt = k.opt_str("model_type");
  NDT_CHECK(mt, where, ": required key 'model_type' is missing");
  c.model_type = *mt;
  const train::FamilyTools& family = tools_of(c.model_type, where);
  family.read_config(k, c);
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
  refuse_unsupported(k, c.model_type);
  family.check_config(c, where);
  return c;
}

HfConfig read_hf_config(const std::string& path) {
  return parse_hf_config(read_text(path, "config file"), path);
}

std::string to_json(const HfConfig& c) {
  const train::FamilyTools& family = tools_of(c.model_type, "to_json(HfConfig)");
  family.check_config(c, "to_json(HfConfig)");
  json j;
  j["architectures"] = {train::architecture_of(c.model_type)};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  family.write_config(c, j);
  // transformers 4 reads torch_dtype, 5 dtype (and warns about torch_dtype)
  if (!c.torch_dtype.empty()) j["torch_dtype"] = j["dtype"] = c.torch_dtype;
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_id.size() == 1) j["eos_token_id"] = c.eos_token_id[0];
  if (c.eos_token_id.size() > 1) j["eos_token_id"] = c.eos_token_id;
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  return j.dump(2) + "\n";
}

}  // namespace ndt::io
