#include "train/checkpoint/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tensor/kernels.h"
#include "tokenizer/json_checked.h"
#include "train/checkpoint/lora.h"
#include "train/guard.h"
#include "train/io/files.h"
#include "train/io/safetensors.h"

namespace fs = std::filesystem;

namespace ndt::ckpt {
namespace {

constexpr const char* kPrefix = "transformer.";
constexpr const char* kManifest = "checkpoint.json";
constexpr const char* kFiles[] = {"model.safetensors", "state.safetensors"};

bool ignored_name(const std::string& n) {
  auto ends = [&](const std::string& s) {
    return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias");
}

// wte (and an untied lm_head) is stored padded in memory (Vp rows) but saved with vocab_size rows.
Shape saved_shape(const models::GPT& gpt, const nn::FlatParam& p) {
  Shape s = p.spec.global_shape();
  if (models::GPT::vocab_rows(p.spec.name)) s[0] = gpt.cfg.vocab_size;
  return s;
}

}  // namespace

namespace {
// Parameter `name` in the master dtype, a view of unsharded params: its value, or with
// mixed precision its slice of the master buffer (the value is the compute copy).
Tensor master_value(const nn::FlatParams& params, const std::string& name, const char* op) {
  for (const nn::FlatUnit& u : params.units)
    for (const nn::FlatParam& p : u.params) {
      if (p.spec.name != name) continue;
      NDT_CHECK(!u.sharded(), op, ": unit ", u.name, " is sharded (use the _local / sharded functions)");
      return u.mixed() ? u.data.narrow(0, p.offset, numel_of(p.spec.shape)).view(p.spec.shape) : p.value;
    }
  NDT_FAIL(op, ": parameter ", name, " is not materialized");
}
}  // namespace

void save_weights(const std::string& path, const models::GPT& gpt, const nn::FlatParams& params,
                  const std::map<std::string, std::string>& metadata) {
  io::SafeTensorsWriter w;
  for (const nn::ParamSpec& spec : gpt.parameters()) {  // HF order
    Tensor v = master_value(params, spec.name, "save_weights");
    if (models::GPT::vocab_rows(spec.name)) v = v.narrow(0, 0, gpt.cfg.vocab_size);
    w.add(spec.name, v);
  }
  w.metadata = metadata;
  w.metadata["format"] = "pt";
  w.write(path);
}

// Checks a weights file against the model (names, with or without "transformer." but not
// both; the whole shapes) and returns our name -> the file's name; lm_head (if present) in *lm_head.
// The file holds the whole model; under pipeline parallelism `gpt` is one stage's part of it,
// whose units name what it reads (the other stages' parameters in the file are not its own).
static std::map<std::string, std::string> match_weights(const io::SafeTensorsReader& r,
                                                        const std::string& path, const models::GPT& gpt,
                                                        const nn::FlatParams& params,
                                                        std::string* lm_head_out) {
  std::set<std::string> expected, model;  // this rank's parameters; the whole model's
  for (const nn::UnitSpec& u : gpt.units())
    for (const nn::ParamSpec& spec : u.params) expected.insert(spec.name);
  std::optional<models::GPT> whole;  // described only
  if (!gpt.part().whole()) whole.emplace(gpt.cfg);
  for (const nn::ParamSpec& spec : (whole ? *whole : gpt).parameters()) model.insert(spec.name);
  // Map file names (with or without the "transformer." prefix) to our names.
  std::map<std::string, std::string> ours_to_file;
  std::vector<std::string> extra, problems;
  std::string lm_head;
  for (auto& [fname, e] : r.entries()) {
    std::string n = fname.rfind(kPrefix, 0) == 0 ? fname.substr(std::string(kPrefix).size()) : fname;
    if (ignored_name(n)) continue;
    // "X" and "transformer.X" are one parameter: a file holding both would load one of
    // them and silently drop the other
    auto duplicate = [&](const std::string& first) {
      NDT_FAIL("weights ", path, ": holds both ", first, " and ", fname, ", which name the same parameter ",
               n, " (with and without the \"", kPrefix, "\" prefix); keep one of them");
    };
    if (n == "lm_head.weight" && !model.count(n)) {  // GPT-2's (tied) head; an untied llama's is its own
      if (!lm_head.empty()) duplicate(lm_head);
      lm_head = fname;
      continue;
    }
    if (!model.count(n)) {
      extra.push_back(fname);
      continue;
    }
    if (auto [it, fresh] = ours_to_file.emplace(n, fname); !fresh) duplicate(it->second);
  }
  std::vector<std::string> missing;
  for (const std::string& n : expected) {
    auto it = ours_to_file.find(n);
    if (it == ours_to_file.end()) {
      missing.push_back(n);
      continue;
    }
    const nn::FlatParam* p = params.find(n);
    const Shape want = saved_shape(gpt, *p);
    const Shape got = r.entries().at(it->second).shape;
    if (got != want)
      problems.push_back(it->second + " has shape " + shape_str(got) + ", the model needs " +
                         shape_str(want));
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 6; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > 6) s += ", ... (" + std::to_string(v.size()) + " in all)";
    return s;
  };
  NDT_CHECK(missing.empty(), "weights ", path, ": missing tensors: ", join(missing),
            "; does the file match model.n_layer/n_embd/vocab_size (", gpt.cfg.str(), ")?");
  NDT_CHECK(extra.empty(), "weights ", path, ": unexpected tensors: ", join(extra), "; the model is ",
            gpt.cfg.str());
  NDT_CHECK(problems.empty(), "weights ", path, ": ", join(problems), "; the model is ", gpt.cfg.str());
  if (!lm_head.empty() && ours_to_file.count("wte.weight"))
    NDT_CHECK(r.entries().at(lm_head).shape == r.entries().at(ours_to_file["wte.weight"]).shape, "weights ",
              path, ": lm_head.weight differs in shape from wte.weight; ndtrain ties them");
  *lm_head_out = lm_head;
  std::erase_if(ours_to_file, [&](const auto& e) { return !expected.count(e.first); });  // other stages'
  return ours_to_file;
}

void load_weights(const std::string& path, const models::GPT& gpt, const nn::FlatParams& params) {
  // model.safetensors of one of our checkpoints: check it against the checkpoint's checksums
  const fs::path manifest = fs::path(path).parent_path() / kManifest;
  if (fs::path(path).filename() == kFiles[0] && fs::exists(manifest))
    verify_checkpoint(fs::path(path).parent_path().string(), {kFiles[0]});
  io::SafeTensorsReader r(path);
  std::string lm_head;
  std::map<std::string, std::string> ours_to_file = match_weights(r, path, gpt, params, &lm_head);
  if (!lm_head.empty()) {
    std::vector<float> a = r.get(lm_head).to_vector<float>(),
                       b = r.get(ours_to_file["wte.weight"]).to_vector<float>();
    NDT_CHECK(a == b, "weights ", path,
              ": lm_head.weight differs from wte.weight; ndtrain ties them (GPT-2 does too)");
  }
  // Read and check every value before copying any.
  std::map<std::string, Tensor> values;
  for (auto& [n, fname] : ours_to_file) {
    Tensor src = r.get(fname, master_value(params, n, "load_weights").dtype());
    for (float x : src.to_vector<float>())
      NDT_CHECK(std::isfinite(x), "weights ", path, ": tensor ", fname, " holds ",
                std::isnan(x) ? "NaN" : "Inf",
                " values; the file is damaged or was saved from a diverged run");
    values[n] = src;
  }
  for (auto& [n, src] : values) {
    Tensor dst = master_value(params, n, "load_weights");
    if (models::GPT::vocab_rows(n)) {
      kernels::fill(dst, 0.0);  // padded rows stay zero
      dst = dst.narrow(0, 0, gpt.cfg.vocab_size);
    }
    dst.copy_(src);
  }
  params.refresh_compute();  // mixed precision: the compute copies of what was loaded
}

std::optional<int64_t> step_of(const std::string& name) {
  if (name.size() <= 5 || name.rfind("step_", 0) != 0 || name.size() > 5 + 18) return std::nullopt;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

namespace {

// The newest complete step_* directory of dir (its manifest is written last, before the
// directory is renamed into place), by step number; nullopt when there is none.
std::optional<std::pair<int64_t, fs::path>> newest_complete(const fs::path& dir) {
  std::optional<std::pair<int64_t, fs::path>> newest;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code kind;
    const std::optional<int64_t> n = step_of(it->path().filename().string());
    if (n && it->is_directory(kind) && fs::exists(it->path() / kManifest, kind) &&
        (!newest || *n > newest->first))
      newest = {{*n, it->path()}};
  }
  return newest;
}

}  // namespace

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  const fs::path lp = fs::path(dir) / "latest";
  std::error_code ec;
  // `latest` is written after its checkpoint is renamed into place: a crash in between
  // leaves it missing (the first checkpoint) or naming the one before. The newest complete
  // checkpoint wins either way.
  const std::optional<std::pair<int64_t, fs::path>> newest = newest_complete(dir);
  if (!fs::exists(lp, ec)) return newest ? std::optional<std::string>(newest->second.string()) : std::nullopt;
  NDT_CHECK(fs::is_regular_file(lp, ec), "checkpoint ", lp.string(),
            " is not a file; it should hold the name of a step_* directory (remove it to start over)");
  std::ifstream f(lp);
  NDT_CHECK(f.good(), "checkpoint ", lp.string(), ": cannot read");
  std::string name;
  std::getline(f, name);
  NDT_CHECK(!name.empty(), "checkpoint ", lp.string(),
            " is empty; it should name a step_* directory (point it at the newest complete one)");
  NDT_CHECK(step_of(name).has_value(), "checkpoint ", lp.string(), " is malformed ('", name,
            "'); it should name a step_* directory such as step_00000100");
  const fs::path p = fs::path(dir) / name;
  if (newest && newest->first > *step_of(name)) return newest->second.string();  // latest is behind
  NDT_CHECK(fs::is_directory(p, ec), "checkpoint ", lp.string(), " names ", name, ", which does not exist");
  return p.string();
}

