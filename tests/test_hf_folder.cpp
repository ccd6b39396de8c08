// Hugging Face model folders (train/io/hf_folder.h): config.json in every form ndtrain reads
// (llama with llama3 rope in transformers 4's rope_scaling and 5's rope_parameters, qwen2,
// mistral, gpt2) and each refusal naming its key and file; folders with one weight file or
// sharded with an index, each broken folder refused by name; writing, sharded and not, read
// back equal, and rewriting a folder in place. No Python needed.
#include <gtest/gtest.h>

#include "support/testing.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "models/gpt.h"
#include "nn/flat.h"
#include "tensor/kernels.h"
#include "tokenizer/json_checked.h"
#include "train/checkpoint/hf.h"
#include "train/io/hf_folder.h"
#include "train/io/safetensors.h"

using namespace ndt;
using ndt::testing::error_of;
using ndt::testing::snapshot;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Llama 3.1 8B's config.json (transformers 4 form: rope_theta + rope_scaling).
const char* kLlama31 = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// The same model as transformers 5 writes it: rope_parameters holds rope_theta, dtype for
// torch_dtype.
const char* kLlama31V5 = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 128000,
  "dtype": "bfloat16",
  "eos_token_id": [128001, 128008, 128009],
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                      "original_max_position_embeddings": 8192, "rope_theta": 500000.0,
                      "rope_type": "llama3"},
  "tie_word_embeddings": false,
  "transformers_version": "5.0.0",
  "vocab_size": 128256
})";

// Qwen2.5 0.5B's config.json.
const char* kQwen2 = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Qwen3-0.6B's config.json: 16 heads of 128 channels from a width of 1024 (head_dim is not
// hidden_size / num_attention_heads), 8 key/value heads, q_norm and k_norm (implied), tied.
const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "max_window_layers": 28,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Mistral 7B v0.3's config.json (sliding_window null: full attention).
const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.0.dev0",
  "use_cache": true,
  "vocab_size": 32768
})";

// openai-community/gpt2's config.json (n_ctx beside n_positions, no n_inner).
const char* kGpt2 = R"({
  "activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_ctx": 1024,
  "n_embd": 768,
  "n_head": 12,
  "n_layer": 12,
  "n_positions": 1024,
  "resid_pdrop": 0.1,
  "summary_activation": null,
  "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true,
  "summary_type": "cls_index",
  "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257
})";

// `base` with keys set (a null value removes the key, unless keep_null).
std::string with(const char* base, const json& changes, bool keep_null = false) {
  json j = json::parse(base);
  for (auto& [k, v] : changes.items()) {
    if (v.is_null() && !keep_null)
      j.erase(k);
    else
      j[k] = v;
  }
  return j.dump(2);
}

io::HfConfig parse(const std::string& text) { return io::parse_hf_config(text, "m/config.json"); }

// The message of parsing `text`; it must name `what` and the file.
void expect_refused(const std::string& text, const std::string& what) {
  const std::string msg = error_of([&] { parse(text); });
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
  EXPECT_NE(msg.find("m/config.json"), std::string::npos) << msg;
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A small llama config (sizes for the weights below).
io::HfConfig tiny_llama() {
  io::HfConfig c = parse(with(kLlama31, {{"hidden_size", 16},
                                         {"intermediate_size", 32},
                                         {"num_attention_heads", 4},
                                         {"num_key_value_heads", 2},
                                         {"num_hidden_layers", 2},
                                         {"vocab_size", 10}}));
  return c;
}

// Tensors of distinct sizes and dtypes, values i * 0.5 - k.
Tensor ramp(const Shape& shape, double k, DType dtype = DType::f32) {
  const int64_t n = numel_of(shape);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i * 0.5 - k);
  return Tensor::from_vector(v, shape).to(dtype);
}

// Writes a safetensors file of the given tensors.
void write_st(const fs::path& p, const std::vector<std::pair<std::string, Tensor>>& ts) {
  io::SafeTensorsWriter w;
  w.metadata["format"] = "pt";
  for (auto& [n, t] : ts) w.add(n, t);
  w.write(p.string());
}

// A folder: config.json (tiny llama) plus the given files.
fs::path folder(const std::string& name) {
  fs::path d = ndt::testing::fresh_dir("hf_" + name);
  write_text(d / "config.json", io::to_json(tiny_llama()));
  return d;
}

void expect_same(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.shape(), b.shape());
  ASSERT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.to(DType::f64).to_vector<double>(), b.to(DType::f64).to_vector<double>());
}

}  // namespace

// ---- config.json: the forms ndtrain reads ----------------------------------------------

TEST(HfConfig, LlamaWithLlama3RopeScaling) {
  const io::HfConfig c = parse(kLlama31);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias());
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_TRUE(c.llama3_scaling);
  EXPECT_EQ(c.factor, 8.0);
  EXPECT_EQ(c.low_freq_factor, 1.0);
  EXPECT_EQ(c.high_freq_factor, 4.0);
  EXPECT_EQ(c.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_id, (std::vector<int64_t>{128001, 128008, 128009}));
}

TEST(HfConfig, RopeParametersFormParsesToTheSameFields) {
  EXPECT_EQ(parse(kLlama31V5), parse(kLlama31));
  // the old "type" key for rope_type, and rope_theta given in both places alike
  json j = json::parse(kLlama31);
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "llama3";
  j["rope_scaling"]["rope_theta"] = 500000.0;
  EXPECT_EQ(parse(j.dump()), parse(kLlama31));
}

