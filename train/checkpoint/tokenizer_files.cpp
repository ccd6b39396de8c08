#include "train/checkpoint/tokenizer_files.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tensor/error.h"
#include "tokenizer/json_checked.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint/load.h"
#include "train/data/preparation.h"
#include "train/data/vocab.h"
#include "train/io/files.h"
#include "train/io/hf_folder.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace ndt::ckpt {
namespace {

constexpr const char* kManifest = "checkpoint.json";
constexpr const char* kTokenizer = "tokenizer.json";
// what a source folder holds beside its tokenizer.json, carried with it: tokenizer_config.json,
// special_tokens_map.json, generation_config.json, chat_template.jinja (in that order)
const auto& kBeside = data::kBesideTokenizer;
constexpr const char* kFix =
    "; the checkpoint is damaged: resume an older one (write its step_* name into latest) or restore the "
    "file";

// The only names a checkpoint's tokenizer files may have (plain names in the step folder).
bool allowed_name(const std::string& n) {
  static const std::set<std::string> names = {kTokenizer, "vocab.json", kBeside[0],
                                              kBeside[1], kBeside[2],   kBeside[3]};
  return names.count(n) > 0;
}

std::string read_bytes(const std::string& path, const std::string& what) {
  io::require_regular_file(path, what);
  std::ifstream f(path, std::ios::binary);
  NDT_CHECK(f.good(), what, " ", path, ": cannot open");
  std::stringstream s;
  s << f.rdbuf();
  NDT_CHECK(!f.bad(), what, " ", path, ": read failed");
  return s.str();
}

// What a source of weights knows of its tokenizer: a Hugging Face folder's tokenizer.json, the
// files beside it and its config.json's special ids; a sharded checkpoint's carried files.
TokenizerFiles source_tokenizer(const WeightSource& w) {
  TokenizerFiles t;
  if (w.kind == WeightSource::Kind::kSharded) return read_tokenizer_files(w.path);
  if (w.kind != WeightSource::Kind::kHfFolder) return t;
  const fs::path d(w.hf->dir());
  std::error_code ec;
  if (fs::is_regular_file(d / kTokenizer, ec)) {
    t.files[kTokenizer] = read_bytes((d / kTokenizer).string(), "tokenizer");
    t.vocabulary = kTokenizer;
  }
  for (const char* name : kBeside)
    if (fs::is_regular_file(d / name, ec)) t.files[name] = read_bytes((d / name).string(), "tokenizer file");
  t.bos_token_id = w.hf->config().bos_token_id;
  t.eos_token_id = w.hf->config().eos_token_id;
  t.pad_token_id = w.hf->config().pad_token_id;
  return t;
}

bool same_vocabulary(const TokenizerFiles& a, const TokenizerFiles& b) {
  return !a.vocabulary.empty() && a.vocabulary == b.vocabulary &&
         a.files.at(a.vocabulary) == b.files.at(b.vocabulary);
}

}  // namespace

TokenizerFiles run_tokenizer(const std::string& vocab_file, const WeightSource* init, std::string* note) {
  TokenizerFiles run;
  if (!vocab_file.empty()) {
    // data::TextCodec reads a file named tokenizer.json as a tokenizer, any other as a vocab.json
    run.vocabulary = fs::path(vocab_file).filename() == kTokenizer ? kTokenizer : "vocab.json";
    run.files[run.vocabulary] = read_bytes(vocab_file, "vocabulary");
    // a tokenizer.json's own folder's files (a model folder's, or a preparation's copies of them)
    const fs::path dir = fs::path(vocab_file).parent_path();
    std::error_code ec;
    if (run.vocabulary == kTokenizer)
      for (const char* name : kBeside)
        if (fs::is_regular_file(dir / name, ec))
          run.files[name] = read_bytes((dir / name).string(), "tokenizer file");
  }
  if (!init) return run;
  const TokenizerFiles source = source_tokenizer(*init);
  if (source.empty()) return run;
  if (same_vocabulary(run, source)) {
    carry_tokenizer(run, source);
  } else if (note) {
    *note = "the tokenizer files of model.init_from " + init->path +
            " are not carried into the checkpoints: " +
            (source.vocabulary.empty() ? "it holds no tokenizer.json to compare with the run's vocabulary"
             : run.empty()             ? "the run has no vocabulary (data.vocab) to compare them with"
                           : "the run trains with " + vocab_file + ", not its " + source.vocabulary);
  }
  return run;
}