void verify_checkpoint(const std::string& path, const std::vector<std::string>& only) {
  const fs::path mp = fs::path(path) / kManifest;
  std::ifstream f(mp);
  NDT_CHECK(f.good(), "checkpoint ", path, " has no ", kManifest,
            " (the checksums of its files); it is incomplete or was written by an older ndtrain");
  nlohmann::json m;
  try {
    m = parse_json_checked(f, mp.string());
    NDT_CHECK(m.is_object() && m.contains("files") && m["files"].is_object(), "no \"files\" object");
    std::vector<std::string> names(std::begin(kFiles), std::end(kFiles));
    if (m.value("format", "full") == "sharded") {  // one file per writing rank, all listed
      names.clear();
      for (auto& [name, e] : m["files"].items()) names.push_back(name);
    }
    for (const std::string& name : only)  // a file that is not listed has no checksum to trust
      NDT_CHECK(std::find(names.begin(), names.end(), name) != names.end(), "checkpoint ", path, ": ",
                kManifest, " does not list ", name, "; the file is not part of this checkpoint");
    for (const std::string& name : names) {
      if (!only.empty() && std::find(only.begin(), only.end(), name) == only.end()) continue;
      NDT_CHECK(m["files"].contains(name), "no entry for ", name);
      const auto& e = m["files"][name];
      verify_file(path, name, e.at("bytes").get<uint64_t>(), e.at("xxh64").get<std::string>());
    }
  } catch (const nlohmann::json::exception& e) {
    NDT_FAIL("checkpoint ", mp.string(), " is malformed (", e.what(), ")");
  }
}