TEST(HfConfig, LlamaDefaults) {
  // no num_key_value_heads, rope_theta, rope_scaling, tie_word_embeddings, attention_bias, hidden_act
  const io::HfConfig c = parse(with(kLlama31, {{"num_key_value_heads", nullptr},
                                               {"rope_theta", nullptr},
                                               {"rope_scaling", nullptr},
                                               {"tie_word_embeddings", nullptr},
                                               {"attention_bias", nullptr},
                                               {"hidden_act", nullptr},
                                               {"torch_dtype", nullptr},
                                               {"bos_token_id", nullptr},
                                               {"eos_token_id", nullptr}}));
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.llama3_scaling);
  EXPECT_EQ(c.factor, 0.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.torch_dtype, "");
  EXPECT_FALSE(c.bos_token_id);
  EXPECT_TRUE(c.eos_token_id.empty());
  // null counts as absent; rope_type "default" is no scaling; attention_bias true biases o_proj too
  const io::HfConfig d = parse(with(kLlama31,
                                    {{"num_key_value_heads", nullptr},
                                     {"rope_scaling", {{"rope_type", "default"}}},
                                     {"attention_bias", true}},
                                    /*keep_null=*/true));
  EXPECT_EQ(d.num_key_value_heads, 32);
  EXPECT_FALSE(d.llama3_scaling);
  EXPECT_TRUE(d.attention_bias);
  EXPECT_TRUE(d.o_proj_bias());
}

TEST(HfConfig, Qwen2) {
  const io::HfConfig c = parse(kQwen2);
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.hidden_size, 896);
  EXPECT_EQ(c.num_attention_heads, 14);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.llama3_scaling);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attention_bias);  // q, k, v biases without a key
  EXPECT_FALSE(c.o_proj_bias());
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.eos_token_id, std::vector<int64_t>{151643});
}

TEST(HfConfig, Qwen3) {
  const io::HfConfig c = parse(kQwen3);
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(parse(io::to_json(c)), c);
  const json j = json::parse(io::to_json(c));
  EXPECT_EQ(j["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(j["head_dim"], 128);
  EXPECT_EQ(j["use_sliding_window"], false);
  // the model: llama with q_norm and k_norm and its own head size
  const models::GPTConfig m = ckpt::model_config(c);
  EXPECT_EQ(m.arch, "llama");
  EXPECT_TRUE(m.qk_norm);
  EXPECT_EQ(m.head_size, 128);
  EXPECT_EQ(m.head_dim(), 128);
  EXPECT_EQ(ckpt::hf_config(m, DType::bf16).model_type, "qwen3");
  // sliding on, but from layer 28 of 28: no layer slides (transformers' layer_types)
  EXPECT_EQ(parse(with(kQwen3, {{"use_sliding_window", true}, {"sliding_window", 4096}})).head_dim, 128);
  // a head size of hidden / heads is no model.head_dim of its own
  EXPECT_EQ(ckpt::model_config(parse(with(kQwen3, {{"head_dim", 64}}))).head_size, 0);
}

TEST(HfConfigErrors, Qwen3OptionsNdtrainWouldIgnore) {
  expect_refused(with(kQwen3, {{"head_dim", nullptr}}), "transformers would take 128 for qwen3");
  expect_refused(with(kQwen3, {{"num_key_value_heads", nullptr}}), "transformers would take 32 for qwen3");
  expect_refused(
      with(kQwen3, {{"use_sliding_window", true}, {"sliding_window", 4096}, {"max_window_layers", 20}}),
      "makes layers 20 to 27 (max_window_layers on) sliding-window attention");
  expect_refused(with(kQwen3, {{"head_dim", 127}}), "head_dim 127 is odd");
  const std::string msg = error_of([&] {
    ckpt::model_config(parse(with(kQwen3, {{"attention_bias", true}})));
  });
  EXPECT_NE(msg.find("bias on o_proj too"), std::string::npos) << msg;
}

TEST(HfConfig, MistralWithNullSlidingWindow) {
  const io::HfConfig c = parse(kMistral);
  EXPECT_EQ(c.model_type, "mistral");
  EXPECT_EQ(c.vocab_size, 32768);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.attention_bias);
  // a window as long as the context is no window
  EXPECT_EQ(parse(with(kMistral, {{"sliding_window", 32768}})), c);
}

TEST(HfConfig, Gpt2) {
  const io::HfConfig c = parse(kGpt2);
  EXPECT_EQ(c.model_type, "gpt2");
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_EQ(c.hidden_size, 768);
  EXPECT_EQ(c.num_hidden_layers, 12);
  EXPECT_EQ(c.num_attention_heads, 12);
  EXPECT_EQ(c.num_key_value_heads, 12);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.max_position_embeddings, 1024);
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.hidden_act, "gelu_new");
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.o_proj_bias());
  EXPECT_TRUE(c.mlp_bias);
  EXPECT_EQ(c.bos_token_id, 50256);
  // only n_ctx (old files); gelu_pytorch_tanh is the same GELU
  const io::HfConfig d =
      parse(with(kGpt2, {{"n_positions", nullptr}, {"activation_function", "gelu_pytorch_tanh"}}));
  EXPECT_EQ(d.max_position_embeddings, 1024);
  EXPECT_EQ(d.hidden_act, "gelu_pytorch_tanh");
}

