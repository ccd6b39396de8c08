// A tiny Hugging Face model folder as the Hub ships one, for the tests of what a run carries
// from model.init_from into its checkpoints and exports: a random tiny llama (config.json with
// bos/eos/pad ids, model.safetensors), a byte-level BPE tokenizer.json with a few merges, BOS
// put first by its post-processor and special <s> </s> <pad>, tokenizer_config.json,
// special_tokens_map.json and generation_config.json.
//
//   ndt::testing::write_tiny_hf_folder(dir / "model");     // vocab_size 264, ids 260 261 262
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace ndt::testing {

struct TinyHfIds {
  static constexpr int64_t bos = 260, eos = 261, pad = 262, vocab_size = 264;
};

// The tokenizer.json of the folder (263 ids: 256 bytes, 4 merges, 3 special tokens).
std::string tiny_bpe_tokenizer_json();
void write_tiny_hf_folder(const std::filesystem::path& dir, uint64_t seed = 7);
// A ChatML-like chat_template.jinja in `dir` on the tiny tokenizer's specials: bos_token, then
// each message as "<pad>ROLE\nCONTENT</s>\n" (eos </s> ends a turn); roles other than system,
// user and assistant raise an error, as templates without a tool role do.
void write_tiny_chat_template(const std::filesystem::path& dir);

}  // namespace ndt::testing