void carry_tokenizer(TokenizerFiles& run, const TokenizerFiles& source) {
  if (run.empty()) {
    run = source;
    return;
  }
  if (!same_vocabulary(run, source)) return;
  for (const auto& [name, bytes] : source.files) run.files.try_emplace(name, bytes);
  if (!run.bos_token_id) run.bos_token_id = source.bos_token_id;
  if (!run.pad_token_id) run.pad_token_id = source.pad_token_id;
  if (run.eos_token_id.empty()) run.eos_token_id = source.eos_token_id;
}

json write_tokenizer_files(const TokenizerFiles& t, const std::string& dir) {
  json files = json::object();
  for (const auto& [name, bytes] : t.files) {
    NDT_CHECK(allowed_name(name), "checkpoint: '", name, "' is not a tokenizer file name");
    io::write_file_atomic((fs::path(dir) / name).string(), bytes);
    files[name] = {{"bytes", bytes.size()}, {"xxh64", io::hex64(io::xxh64(bytes.data(), bytes.size()))}};
  }
  json j = {{"vocabulary", t.vocabulary}, {"files", files}};
  if (t.bos_token_id) j["bos_token_id"] = *t.bos_token_id;
  if (!t.eos_token_id.empty()) j["eos_token_id"] = t.eos_token_id;
  if (t.pad_token_id) j["pad_token_id"] = *t.pad_token_id;
  return j;
}

namespace {

// checkpoint.json's "tokenizer" object into t: every field checked, each file read and verified.
void read_entry(const json& e, const std::string& dir, const std::string& F, TokenizerFiles& t) {
  auto fail = [&](const std::string& field, const std::string& what) {
    NDT_FAIL("checkpoint ", F, ": \"tokenizer", field.empty() ? "" : "." + field, "\" ", what, kFix);
  };
  if (!e.is_object()) fail("", "is " + e.dump() + ", not an object");
  if (!e.contains("files") || !e["files"].is_object()) fail("files", "is missing or not an object");
  for (const auto& [name, f] : e["files"].items()) {
    if (!allowed_name(name)) fail("files", "lists '" + name + "', which is not a tokenizer file");
    const bool ok = f.is_object() && f.contains("bytes") && f["bytes"].is_number_unsigned() &&
                    f.contains("xxh64") && f["xxh64"].is_string();
    if (!ok) fail("files." + name, "is " + f.dump() + ", not {\"bytes\": N, \"xxh64\": \"...\"}");
    const std::string path = (fs::path(dir) / name).string();
    std::string bytes = read_bytes(path, "checkpoint file");
    NDT_CHECK(bytes.size() == f["bytes"].get<uint64_t>(), "checkpoint file ", path, " has ", bytes.size(),
              " bytes, ", kManifest, " says ", f["bytes"].get<uint64_t>(),
              "; the file is truncated or damaged");
    const std::string got = io::hex64(io::xxh64(bytes.data(), bytes.size()));
    NDT_CHECK(got == f["xxh64"].get<std::string>(), "checkpoint file ", path, " fails its checksum (xxh64 ",
              got, ", ", kManifest, " says ", f["xxh64"].get<std::string>(), "); the file is damaged");
    t.files[name] = std::move(bytes);
  }
  if (!e.contains("vocabulary") || !e["vocabulary"].is_string())
    fail("vocabulary", "is missing or not a string");
  t.vocabulary = e["vocabulary"].get<std::string>();
  if (!t.vocabulary.empty() && !t.files.count(t.vocabulary))
    fail("vocabulary", "names " + t.vocabulary + ", which \"tokenizer.files\" does not list");
  auto id = [&](const json& v, const std::string& field) {
    if (!v.is_number_unsigned()) fail(field, "is " + v.dump() + ", not a token id (an integer >= 0)");
    return static_cast<int64_t>(v.get<uint64_t>());
  };
  if (e.contains("bos_token_id")) t.bos_token_id = id(e["bos_token_id"], "bos_token_id");
  if (e.contains("pad_token_id")) t.pad_token_id = id(e["pad_token_id"], "pad_token_id");
  if (e.contains("eos_token_id")) {
    if (!e["eos_token_id"].is_array())
      fail("eos_token_id", "is " + e["eos_token_id"].dump() + ", not a list");
    for (const json& v : e["eos_token_id"]) t.eos_token_id.push_back(id(v, "eos_token_id"));
  }
}

}  // namespace

