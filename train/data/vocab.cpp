#include "train/data/vocab.h"
#include "tokenizer/bpe_json.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tensor/error.h"
#include "tokenizer/json_checked.h"
#include "tokenizer/unicode.h"
#include "train/io/files.h"

namespace ndt::data {

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    if (i + n > s.size()) n = 1;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

Vocab Vocab::byte_level() {
  Vocab v;
  v.kind_ = kByte;
  for (int b = 0; b < 256; ++b) v.tokens_.push_back(std::string(1, static_cast<char>(b)));
  return v;
}

Vocab Vocab::build_char(const std::string& text) {
  std::set<std::string> chars;
  for (const std::string& c : utf8_chars(text)) chars.insert(c);
  NDT_CHECK(chars.size() <= 65536, "char vocabulary: ", chars.size(),
            " distinct characters do not fit uint16 tokens");
  Vocab v;
  v.kind_ = kChar;
  v.tokens_.assign(chars.begin(), chars.end());
  return v;
}

std::vector<uint16_t> Vocab::encode(const std::string& text) const {
  std::vector<uint16_t> out;
  if (kind_ == kByte) {
    for (unsigned char c : text) out.push_back(c);
    return out;
  }
  std::map<std::string, uint16_t> index;
  for (size_t i = 0; i < tokens_.size(); ++i) index[tokens_[i]] = static_cast<uint16_t>(i);
  for (const std::string& c : utf8_chars(text)) {
    auto it = index.find(c);
    NDT_CHECK(it != index.end(), "char vocabulary: character '", c, "' is not in the vocabulary");
    out.push_back(it->second);
  }
  return out;
}

std::string Vocab::decode(const std::vector<int32_t>& ids) const {
  std::string s;
  for (int32_t id : ids) s += (id >= 0 && id < size()) ? tokens_[id] : std::string("?");
  return s;
}

void Vocab::save(const std::string& path) const { io::write_file_atomic(path, to_json()); }

std::string Vocab::to_json() const {
  nlohmann::json j;
  j["type"] = kind_ == kByte ? "byte" : "char";
  if (kind_ == kChar) {
    // raw bytes that are not valid UTF-8 are stored as their code (0..255) instead of text
    nlohmann::json toks = nlohmann::json::array();
    for (const std::string& t : tokens_) {
      const bool valid =
          utf8_chars(t).size() == 1 && (t.size() == 1 ? static_cast<unsigned char>(t[0]) < 0x80 : true);
      if (valid)
        toks.push_back(t);
      else
        toks.push_back(static_cast<int>(static_cast<unsigned char>(t[0])));
    }
    j["tokens"] = toks;
  }
  j["size"] = size();
  return j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

Vocab Vocab::load(const std::string& path) {
  io::require_regular_file(path, "vocab file");
  std::ifstream f(path, std::ios::binary);
  NDT_CHECK(f.good(), "vocab file ", path, ": cannot open");
  std::stringstream text;
  text << f.rdbuf();
  NDT_CHECK(!f.bad(), "vocab file ", path, ": read failed");
  return parse(text.str(), path);
}

Vocab Vocab::parse(const std::string& text, const std::string& path) {
  nlohmann::json j;
  try {
    j = parse_json_checked(text, path);
  } catch (const std::exception& e) {
    NDT_FAIL("vocab file ", path, ": not valid JSON (", e.what(), ")");
  }
  NDT_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), "vocab file ", path,
            ": missing \"type\" (\"byte\" or \"char\")");
  const std::string type = j["type"].get<std::string>();
  if (type == "byte") return byte_level();
  NDT_CHECK(type == "char" && j.contains("tokens") && j["tokens"].is_array(), "vocab file ", path,
            ": expected type byte or char with a tokens array");
  Vocab v;
  v.kind_ = kChar;
  NDT_CHECK(j["tokens"].size() <= 65536, "vocab file ", path, ": ", j["tokens"].size(),
            " tokens do not fit uint16 token ids");
  size_t i = 0;
  for (const auto& t : j["tokens"]) {
    if (t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() <= 255)
      v.tokens_.push_back(std::string(1, static_cast<char>(t.get<int>())));
    else if (t.is_string())
      v.tokens_.push_back(t.get<std::string>());
    else
      NDT_FAIL("vocab file ", path, ": token ", i, " is ", t.dump(),
               "; each token must be a string or a byte value 0..255");
    ++i;
  }
  return v;
}

// ---- as a Hugging Face tokenizer.json (vocab.h) ----------------------------------------------

std::optional<std::string> Vocab::to_tokenizer_json() const {
  nlohmann::json vocab = nlohmann::json::object();
  nlohmann::json j = {{"version", "1.0"},      {"truncation", nullptr},
                      {"padding", nullptr},    {"added_tokens", nlohmann::json::array()},
                      {"normalizer", nullptr}, {"post_processor", nullptr}};
  if (kind_ == kByte) {  // each byte as GPT-2's byte-level character, its id the byte value
    for (int b = 0; b < 256; ++b) {
      std::string c;
      tok::append_utf8(c, tok::byte_to_char(static_cast<uint8_t>(b)));
      vocab[c] = b;
    }
    const nlohmann::json level = {
        {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
    j["pre_tokenizer"] = level;
    j["decoder"] = level;
    j["model"] = tok::bpe_model_json(vocab, nlohmann::json::array());
    return j.dump(1) + "\n";
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {  // one valid character per token, or no form
    if (utf8_chars(tokens_[i]).size() != 1 || !tok::utf8_valid(tokens_[i])) return std::nullopt;
    vocab[tokens_[i]] = i;
  }
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "[\\s\\S]"}}}, {"behavior", "Isolated"}, {"invert", false}};
  j["decoder"] = {{"type", "Fuse"}};
  j["model"] = {{"type", "WordLevel"}, {"vocab", vocab}, {"unk_token", "<unk>"}};
  return j.dump(1) + "\n";
}

std::optional<Vocab> Vocab::from_tokenizer_json(const std::string& text, const std::string& where) {
  // the largest form, 65536 characters, is about 1.5 MB: a larger file is a model's tokenizer,
  // not parsed twice (Llama 3's is 9 MB)
  if (text.size() > (size_t(4) << 20)) return std::nullopt;
  nlohmann::json j;
  try {
    j = parse_json_checked(text, where);
  } catch (const std::exception& e) {
    NDT_FAIL("tokenizer ", where, ": not valid JSON (", e.what(), ")");
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) return std::nullopt;
  const nlohmann::json& m = j["model"];
  const std::string type = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "";
  Vocab v;  // the candidate: the byte vocabulary, or the characters of a WordLevel vocabulary by id
  if (type == "WordLevel" && m.contains("vocab") && m["vocab"].is_object() && m["vocab"].size() <= 65536) {
    v.kind_ = kChar;
    v.tokens_.assign(m["vocab"].size(), std::string());
    for (auto& [token, id] : m["vocab"].items()) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() >= v.tokens_.size()) return std::nullopt;
      v.tokens_[id.get<uint64_t>()] = token;
    }
  } else if (type == "BPE") {
    v = byte_level();
  } else {
    return std::nullopt;
  }
  const std::optional<std::string> form = v.to_tokenizer_json();
  if (!form || nlohmann::json::parse(*form) != j) return std::nullopt;
  return v;
}

}  // namespace ndt::data
