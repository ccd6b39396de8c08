#include "train/data/preparation.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tensor/error.h"
#include "tokenizer/json_checked.h"
#include "train/data/data.h"
#include "train/io/files.h"

namespace fs = std::filesystem;

namespace ndt::data {
namespace {

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& e) {
  return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
}

// A shard's name as prepare_text writes it, or as the documented globs match it.
bool is_shard_name(const std::string& n) {
  return (starts_with(n, "train_") || starts_with(n, "val_")) && ends_with(n, ".bin");
}

// A shard's sidecar: train_NNNNNN.mask, val_000000.docs.
bool is_sidecar_name(const std::string& n) {
  return (starts_with(n, "train_") || starts_with(n, "val_")) &&
         (ends_with(n, ".mask") || ends_with(n, ".docs"));
}

// What a preparation writes: its shards, vocabulary (and the files beside a tokenizer.json) and
// manifest, or one of them as NAME.tmp.
bool is_preparation_name(std::string n) {
  if (ends_with(n, ".tmp")) n.resize(n.size() - 4);
  for (const char* beside : kBesideTokenizer)
    if (n == beside) return true;
  return is_shard_name(n) || is_sidecar_name(n) || n == "vocab.json" || n == "tokenizer.json" ||
         n == kPreparationFile;
}

// The folder a path names, spelled one way for every path to it ("." for a bare name).
std::string folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  const fs::path canon = fs::weakly_canonical(parent.empty() ? fs::path(".") : parent, ec);
  return ec ? parent.string() : canon.string();
}

// A shard entry's "mask" and "docs" (both or neither), each {"file", "bytes" = the shard's tokens}.
ShardSidecars parse_sidecars(const nlohmann::json& s, const std::string& shard, int64_t tokens) {
  ShardSidecars out;
  for (const char* key : {"mask", "docs"}) {
    NDT_CHECK(s.contains(key) && s[key].is_object() && s[key].contains("file") &&
                  s[key]["file"].is_string() && s[key].contains("bytes") &&
                  s[key]["bytes"].is_number_integer(),
              "shard \"", shard, "\" lists no \"", key, "\" {\"file\", \"bytes\"} beside the other");
    const std::string file = s[key]["file"].get<std::string>();
    NDT_CHECK(is_sidecar_name(file) && file.find('/') == std::string::npos, "shard \"", shard, "\": \"", key,
              "\" file \"", file, "\" is not a sidecar's name (train_*.mask, val_*.docs, ...)");
    NDT_CHECK(s[key]["bytes"].get<int64_t>() == tokens, "shard \"", shard, "\": its ", key, " lists ",
              s[key]["bytes"].get<int64_t>(), " bytes for ", tokens, " tokens (one byte per token)");
    (std::string(key) == "mask" ? out.mask : out.docs) = file;
  }
  out.bytes = tokens;
  return out;
}

// The manifest's JSON into `p`; throws a message without the file's name.
void parse_manifest(const nlohmann::json& j, Preparation& p) {
  auto text = [&](const char* key) {
    NDT_CHECK(j.is_object() && j.contains(key) && j[key].is_string(), "no \"", key, "\" string");
    return j[key].get<std::string>();
  };
  p.id = text("preparation");
  p.vocabulary = text("vocabulary");
  NDT_CHECK(j.contains("shards") && j["shards"].is_array() && !j["shards"].empty(), "no \"shards\" list");
  for (const auto& s : j["shards"]) {
    NDT_CHECK(s.is_object() && s.contains("file") && s["file"].is_string() && s.contains("tokens") &&
                  s["tokens"].is_number_integer(),
              "a shard without its \"file\" name and \"tokens\" count");
    const std::string file = s["file"].get<std::string>();
    NDT_CHECK(is_shard_name(file), "shard \"", file, "\" is not a shard's name (train_*.bin or val_*.bin)");
    p.shards.emplace_back(file, s["tokens"].get<int64_t>());
    if (s.contains("mask") || s.contains("docs"))
      p.sidecars[file] = parse_sidecars(s, file, p.shards.back().second);
  }
  NDT_CHECK(p.vocabulary.empty() || p.vocabulary == "vocab.json" || p.vocabulary == "tokenizer.json",
            "vocabulary \"", p.vocabulary, "\" is neither vocab.json nor tokenizer.json");
}

}  // namespace

int64_t Preparation::tokens_of(const std::string& file_name) const {
  for (const auto& [file, tokens] : shards)
    if (file == file_name) return tokens;
  return -1;
}