TokenizerFiles read_tokenizer_files(const std::string& dir) {
  const std::string F = (fs::path(dir) / kManifest).string();
  std::ifstream in(F);
  NDT_CHECK(in.good(), "checkpoint ", dir, " has no ", kManifest, "; it is incomplete");
  json m;
  try {
    m = parse_json_checked(in, F);
  } catch (const json::exception& e) {
    NDT_FAIL("checkpoint ", F, " is malformed (", e.what(), ")", kFix);
  }
  TokenizerFiles t;
  if (m.is_object() && m.contains("tokenizer")) read_entry(m["tokenizer"], dir, F, t);
  return t;
}

namespace {

// tokenizer_config.json for a tokenizer.json without one: transformers' PreTrainedTokenizerFast
// reads the file as it is (a model class's tokenizer, LlamaTokenizerFast, would rebuild its
// post-processor), text decoded as it is (no clean-up of spaces before punctuation).
std::string plain_tokenizer_config(const tok::Tokenizer* model, const io::HfConfig& c) {
  json j = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"clean_up_tokenization_spaces", false}};
  if (model && c.bos_token_id) j["bos_token"] = model->token_bytes(static_cast<int32_t>(*c.bos_token_id));
  if (model && !c.eos_token_id.empty())
    j["eos_token"] = model->token_bytes(static_cast<int32_t>(c.eos_token_id[0]));
  return j.dump(2) + "\n";
}

std::string plain_generation_config(const io::HfConfig& c) {
  json j = json::object();
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_id.size() == 1) j["eos_token_id"] = c.eos_token_id[0];
  if (c.eos_token_id.size() > 1) j["eos_token_id"] = c.eos_token_id;
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  return j.dump(2) + "\n";
}

}  // namespace

void export_tokenizer(const TokenizerFiles& t, io::HfFolderWriter& w, io::HfConfig& config,
                      std::ostream& note) {
  if (t.vocabulary.empty()) {
    note << "export: the folder has no tokenizer: the checkpoint carries none (written by an older ndtrain, "
            "or by a run without a vocabulary); give generate --tokenizer, and copy the tokenizer's files "
            "in for transformers\n";
    return;
  }
  const std::string& bytes = t.files.at(t.vocabulary);
  std::string tokenizer_json = bytes;
  std::optional<tok::Tokenizer> model;  // a model's tokenizer (not a char or byte vocabulary)
  if (t.vocabulary == "vocab.json") {
    tokenizer_json =
        data::Vocab::parse(bytes, "the checkpoint's vocab.json").to_tokenizer_json().value_or("");
  } else if (!data::Vocab::from_tokenizer_json(bytes, "the checkpoint's tokenizer.json")) {
    model.emplace(tok::Tokenizer::from_json(bytes, "the checkpoint's tokenizer.json"));
  }
  config.bos_token_id = t.bos_token_id;
  config.eos_token_id = t.eos_token_id;
  config.pad_token_id = t.pad_token_id;
  if (model && !t.bos_token_id && t.eos_token_id.empty()) {  // none recorded: those the tokenizer names
    config.bos_token_id = model->bos_id();
    if (model->eos_id()) config.eos_token_id = {*model->eos_id()};
  }
  if (tokenizer_json.empty()) {  // a char vocabulary with bytes that are not UTF-8
    w.add_file("vocab.json", bytes);
    note << "export: transformers cannot load this folder's tokenizer: its char vocabulary holds bytes that "
            "are not UTF-8 (the training text was not), which Hugging Face tokenizers cannot express; "
            "vocab.json is copied for generate\n";
  } else {
    w.add_file(kTokenizer, tokenizer_json);
    if (!t.files.count(kBeside[0]))
      w.add_file(kBeside[0], plain_tokenizer_config(model ? &*model : nullptr, config));
  }
  for (const char* name : kBeside)
    if (t.files.count(name)) w.add_file(name, t.files.at(name));
  if (!t.files.count(kBeside[2])) w.add_file(kBeside[2], plain_generation_config(config));
}

}  // namespace ndt::ckpt