void verify_file(const std::string& dir, const std::string& name, uint64_t bytes, const std::string& xxh64) {
  const std::string file = (fs::path(dir) / name).string();
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  NDT_CHECK(!ec, "checkpoint file ", file, " is missing (", ec.message(), ")");
  NDT_CHECK(size == bytes, "checkpoint file ", file, " has ", size, " bytes, ", kManifest, " says ", bytes,
            "; the file is truncated or damaged");
  const std::string got = io::hex64(io::file_xxh64(file));
  NDT_CHECK(got == xxh64, "checkpoint file ", file, " fails its checksum (xxh64 ", got, ", ", kManifest,
            " says ", xxh64, "); the file is damaged");
}

namespace {

// state.safetensors of a full checkpoint: the AdamW moments of each unit of the single-process
// layout `units` (checked: present, whole-buffer shaped) and the step, data position and
// AdamW steps from its metadata. Throws one line naming what is missing or malformed.
TrainState read_state(const io::SafeTensorsReader& st, const std::string& path,
                      const std::vector<nn::FlatUnit>& units, int64_t* adam_steps) {
  for (const nn::FlatUnit& w : units)
    for (const char* k : {"adam.m.", "adam.v."}) {
      const std::string n = k + w.name;
      NDT_CHECK(st.has(n), "checkpoint ", path, ": optimizer state lacks ", n,
                "; the model differs from the checkpoint's");
      NDT_CHECK(st.entries().at(n).shape == Shape{w.numel}, "checkpoint ", path, ": ", n, " has shape ",
                shape_str(st.entries().at(n).shape), ", the model needs (", w.numel,
                "); the model config differs from the checkpoint's");
    }
  auto meta_int = [&](const char* key) -> int64_t {
    auto it = st.metadata().find(key);
    NDT_CHECK(it != st.metadata().end(), "checkpoint ", path, ": state lacks '", key, "'");
    try {
      return std::stoll(it->second);
    } catch (...) {
      NDT_FAIL("checkpoint ", path, ": state '", key, "' is not a number");
    }
  };
  TrainState s;
  s.step = meta_int("step");
  s.loader.epoch = meta_int("loader_epoch");
  s.loader.window = meta_int("loader_window");
  *adam_steps = meta_int("adam_steps");
  s.extra = st.metadata();
  return s;
}

}  // namespace

