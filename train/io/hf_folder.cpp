#include "train/io/hf_folder.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "train/io/files.h"

namespace ndt::io {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* kConfig = "config.json";
const char* kSingle = "model.safetensors";
const char* kIndex = "model.safetensors.index.json";

// ---- folders ---------------------------------------------------------------------------

// DIR without trailing separators ("out/" -> "out"), so that parent_path() is its parent.
fs::path clean_dir(const std::string& dir) {
  NDT_CHECK(!dir.empty(), "Hugging Face model folder: empty path");
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return p;
}

// A shard name from an index: a plain file name in the folder (no path, no "..").
bool plain_file_name(const std::string& f) {
  return !f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos &&
         f.find('\0') == std::string::npos;
}

const std::regex& shard_name_pattern() {
  static const std::regex re("model-[0-9]{5}-of-[0-9]{5}\\.safetensors");
  return re;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// Filesystem calls with messages naming what was being done.
template <typename F>
void fs_do(const std::string& what, F&& f) {
  try {
    f();
  } catch (const fs::filesystem_error& e) {
    NDT_FAIL("writing a Hugging Face model folder: ", what, " failed (", e.code().message(), ")");
  }
}

}  // namespace

HfFolder::HfFolder(const std::string& dir) : dir_(clean_dir(dir).string()) {
  const fs::path d(dir_);
  std::error_code ec;
  NDT_CHECK(fs::is_directory(d, ec), dir_, " is not a Hugging Face model folder: ",
            fs::exists(d, ec) ? "not a directory" : "it does not exist");
  NDT_CHECK(fs::exists(d / kConfig, ec), dir_, " is not a Hugging Face model folder: no config.json");
  config_ = read_hf_config((d / kConfig).string());

  const bool single = fs::exists(d / kSingle, ec), indexed = fs::exists(d / kIndex, ec);
  NDT_CHECK(!(single && indexed), dir_, " has both ", kSingle, " and ", kIndex,
            "; one of them is left from another export: remove it (transformers would read ", kSingle, ")");
  if (!single && !indexed) {
    const bool bin =
        fs::exists(d / "pytorch_model.bin", ec) || fs::exists(d / "pytorch_model.bin.index.json", ec);
    NDT_FAIL(dir_, " has no weights: neither ", kSingle, " nor ", kIndex,
             bin ? " (it has pytorch_model.bin: ndtrain reads safetensors only; convert the folder with "
                   "transformers' save_pretrained(..., safe_serialization=True))"
                 : "");
  }
  if (single) {
    shards_.push_back(std::make_unique<SafeTensorsReader>((d / kSingle).string()));
    for (auto& [name, e] : shards_[0]->entries()) where_[name] = 0;
    return;
  }

  // sharded: the index's weight_map names each tensor's file
  const std::string index_path = (d / kIndex).string();
  const json index = parse_json_object(read_text(index_path, "weight index"), index_path);
  auto it = index.find("weight_map");
  NDT_CHECK(it != index.end() && it->is_object(), index_path,
            ": no \"weight_map\" object (tensor name -> file)");
  std::map<std::string, std::string> listed;  // tensor -> shard file
  std::map<std::string, size_t> file_no;      // shard file -> index in shards_ (sorted: shard order)
  for (auto& [name, f] : it->items()) {
    NDT_CHECK(f.is_string(), index_path, ": weight_map['", name, "'] must be a file name, got ", show(f));
    const std::string file = f.get<std::string>();
    NDT_CHECK(plain_file_name(file), index_path, ": weight_map['", name, "'] = '", file,
              "' is not a file name in the folder");
    NDT_CHECK(file_no.count(file) || fs::exists(d / file, ec), index_path, " lists ", file, " (for '", name,
              "'), which is not in ", dir_);
    listed[name] = file;
    file_no[file] = 0;
  }
  for (auto& [file, no] : file_no) {
    no = shards_.size();
    shards_.push_back(std::make_unique<SafeTensorsReader>((d / file).string()));
  }
  // every tensor of every shard once, and where the index says it is
  for (size_t s = 0; s < shards_.size(); ++s) {
    for (auto& [name, e] : shards_[s]->entries()) {
      NDT_CHECK(!where_.count(name), dir_, ": tensor '", name, "' is in both ", shards_[where_[name]]->path(),
                " and ", shards_[s]->path());
      auto l = listed.find(name);
      NDT_CHECK(l != listed.end(), shards_[s]->path(), " holds '", name, "', which ", index_path,
                " does not list");
      NDT_CHECK(file_no[l->second] == s, index_path, " puts '", name, "' in ", l->second, " but it is in ",
                shards_[s]->path());
      where_[name] = s;
    }
  }
  for (auto& [name, file] : listed)
    NDT_CHECK(where_.count(name), index_path, " puts '", name, "' in ", file, ", which does not contain it");
}

size_t HfFolder::shard_of(const std::string& name) const {
  auto it = where_.find(name);
  NDT_CHECK(it != where_.end(), "no tensor '", name, "' in the Hugging Face model folder ", dir_, " (",
            where_.size(), " tensors)");
  return it->second;
}

const SafeTensorsReader::Entry& HfFolder::entry(const std::string& name) const {
  return shards_[shard_of(name)]->entries().at(name);
}

const SafeTensorsReader& HfFolder::reader(const std::string& name) const { return *shards_[shard_of(name)]; }

Tensor HfFolder::get(const std::string& name, DType dtype) const {
  Tensor t = reader(name).get(name, dtype);
  const SafeTensorsReader::Entry& e = entry(name);
  bytes_read_ += static_cast<int64_t>(e.end - e.begin);
  return t;
}

void HfFolder::read_range(const std::string& name, int64_t begin, const Tensor& dst) const {
  reader(name).read_range(name, begin, dst);  // checks the range against the tensor
  const SafeTensorsReader::Entry& e = entry(name);
  const int64_t n = numel_of(e.shape);  // > 0: the range above held dst's elements
  if (n > 0) bytes_read_ += dst.numel() * static_cast<int64_t>(e.end - e.begin) / n;
}

std::vector<std::string> HfFolder::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (auto& [name, s] : where_) out.push_back(name);
  return out;
}

