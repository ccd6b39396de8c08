// Reading tokenizer.json: every field that changes the ids is either read with tokenizers'
// meaning or refused with an error naming it.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tensor/error.h"
#include "tokenizer/impl.h"
#include "tokenizer/json_checked.h"

namespace ndt::tok {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The GPT-2 regex that ByteLevel applies when use_regex is true (tokenizers' byte_level.rs).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class Reader {
 public:
  explicit Reader(const std::string& source) : source_(source) {}

  std::string where(const std::string& field) const { return "tokenizer " + source_ + ": " + field; }
  [[noreturn]] void fail(const std::string& field, const std::string& msg) const {
    NDT_FAIL("tokenizer ", source_, ": ", field, ": ", msg);
  }
  std::string kind(const json& j) const {
    return j.is_null()      ? "null"
           : j.is_string()  ? "a string"
           : j.is_boolean() ? "a boolean"
           : j.is_number()  ? "a number"
           : j.is_array()   ? "an array"
                            : "an object";
  }
  const json& object(const json& j, const std::string& field) const {
    if (!j.is_object()) fail(field, "expected an object, got " + kind(j));
    return j;
  }
  std::string string(const json& j, const std::string& field) const {
    if (!j.is_string()) fail(field, "expected a string, got " + kind(j));
    return j.get<std::string>();
  }
  bool boolean(const json& obj, const std::string& key, const std::string& field, bool fallback) const {
    if (!obj.contains(key) || obj[key].is_null()) return fallback;
    if (!obj[key].is_boolean()) fail(field + "." + key, "expected true or false, got " + kind(obj[key]));
    return obj[key].get<bool>();
  }
  std::string type(const json& obj, const std::string& field) const {
    object(obj, field);
    if (!obj.contains("type")) fail(field, "has no \"type\"");
    return string(obj["type"], field + ".type");
  }
  int32_t id(const json& j, const std::string& field) const {
    if (!j.is_number_integer() || j.get<int64_t>() < 0 || j.get<int64_t>() >= INT32_MAX)
      fail(field, "expected a token id (an integer from 0 to 2^31-2), got " + j.dump());
    return static_cast<int32_t>(j.get<int64_t>());
  }

 private:
  std::string source_;
};

std::string quoted(const std::string& s) { return "'" + s + "'"; }

void read_normalizer(const Reader& r, const json& j, const std::string& field, std::vector<NormalForm>& out) {
  if (j.is_null()) return;
  const std::string t = r.type(j, field);
  if (t == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      r.fail(field + ".normalizers", "expected an array");
    for (size_t i = 0; i < j["normalizers"].size(); ++i)
      read_normalizer(r, j["normalizers"][i], field + ".normalizers[" + std::to_string(i) + "]", out);
  } else if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
    out.push_back(t == "NFC"    ? NormalForm::nfc
                  : t == "NFD"  ? NormalForm::nfd
                  : t == "NFKC" ? NormalForm::nfkc
                                : NormalForm::nfkd);
  } else {
    r.fail(field + ".type",
           quoted(t) + " is not implemented (ndtrain implements NFC, NFD, NFKC, NFKD and Sequence of them)");
  }
}

Behavior read_behavior(const Reader& r, const json& j, const std::string& field) {
  const std::string b = r.string(j, field);
  static const std::map<std::string, Behavior> names = {
      {"Removed", Behavior::removed},
      {"Isolated", Behavior::isolated},
      {"MergedWithPrevious", Behavior::merged_with_previous},
      {"MergedWithNext", Behavior::merged_with_next},
      {"Contiguous", Behavior::contiguous}};
  auto it = names.find(b);
  if (it == names.end())
    r.fail(
        field,
        quoted(b) +
            " is not a split behavior (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)");
  return it->second;
}