std::string save_checkpoint(const std::string& dir, const models::GPT& gpt, const nn::FlatParams& params,
                            const optim::AdamW& opt, const TrainState& state, int keep, PruneLog* prune_log) {
  for (const nn::FlatUnit& u : params.units)
    NDT_CHECK(!u.sharded(), "save_checkpoint: unit ", u.name, " is sharded; pass its gathered Moments");
  return save_checkpoint(dir, gpt, params, Moments{opt.m(), opt.v(), opt.steps_taken()}, state, keep,
                         prune_log);
}

std::string save_checkpoint(const std::string& dir, const models::GPT& gpt, const nn::FlatParams& params,
                            const Moments& opt, const TrainState& state, int keep, PruneLog* prune_log) {
  NDT_CHECK(opt.m.size() == params.units.size() && opt.v.size() == params.units.size(),
            "save_checkpoint: one m and one v per unit");
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(state.step));
  const std::string bad = train::first_nonfinite_param(params);
  NDT_CHECK(bad.empty(), "checkpoint of step ", state.step, " not written: parameter ", bad,
            " is not finite; the previous checkpoint is kept");
  fs::create_directories(dir);
  const fs::path tmp_dir = fs::path(dir) / (std::string(".tmp_") + name);
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  const std::map<std::string, std::string> step{{"step", std::to_string(state.step)}};
  if (gpt.has_lora())  // a LoRA run's: its adapters (train/checkpoint/lora.h)
    save_adapters((tmp_dir / "model.safetensors").string(), params, step);
  else
    save_weights((tmp_dir / "model.safetensors").string(), gpt, params, step);
  io::SafeTensorsWriter w;
  for (size_t i = 0; i < params.units.size(); ++i) {
    const int64_t n = params.units[i].numel;  // without the shard padding
    w.add("adam.m." + params.units[i].name, opt.m[i].narrow(0, 0, n));
    w.add("adam.v." + params.units[i].name, opt.v[i].narrow(0, 0, n));
  }
  w.metadata = state.extra;
  w.metadata["step"] = std::to_string(state.step);
  w.metadata["adam_steps"] = std::to_string(opt.steps);
  w.metadata["loader_epoch"] = std::to_string(state.loader.epoch);
  w.metadata["loader_window"] = std::to_string(state.loader.window);
  w.write((tmp_dir / "state.safetensors").string());
  // The checksums, last: a checkpoint directory without them was never completed.
  nlohmann::json m = {{"step", state.step}, {"files", nlohmann::json::object()}};
  for (const char* f : kFiles) {
    const std::string fp = (tmp_dir / f).string();
    m["files"][f] = {{"bytes", fs::file_size(fp)}, {"xxh64", io::hex64(io::file_xxh64(fp))}};
  }
  if (!state.tokenizer.empty()) m["tokenizer"] = write_tokenizer_files(state.tokenizer, tmp_dir.string());
  io::write_file_atomic((tmp_dir / kManifest).string(), m.dump(1) + "\n");
  return publish_checkpoint(dir, name, tmp_dir.string(), keep, prune_log);
}

