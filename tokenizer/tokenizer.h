// ndtrain: a model's own tokenizer, read from Hugging Face's tokenizer.json.
//
// Byte-level BPE, the kind GPT-2, Llama 3, Qwen2 and SmolLM ship, with the ids Hugging Face's
// `tokenizers` gives: the same added and special tokens (matched before anything else), NFC
// where the file asks for it, the pre-tokenizer's regex (through PCRE2, with Oniguruma's
// meaning of \s, \w and \h), BPE merges by rank, ignore_merges, and the post-processor's BOS.
// A file that asks for anything else (another model, normalizer, pre-tokenizer, decoder or
// post-processor) is refused with one error naming the field: never a silently different
// tokenization.
//
//   tok::Tokenizer t = tok::Tokenizer::from_file("models/llama3");   // or .../tokenizer.json
//   std::vector<int32_t> ids = t.encode("Hello world", /*add_special=*/true);  // BOS first
//   std::string text = t.decode(ids);                                // exact UTF-8
//   tok::StreamDecoder out(t);
//   for (int32_t id : generated) std::cout << out.push(id);          // whole characters only
//   std::cout << out.flush();
//
// Text that is not valid UTF-8 is read as Python reads it with errors="replace": each
// maximal invalid subpart becomes U+FFFD (the `tokenizers` package takes only valid str).
// Decoding gives the tokens' bytes with the same replacement, as `tokenizers` decodes.
//
// Encoding is safe from any number of threads at once; encode_batch encodes documents on
// OpenMP threads, and encode splits one long text across threads where the pre-tokenizer
// allows it (the same ids as one thread).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ndt::tok {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = true;
};

struct EncodeOptions {
  bool add_special = false;   // the post-processor's tokens (Llama 3: BOS first)
  bool parse_special = true;  // false: special tokens in the text are plain text (tokenizers'
                              // encode_special_tokens / transformers' split_special_tokens)
  int threads = 1;            // for one long text; 0: OpenMP's default
};

class Tokenizer {
 public:
  // PATH is a tokenizer.json or a folder holding one. tokenizer_config.json beside it, when
  // there, names the end-of-text token (eos_token). Throws ndt::Error naming the file and field.
  static Tokenizer from_file(const std::string& path);
  // The same from the file's text; `source` names it in errors.
  static Tokenizer from_json(std::string_view json, const std::string& source = "tokenizer.json");

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opt = {}) const;
  std::vector<int32_t> encode(std::string_view text, bool add_special) const {
    return encode(text, EncodeOptions{.add_special = add_special});
  }
  // Each text alone (as encode), documents spread over `threads` OpenMP threads (0: default).
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string_view>& texts,
                                                 const EncodeOptions& opt = {}) const;

  // The tokens' bytes, invalid UTF-8 replaced by U+FFFD; throws on an id outside the vocabulary.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The bytes of one token (what it contributes to decode, before the UTF-8 check).
  const std::string& token_bytes(int32_t id) const;

  int64_t vocab_size() const;  // largest id + 1: the model's vocabulary must be at least this
  std::optional<int32_t> id_of(std::string_view token) const;  // an added token's content or a
                                                               // vocabulary entry as the file spells it
  std::optional<int32_t> bos_id() const;  // the BOS the post-processor puts first, if any
  std::optional<int32_t> eos_id() const;  // tokenizer_config.json's eos_token, else a special
                                          // <|endoftext|>, <|end_of_text|> or </s>
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;
  const std::string& source() const;  // the file read

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  static std::shared_ptr<Impl> load(std::string_view json, const std::string& source);
  std::shared_ptr<const Impl> impl_;
};

// Decoding as tokens arrive: push returns the text that the new token completes, holding back
// the bytes of a character not yet complete; flush returns what is held (an incomplete
// character as U+FFFD). All pushes then flush concatenated equal decode of all the ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false)
      : tok_(tok), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string held_;  // bytes of an incomplete character
};

}  // namespace ndt::tok