// The pre-tokenizer as a list of splits; ByteLevel must come last, once.
void read_pre_tokenizer(const Reader& r, const json& j, const std::string& field, Tokenizer::Impl& t,
                        bool& byte_level) {
  const std::string type = r.type(j, field);
  if (byte_level)
    r.fail(field, "comes after ByteLevel; ndtrain reads pre-tokenizers whose ByteLevel is the last step");
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      r.fail(field + ".pretokenizers", "expected an array");
    for (size_t i = 0; i < j["pretokenizers"].size(); ++i)
      read_pre_tokenizer(r, j["pretokenizers"][i], field + ".pretokenizers[" + std::to_string(i) + "]", t,
                         byte_level);
  } else if (type == "Split") {
    SplitStep s;
    if (!j.contains("pattern")) r.fail(field, "has no \"pattern\"");
    const json& p = r.object(j["pattern"], field + ".pattern");
    if (p.contains("Regex")) {
      s.re = std::make_unique<Regex>(r.string(p["Regex"], field + ".pattern.Regex"), false,
                                     r.where(field + ".pattern.Regex"));
    } else if (p.contains("String")) {
      s.re = std::make_unique<Regex>(r.string(p["String"], field + ".pattern.String"), true,
                                     r.where(field + ".pattern.String"));
    } else {
      r.fail(field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    if (!j.contains("behavior")) r.fail(field, "has no \"behavior\"");
    s.behavior = read_behavior(r, j["behavior"], field + ".behavior");
    s.invert = r.boolean(j, "invert", field, false);
    t.splits.push_back(std::move(s));
  } else if (type == "Digits") {
    // char::is_numeric, each digit alone (Isolated) or runs of them (Contiguous)
    SplitStep s;
    const bool individual = r.boolean(j, "individual_digits", field, false);
    s.re = std::make_unique<Regex>(individual ? R"(\p{N})" : R"(\p{N}+)", false, r.where(field));
    t.splits.push_back(std::move(s));
  } else if (type == "ByteLevel") {
    byte_level = true;
    t.prefix_space_at = r.boolean(j, "add_prefix_space", field, true) ? t.splits.size() : SIZE_MAX;
    if (r.boolean(j, "use_regex", field, true)) {
      SplitStep s;
      s.re = std::make_unique<Regex>(kGpt2Pattern, false, r.where(field + " (GPT-2's regex)"));
      t.splits.push_back(std::move(s));
    }
  } else {
    r.fail(field + ".type",
           quoted(type) +
               " is not implemented (ndtrain reads byte-level BPE: ByteLevel, Split, Digits and "
               "Sequence of them)");
  }
}

void read_post_processor(const Reader& r, const json& j, const std::string& field, Tokenizer::Impl& t) {
  if (j.is_null()) return;
  const std::string type = r.type(j, field);
  if (type == "Sequence") {
    if (!j.contains("processors") || !j["processors"].is_array())
      r.fail(field + ".processors", "expected an array");
    for (size_t i = 0; i < j["processors"].size(); ++i)
      read_post_processor(r, j["processors"][i], field + ".processors[" + std::to_string(i) + "]", t);
  } else if (type == "ByteLevel") {
    // offsets only
  } else if (type == "TemplateProcessing") {
    if (t.template_set) r.fail(field, "is a second TemplateProcessing; ndtrain reads one");
    t.template_set = true;
    if (!j.contains("single") || !j["single"].is_array())
      r.fail(field + ".single", "expected an array of pieces");
    const json& specials = j.contains("special_tokens")
                               ? r.object(j["special_tokens"], field + ".special_tokens")
                               : json::object();
    bool seen_a = false;
    for (size_t i = 0; i < j["single"].size(); ++i) {
      const std::string f = field + ".single[" + std::to_string(i) + "]";
      const json& piece = r.object(j["single"][i], f);
      if (piece.contains("Sequence")) {
        const std::string which =
            r.string(r.object(piece["Sequence"], f + ".Sequence").value("id", json()), f + ".Sequence.id");
        if (which != "A" || seen_a)
          r.fail(f, "a single sequence's template holds sequence A once, got " + piece.dump());
        seen_a = true;
      } else if (piece.contains("SpecialToken")) {
        const std::string name = r.string(
            r.object(piece["SpecialToken"], f + ".SpecialToken").value("id", json()), f + ".SpecialToken.id");
        if (!specials.contains(name))
          r.fail(f, "names special token " + quoted(name) + ", which special_tokens does not hold");
        const json& st = r.object(specials[name], field + ".special_tokens." + name);
        if (!st.contains("ids") || !st["ids"].is_array())
          r.fail(field + ".special_tokens." + name + ".ids", "expected an array");
        for (const json& id : st["ids"])
          (seen_a ? t.after : t.before).push_back(r.id(id, field + ".special_tokens." + name + ".ids"));
      } else {
        r.fail(f, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}, got " + piece.dump());
      }
    }
    if (!seen_a) r.fail(field + ".single", "has no sequence A");
  } else {
    r.fail(field + ".type",
           quoted(type) +
               " is not implemented (ndtrain reads ByteLevel, TemplateProcessing and Sequence of them)");
  }
}

void read_decoder(const Reader& r, const json& j, const std::string& field) {
  if (j.is_null()) r.fail(field, "is null; ndtrain reads byte-level tokenizers, whose decoder is ByteLevel");
  const std::string type = r.type(j, field);
  if (type == "Sequence" && j.contains("decoders") && j["decoders"].is_array() && j["decoders"].size() == 1)
    return read_decoder(r, j["decoders"][0], field + ".decoders[0]");
  if (type != "ByteLevel")
    r.fail(field + ".type", quoted(type) + " is not implemented (ndtrain's decoder is ByteLevel)");
}

// What decoding a token gives: tokenizers' ByteLevel decoder maps each character back to its
// byte, and takes a token with a character outside the alphabet as its UTF-8 text.
std::string decoded_bytes(const std::string& token) {
  std::string b;
  return byte_level_decode(token, b) ? b : token;
}

// A vocabulary's tokens with their ids, in the file's order.
using Vocab = std::vector<std::pair<std::string, int32_t>>;

// The file as a JSON object, its top-level fields that change the ids checked.
json read_file(const Reader& r, std::string_view text, const std::string& source) {
  json j;
  try {
    j = parse_json_checked(text, source);
  } catch (const std::exception& e) {
    NDT_FAIL("tokenizer ", source, ": not valid JSON (", e.what(), ")");
  }
  r.object(j, "the file");
  if (j.contains("version") && !(j["version"].is_string() && j["version"] == "1.0"))
    r.fail("version", j["version"].dump() + " is not 1.0");
  for (const char* key : {"truncation", "padding"})
    if (j.contains(key) && !j[key].is_null())
      r.fail(key, "is set; ndtrain encodes whole texts: save the tokenizer without it");
  return j;
}

// ---- model: BPE over the byte-level alphabet

// The model's type and the fields that byte-level BPE does not have.
void check_bpe_model(const Reader& r, const json& m) {
  const std::string model_type = r.type(m, "model");
  if (model_type != "BPE")
    r.fail("model.type", quoted(model_type) +
                             " is not implemented (ndtrain reads BPE models: GPT-2, Llama 3, Qwen2, SmolLM)");
  if (m.contains("dropout") && !m["dropout"].is_null() &&
      !(m["dropout"].is_number() && m["dropout"].get<double>() == 0))
    r.fail("model.dropout",
           m["dropout"].dump() + ": BPE dropout samples the merges; set it to null to tokenize");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(key) && !m[key].is_null() && !(m[key].is_string() && m[key].get<std::string>().empty()))
      r.fail(std::string("model.") + key, m[key].dump() + " is not implemented (byte-level BPE has none)");
  if (r.boolean(m, "byte_fallback", "model", false))
    r.fail("model.byte_fallback",
           "true is not implemented (it is for SentencePiece-style BPE, not byte-level)");
}

