// ndtrain: text <-> tokens for prompts and samples, with whichever vocabulary the data was
// prepared with: prepare_text's char or byte vocab.json (data/vocab.h), or a model's own
// tokenizer.json (tokenizer/tokenizer.h; a model folder holding one will do).
//
//   data::TextCodec codec = data::TextCodec::load("data/fortunes/vocab.json");  // or tokenizer.json
//   std::vector<int32_t> ids = codec.encode_prompt("Hello");   // the tokenizer's BOS first, if it adds one
//   data::TextCodec::Stream out(codec);
//   for (int32_t id : new_ids) std::cout << out.push(id);      // whole UTF-8 characters only
//   std::cout << out.flush();
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "train/data/vocab.h"

namespace ndt::data {

// The vocabulary of a run's text: `vocab` (data.vocab) when given, else the one the shards
// that `train_pattern` names were prepared with, as their folder's preparation.json names it
// (a model's tokenizer.json that prepare_text --tokenizer copied there, or prepare_text's
// char or byte vocab.json); for shards without one, the folder's tokenizer.json or vocab.json;
// "" when none is. Throws ndt::Error when the named one is missing, or when a folder without
// preparation.json holds both (either may be a leftover).
std::string vocabulary_path(const std::string& vocab, const std::string& train_pattern);

class TextCodec {
 public:
  // PATH: a vocab.json of prepare_text, a tokenizer.json, or a folder holding tokenizer.json
  // (a Hugging Face model folder) or vocab.json. Throws ndt::Error naming the path.
  // A tokenizer.json that is a char or byte vocabulary in Hugging Face's form (data/vocab.h,
  // what export_weights writes for one) is read as that vocabulary.
  static TextCodec load(const std::string& path);
  // The vocabulary a model folder holds for load: its tokenizer.json, else a vocab.json that
  // prepare_text wrote (not GPT-2's BPE vocab.json); "" when neither.
  static std::string find_in_folder(const std::string& dir);
  // The file `path` named (vocab.json or tokenizer.json), for messages.
  const std::string& source() const { return source_; }
  // A prompt's tokens: a tokenizer's post-processor tokens (Llama 3's BOS) first, special
  // tokens in the text matched as such. Throws ndt::Error for text a char vocabulary lacks.
  std::vector<int32_t> encode_prompt(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  int64_t vocab_size() const;             // largest id + 1
  std::optional<int32_t> eos_id() const;  // a tokenizer's end-of-text token (vocab.json: none)
  std::string describe() const;           // "tokenizer.json (BPE, 128256 tokens)", ...
  const tok::Tokenizer* tokenizer() const { return tok_.get(); }  // null for a vocab.json

  // Decoding as tokens arrive: push gives the text the new token completes, holding back the
  // bytes of a character that is not complete yet; flush gives what is held.
  class Stream {
   public:
    explicit Stream(const TextCodec& codec);
    std::string push(int32_t id);
    std::string flush();

   private:
    const TextCodec& codec_;
    std::unique_ptr<tok::StreamDecoder> tok_;
    std::string held_;  // a byte vocabulary's incomplete character
  };

 private:
  std::string source_;
  std::shared_ptr<const Vocab> vocab_;         // prepare_text's char or byte vocabulary
  std::shared_ptr<const tok::Tokenizer> tok_;  // or a model's tokenizer
};

}  // namespace ndt::data
