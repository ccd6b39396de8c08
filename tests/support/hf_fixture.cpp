#include "support/hf_fixture.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "models/gpt.h"
#include "nn/flat.h"
#include "tokenizer/bpe_json.h"
#include "tokenizer/unicode.h"
#include "train/checkpoint/hf.h"
#include "train/io/hf_folder.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace ndt::testing {
namespace {

json special(int64_t id, const std::string& content) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", true}};
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

}  // namespace

std::string tiny_bpe_tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string c;
    tok::append_utf8(c, tok::byte_to_char(static_cast<uint8_t>(b)));
    vocab[c] = b;
  }
  vocab["Ġt"] = 256;
  vocab["he"] = 257;
  vocab["Ġthe"] = 258;
  vocab["th"] = 259;
  const json level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  json j = {{"version", "1.0"},      {"truncation", nullptr},  {"padding", nullptr},
            {"normalizer", nullptr}, {"pre_tokenizer", level}, {"decoder", level}};
  j["added_tokens"] = json::array(
      {special(TinyHfIds::bos, "<s>"), special(TinyHfIds::eos, "</s>"), special(TinyHfIds::pad, "<pad>")});
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                            {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {TinyHfIds::bos}}, {"tokens", {"<s>"}}}}}}};
  j["model"] = ndt::tok::bpe_model_json(vocab, json::array({"Ġ t", "h e", "Ġt he", "t h"}));
  return j.dump(2) + "\n";
}

void write_tiny_hf_folder(const fs::path& dir, uint64_t seed) {
  models::GPTConfig c{.arch = "llama",
                      .n_layer = 2,
                      .n_head = 4,
                      .n_embd = 32,
                      .vocab_size = TinyHfIds::vocab_size,
                      .block_size = 64};
  c.n_kv_head = 2;
  c.intermediate_size = 48;
  models::GPT gpt(c);
  const nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f32, seed);
  ckpt::export_hf(dir.string(), gpt, params, DType::f32);
  io::HfConfig hf = io::read_hf_config((dir / "config.json").string());
  hf.bos_token_id = TinyHfIds::bos;
  hf.eos_token_id = {TinyHfIds::eos};
  hf.pad_token_id = TinyHfIds::pad;
  write(dir / "config.json", io::to_json(hf));
  write(dir / "tokenizer.json", tiny_bpe_tokenizer_json());
  const json tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"pad_token", "<pad>"}};
  json config = tokens;
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  config["clean_up_tokenization_spaces"] = false;
  config["model_max_length"] = 64;
  write(dir / "tokenizer_config.json", config.dump(2) + "\n");
  write(dir / "special_tokens_map.json", tokens.dump(2) + "\n");
  write(dir / "generation_config.json", json{{"bos_token_id", TinyHfIds::bos},
                                             {"eos_token_id", TinyHfIds::eos},
                                             {"pad_token_id", TinyHfIds::pad},
                                             {"max_length", 64}}
                                                .dump(2) +
                                            "\n");
}

void write_tiny_chat_template(const std::filesystem::path& dir) {
  std::ofstream(dir / "chat_template.jinja")
      << "{{ bos_token }}{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
         "{{ raise_exception('no role ' + m['role'] + ' in this template') }}{% endif %}"
         "<pad>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
         "{% if add_generation_prompt %}<pad>assistant\n{% endif %}";
}

}  // namespace ndt::testing