// model.vocab, each token also into t.ids.
Vocab read_vocab(const Reader& r, const json& m, Tokenizer::Impl& t) {
  if (!m.contains("vocab")) r.fail("model.vocab", "missing");
  r.object(m["vocab"], "model.vocab");
  Vocab vocab;
  vocab.reserve(m["vocab"].size());
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    const int32_t id = r.id(it.value(), "model.vocab." + it.key());
    vocab.emplace_back(it.key(), id);
    t.ids[it.key()] = id;
  }
  return vocab;
}

BpeOptions read_bpe_options(const Reader& r, const json& m, const Tokenizer::Impl& t) {
  BpeOptions opt;
  opt.ignore_merges = r.boolean(m, "ignore_merges", "model", false);
  opt.fuse_unk = r.boolean(m, "fuse_unk", "model", false);
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    const std::string unk = r.string(m["unk_token"], "model.unk_token");
    auto it = t.ids.find(unk);
    if (it == t.ids.end()) r.fail("model.unk_token", quoted(unk) + " is not in model.vocab");
    opt.unk_id = it->second;
  }
  return opt;
}

// One merge's two tokens into a and b; false for a "#version" line, which is no merge.
bool read_merge(const Reader& r, const json& e, const std::string& f, std::string& a, std::string& b) {
  if (e.is_string()) {  // "a b"
    const std::string s = e.get<std::string>();
    if (s.rfind("#version", 0) == 0) return false;
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
      r.fail(f, quoted(s) + " is not two tokens separated by one space");
    a = s.substr(0, sp);
    b = s.substr(sp + 1);
  } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["a", "b"]
    a = e[0].get<std::string>();
    b = e[1].get<std::string>();
  } else {
    r.fail(f, "expected \"a b\" or [\"a\", \"b\"], got " + e.dump());
  }
  return true;
}