namespace {

// Deletes all but the newest `keep` step_* directories of dir (by step number: names sort
// wrongly past 8 digits), never `current`. What cannot be deleted is a warning (PruneLog).
void prune(const fs::path& dir, const fs::path& current, int keep, PruneLog* log) {
  auto warn = [&](const fs::path& path, const std::error_code& ec) {
    if (log && !log->reported.insert(path.string()).second) return;  // said once already
    std::ostream& out = log && log->out ? *log->out : std::cerr;
    out << "warning: checkpoint.keep = " << keep << ": cannot delete the old checkpoint " << path.string()
        << " (" << ec.message() << "); it stays on disk and training goes on" << std::endl;
  };
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code kind;
    if (auto n = step_of(it->path().filename().string()); n && it->is_directory(kind))
      steps.push_back({*n, it->path()});
  }
  if (ec) return warn(dir, ec);
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + keep < steps.size(); ++i) {
    if (steps[i].second == current) continue;
    if (fs::remove_all(steps[i].second, ec); ec) warn(steps[i].second, ec);
  }
}

}  // namespace

std::string publish_checkpoint(const std::string& dir, const std::string& name, const std::string& tmp,
                               int keep, PruneLog* prune_log) {
  const fs::path tmp_dir(tmp), final_dir = fs::path(dir) / name;
  io::fsync_dir(tmp_dir.string());
  // Move into place; an existing directory of the same step is replaced only after the new one is complete.
  const fs::path old_dir = fs::path(dir) / (std::string(".old_") + name);
  fs::remove_all(old_dir);
  if (fs::exists(final_dir)) fs::rename(final_dir, old_dir);
  fs::rename(tmp_dir, final_dir);
  fs::remove_all(old_dir);
  io::fsync_dir(dir);
  io::write_file_atomic((fs::path(dir) / "latest").string(), std::string(name) + "\n");
  io::fsync_dir(dir);
  if (keep > 0) prune(dir, final_dir, keep, prune_log);
  return final_dir.string();
}

