// ndtrain: the vocabularies that turn text into tokens and back.
//
//   byte: 256 tokens, token = byte value (any file, any encoding).
//   char: one token per distinct Unicode character of the training text (UTF-8), in
//         sorted order; saved as JSON beside the shards so samples can be decoded.
//   (A model's own tokenizer, GPT-2's, Llama 3's or Qwen2's BPE, is tokenizer/tokenizer.h.)
//
//   data::Vocab v = data::Vocab::build_char(text);
//   std::vector<uint16_t> ids = v.encode(text);
//   v.save("data/vocab.json");  ...  data::Vocab::load("data/vocab.json").decode(ids) == text
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ndt::data {

class Vocab {
 public:
  enum Kind { kByte, kChar };
  static Vocab byte_level();
  static Vocab build_char(const std::string& text);
  static Vocab load(const std::string& path);  // throws ndt::Error naming the file
  void save(const std::string& path) const;    // atomic
  std::string to_json() const;                 // what save writes

  Kind kind() const { return kind_; }
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  std::vector<uint16_t> encode(const std::string& text) const;  // throws on unknown chars
  std::string decode(const std::vector<int32_t>& ids) const;
  const std::string& token(int64_t id) const { return tokens_.at(id); }

 private:
  Kind kind_ = kByte;
  std::vector<std::string> tokens_;  // id -> UTF-8 text (char) or one raw byte (byte)
};

// Splits UTF-8 text into characters; an invalid byte becomes a character of its own.
std::vector<std::string> utf8_chars(const std::string& text);

}  // namespace ndt::data