// model.merges as (left id, right id, merged id) in rank order: those of byte-level tokens,
// the ones BPE can apply; every merge's tokens must be in the vocabulary.
std::vector<std::array<int32_t, 3>> read_merges(const Reader& r, const json& m, const Tokenizer::Impl& t) {
  if (!m.contains("merges") || !m["merges"].is_array()) r.fail("model.merges", "missing or not an array");
  std::vector<std::array<int32_t, 3>> merges;
  merges.reserve(m["merges"].size());
  for (size_t i = 0; i < m["merges"].size(); ++i) {
    const std::string f = "model.merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (!read_merge(r, m["merges"][i], f, a, b)) continue;
    const auto find = [&](const std::string& s, const char* what) {
      auto it = t.ids.find(s);
      if (it == t.ids.end())
        r.fail(f, std::string(what) + quoted(s) +
                      " is not in model.vocab (the merges do not belong to this vocabulary)");
      return it->second;
    };
    const int32_t ia = find(a, "token "), ib = find(b, "token "), iab = find(a + b, "the merged token ");
    std::string ba, bb;
    if (byte_level_decode(a, ba) && byte_level_decode(b, bb)) merges.push_back({ia, ib, iab});
  }
  return merges;
}

// The model into t.bpe and t.ids; returns model.vocab.
Vocab read_model(const Reader& r, const json& j, Tokenizer::Impl& t) {
  if (!j.contains("model")) r.fail("model", "missing");
  const json& m = j["model"];
  check_bpe_model(r, m);
  Vocab vocab = read_vocab(r, m, t);
  Vocab vocab_bytes;  // what BPE can produce
  std::string bytes;
  for (const auto& [token, id] : vocab)
    if (byte_level_decode(token, bytes)) vocab_bytes.emplace_back(bytes, id);
  const BpeOptions opt = read_bpe_options(r, m, t);
  const std::vector<std::array<int32_t, 3>> merges = read_merges(r, m, t);
  t.bpe = Bpe(vocab_bytes, merges, opt);
  return vocab;
}

// ---- normalizer, pre-tokenizer, post-processor, decoder

void read_pipeline(const Reader& r, const json& j, Tokenizer::Impl& t) {
  if (j.contains("normalizer")) read_normalizer(r, j["normalizer"], "normalizer", t.normalizers);
  if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
    r.fail("pre_tokenizer",
           "missing; ndtrain reads byte-level BPE, whose pre_tokenizer is (or ends with) ByteLevel");
  bool byte_level = false;
  read_pre_tokenizer(r, j["pre_tokenizer"], "pre_tokenizer", t, byte_level);
  if (!byte_level)
    r.fail("pre_tokenizer",
           "has no ByteLevel step; ndtrain reads byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM)");
  if (j.contains("post_processor")) read_post_processor(r, j["post_processor"], "post_processor", t);
  read_decoder(r, j.contains("decoder") ? j["decoder"] : json(), "decoder");
}