TrainState load_checkpoint(const std::string& path, const models::GPT& gpt, const nn::FlatParams& params,
                           optim::AdamW& opt) {
  for (const nn::FlatUnit& u : params.units)
    NDT_CHECK(!u.sharded(), "load_checkpoint: unit ", u.name, " is sharded; load whole Moments");
  Moments m;
  TrainState s = load_checkpoint(path, gpt, params, m);
  for (size_t i = 0; i < params.units.size(); ++i) {
    opt.m()[i].copy_(m.m[i]);
    opt.v()[i].copy_(m.v[i]);
  }
  opt.set_steps_taken(m.steps);
  return s;
}

TrainState load_checkpoint(const std::string& path, const models::GPT& gpt, const nn::FlatParams& params,
                           Moments& opt) {
  const fs::path dir(path);
  verify_checkpoint(path);  // every file against its checksum, before anything is read
  io::SafeTensorsReader st((dir / "state.safetensors").string());
  NDT_CHECK(is_lora_state(st.metadata()) == gpt.has_lora(), "checkpoint ", path,
            is_lora_state(st.metadata())
                ? " holds LoRA adapters (lora.rank = " + st.metadata().at("lora.rank") +
                      "); resume it with its [lora] settings and model.init_from"
                : " holds a whole model, not LoRA adapters; resume it without [lora] (lora.rank "
                  "= 0), or start the LoRA run in a new checkpoint.dir");
  int64_t adam_steps = 0;
  TrainState s = read_state(st, path, params.units, &adam_steps);  // validated before touching anything
  s.tokenizer = read_tokenizer_files(path);
  if (gpt.has_lora())
    load_adapters((dir / "model.safetensors").string(), params);
  else
    load_weights((dir / "model.safetensors").string(), gpt, params);
  opt.m.clear();
  opt.v.clear();
  for (const nn::FlatUnit& u : params.units) {
    opt.m.push_back(st.get("adam.m." + u.name, u.data.dtype()));
    opt.v.push_back(st.get("adam.v." + u.name, u.data.dtype()));
  }
  opt.steps = adam_steps;
  return s;
}

// ---- RAM-efficient loading: each rank reads only its own elements -------------------------

