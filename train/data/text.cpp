#include "train/data/text.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "tensor/error.h"
#include "train/data/data.h"
#include "train/data/preparation.h"
#include "train/io/files.h"

namespace fs = std::filesystem;

namespace ndt::data {
namespace {

// The length of the longest prefix of `s` that ends on a whole UTF-8 character: a trailing
// lead byte and its continuation bytes, too few for the character, are left out. Bytes that
// can never complete (a stray continuation byte, an invalid lead) count as whole.
size_t complete_prefix(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back for its lead
    const size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

}  // namespace

TextCodec TextCodec::load(const std::string& path) {
  TextCodec c;
  fs::path p(path);
  if (fs::is_directory(p)) {
    if (fs::exists(p / "tokenizer.json"))
      p /= "tokenizer.json";
    else if (fs::exists(p / "vocab.json"))
      p /= "vocab.json";
    else
      NDT_FAIL("the folder ", path,
               " holds neither tokenizer.json (a model's tokenizer) nor vocab.json "
               "(prepare_text's vocabulary): give the file itself");
  }
  NDT_CHECK(fs::exists(p), "the vocabulary ", p.string(), " does not exist");
  c.source_ = p.string();
  if (p.filename() != "tokenizer.json") {
    c.vocab_ = std::make_shared<const Vocab>(Vocab::load(p.string()));
    return c;
  }
  // a char or byte vocabulary written as tokenizer.json (export_weights), or a model's tokenizer
  io::require_regular_file(p.string(), "tokenizer");
  std::ifstream f(p, std::ios::binary);
  std::stringstream text;
  text << f.rdbuf();
  NDT_CHECK(f.good() || f.eof(), "tokenizer ", p.string(), ": cannot read");
  if (std::optional<Vocab> v = Vocab::from_tokenizer_json(text.str(), p.string()))
    c.vocab_ = std::make_shared<const Vocab>(std::move(*v));
  else
    c.tok_ = std::make_shared<const tok::Tokenizer>(tok::Tokenizer::from_file(p.string()));
  return c;
}

std::string TextCodec::find_in_folder(const std::string& dir) {
  const fs::path d(dir);
  std::error_code ec;
  if (fs::is_regular_file(d / "tokenizer.json", ec)) return (d / "tokenizer.json").string();
  if (!fs::is_regular_file(d / "vocab.json", ec)) return "";
  try {  // prepare_text's, not GPT-2's BPE vocabulary (token -> id, beside merges.txt)
    Vocab::load((d / "vocab.json").string());
    return (d / "vocab.json").string();
  } catch (const Error&) {
    return "";
  }
}

std::vector<int32_t> TextCodec::encode_prompt(const std::string& text) const {
  if (tok_) return tok_->encode(text, /*add_special=*/true);
  const std::vector<uint16_t> ids = vocab_->encode(text);
  return {ids.begin(), ids.end()};
}

std::string TextCodec::decode(const std::vector<int32_t>& ids) const {
  return tok_ ? tok_->decode(ids) : vocab_->decode(ids);
}

int64_t TextCodec::vocab_size() const { return tok_ ? tok_->vocab_size() : vocab_->size(); }

std::optional<int32_t> TextCodec::eos_id() const { return tok_ ? tok_->eos_id() : std::nullopt; }

std::string TextCodec::describe() const {
  if (tok_) return source_ + " (byte-level BPE, " + std::to_string(tok_->vocab_size()) + " tokens)";
  return source_ + " (" + (vocab_->kind() == Vocab::kChar ? "char" : "byte") + " vocabulary, " +
         std::to_string(vocab_->size()) + " tokens)";
}

TextCodec::Stream::Stream(const TextCodec& codec) : codec_(codec) {
  if (codec.tok_) tok_ = std::make_unique<tok::StreamDecoder>(*codec.tok_);
}

std::string TextCodec::Stream::push(int32_t id) {
  if (tok_) return tok_->push(id);
  held_ += codec_.vocab_->decode({id});
  const size_t whole = complete_prefix(held_);
  std::string out = held_.substr(0, whole);
  held_.erase(0, whole);
  return out;
}

std::string TextCodec::Stream::flush() {
  if (tok_) return tok_->flush();
  return std::exchange(held_, std::string());
}

std::string vocabulary_path(const std::string& vocab, const std::string& train_pattern) {
  if (!vocab.empty()) return vocab;
  const std::vector<std::string> shards = glob_paths(train_pattern);
  if (const std::optional<Preparation> p = preparation_of(shards)) {  // the one it wrote, never a leftover
    if (p->vocabulary.empty()) return "";
    const fs::path path = fs::path(p->dir) / p->vocabulary;
    NDT_CHECK(fs::exists(path), "the vocabulary ", path.string(), " that ", p->dir, "/", kPreparationFile,
              " names is missing; prepare the folder again with prepare_text --overwrite, or set data.vocab");
    return path.string();
  }
  // shards without a preparation.json: the folder's one vocabulary, if it has only one
  const fs::path dir = fs::path(shards[0]).parent_path();
  const bool tok = fs::exists(dir / "tokenizer.json"), voc = fs::exists(dir / "vocab.json");
  NDT_CHECK(!(tok && voc), "the folder of ", shards[0],
            " holds both tokenizer.json and vocab.json, and no preparation.json says which made its "
            "shards: set data.vocab to the one, or prepare the folder again with prepare_text --overwrite");
  return tok ? (dir / "tokenizer.json").string() : voc ? (dir / "vocab.json").string() : "";
}

}  // namespace ndt::data