// ---- ids and their bytes

// One entry of added_tokens; its id is given by read_added_tokens.
AddedToken read_added_token(const Reader& r, const json& e, const std::string& f) {
  AddedToken a;
  if (!e.contains("content")) r.fail(f, "has no content");
  a.content = r.string(e["content"], f + ".content");
  a.special = r.boolean(e, "special", f, false);
  a.single_word = r.boolean(e, "single_word", f, false);
  a.lstrip = r.boolean(e, "lstrip", f, false);
  a.rstrip = r.boolean(e, "rstrip", f, false);
  a.normalized = r.boolean(e, "normalized", f, !a.special);
  return a;
}

// added_tokens by id; next_id is the first id after the vocabulary.
std::map<int32_t, AddedToken> read_added_tokens(const Reader& r, const json& j, const Tokenizer::Impl& t,
                                                int32_t next_id) {
  std::map<int32_t, AddedToken> added;  // tokenizers' added_tokens_map_r
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) return added;
  if (!j["added_tokens"].is_array()) r.fail("added_tokens", "expected an array");
  // tokenizers gives each content the vocabulary's id, or the next one after the vocabulary
  // (the file's "id" is only checked with a warning there)
  std::unordered_map<std::string, int32_t> by_content;
  for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
    const std::string f = "added_tokens[" + std::to_string(i) + "]";
    AddedToken a = read_added_token(r, r.object(j["added_tokens"][i], f), f);
    if (a.content.empty()) continue;
    if (auto it = by_content.find(a.content); it != by_content.end()) {
      a.id = it->second;
    } else if (auto v = t.ids.find(a.content); v != t.ids.end()) {
      a.id = v->second;
    } else {
      a.id = next_id++;
    }
    by_content[a.content] = a.id;
    added[a.id] = a;
  }
  return added;
}

// How many ids there are: one past the largest of the vocabulary, the added tokens and the template.
int64_t id_count(const Vocab& vocab, const std::map<int32_t, AddedToken>& added, const Tokenizer::Impl& t) {
  int64_t size = 0;
  for (const auto& [token, id] : vocab) size = std::max<int64_t>(size, id + 1);
  for (const auto& [id, a] : added) size = std::max<int64_t>(size, id + 1);
  for (int32_t id : t.before) size = std::max<int64_t>(size, id + 1);
  for (int32_t id : t.after) size = std::max<int64_t>(size, id + 1);
  return size;
}

// An added token into t: its matcher, its bytes and flags, its id, and \w when single_word needs it.
void add_token(Tokenizer::Impl& t, int32_t id, const AddedToken& a) {
  std::string match = a.content;
  if (a.normalized)
    for (NormalForm n : t.normalizers) match = normalize(n, match);
  const int32_t index = static_cast<int32_t>(t.added.size());
  (a.normalized ? t.normalized_tokens : t.raw_tokens).add(match, index);
  t.bytes[id] = decoded_bytes(match);  // tokenizers decodes the normalized form
  t.known[id] = 1;
  t.special[id] = a.special;
  t.ids[a.content] = id;
  t.added.push_back(a);
  if (a.single_word && !t.word_char)  // the regex crate's \w, which single_word tests
    t.word_char =
        std::make_unique<Regex>(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])", false, "single_word");
}

// Every id's bytes and flags: the vocabulary's tokens, then the added ones.
void lay_out_ids(Tokenizer::Impl& t, const Vocab& vocab, const std::map<int32_t, AddedToken>& added) {
  const int64_t size = id_count(vocab, added, t);
  t.vocab_size = size;
  t.bytes.assign(size, std::string());
  t.known.assign(size, 0);
  t.special.assign(size, 0);
  for (const auto& [token, id] : vocab) {
    t.bytes[id] = decoded_bytes(token);
    t.known[id] = 1;
  }
  for (const auto& [id, a] : added) add_token(t, id, a);
}