namespace {

void for_each_local_run(const nn::FlatUnit& u, const nn::FlatParam& p,
                        const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  nn::for_each_shard_run(u, p, fn);
}

void check_finite(const Tensor& t, const std::string& path, const std::string& name) {
  if (const char* kind = non_finite_kind(t))
    NDT_FAIL("weights ", path, ": tensor ", name, " holds ", kind,
             " values; the file is damaged or was saved from a diverged run");
}

// Calls fn(unit, offset in the shard, the file's tensor, element index in it, length) for
// every piece of this rank's elements, pieces of at most 256K elements (reading a piece at a
// time keeps the memory that loading adds to a few MiB).
constexpr int64_t kPiece = int64_t(1) << 18;

template <typename F>
void for_each_piece(const io::SafeTensorsReader& r, const nn::FlatParams& params,
                    const std::map<std::string, std::string>& ours_to_file, F&& fn) {
  for (size_t i = 0; i < params.units.size(); ++i)
    for (const nn::FlatParam& p : params.units[i].params) {
      const std::string& fname = ours_to_file.at(p.spec.name);
      const int64_t file_numel = numel_of(r.entries().at(fname).shape);  // wte: without padding rows
      for_each_local_run(params.units[i], p, [&](int64_t dst, int64_t g, int64_t len) {
        const int64_t live = std::clamp<int64_t>(file_numel - g, 0, len);  // the rest: padding, zero
        for (int64_t k = 0; k < live; k += kPiece) fn(i, dst + k, fname, g + k, std::min(kPiece, live - k));
      });
    }
}

// The rank's elements of every parameter, from a file of whole tensors: all checked first
// (finite, lm_head tied), then copied into the shards.
void read_local_weights(const std::string& path, const models::GPT& gpt, const nn::FlatParams& params) {
  io::SafeTensorsReader r(path);
  std::string lm_head;
  const std::map<std::string, std::string> ours_to_file = match_weights(r, path, gpt, params, &lm_head);
  // the tied lm_head is checked against the elements of wte that this rank reads (none on a
  // pipeline stage without wte)
  const auto wte = ours_to_file.find("wte.weight");
  const std::string wte_file = wte == ours_to_file.end() ? std::string() : wte->second;
  // two reusable buffers of one piece: the memory loading adds stays a few MiB
  const DType dt = params.units.empty() ? DType::f32 : params.units[0].data.dtype();
  Tensor piece = Tensor::empty({kPiece}, dt), other = Tensor::empty({kPiece}, dt);
  for_each_piece(
      r, params, ours_to_file, [&](size_t, int64_t, const std::string& fname, int64_t g, int64_t n) {
        Tensor part = piece.narrow(0, 0, n);
        r.read_range(fname, g, part);
        check_finite(part, path, fname);
        if (!lm_head.empty() && !wte_file.empty() && fname == wte_file) {
          Tensor tied = other.narrow(0, 0, n);
          r.read_range(lm_head, g, tied);
          NDT_CHECK(std::memcmp(tied.data_ptr(), part.data_ptr(), part.nbytes()) == 0, "weights ", path,
                    ": lm_head.weight differs from wte.weight; ndtrain ties them (GPT-2 does too)");
        }
      });
  for (const nn::FlatUnit& u : params.units) kernels::fill(u.data, 0.0);  // padding and gaps stay zero
  for_each_piece(r, params, ours_to_file,
                 [&](size_t i, int64_t dst, const std::string& fname, int64_t g, int64_t n) {
                   const Tensor to = params.units[i].data.narrow(0, dst, n);
                   if (to.device().is_cpu() && to.dtype() == dt) {
                     r.read_range(fname, g, to);  // straight into the shard
                   } else {
                     r.read_range(fname, g, piece.narrow(0, 0, n));
                     to.copy_(piece.narrow(0, 0, n));
                   }
                 });
}

// The single-process layout that wrote a full checkpoint's moments: `whole` (the model's),
// unless the checkpoint was written with another model.vocab_multiple. Only the lengths of
// the vocabulary's parameters (wte, and an untied lm_head: (rows, C) each) depend on it, so
// the stored length of the unit that holds them tells their padded rows.
std::vector<nn::FlatUnit> written_layout(const io::SafeTensorsReader& st, const models::GPTConfig& cfg,
                                         const std::vector<nn::FlatUnit>& whole) {
  auto aligned = [](int64_t n) { return (n + nn::kAlign - 1) / nn::kAlign * nn::kAlign; };
  for (size_t i = 0; i < whole.size(); ++i) {
    int64_t k = 0, vocab = 0;  // the unit's vocabulary parameters and their aligned length
    for (const nn::FlatParam& p : whole[i].params)
      if (models::GPT::vocab_rows(p.spec.name)) ++k, vocab += aligned(numel_of(p.spec.shape));
    if (k == 0) continue;
    const std::string n = "adam.m." + whole[i].name;
    if (!st.has(n) || st.entries().at(n).shape.size() != 1) return whole;  // read_state names it
    const int64_t stored = st.entries().at(n).shape[0];
    const int64_t each = (stored - (whole[i].numel - vocab)) / k;  // the others' lengths are fixed
    const int64_t rows = each / cfg.n_embd;                        // the most rows that fit
    if (stored == whole[i].numel || each <= 0 || rows < cfg.vocab_size) return whole;
    models::GPTConfig c = cfg;
    c.vocab_multiple = rows;  // padded_vocab() == rows
    std::vector<nn::FlatUnit> w = nn::flat_layout(models::GPT(c).units());
    return w[i].numel == stored ? w : whole;
  }
  return whole;
}

}  // namespace

