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
//
// Either one as a Hugging Face tokenizer.json (what export_weights writes into a model folder,
// so that transformers' AutoTokenizer gives the same ids and text for valid UTF-8):
//   byte: byte-level BPE without merges: the ByteLevel pre-tokenizer (no regex, no prefix
//         space) maps each byte to GPT-2's printable alphabet, whose 256 entries have the
//         byte values as ids; the ByteLevel decoder maps them back.
//   char: a WordLevel model whose vocabulary is the characters, split one per code point by a
//         Split pre-tokenizer (regex [\s\S], isolated), joined by the Fuse decoder; a character
//         not in the vocabulary is an error there too (the unk token "<unk>" is not in it).
//         A char vocabulary holding raw bytes that are not UTF-8 (from a text that was not)
//         has no such form: transformers' text is Unicode.
//   std::optional<std::string> j = v.to_tokenizer_json();     // nullopt: not expressible
//   std::optional<Vocab> back = Vocab::from_tokenizer_json(*j);  // exactly that form, or nullopt
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ndt::data {

class Vocab {
 public:
  enum Kind { kByte, kChar };
  static Vocab byte_level();
  static Vocab build_char(const std::string& text);
  static Vocab load(const std::string& path);                             // throws ndt::Error naming the file
  static Vocab parse(const std::string& text, const std::string& where);  // a vocab.json's text
  void save(const std::string& path) const;                               // atomic
  std::string to_json() const;                                            // what save writes
  // The tokenizer.json above; nullopt for a char vocabulary holding bytes that are not UTF-8.
  std::optional<std::string> to_tokenizer_json() const;
  // The vocabulary whose to_tokenizer_json is this JSON (compared as JSON); nullopt for any
  // other tokenizer.json. Throws ndt::Error when `text` is not JSON (`where` names it).
  static std::optional<Vocab> from_tokenizer_json(const std::string& text, const std::string& where);

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