std::vector<std::string> HfFolder::files() const {
  std::vector<std::string> out;
  for (auto& s : shards_) out.push_back(s->path());
  return out;
}

// ---- HfFolderWriter ------------------------------------------------------------------------

namespace {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// One export's files: the tensors of each shard (indices into the writer's list) and its file.
struct ShardPlan {
  std::vector<std::vector<size_t>> shards;
  std::vector<std::string> files;  // one per shard
  int64_t total = 0;               // bytes of all tensors
  bool sharded() const { return shards.size() > 1; }
};

// Shards as huggingface_hub's split_state_dict_into_shards_factory cuts them.
ShardPlan plan_shards(const NamedTensors& tensors, int64_t max_shard_bytes) {
  ShardPlan p;
  std::vector<size_t> current;
  int64_t current_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t b = static_cast<int64_t>(tensors[i].second.nbytes());
    p.total += b;
    if (b > max_shard_bytes) {
      p.shards.push_back({i});
      continue;
    }
    if (current_bytes + b > max_shard_bytes) {
      p.shards.push_back(current);
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += b;
  }
  if (!current.empty() || p.shards.empty()) p.shards.push_back(current);
  for (size_t s = 0; s < p.shards.size(); ++s)
    p.files.push_back(p.sharded() ? shard_name(s, p.shards.size()) : kSingle);
  return p;
}

// model.safetensors.index.json's text; empty when there is one shard.
std::string index_json(const ShardPlan& p, const NamedTensors& tensors) {
  if (!p.sharded()) return "";
  json wm = json::object();
  for (size_t s = 0; s < p.shards.size(); ++s)
    for (size_t i : p.shards[s]) wm[tensors[i].first] = p.files[s];
  // as transformers' save_pretrained: json.dumps(index, indent=2, sort_keys=True) + "\n"
  return json{{"metadata", {{"total_size", p.total}}}, {"weight_map", wm}}.dump(2) + "\n";
}

// Everything one export writes, ready to go to disk.
struct Export {
  const NamedTensors& tensors;
  ShardPlan plan;
  std::string config_text, index_text;
  const std::map<std::string, std::string>& files;  // HfFolderWriter::add_file's

  // Every file into `to`, each written atomically.
  void write_all(const fs::path& to) const {
    for (size_t s = 0; s < plan.shards.size(); ++s) {
      SafeTensorsWriter w;
      w.metadata["format"] = "pt";  // transformers refuses safetensors files without it
      for (size_t i : plan.shards[s]) w.add(tensors[i].first, tensors[i].second);
      w.write((to / plan.files[s]).string());
    }
    write_file_atomic((to / kConfig).string(), config_text);
    for (const auto& [name, bytes] : files) write_file_atomic((to / name).string(), bytes);
    if (plan.sharded()) write_file_atomic((to / kIndex).string(), index_text);
    fsync_dir(to.string());
  }