void load_weights_local(const std::string& path, const models::GPT& gpt, const nn::FlatParams& params) {
  const fs::path manifest = fs::path(path).parent_path() / kManifest;
  if (fs::path(path).filename() == kFiles[0] && fs::exists(manifest))
    verify_checkpoint(fs::path(path).parent_path().string(), {kFiles[0]});  // read(), not mapped
  read_local_weights(path, gpt, params);
}

TrainState load_checkpoint_local(const std::string& path, const models::GPT& gpt,
                                 const nn::FlatParams& params, const std::vector<nn::FlatUnit>& whole,
                                 const std::vector<Tensor>& m, const std::vector<Tensor>& v,
                                 int64_t* adam_steps) {
  const fs::path dir(path);
  verify_checkpoint(path);  // every file against its checksum, before anything is read
  io::SafeTensorsReader st((dir / "state.safetensors").string());
  NDT_CHECK(m.size() == params.units.size() && v.size() == m.size(),
            "load_checkpoint_local: one m and one v per unit");
  const std::vector<nn::FlatUnit> written = written_layout(st, gpt.cfg, whole);
  TrainState s = read_state(st, path, written, adam_steps);
  s.tokenizer = read_tokenizer_files(path);
  // each of this rank's parameters by name in the whole model's units: under pipeline
  // parallelism it holds some of them (its blocks, and of "embeddings" only what its stage
  // uses); under expert parallelism inside FSDP its experts are in units of their own
  std::map<std::string, std::pair<const nn::FlatUnit*, const nn::FlatParam*>> where;
  for (const nn::FlatUnit& w : written)
    for (const nn::FlatParam& q : w.params) where[q.spec.name] = {&w, &q};
  read_local_weights((dir / "model.safetensors").string(), gpt, params);
  // the moments: whole buffers of the single-process layout; each parameter at its offset there
  for (size_t i = 0; i < params.units.size(); ++i) {
    const nn::FlatUnit& u = params.units[i];
    kernels::fill(m[i], 0.0);
    kernels::fill(v[i], 0.0);
    for (const nn::FlatParam& p : u.params) {
      const auto found = where.find(p.spec.name);
      NDT_CHECK(found != where.end(), "checkpoint ", path, ": state.safetensors holds no moments of ",
                p.spec.name, " (unit ", u.name, "); the model differs from the checkpoint's");
      const auto [from, wp] = found->second;
      // wte's rows past vocab_size are padding: zero in any layout, never read
      const int64_t live = models::GPT::vocab_rows(p.spec.name) ? gpt.cfg.vocab_size * gpt.cfg.n_embd
                                                                : numel_of(p.spec.global_shape());
      for_each_local_run(u, p, [&](int64_t dst, int64_t g, int64_t len) {
        len = std::clamp<int64_t>(live - g, 0, len);
        constexpr int64_t kPiece = int64_t(1) << 18;  // a few MiB at a time
        for (int64_t k = 0; k < len; k += kPiece) {
          const int64_t n = std::min(kPiece, len - k);
          m[i].narrow(0, dst + k, n)
              .copy_(st.get_range("adam.m." + from->name, wp->offset + g + k, n, m[i].dtype()));
          v[i].narrow(0, dst + k, n)
              .copy_(st.get_range("adam.v." + from->name, wp->offset + g + k, n, v[i].dtype()));
        }
      });
    }
  }
  return s;
}

const char* non_finite_kind(const Tensor& t) {
  const Tensor h = t.dtype() == DType::f32 || t.dtype() == DType::f64 ? t : t.to(DType::f32);
  const bool f64 = h.dtype() == DType::f64;
  for (int64_t i = 0; i < h.numel(); ++i)
    if (const double x = f64 ? h.data<double>()[i] : h.data<float>()[i]; !std::isfinite(x))
      return std::isnan(x) ? "NaN" : "Inf";
  return nullptr;
}

}  // namespace ndt::ckpt