const ShardSidecars* Preparation::sidecars_of(const std::string& file_name) const {
  const auto it = sidecars.find(file_name);
  return it == sidecars.end() ? nullptr : &it->second;
}

void write_preparation(const Preparation& p) {
  nlohmann::json j;
  j["preparation"] = p.id;
  j["vocabulary"] = p.vocabulary;
  j["shards"] = nlohmann::json::array();
  for (const auto& [file, tokens] : p.shards) {
    nlohmann::json e = {{"file", file}, {"tokens", tokens}};
    if (const ShardSidecars* sc = p.sidecars_of(file)) {
      e["mask"] = {{"file", sc->mask}, {"bytes", sc->bytes}};
      e["docs"] = {{"file", sc->docs}, {"bytes", sc->bytes}};
    }
    j["shards"].push_back(e);
  }
  io::write_file_atomic((fs::path(p.dir) / kPreparationFile).string(), j.dump(1) + "\n");
}

std::optional<Preparation> read_preparation(const std::string& dir) {
  const fs::path path = fs::path(dir) / kPreparationFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  io::require_regular_file(path.string(), "preparation file");
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  NDT_CHECK(f.good() || f.eof(), "preparation file ", path.string(), ": cannot read it");
  Preparation p;
  p.dir = dir;
  try {
    parse_manifest(parse_json_checked(ss.str(), path.string()), p);
  } catch (const std::exception& e) {
    NDT_FAIL("preparation file ", path.string(), ": ", e.what(),
             "; it is not one prepare_text wrote: prepare the folder again with prepare_text --overwrite");
  }
  return p;
}

std::vector<std::string> preparation_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (is_preparation_name(e.path().filename().string())) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string describe_files(const std::vector<std::string>& names) {
  std::vector<std::string> parts, shards;
  size_t sidecars = 0;  // counted, not named
  for (const std::string& n : names) {
    if (is_sidecar_name(n))
      ++sidecars;
    else
      (is_shard_name(n) ? shards : parts).push_back(n);
  }
  if (shards.size() == 1) parts.push_back("1 shard (" + shards[0] + ")");
  if (shards.size() > 1)
    parts.push_back(std::to_string(shards.size()) + " shards (" + shards.front() + " ... " + shards.back() +
                    ")");
  if (sidecars) parts.push_back(std::to_string(sidecars) + " mask and document files (.mask, .docs)");
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i)
    s += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
  return s;
}

std::optional<Preparation> preparation_of(const std::vector<std::string>& paths) {
  std::map<std::string, std::optional<Preparation>> folders;  // folder -> its manifest
  std::optional<Preparation> found;
  std::string found_shard, bare_shard;  // the first shard of `found`, of a folder without one
  for (const std::string& path : paths) {
    const std::string folder = folder_of(path);
    if (!folders.count(folder)) folders[folder] = read_preparation(fs::path(path).parent_path().string());
    const std::optional<Preparation>& p = folders[folder];
    const std::string name = fs::path(path).filename().string();
    if (p && p->tokens_of(name) < 0)
      NDT_FAIL("data shard ", path, " is not one of the ", p->shards.size(), " shards that ",
               (fs::path(p->dir) / kPreparationFile).string(),
               " lists: it is left from another preparation or was added by hand; remove it, or "
               "prepare the folder again with prepare_text --overwrite");
    if (!p && bare_shard.empty()) bare_shard = path;
    if (p && !found) {
      found = p;
      found_shard = path;
    }
    if (p && folder_of(found_shard) != folder)
      NDT_FAIL("data shards ", found_shard, " and ", path, " come from two preparations (",
               (fs::path(found->dir) / kPreparationFile).string(), ": ", found->id, ", ",
               (fs::path(p->dir) / kPreparationFile).string(), ": ", p->id,
               "); a run reads one preparation's shards: point data.train and data.val at one folder, or "
               "prepare all the text in one prepare_text run");
    if (found && !bare_shard.empty())
      NDT_FAIL("data shards ", found_shard, " and ", bare_shard, " come from two preparations (",
               (fs::path(found->dir) / kPreparationFile).string(), ": ", found->id, "; the folder of ",
               bare_shard,
               " has no preparation.json: its shards were made elsewhere); a run reads one "
               "preparation's shards: point data.train and data.val at one folder");
  }
  return found;
}

std::optional<Preparation> preparation_of(const std::string& train_glob, const std::string& val_glob) {
  std::vector<std::string> shards = glob_paths(train_glob);
  if (!val_glob.empty())
    for (const std::string& p : glob_paths(val_glob)) shards.push_back(p);
  return preparation_of(shards);
}

}  // namespace ndt::data