  // Every file into a fresh folder `tmp`, which is removed if that fails.
  void stage(const fs::path& tmp) const {
    fs_do("preparing " + tmp.string(), [&] {
      fs::remove_all(tmp);
      fs::create_directories(tmp);
    });
    try {
      write_all(tmp);
    } catch (...) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      throw;
    }
  }
};

// A new folder: built whole beside its final name, then renamed into place.
void write_new_folder(const fs::path& d, const Export& out) {
  fs::path tmp = d;
  tmp += ".ndt-partial";
  if (d.has_parent_path())
    fs_do("creating " + d.parent_path().string(), [&] { fs::create_directories(d.parent_path()); });
  out.stage(tmp);
  fs_do("renaming " + tmp.string() + " to " + d.string(), [&] { fs::rename(tmp, d); });
  fsync_dir(d.has_parent_path() ? d.parent_path().string() : ".");
}

// An existing folder: stage inside it, then swap the files of our names in, entry point last.
void replace_in_folder(const fs::path& d, const Export& out) {
  const fs::path tmp = d / ".ndt-partial";
  out.stage(tmp);
  const std::vector<std::string>& files = out.plan.files;
  const std::string entry = out.plan.sharded() ? kIndex : kSingle;
  // a file of the folder that is a symlink (a Hugging Face cache snapshot) keeps its link: its
  // target is replaced
  auto at = [&](const std::string& f) { return fs::path(output_target((d / f).string())); };
  fs_do("replacing the weights in " + d.string(), [&] {
    fs::remove(at(kIndex));
    fs::remove(at(kSingle));
    for (const std::string& f : files)
      if (f != entry) fs::rename(tmp / f, at(f));
    fs::rename(tmp / kConfig, at(kConfig));
    for (const auto& [name, bytes] : out.files) fs::rename(tmp / name, at(name));
    fsync_dir(d.string());
    fs::rename(tmp / entry, at(entry));
    fsync_dir(d.string());
    // shards of an earlier export that this one does not use
    const std::set<std::string> ours(files.begin(), files.end());
    for (const auto& e : fs::directory_iterator(d)) {
      const std::string name = e.path().filename().string();
      if (!ours.count(name) && std::regex_match(name, shard_name_pattern())) fs::remove(e.path());
    }
    fs::remove_all(tmp);
    fsync_dir(d.string());
  });
}

}  // namespace

void HfFolderWriter::add(const std::string& name, const Tensor& t) {
  NDT_CHECK(!name.empty() && name != "__metadata__", "HfFolderWriter: tensor name '", name, "' is reserved");
  for (auto& [n, _] : tensors_) NDT_CHECK(n != name, "HfFolderWriter: tensor '", name, "' added twice");
  tensors_.emplace_back(name, t.to(Device::cpu()).contiguous());
}

void HfFolderWriter::add_file(const std::string& name, const std::string& bytes) {
  const bool weights = name == kSingle || name == kIndex || std::regex_match(name, shard_name_pattern());
  NDT_CHECK(plain_file_name(name) && name != kConfig && !weights && name != ".ndt-partial",
            "HfFolderWriter: '", name, "' cannot be added as a file of the folder");
  NDT_CHECK(files_.emplace(name, bytes).second, "HfFolderWriter: file '", name, "' added twice");
}

void HfFolderWriter::write(const std::string& dir, const HfConfig& config, int64_t max_shard_bytes) const {
  NDT_CHECK(max_shard_bytes > 0, "HfFolderWriter::write: max_shard_bytes must be positive, got ",
            max_shard_bytes);
  const fs::path d = output_target(clean_dir(dir).string());  // a link to a folder: the folder
  const std::string config_text = to_json(config);  // refuses a bad config before anything is written
  const ShardPlan plan = plan_shards(tensors_, max_shard_bytes);
  const Export out{tensors_, plan, config_text, index_json(plan, tensors_), files_};

  std::error_code ec;
  if (!fs::exists(d, ec)) {
    write_new_folder(d, out);
    return;
  }
  NDT_CHECK(fs::is_directory(d, ec), "cannot write a Hugging Face model folder at ", d.string(),
            ": it exists and is not a directory");
  replace_in_folder(d, out);
}

}  // namespace ndt::io