// The template's tokens checked; BOS is the template's first, EOS the first special end-of-text token.
void set_bos_eos(const Reader& r, Tokenizer::Impl& t) {
  for (int32_t id : t.before)
    if (!t.known[id])
      r.fail("post_processor", "adds token id " + std::to_string(id) + ", which is not in the vocabulary");
  for (int32_t id : t.after)
    if (!t.known[id])
      r.fail("post_processor", "adds token id " + std::to_string(id) + ", which is not in the vocabulary");
  if (!t.before.empty()) t.bos = t.before.front();
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>"})
    if (auto it = t.ids.find(name); !t.eos && it != t.ids.end() && t.special[it->second]) t.eos = it->second;
}

}  // namespace

std::shared_ptr<Tokenizer::Impl> Tokenizer::load(std::string_view text, const std::string& source) {
  const Reader r(source);
  const json j = read_file(r, text, source);
  auto t = std::make_shared<Impl>();
  t->source = source;
  const Vocab vocab = read_model(r, j, *t);
  read_pipeline(r, j, *t);
  const std::map<int32_t, AddedToken> added = read_added_tokens(r, j, *t, static_cast<int32_t>(vocab.size()));
  lay_out_ids(*t, vocab, added);
  set_bos_eos(r, *t);
  return t;
}

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& source) {
  return Tokenizer(load(text, source));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  fs::path file = path;
  std::error_code ec;
  if (fs::is_directory(file, ec)) {
    file /= "tokenizer.json";
    NDT_CHECK(
        fs::exists(file, ec), "tokenizer: the folder ", path,
        " holds no tokenizer.json (a Hugging Face model folder has one; give its path or the folder's)");
  }
  NDT_CHECK(fs::exists(file, ec), "tokenizer: ", path,
            " does not exist (give a tokenizer.json or a folder holding one)");
  NDT_CHECK(fs::is_regular_file(file, ec), "tokenizer: ", file.string(), " is not a regular file");
  std::ifstream in(file, std::ios::binary);
  NDT_CHECK(in.good(), "tokenizer: cannot read ", file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  std::shared_ptr<Impl> t = load(ss.str(), file.string());
  // tokenizer_config.json beside it names the end-of-text token
  const fs::path config = file.parent_path() / "tokenizer_config.json";
  if (fs::is_regular_file(config, ec)) {
    std::ifstream c(config);
    json cj;  // not valid JSON: no end-of-text token from it; nested too deep: refused
    try {
      cj = parse_json_checked(c, config.string());
    } catch (const json::exception&) {
    }
    if (cj.is_object() && cj.contains("eos_token")) {
      const json& e = cj["eos_token"];
      const json name = e.is_object() ? e.value("content", json()) : e;
      if (name.is_string())
        if (auto it = t->ids.find(name.get<std::string>()); it != t->ids.end()) t->eos = it->second;
    }
  }
  return Tokenizer(std::move(t));
}

void Trie::add(std::string_view s, int32_t value) {
  int32_t node = 0;
  for (unsigned char c : s) {
    int32_t child = -1;
    for (const auto& [b, n] : nodes_[node].next)
      if (b == c) child = n;
    if (child < 0) {
      child = static_cast<int32_t>(nodes_.size());
      nodes_[node].next.emplace_back(c, child);
      nodes_.emplace_back();
    }
    node = child;
  }
  nodes_[node].value = value;
  first_[static_cast<unsigned char>(s[0])] = true;
}

bool Trie::find(std::string_view text, size_t from, size_t& start, size_t& len, int32_t& value) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_[static_cast<unsigned char>(text[i])]) continue;
    int32_t node = 0, best = -1;
    size_t best_len = 0;
    for (size_t k = i; k < text.size(); ++k) {
      int32_t child = -1;
      for (const auto& [b, n] : nodes_[node].next)
        if (b == static_cast<unsigned char>(text[k])) child = n;
      if (child < 0) break;
      node = child;
      if (nodes_[node].value >= 0) {
        best = nodes_[node].value;
        best_len = k + 1 - i;
      }
    }
    if (best >= 0) {
      start = i;
      len = best_len;
      value = best;
      return true;
    }
  }
  return false;
}

nlohmann::json bpe_model_json(nlohmann::json vocab, nlohmann::json merges) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", false},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

}  // namespace ndt::tok