TEST(HfConfig, ToJsonRoundTripsEveryForm) {
  for (const char* text : {kLlama31, kLlama31V5, kQwen2, kMistral, kGpt2}) {
    const io::HfConfig c = parse(text);
    const std::string out = io::to_json(c);
    EXPECT_EQ(parse(out), c) << out;
    const json j = json::parse(out);
    EXPECT_EQ(j["model_type"], c.model_type);
    EXPECT_EQ(j["architectures"].size(), 1u);
    if (!c.torch_dtype.empty()) EXPECT_EQ(j["torch_dtype"], c.torch_dtype);
  }
  EXPECT_EQ(json::parse(io::to_json(parse(kLlama31)))["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(json::parse(io::to_json(parse(kQwen2)))["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(json::parse(io::to_json(parse(kMistral)))["architectures"][0], "MistralForCausalLM");
  EXPECT_EQ(json::parse(io::to_json(parse(kGpt2)))["architectures"][0], "GPT2LMHeadModel");
  // the transformers 4 form, which 4 and 5 both read
  const json l = json::parse(io::to_json(parse(kLlama31V5)));
  EXPECT_EQ(l["rope_theta"], 500000.0);
  EXPECT_EQ(l["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(l["rope_scaling"]["original_max_position_embeddings"], 8192);
  EXPECT_EQ(l["torch_dtype"], "bfloat16");
  EXPECT_TRUE(json::parse(io::to_json(parse(kMistral)))["sliding_window"].is_null());  // absent means 4096
  // a gpt2 with n_inner of its own keeps it
  const io::HfConfig g = parse(with(kGpt2, {{"n_inner", 1000}}));
  EXPECT_EQ(g.intermediate_size, 1000);
  EXPECT_EQ(parse(io::to_json(g)), g);
}

TEST(HfConfig, ToJsonRefusesWhatParseWould) {
  io::HfConfig c = parse(kQwen2);
  c.head_dim = 32;  // qwen2 has no head_dim of its own
  EXPECT_NE(error_of([&] { io::to_json(c); }).find("head_dim"), std::string::npos);
  c = parse(kQwen2);
  c.attention_bias = false;
  EXPECT_NE(error_of([&] { io::to_json(c); }).find("attention_bias"), std::string::npos);
  c = parse(kGpt2);
  c.llama3_scaling = true;
  EXPECT_NE(error_of([&] { io::to_json(c); }).find("rotary"), std::string::npos);
  c = parse(kLlama31);
  c.model_type = "falcon";
  EXPECT_NE(error_of([&] { io::to_json(c); }).find("falcon"), std::string::npos);
}

// ---- config.json: refusals, each naming its key and the file ----------------------------

TEST(HfConfigErrors, UnknownModelType) {
  const std::string msg = error_of([&] { parse(with(kLlama31, {{"model_type", "falcon"}})); });
  EXPECT_NE(msg.find("unknown model_type 'falcon' in m/config.json; ndtrain reads gpt2, llama, mistral, "
                     "qwen2, qwen3, qwen3_moe, qwen2_moe and mixtral"),
            std::string::npos)
      << msg;
  expect_refused(with(kLlama31, {{"model_type", nullptr}}), "'model_type' is missing");
}

TEST(HfConfigErrors, MissingRequiredKey) {
  expect_refused(with(kLlama31, {{"hidden_size", nullptr}}), "required key 'hidden_size' is missing");
  expect_refused(with(kLlama31, {{"rms_norm_eps", nullptr}}), "'rms_norm_eps' is missing");
  expect_refused(with(kQwen2, {{"intermediate_size", nullptr}}), "'intermediate_size' is missing");
  expect_refused(with(kGpt2, {{"n_embd", nullptr}}), "'n_embd' is missing");
  // transformers defaults an absent num_key_value_heads to 8 (mistral) or 32 (qwen2), not to the heads
  expect_refused(with(kMistral, {{"num_key_value_heads", nullptr}}), "'num_key_value_heads' is missing");
  expect_refused(with(kQwen2, {{"num_key_value_heads", nullptr}}), "transformers would take 32 for qwen2");
  EXPECT_EQ(parse(with(kQwen2, {{"num_key_value_heads", nullptr}}, /*keep_null=*/true)).num_key_value_heads,
            14);
  expect_refused(with(kGpt2, {{"n_positions", nullptr}, {"n_ctx", nullptr}}), "'n_positions' is missing");
  expect_refused(with(kLlama31, {{"vocab_size", nullptr}}, /*keep_null=*/true),
                 "'vocab_size' is missing (it is null)");
}

TEST(HfConfigErrors, WrongJsonType) {
  expect_refused(with(kLlama31, {{"vocab_size", "128256"}}), "key 'vocab_size' must be an integer");
  expect_refused(with(kLlama31, {{"hidden_size", 4096.5}}), "key 'hidden_size' must be an integer");
  expect_refused(with(kLlama31, {{"rms_norm_eps", "1e-5"}}), "key 'rms_norm_eps' must be a number");
  expect_refused(with(kLlama31, {{"tie_word_embeddings", 0}}),
                 "key 'tie_word_embeddings' must be true or false");
  expect_refused(with(kLlama31, {{"torch_dtype", 16}}), "key 'torch_dtype' must be a string");
  expect_refused(with(kLlama31, {{"eos_token_id", {1, "2"}}}), "key 'eos_token_id' must be an integer");
  expect_refused(with(kLlama31, {{"rope_scaling", "llama3"}}),
                 "key 'rope_scaling' must be an object or null");
  json j = json::parse(kLlama31);
  j["rope_scaling"]["factor"] = "8";
  expect_refused(j.dump(), "key 'rope_scaling.factor' must be a number");
  expect_refused(with(kLlama31, {{"hidden_size", 0}}), "key 'hidden_size' must be positive");
}

TEST(HfConfigErrors, NotJsonDuplicateKeyNotAnObject) {
  expect_refused("{\"model_type\": \"llama\",", "not valid JSON");
  expect_refused("[1, 2]", "not a JSON object");
  std::string dup = kMistral;
  dup.insert(dup.find("\"vocab_size\""), "\"rope_theta\": 10000.0,\n  ");
  expect_refused(dup, "key 'rope_theta' is given twice");
}

TEST(HfConfigErrors, HeadDimOtherThanHiddenOverHeads) {
  // qwen2 has no head_dim of its own (Mistral NeMo's 5120 / 32 heads with head_dim 128 reads)
  expect_refused(with(kQwen2, {{"head_dim", 128}}), "head_dim 128 differs");
  EXPECT_EQ(parse(with(kMistral, {{"hidden_size", 5120}, {"head_dim", 128}})).head_dim, 128);
  expect_refused(with(kLlama31, {{"num_attention_heads", 30}}), "not a multiple of num_attention_heads");
  expect_refused(with(kLlama31, {{"num_key_value_heads", 5}}), "not a multiple of num_key_value_heads");
}

TEST(HfConfigErrors, ActivationAndBiases) {
  expect_refused(with(kLlama31, {{"hidden_act", "gelu"}}), "hidden_act 'gelu' is not supported");
  expect_refused(with(kLlama31, {{"mlp_bias", true}}), "mlp_bias true is not supported");
  expect_refused(with(kMistral, {{"attention_bias", true}}),
                 "attention_bias true is not supported for mistral");
  expect_refused(with(kQwen2, {{"attention_bias", false}}), "attention_bias false contradicts qwen2");
  expect_refused(with(kGpt2, {{"activation_function", "relu"}}),
                 "activation_function 'relu' is not supported");
  expect_refused(with(kGpt2, {{"scale_attn_by_inverse_layer_idx", true}}), "scale_attn_by_inverse_layer_idx");
}

// ndtrain's GPT-2 always ties its head to wte: an untied GPT-2 is refused, never read as tied.
TEST(HfConfigErrors, Gpt2WithUntiedHead) {
  expect_refused(with(kGpt2, {{"tie_word_embeddings", false}}),
                 "m/config.json: tie_word_embeddings = false: ndtrain's GPT-2 ties its head to wte");
  EXPECT_TRUE(parse(with(kGpt2, {{"tie_word_embeddings", true}})).tie_word_embeddings);
  io::HfConfig c = parse(kGpt2);
  c.tie_word_embeddings = false;
  EXPECT_NE(error_of([&] { io::to_json(c); }).find("tie_word_embeddings = false"), std::string::npos);
}

// A tied GPT-2 folder that also stores lm_head.weight: read when it equals wte, refused when it
// differs (its logits would silently come from wte instead).
TEST(HfFolderErrors, Gpt2LmHeadThatDiffersFromWte) {
  const fs::path d = ndt::testing::fresh_dir("hf_gpt2_head");
  models::GPTConfig g;
  g.n_layer = 1, g.n_head = 2, g.n_embd = 8, g.vocab_size = 11, g.block_size = 16;
  models::GPT a(g);
  nn::FlatParams pa = nn::materialize(a.units(), Device::cpu(), DType::f32, 5);
  const auto tensors = ckpt::hf_tensors(a, [&](const std::string& n) { return pa.find(n)->value; });
  Tensor wte;
  for (auto& [n, t] : tensors)
    if (n.ends_with("wte.weight")) wte = t.to(DType::f32);
  ASSERT_TRUE(wte.defined());
  auto write = [&](const std::string& name, const Tensor& head) {
    io::HfFolderWriter w;
    for (auto& [n, t] : tensors) w.add(n, t.to(DType::f32));
    w.add("lm_head.weight", head);
    w.write((d / name).string(), ckpt::hf_config(g, DType::f32));
  };
  auto load = [&](const std::string& name) {
    models::GPT b(g);
    nn::FlatParams pb = nn::materialize(b.units(), Device::cpu(), DType::f32, 9);
    try {
      ckpt::load_hf_local(io::HfFolder((d / name).string()), b, pb);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  write("same", wte.clone());
  EXPECT_EQ(load("same"), "");
  Tensor other = wte.clone();
  kernels::fill(other.narrow(0, 3, 1), 0.25);
  write("differs", other);
  const std::string msg = load("differs");
  EXPECT_NE(msg.find("lm_head.weight differs from"), std::string::npos) << msg;
  EXPECT_NE(msg.find((d / "differs").string()), std::string::npos) << msg;
}

TEST(HfConfigErrors, RopeTypesOtherThanDefaultAndLlama3) {
  for (const char* type : {"linear", "dynamic", "yarn", "longrope"}) {
    json j = json::parse(kLlama31);
    j["rope_scaling"] = {{"rope_type", type}, {"factor", 4.0}};
    expect_refused(j.dump(), std::string("rope_type '") + type + "' is not supported");
    j["rope_scaling"] = {{"type", type}, {"factor", 4.0}};  // the old key
    expect_refused(j.dump(), std::string("rope_type '") + type + "' is not supported");
    json v5 = json::parse(kLlama31V5);
    v5["rope_parameters"]["rope_type"] = type;
    expect_refused(v5.dump(), std::string("rope_parameters rope_type '") + type + "' is not supported");
  }
}

TEST(HfConfigErrors, Llama3RopeKeys) {
  json j = json::parse(kLlama31);
  j["rope_scaling"].erase("low_freq_factor");
  expect_refused(j.dump(), "required key 'rope_scaling.low_freq_factor' is missing");
  json v5 = json::parse(kLlama31V5);
  v5["rope_parameters"].erase("original_max_position_embeddings");
  expect_refused(v5.dump(), "'rope_parameters.original_max_position_embeddings' is missing");
  j = json::parse(kLlama31);
  j["rope_scaling"]["attention_factor"] = 1.0;  // a yarn key: would be ignored
  expect_refused(j.dump(), "key 'rope_scaling.attention_factor' is not used by rope_type 'llama3'");
  j = json::parse(kLlama31);
  j["rope_scaling"]["high_freq_factor"] = 1.0;
  expect_refused(j.dump(), "low_freq_factor < high_freq_factor");
  j = json::parse(kLlama31);
  j["rope_scaling"]["rope_theta"] = 10000.0;
  expect_refused(j.dump(), "rope_theta 500000 and rope_scaling.rope_theta 10000 differ");
  expect_refused(with(kLlama31V5, {{"rope_scaling", {{"rope_type", "default"}}}}),
                 "has both 'rope_scaling' and 'rope_parameters'");
  expect_refused(with(kLlama31, {{"partial_rotary_factor", 0.5}}),
                 "partial_rotary_factor 0.5 is not supported");
}

TEST(HfConfigErrors, SlidingWindowsInUse) {
  // Mistral 7B v0.1: a 4096 window over a 32768 context
  expect_refused(with(kMistral, {{"sliding_window", 4096}}), "sliding_window 4096 is smaller than");
  // absent: MistralConfig's default 4096
  expect_refused(with(kMistral, {{"sliding_window", nullptr}}), "default for mistral when the key is absent");
  expect_refused(with(kQwen2, {{"use_sliding_window", true}}), "use_sliding_window true");
  expect_refused(with(kQwen2, {{"layer_types", {"full_attention", "sliding_attention"}}}),
                 "layer_types has \"sliding_attention\"");
}

TEST(HfConfigErrors, MixtureOfExpertsAndQuantization) {
  expect_refused(with(kMistral, {{"num_local_experts", 8}}),
                 "'num_local_experts' is a mixture-of-experts option");
  expect_refused(with(kQwen2, {{"num_experts", 60}}), "'num_experts'");
  expect_refused(with(kLlama31, {{"n_routed_experts", 64}}), "'n_routed_experts'");
  expect_refused(with(kLlama31, {{"quantization_config", {{"quant_method", "gptq"}, {"bits", 4}}}}),
                 "quantization_config");
  // switched off is not refused
  EXPECT_EQ(parse(with(kQwen2, {{"num_experts", 0}, {"quantization_config", nullptr}}, true)), parse(kQwen2));
}

// Qwen2-MoE (Qwen1.5-MoE's keys on Qwen2's sizes): qkv_bias (absent: true), the routed experts and
// the shared expert's size (required: transformers' default is not the model's), written back alike;
// other model_types' shared experts refused by name.
TEST(HfConfig, Qwen2MoeWithASharedExpert) {
  const json moe = {{"model_type", "qwen2_moe"},
                    {"architectures", {"Qwen2MoeForCausalLM"}},
                    {"num_experts", 4},
                    {"num_experts_per_tok", 2},
                    {"moe_intermediate_size", 64},
                    {"shared_expert_intermediate_size", 128},
                    {"decoder_sparse_step", 1},
                    {"mlp_only_layers", {1}}};
  const io::HfConfig c = parse(with(kQwen2, moe));
  EXPECT_EQ(c.model_type, "qwen2_moe");
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias());
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.shared_expert_intermediate_size, 128);
  EXPECT_EQ(c.mlp_only_layers, std::vector<int64_t>{1});
  EXPECT_EQ(parse(io::to_json(c)), c);
  json no_bias = moe;
  no_bias["qkv_bias"] = false;
  EXPECT_FALSE(parse(with(kQwen2, no_bias)).attention_bias);
  json absent = moe;
  absent["shared_expert_intermediate_size"] = nullptr;
  expect_refused(with(kQwen2, absent), "'shared_expert_intermediate_size'");
  json qwen3 = moe;
  qwen3["model_type"] = "qwen3_moe";
  expect_refused(with(kQwen2, qwen3), "'shared_expert_intermediate_size' (shared experts) is not supported");
}

// ---- folders: reading ------------------------------------------------------------------

TEST(HfFolder, SingleFile) {
  fs::path d = folder("single");
  const Tensor a = ramp({4, 16}, 1), b = ramp({16}, 2, DType::bf16);
  write_st(d / "model.safetensors", {{"model.embed_tokens.weight", a}, {"model.norm.weight", b}});
  io::HfFolder f(d.string() + "/");
  EXPECT_EQ(f.config(), tiny_llama());
  EXPECT_EQ(f.names(), (std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight"}));
  EXPECT_EQ(f.files(), std::vector<std::string>{(d / "model.safetensors").string()});
  EXPECT_TRUE(f.has("model.norm.weight"));
  EXPECT_FALSE(f.has("lm_head.weight"));
  EXPECT_EQ(f.entry("model.norm.weight").dtype, "BF16");
  EXPECT_EQ(f.entry("model.embed_tokens.weight").shape, (Shape{4, 16}));
  expect_same(f.get("model.embed_tokens.weight"), a);
  expect_same(f.get("model.norm.weight", DType::bf16), b);
  EXPECT_EQ(f.reader("model.norm.weight").path(), (d / "model.safetensors").string());
  const std::string msg = error_of([&] { f.entry("lm_head.weight"); });
  EXPECT_NE(msg.find("'lm_head.weight'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(d.string()), std::string::npos) << msg;
}

TEST(HfFolderErrors, NoConfigJson) {
  fs::path d = ndt::testing::fresh_dir("hf_noconfig");
  write_st(d / "model.safetensors", {{"w", ramp({2}, 0)}});
  const std::string msg = error_of([&] { io::HfFolder f(d.string()); });
  EXPECT_NE(msg.find(d.string() + " is not a Hugging Face model folder: no config.json"), std::string::npos)
      << msg;
  EXPECT_NE(error_of([&] { io::HfFolder f((d / "nothing").string()); }).find("does not exist"),
            std::string::npos);
}

TEST(HfFolderErrors, BadConfigNamesTheFile) {
  fs::path d = ndt::testing::fresh_dir("hf_badconfig");
  write_text(d / "config.json", with(kLlama31, {{"model_type", "gemma"}}));
  const std::string msg = error_of([&] { io::HfFolder f(d.string()); });
  EXPECT_NE(msg.find("unknown model_type 'gemma' in " + (d / "config.json").string()), std::string::npos)
      << msg;
}

// JSON nested 100,000 deep (which crashed nlohmann's recursion) is one error naming the file,
// for config.json and the index alike; 512 levels are read, and print without deep recursion.
TEST(HfFolderErrors, DeeplyNestedJsonIsOneErrorNamingTheFile) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  fs::path d = ndt::testing::fresh_dir("hf_deep");
  write_text(d / "config.json", deep);
  std::string msg = error_of([&] { io::HfFolder f(d.string()); });
  EXPECT_NE(msg.find((d / "config.json").string() + ": JSON nested deeper than 512 levels"),
            std::string::npos)
      << msg.substr(0, 300);
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  write_text(d / "config.json", io::to_json(tiny_llama()));
  write_text(d / "model.safetensors.index.json", "{\"weight_map\": " + deep + "}");
  msg = error_of([&] { io::HfFolder f(d.string()); });
  EXPECT_NE(msg.find("model.safetensors.index.json: JSON nested deeper than 512 levels"), std::string::npos)
      << msg.substr(0, 300);
  // the limit: 512 levels parse (and dump), 513 do not
  const std::string ok = std::string(512, '[') + std::string(512, ']');
  EXPECT_EQ(ndt::parse_json_checked(ok, "ok.json").dump(), ok);
  const std::string over = std::string(513, '[') + std::string(513, ']');
  EXPECT_NE(error_of([&] { ndt::parse_json_checked(over, "over.json"); }).find("over.json: JSON nested"),
            std::string::npos);
  std::string dup;
  ndt::parse_json_checked(R"({"a": {"b": 1, "b": 2}})", "dup.json", &dup);
  EXPECT_EQ(dup, "b");
}

TEST(HfFolderErrors, NoWeights) {
  fs::path d = folder("noweights");
  std::string msg = error_of([&] { io::HfFolder f(d.string()); });
  EXPECT_NE(msg.find("has no weights: neither model.safetensors nor model.safetensors.index.json"),
            std::string::npos)
      << msg;
  write_text(d / "pytorch_model.bin", "pickle");
  msg = error_of([&] { io::HfFolder f(d.string()); });
  EXPECT_NE(msg.find("pytorch_model.bin: ndtrain reads safetensors only"), std::string::npos) << msg;
}

TEST(HfFolderErrors, BothSingleFileAndIndex) {
  fs::path d = folder("both");
  write_st(d / "model.safetensors", {{"w", ramp({2}, 0)}});
  write_text(d / "model.safetensors.index.json",
             R"({"metadata": {}, "weight_map": {"w": "model.safetensors"}})");
  const std::string msg = error_of([&] { io::HfFolder f(d.string()); });
  EXPECT_NE(msg.find("has both model.safetensors and model.safetensors.index.json"), std::string::npos)
      << msg;
}

// A sharded folder by hand: two shards and an index (edited by each test).
struct Sharded {
  fs::path d;
  json index;
  explicit Sharded(const std::string& name) : d(folder(name)) {
    write_st(d / "model-00001-of-00002.safetensors", {{"a", ramp({3}, 0)}, {"b", ramp({2, 2}, 1)}});
    write_st(d / "model-00002-of-00002.safetensors", {{"c", ramp({5}, 2)}});
    index = {{"metadata", {{"total_size", 48}}},
             {"weight_map",
              {{"a", "model-00001-of-00002.safetensors"},
               {"b", "model-00001-of-00002.safetensors"},
               {"c", "model-00002-of-00002.safetensors"}}}};
  }
  std::string open() {
    write_text(d / "model.safetensors.index.json", index.dump(2));
    return error_of([&] { io::HfFolder f(d.string()); });
  }
  std::string index_path() const { return (d / "model.safetensors.index.json").string(); }
};

TEST(HfFolder, ShardedByHand) {
  Sharded s("sharded_ok");
  write_text(s.d / "model.safetensors.index.json", s.index.dump(2));
  io::HfFolder f(s.d.string());
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(f.files().size(), 2u);
  EXPECT_EQ(f.reader("c").path(), (s.d / "model-00002-of-00002.safetensors").string());
  expect_same(f.get("b"), ramp({2, 2}, 1));
}

TEST(HfFolderErrors, IndexListsAMissingFile) {
  Sharded s("idx_missing");
  s.index["weight_map"]["c"] = "model-00003-of-00003.safetensors";
  const std::string msg = s.open();
  EXPECT_NE(msg.find(s.index_path() + " lists model-00003-of-00003.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("which is not in"), std::string::npos) << msg;
}

TEST(HfFolderErrors, IndexPutsATensorInAFileWithoutIt) {
  Sharded s("idx_wrongfile");  // a and c swapped
  s.index["weight_map"]["a"] = "model-00002-of-00002.safetensors";
  s.index["weight_map"]["c"] = "model-00001-of-00002.safetensors";
  std::string msg = s.open();
  EXPECT_NE(msg.find("puts 'a' in model-00002-of-00002.safetensors but it is in"), std::string::npos) << msg;
  Sharded t("idx_phantom");
  t.index["weight_map"]["ghost"] = "model-00002-of-00002.safetensors";
  msg = t.open();
  EXPECT_NE(msg.find("puts 'ghost' in model-00002-of-00002.safetensors, which does not contain it"),
            std::string::npos)
      << msg;
}

TEST(HfFolderErrors, ShardHoldsATensorTheIndexDoesNotList) {
  Sharded s("idx_unlisted");
  s.index["weight_map"].erase("b");
  const std::string msg = s.open();
  EXPECT_NE(msg.find("holds 'b', which " + s.index_path() + " does not list"), std::string::npos) << msg;
}

TEST(HfFolderErrors, DuplicateTensorAcrossShards) {
  Sharded s("idx_dup");
  write_st(s.d / "model-00002-of-00002.safetensors", {{"c", ramp({5}, 2)}, {"a", ramp({3}, 0)}});
  const std::string msg = s.open();
  EXPECT_NE(msg.find("tensor 'a' is in both"), std::string::npos) << msg;
}

TEST(HfFolderErrors, MalformedIndex) {
  Sharded s("idx_malformed");
  s.index.erase("weight_map");
  std::string msg = s.open();
  EXPECT_NE(msg.find(s.index_path() + ": no \"weight_map\""), std::string::npos) << msg;
  Sharded t("idx_escape");
  t.index["weight_map"]["c"] = "../elsewhere.safetensors";
  msg = t.open();
  EXPECT_NE(msg.find("is not a file name in the folder"), std::string::npos) << msg;
  Sharded u("idx_type");
  u.index["weight_map"]["c"] = 2;
  msg = u.open();
  EXPECT_NE(msg.find("weight_map['c'] must be a file name"), std::string::npos) << msg;
}

// ---- folders: writing ------------------------------------------------------------------

// 7 tensors, in order: 64, 64, 128, 32, 512, 64, 2 (bf16) bytes.
io::HfFolderWriter seven(std::vector<std::pair<std::string, Tensor>>& ts) {
  ts = {{"model.embed_tokens.weight", ramp({4, 4}, 0)},
        {"model.layers.0.input_layernorm.weight", ramp({16}, 1)},
        {"model.layers.0.mlp.up_proj.weight", ramp({2, 16}, 2)},
        {"model.layers.0.self_attn.q_proj.bias", ramp({8}, 3)},
        {"model.layers.1.mlp.down_proj.weight", ramp({8, 16}, 4)},
        {"model.norm.weight", ramp({16}, 5)},
        {"lm_head.weight", ramp({1}, 6, DType::bf16)}};
  io::HfFolderWriter w;
  for (auto& [n, t] : ts) w.add(n, t);
  return w;
}

TEST(HfFolderWriter, ShardedWriteReadsBackWithTransformersIndex) {
  fs::path parent = ndt::testing::fresh_dir("hf_write_sharded");
  fs::path d = parent / "export";
  std::vector<std::pair<std::string, Tensor>> ts;
  // max 200 bytes, cut as huggingface_hub does: [64 + 64], then 512 is over the limit and takes
  // a shard of its own at once, before the open [128 + 32] closes; then [64 + 2]
  seven(ts).write(d.string(), tiny_llama(), 200);
  for (const char* f : {"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                        "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
                        "model.safetensors.index.json", "config.json"})
    EXPECT_TRUE(fs::exists(d / f)) << f;
  EXPECT_FALSE(fs::exists(d / "model.safetensors"));
  EXPECT_FALSE(fs::exists(parent / "export.ndt-partial"));
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 6);

  const std::string text = read_all(d / "model.safetensors.index.json");
  const json index = json::parse(text);
  EXPECT_EQ(index["metadata"]["total_size"], 64 + 64 + 128 + 32 + 512 + 64 + 2);
  EXPECT_EQ(index.size(), 2u);
  EXPECT_EQ(index["weight_map"].size(), 7u);
  EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["model.layers.0.input_layernorm.weight"], "model-00001-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["model.layers.1.mlp.down_proj.weight"], "model-00002-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["model.layers.0.mlp.up_proj.weight"], "model-00003-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["model.layers.0.self_attn.q_proj.bias"], "model-00003-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["model.norm.weight"], "model-00004-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["lm_head.weight"], "model-00004-of-00004.safetensors");
  // as Python's json.dumps(index, indent=2, sort_keys=True) + "\n"
  EXPECT_TRUE(
      text.starts_with("{\n  \"metadata\": {\n    \"total_size\": 866\n  },\n  \"weight_map\": {\n"
                       "    \"lm_head.weight\": \"model-00004-of-00004.safetensors\",\n"))
      << text;
  EXPECT_EQ(text.back(), '\n');

  io::HfFolder f(d.string());
  EXPECT_EQ(f.config(), tiny_llama());
  EXPECT_EQ(f.names().size(), 7u);
  EXPECT_EQ(f.files().size(), 4u);
  for (auto& [n, t] : ts) expect_same(f.get(n, t.dtype()), t);
  EXPECT_EQ(f.entry("lm_head.weight").dtype, "BF16");
  for (const std::string& file : f.files())
    EXPECT_EQ(io::SafeTensorsReader(file).metadata().at("format"), "pt");
}

TEST(HfFolderWriter, ThreeShards) {
  fs::path d = ndt::testing::fresh_dir("hf_write_three") / "m";
  io::HfFolderWriter w;
  std::vector<Tensor> ts;
  for (int i = 0; i < 6; ++i) {
    ts.push_back(ramp({10}, i));  // 40 bytes each; 100 per shard: 2 + 2 + 2
    w.add("t" + std::to_string(i), ts.back());
  }
  w.write(d.string(), tiny_llama(), 100);
  io::HfFolder f(d.string());
  ASSERT_EQ(f.files().size(), 3u);
  EXPECT_EQ(f.files()[2], (d / "model-00003-of-00003.safetensors").string());
  for (int i = 0; i < 6; ++i) {
    expect_same(f.get("t" + std::to_string(i)), ts[i]);
    EXPECT_EQ(f.reader("t" + std::to_string(i)).path(), f.files()[i / 2]);
  }
  EXPECT_EQ(json::parse(read_all(d / "model.safetensors.index.json"))["metadata"]["total_size"], 240);
}

TEST(HfFolderWriter, SingleFileWhenItFits) {
  fs::path d = ndt::testing::fresh_dir("hf_write_single") / "nested" / "m";
  std::vector<std::pair<std::string, Tensor>> ts;
  seven(ts).write(d.string(), parse(kGpt2));  // 5 GB default
  EXPECT_TRUE(fs::exists(d / "model.safetensors"));
  EXPECT_FALSE(fs::exists(d / "model.safetensors.index.json"));
  EXPECT_EQ(io::read_hf_config((d / "config.json").string()), parse(kGpt2));
  io::HfFolder f(d.string());
  EXPECT_EQ(f.files().size(), 1u);
  for (auto& [n, t] : ts) expect_same(f.get(n, t.dtype()), t);
  EXPECT_EQ(io::SafeTensorsReader((d / "model.safetensors").string()).metadata().at("format"), "pt");
}

TEST(HfFolderWriter, RewritesAFolderInPlaceKeepingOtherFiles) {
  fs::path d = ndt::testing::fresh_dir("hf_rewrite");
  write_text(d / "tokenizer.json", "{\"tok\": 1}");
  std::vector<std::pair<std::string, Tensor>> ts;
  seven(ts).write(d.string(), tiny_llama(), 200);  // 4 shards
  EXPECT_TRUE(fs::exists(d / "model-00004-of-00004.safetensors"));
  // now one file: the shards and index go, the tokenizer stays
  io::HfFolderWriter one;
  one.add("x", ramp({3}, 7));
  one.write(d.string(), parse(kQwen2));
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));
  EXPECT_EQ(read_all(d / "tokenizer.json"), "{\"tok\": 1}");
  {
    io::HfFolder f(d.string());
    EXPECT_EQ(f.config(), parse(kQwen2));
    EXPECT_EQ(f.names(), std::vector<std::string>{"x"});
  }
  // and back to shards of other names: model.safetensors goes
  io::HfFolderWriter three;
  for (int i = 0; i < 3; ++i) three.add("t" + std::to_string(i), ramp({10}, i));
  three.write(d.string(), tiny_llama(), 40);
  names.clear();
  for (const auto& e : fs::directory_iterator(d)) names.insert(e.path().filename().string());
  EXPECT_EQ(names,
            (std::set<std::string>{"config.json", "model-00001-of-00003.safetensors",
                                   "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                                   "model.safetensors.index.json", "tokenizer.json"}));
  io::HfFolder f(d.string());
  EXPECT_EQ(f.names(), (std::vector<std::string>{"t0", "t1", "t2"}));
}

// Files added beside the weights (a tokenizer) are written with them, into a new folder or
// over the same names in an existing one; config.json and the weights' names cannot be added.
TEST(HfFolderWriter, AddedFilesAreWrittenAndReplacedWithTheWeights) {
  fs::path d = ndt::testing::fresh_dir("hf_files") / "m";
  io::HfFolderWriter w;
  w.add("x", ramp({3}, 7));
  w.add_file("tokenizer.json", "{\"new\": 1}");
  w.write(d.string(), parse(kQwen2));
  EXPECT_EQ(read_all(d / "tokenizer.json"), "{\"new\": 1}");
  write_text(d / "tokenizer.json", "{\"old\": 1}");
  write_text(d / "README.md", "mine");
  w.write(d.string(), parse(kQwen2));  // in place
  EXPECT_EQ(read_all(d / "tokenizer.json"), "{\"new\": 1}");
  EXPECT_EQ(read_all(d / "README.md"), "mine");
  EXPECT_FALSE(fs::exists(d / ".ndt-partial"));
  for (const char* bad : {"config.json", "model.safetensors", "model.safetensors.index.json",
                          "model-00001-of-00002.safetensors", "../x.json", "a/b.json", ""})
    EXPECT_NE(error_of([&] { w.add_file(bad, "{}"); }).find("cannot be added as a file of the folder"),
              std::string::npos)
        << bad;
  EXPECT_NE(error_of([&] { w.add_file("tokenizer.json", "{}"); }).find("added twice"), std::string::npos);
}

// pad_token_id is kept when it is an id, ignored as transformers' odd values (-1, a list) are.
TEST(HfConfig, PadTokenIdIsKeptWhenItIsAnId) {
  io::HfConfig c = parse(kQwen2);
  c.pad_token_id = 7;
  const io::HfConfig back = io::parse_hf_config(io::to_json(c), "config.json");
  EXPECT_EQ(back.pad_token_id, 7);
  EXPECT_EQ(back, c);
  for (const char* odd : {"-1", "[0, 1]", "null"}) {
    std::string text = io::to_json(c);
    text.replace(text.find("\"pad_token_id\": 7"), 17, std::string("\"pad_token_id\": ") + odd);
    EXPECT_FALSE(io::parse_hf_config(text, "config.json").pad_token_id) << odd;
  }
}

TEST(HfFolderWriter, RefusalsLeaveTheFolderAsItWas) {
  fs::path d = ndt::testing::fresh_dir("hf_write_refused");
  io::HfFolderWriter w;
  w.add("a", ramp({2}, 0));
  EXPECT_NE(error_of([&] { w.add("a", ramp({2}, 0)); }).find("'a' added twice"), std::string::npos);
  w.write(d.string(), tiny_llama());
  const auto before = snapshot(d);
  io::HfConfig bad = tiny_llama();
  bad.head_dim = 3;
  EXPECT_NE(error_of([&] { w.write(d.string(), bad); }).find("head_dim"), std::string::npos);
  EXPECT_NE(error_of([&] { w.write(d.string(), tiny_llama(), 0); }).find("max_shard_bytes"),
            std::string::npos);
  EXPECT_EQ(snapshot(d), before);
  write_text(d / "file", "x");
  EXPECT_NE(error_of([&] { w.write((d / "file").string(), tiny_llama()); }).find("is not a directory"),
            std::string::npos);
}

// An export given a symlinked folder writes the folder it names; a dangling link's folder is
// made; a file of the folder that is a link (a Hugging Face cache snapshot) keeps its link.
TEST(HfFolderWriter, LinksAreWrittenThroughNotReplaced) {
  const fs::path d = ndt::testing::fresh_dir("hf_write_links");
  io::HfFolderWriter w;
  w.add("a", ramp({2}, 0));
  fs::create_directories(d / "real");
  fs::create_symlink(d / "real", d / "link");
  w.write((d / "link").string(), tiny_llama());
  EXPECT_TRUE(fs::is_symlink(d / "link"));
  EXPECT_TRUE(fs::is_regular_file(d / "real" / "model.safetensors"));
  fs::create_symlink(d / "made", d / "dangling");
  w.write((d / "dangling").string(), tiny_llama());
  EXPECT_TRUE(fs::is_symlink(d / "dangling"));
  EXPECT_TRUE(fs::is_regular_file(d / "made" / "config.json"));
  // config.json a link into a blob folder: the blob is rewritten, the link kept
  fs::create_directories(d / "blobs");
  fs::rename(d / "real" / "config.json", d / "blobs" / "cfg");
  fs::create_symlink("../blobs/cfg", d / "real" / "config.json");
  w.write((d / "link").string(), parse(kQwen2));
  EXPECT_TRUE(fs::is_symlink(d / "real" / "config.json"));
  EXPECT_EQ(io::read_hf_config((d / "blobs" / "cfg").string()).model_type, "qwen2");
  EXPECT_EQ(io::HfFolder((d / "link").string()).names(), std::vector<std::string>{"a"});
}

TEST(HfFolderWriter, AFailedWriteLeavesTheFolderAsItWas) {
  fs::path d = ndt::testing::fresh_dir("hf_write_fails");
  io::HfFolderWriter w;
  w.add("a", ramp({2}, 0));
  w.write(d.string(), tiny_llama());
  // the staging folder's place taken by a file nothing can remove
  write_text(d / ".ndt-partial", "x");
  ndt::testing::Immutable lock(d / ".ndt-partial");
  if (!lock.error().empty()) GTEST_SKIP() << "no immutable files here: " << lock.error();
  const auto before = snapshot(d);
  io::HfFolderWriter other;
  other.add("b", ramp({3}, 1));
  const std::string msg = error_of([&] { other.write(d.string(), parse(kQwen2)); });
  EXPECT_NE(msg.find(".ndt-partial"), std::string::npos) << msg;
  EXPECT_EQ(snapshot(d), before);
  EXPECT_EQ(io::HfFolder(d.string()).names(), std::vector<std::string>{"a"});
}
