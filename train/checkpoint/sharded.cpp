#include "train/checkpoint/sharded.h"

#include "train/checkpoint/lora.h"

#include "models/family.h"

#include "train/checkpoint/hf.h"
#include "train/checkpoint/lora.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "dist/expert_parallel/expert_parallel.h"
#include "dist/pipeline_parallel/stages.h"
#include "dist/tensor_parallel/tensor_parallel.h"
#include "tensor/kernels.h"
#include "tokenizer/json_checked.h"
#include "train/io/files.h"
#include "train/io/safetensors.h"

namespace fs = std::filesystem;

namespace ndt::ckpt {
namespace {

constexpr const char* kManifest = "checkpoint.json";
constexpr const char* kSeal = "manifest_xxh64";  // the manifest's own checksum
constexpr int64_t kPiece = int64_t(1) << 18;     // elements read at a time

// A writer's file: its pipeline stage (named only under pipeline parallelism, so that the
// files of a checkpoint without it keep their names), tensor-parallel rank and FSDP shard.
std::string shard_file(int64_t pp, int64_t stage, int64_t tp_rank, int64_t fsdp_rank) {
  return "shard_" + (pp > 1 ? "pp" + std::to_string(stage) + "_" : std::string()) + "tp" +
         std::to_string(tp_rank) + "_fsdp" + std::to_string(fsdp_rank) + ".safetensors";
}

// XXH64 of the manifest's compact JSON without its checksum key (nlohmann::json keeps keys
// sorted): whitespace does not count, any change of a key or a value does.
std::string manifest_xxh64(nlohmann::json m) {
  m.erase(kSeal);
  const std::string s = m.dump();
  return io::hex64(io::xxh64(s.data(), s.size()));
}

// The model's fields (models/gpt_config.h) that its architecture uses; an optional one only
// when it is not the default, so a GPT-2 with the default epsilon writes only its sizes, as
// it always did.
nlohmann::json model_json(const models::GPTConfig& c) {
  models::GPTConfig w = c;
  w.n_kv_head = c.kv_heads();
  const models::GPTConfig d;
  nlohmann::json j = nlohmann::json::object();
  models::visit_fields(
      [&](const models::Field& f, const auto& v, const auto& dv) {
        if (!f.of(c) || (f.optional && v == dv)) return;
        j[f.name] = v;
      },
      w, d);
  if (c.rope.llama3)
    j["rope_llama3"] = {{"factor", c.rope.llama3->factor},
                        {"low_freq_factor", c.rope.llama3->low_freq_factor},
                        {"high_freq_factor", c.rope.llama3->high_freq_factor},
                        {"original_max_position", c.rope.llama3->original_max_position}};
  return j;
}

bool finite_shards(const nn::FlatParams& params) {
  for (const nn::FlatUnit& u : params.units) {
    Tensor s = Tensor::empty({}, u.data.dtype() == DType::f64 ? DType::f64 : DType::f32, u.data.device());
    kernels::sum_squares(u.data, s);  // NaN or Inf anywhere makes the sum so
    if (!std::isfinite(s.item())) return false;
  }
  return true;
}

}  // namespace

namespace {

// One rank's shard file: its size and checksum, or why it could not be written.
struct WrittenShard {
  uint64_t bytes = 0, xxh64 = 0;
  std::string error;
};
WrittenShard write_shard(const nn::FlatParams& params, const optim::AdamW& opt, const fs::path& path) {
  WrittenShard out;
  try {
    io::SafeTensorsWriter w;
    for (size_t i = 0; i < params.units.size(); ++i) {
      w.add("data." + params.units[i].name, params.units[i].data);
      w.add("m." + params.units[i].name, opt.m()[i]);
      w.add("v." + params.units[i].name, opt.v()[i]);
    }
    w.write(path.string());  // complete and fsynced when it returns
    out.bytes = fs::file_size(path);
    out.xxh64 = io::file_xxh64(path.string());
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

// checkpoint.json but its files and seal. pp_blocks: the blocks of each virtual stage.
nlohmann::json manifest_of(const TrainState& state, int64_t adam_steps, const models::GPTConfig& cfg,
                           const dist::ParallelDims& d, const std::vector<int64_t>& pp_blocks) {
  nlohmann::json j = {{"format", "sharded"},
                      {"step", state.step},
                      {"adam_steps", adam_steps},
                      {"loader_epoch", state.loader.epoch},
                      {"loader_window", state.loader.window},
                      {"extra", state.extra},
                      {"model", model_json(cfg)},
                      {"layout",
                       {{"pp", d.pp},
                        {"pp_blocks", pp_blocks},
                        {"dp_replicate", d.dp_replicate},
                        {"dp_shard", d.dp_shard},
                        {"cp", d.cp * d.sp},  // (Ulysses' sp ranks shard like cp ranks: one flat fsdp index)
                        {"tp", d.tp}}},
                      {"files", nlohmann::json::object()}};
  // expert parallelism inside FSDP: the experts' units of each ep rank's slice (written only then,
  // so that other checkpoints keep their manifests)
  if (d.experts_apart()) j["layout"]["ep"] = d.ep;
  return j;
}

}  // namespace

std::string save_sharded(const std::string& dir, const TrainState& state, const nn::FlatParams& params,
                         const optim::AdamW& opt, const dist::DeviceMesh& mesh, const models::GPTConfig& cfg,
                         const std::vector<int64_t>& pp_blocks, int keep, PruneLog* prune_log) {
  dist::Communicator& world = mesh.world();
  const dist::ParallelDims& d = mesh.dims();
  // the stages' blocks, which the readers rebuild every writer's layout from
  const std::vector<int64_t> blocks = pp_blocks.empty() ? std::vector<int64_t>{cfg.n_layer} : pp_blocks;
  bool fits = !(d.pp > 1 && pp_blocks.empty()) && static_cast<int64_t>(blocks.size()) % d.pp == 0;
  int64_t sum = 0;
  for (int64_t b : blocks) fits = fits && b >= 1, sum += b;
  NDT_CHECK(
      fits && sum == cfg.n_layer, "save_sharded: pp_blocks of ", blocks.size(), " stages summing to ", sum,
      " for pp_size ", d.pp, " and model.n_layer ", cfg.n_layer,
      ": every stage holds a block, the stages are a multiple of pp_size, the blocks model.n_layer in all");
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08lld", static_cast<long long>(state.step));
  const fs::path tmp = fs::path(dir) / (std::string(".tmp_") + name);
  if (world.rank() == 0) {
    fs::create_directories(dir);
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  world.barrier();
  NDT_CHECK(world.all_reduce_scalar(finite_shards(params) ? 0.0 : 1.0, dist::ReduceOp::kMax) == 0,
            "checkpoint of step ", state.step,
            " not written: a parameter is not finite; the previous checkpoint is kept");
  // every writer (replicate coordinate 0: the replicas hold the same shards) writes its own
  const bool writer = mesh.coords().replicate == 0;
  const std::string file = shard_file(d.pp, mesh.coords().pp, mesh.coords().tp, mesh.fsdp_rank());
  WrittenShard mine_file = writer ? write_shard(params, opt, tmp / file) : WrittenShard{};
  nlohmann::json tokenizer;  // rank 0: the run's tokenizer files beside the shards (a failure as a shard's)
  if (world.rank() == 0 && mine_file.error.empty() && !state.tokenizer.empty()) try {
      tokenizer = write_tokenizer_files(state.tokenizer, tmp.string());
    } catch (const std::exception& e) {
      mine_file.error = e.what();
    }
  const std::string& error = mine_file.error;
  const uint64_t bytes = mine_file.bytes, hash = mine_file.xxh64;
  // rank 0 learns every file's size and checksum; everyone learns of any failure
  const int64_t n = world.size();
  Tensor mine = Tensor::zeros({5}, DType::f64), all = Tensor::zeros({5 * n}, DType::f64, world.device());
  std::vector<double> v = {writer && error.empty() ? 1.0 : 0.0, error.empty() ? 0.0 : 1.0,
                           static_cast<double>(bytes), static_cast<double>(hash >> 32),
                           static_cast<double>(hash & 0xffffffffu)};
  mine = Tensor::from_vector(v, {5}).to(world.device());
  world.all_gather(all, mine)->wait();
  const std::vector<double> got = all.to_vector<double>();
  bool failed = false;
  for (int64_t r = 0; r < n; ++r) failed = failed || got[5 * r + 1] > 0;
  if (failed) {
    if (world.rank() == 0) fs::remove_all(tmp);
    throw Error(error.empty() ? "another rank failed to write its shard of the checkpoint of step " +
                                    std::to_string(state.step) + "; the previous checkpoint is kept"
                              : "writing the checkpoint of step " + std::to_string(state.step) +
                                    " failed: " + error + "; the previous checkpoint is kept");
  }
  std::string where = (fs::path(dir) / name).string();
  if (world.rank() == 0) {
    nlohmann::json m = manifest_of(state, opt.steps_taken(), cfg, d, blocks);
    if (!tokenizer.is_null()) m["tokenizer"] = tokenizer;
    for (int64_t r = 0; r < n; ++r) {  // the writers' files
      if (got[5 * r] == 0) continue;
      const dist::ParallelDims::Coords c = d.coords(r);
      const uint64_t h =
          (static_cast<uint64_t>(got[5 * r + 3]) << 32) | static_cast<uint64_t>(got[5 * r + 4]);
      m["files"][shard_file(d.pp, c.pp, c.tp, (c.shard * d.cp + c.cp) * d.sp + c.sp)] = {
          {"bytes", static_cast<uint64_t>(got[5 * r + 2])}, {"xxh64", io::hex64(h)}};
    }
    m[kSeal] = manifest_xxh64(m);                                         // over everything above
    io::write_file_atomic((tmp / kManifest).string(), m.dump(1) + "\n");  // last: the directory is complete
    where = publish_checkpoint(dir, name, tmp.string(), keep, prune_log);
  }
  world.barrier();  // nobody goes on (or writes again) before the checkpoint is in place
  return where;
}

bool is_sharded(const std::string& path) {
  std::ifstream f(fs::path(path) / kManifest);
  if (!f.good()) return false;
  try {
    const nlohmann::json m = parse_json_checked(f, (fs::path(path) / kManifest).string());
    return m.is_object() && m.value("format", "full") == "sharded";
  } catch (const nlohmann::json::exception&) {  // not ours to judge here; nested too deep is
    return false;
  }
}

namespace {

// What to do about a bad checkpoint.json: it was written complete and sealed, so it was
// changed or damaged since.
constexpr const char* kFix =
    "; the checkpoint is damaged: resume an older one (write its step_* name into latest) or restore the "
    "file";

struct ShardFile {
  uint64_t bytes = 0;
  std::string xxh64;
};

// checkpoint.json of a sharded checkpoint, read and checked in one place: its checksum, and
// every field present, of its type, in range and consistent with the others.
struct Manifest {
  std::string dir, file;  // the checkpoint directory and its checkpoint.json
  int64_t step = 0, adam_steps = 0;
  data::LoaderState loader;
  std::map<std::string, std::string> extra;
  models::GPTConfig model;                 // the writers' (with their model.vocab_multiple)
  dist::ParallelDims layout;               // the writers' layout (pp: 1 in manifests without it)
  std::vector<int64_t> pp_blocks;          // the blocks of each virtual stage ({n_layer} without pp)
  std::map<std::string, ShardFile> files;  // exactly one per writer: shard_file(pp, s, t, f)
  int64_t fsdp() const { return layout.dp_shard * layout.cp; }
};

// Reading checkpoint.json's fields, each error one line naming the file and the field.
struct Fields {
  const std::string& F;  // checkpoint.json's path
  // an integer field of object `o` (named `where`.`key`) in [lo, hi]
  int64_t integer(const nlohmann::json& o, const std::string& where, const char* key, int64_t lo,
                  int64_t hi) const {
    const std::string field = where.empty() ? key : where + "." + key;
    NDT_CHECK(o.contains(key), "checkpoint ", F, " has no \"", field, "\"", kFix);
    const nlohmann::json& v = o.at(key);
    NDT_CHECK(v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)),
              "checkpoint ", F, ": \"", field, "\" is ", v.dump(), ", not an integer", kFix);
    const int64_t x = v.get<int64_t>();
    if (hi == INT64_MAX)
      NDT_CHECK(x >= lo, "checkpoint ", F, ": \"", field, "\" is ", x, "; it must be >= ", lo, kFix);
    else
      NDT_CHECK(x >= lo && x <= hi, "checkpoint ", F, ": \"", field, "\" is ", x, "; it must be in [", lo,
                ", ", hi, "]", kFix);
    return x;
  }
  // a number (`key` of `o`, named `where`.`key`) in (lo, hi]
  double number(const nlohmann::json& o, const std::string& where, const char* key, double lo,
                double hi) const {
    const std::string field = where + "." + key;
    NDT_CHECK(o.contains(key), "checkpoint ", F, " has no \"", field, "\"", kFix);
    const nlohmann::json& v = o.at(key);
    NDT_CHECK(v.is_number() && v.get<double>() > lo && v.get<double>() <= hi, "checkpoint ", F, ": \"", field,
              "\" is ", v.dump(), "; it must be a number in (", lo, ", ", hi, "]", kFix);
    return v.get<double>();
  }
  bool boolean(const nlohmann::json& o, const std::string& where, const char* key) const {
    NDT_CHECK(o.contains(key) && o.at(key).is_boolean(), "checkpoint ", F, ": \"", where, ".", key, "\" is ",
              o.contains(key) ? o.at(key).dump() : "missing", ", not true or false", kFix);
    return o.at(key).get<bool>();
  }
  std::string text(const nlohmann::json& o, const std::string& where, const char* key) const {
    NDT_CHECK(o.contains(key) && o.at(key).is_string(), "checkpoint ", F, ": \"", where, ".", key, "\" is ",
              o.contains(key) ? o.at(key).dump() : "missing", ", not a string", kFix);
    return o.at(key).get<std::string>();
  }
  const nlohmann::json& object(const nlohmann::json& m, const char* key) const {
    NDT_CHECK(m.contains(key) && m[key].is_object(), "checkpoint ", F, ": \"", key, "\" is ",
              m.contains(key) ? m[key].dump() : "missing", ", not an object", kFix);
    return m[key];
  }
};
constexpr int64_t kMax = INT64_MAX;

// The JSON of checkpoint.json, its seal checked first: a changed value is reported as a
// change, whatever the value.
nlohmann::json read_sealed(const std::string& path, const std::string& F, std::ostream* warn) {
  std::ifstream in(F);
  NDT_CHECK(in.good(), "checkpoint ", path, " has no ", kManifest, "; it is incomplete");
  nlohmann::json m;
  try {
    m = parse_json_checked(in, F);
  } catch (const nlohmann::json::exception& e) {
    NDT_FAIL("checkpoint ", F, " is malformed (", e.what(), ")", kFix);
  }
  NDT_CHECK(m.is_object(), "checkpoint ", F, " is not a JSON object", kFix);
  if (m.contains(kSeal)) {
    const std::string want = manifest_xxh64(m);
    NDT_CHECK(m[kSeal].is_string() && m[kSeal].get<std::string>() == want, "checkpoint ", F,
              " fails its checksum (", kSeal, " ", m[kSeal].dump(), ", the content hashes to \"", want, "\")",
              kFix);
  } else if (warn) {  // written before manifests were sealed: still validated by the caller
    *warn << "warning: checkpoint " << F << " has no checksum (" << kSeal
          << ", written by an older ndtrain); its values are checked for range and consistency only\n";
  }
  NDT_CHECK(m.value("format", "") == "sharded", "checkpoint ", F, ": \"format\" is ",
            m.contains("format") ? m["format"].dump() : "missing", ", not \"sharded\"", kFix);
  return m;
}

// step, adam_steps, the data position and extra.
void read_position(const nlohmann::json& m, const Fields& in, Manifest& r) {
  const std::string& F = in.F;
  r.step = in.integer(m, "", "step", 0, kMax);
  r.adam_steps = in.integer(m, "", "adam_steps", 0, kMax);
  // every step applies one AdamW update (a non-finite step stops the run, unapplied and unsaved)
  NDT_CHECK(r.adam_steps == r.step, "checkpoint ", F, ": \"adam_steps\" is ", r.adam_steps,
            " but \"step\" is ", r.step, "; every step takes one AdamW step, so they are equal", kFix);
  r.loader.epoch = in.integer(m, "", "loader_epoch", 0, kMax);
  r.loader.window = in.integer(m, "", "loader_window", 0, kMax);
  for (auto& [k, v] : in.object(m, "extra").items()) {
    NDT_CHECK(v.is_string(), "checkpoint ", F, ": \"extra.", k, "\" is ", v.dump(), ", not a string", kFix);
    r.extra[k] = v.get<std::string>();
  }
  if (auto it = r.extra.find("window_tokens"); it != r.extra.end()) {  // the loader position's unit
    const std::string& s = it->second;
    const bool ok = !s.empty() && s.size() <= 15 && s.find_first_not_of("0123456789") == std::string::npos &&
                    std::stoll(s) > 0;
    NDT_CHECK(ok, "checkpoint ", F, ": \"extra.window_tokens\" is \"", s, "\", not a positive integer", kFix);
  }
}

// The model's fields (model_json), each checked in its range as the config checks it.
void read_model(const nlohmann::json& mj, const Fields& in, models::GPTConfig& c) {
  const std::string& F = in.F;
  if (mj.contains("arch")) {
    const nlohmann::json& arch = mj.at("arch");
    NDT_CHECK(arch.is_string() && models::find_family(arch.get<std::string>()), "checkpoint ", F,
              ": \"model.arch\" is ", arch.dump(), ", not ", models::family_names(), kFix);
    c.arch = arch.get<std::string>();
  }
  models::visit_fields(
      [&](const models::Field& f, auto& v) {
        using T = std::decay_t<decltype(v)>;
        if (!f.of(c) || (f.optional && !mj.contains(f.name))) return;
        if constexpr (std::is_same_v<T, bool>)
          v = in.boolean(mj, "model", f.name);
        else if constexpr (std::is_same_v<T, double>)
          v = in.number(mj, "model", f.name, f.lo, f.hi);
        else if constexpr (std::is_same_v<T, int64_t>)
          v = in.integer(mj, "model", f.name, static_cast<int64_t>(f.lo), static_cast<int64_t>(f.hi));
        else if constexpr (std::is_same_v<T, std::string>)
          if (std::string_view(f.name) != "arch") v = in.text(mj, "model", f.name);  // arch: read above
      },
      c);
  NDT_CHECK(c.n_embd % c.n_head == 0, "checkpoint ", F, ": \"model.n_embd\" is ", c.n_embd,
            ", not a multiple of \"model.n_head\" ", c.n_head, kFix);
  if (mj.contains("rope_llama3")) {
    const nlohmann::json& s = in.object(mj, "rope_llama3");
    c.rope.llama3 =
        models::Llama3Scaling{in.number(s, "model.rope_llama3", "factor", 0, 1e6),
                              in.number(s, "model.rope_llama3", "low_freq_factor", 0, 1e6),
                              in.number(s, "model.rope_llama3", "high_freq_factor", 0, 1e6),
                              in.integer(s, "model.rope_llama3", "original_max_position", 1, 1 << 30)};
  }
  try {
    c.validate();
  } catch (const Error& e) {
    NDT_FAIL("checkpoint ", F, ": its model is not valid (", e.what(), ")", kFix);
  }
}

// The pipeline stages of the layout: "pp" and the blocks of each virtual stage "pp_blocks"
// (pp x pp_virtual of them, each at least one block, model.n_layer in all). A manifest
// written before pipeline parallelism has neither: one stage of every block.
void read_pipeline(const nlohmann::json& lj, const Fields& in, Manifest& r) {
  const std::string& F = in.F;
  const int64_t L = r.model.n_layer;
  r.layout.pp = lj.contains("pp") ? in.integer(lj, "layout", "pp", 1, L) : 1;
  if (!lj.contains("pp_blocks")) {
    NDT_CHECK(r.layout.pp == 1, "checkpoint ", F, " has no \"layout.pp_blocks\" but \"layout.pp\" is ",
              r.layout.pp, kFix);
    r.pp_blocks = {L};
    return;
  }
  const nlohmann::json& b = lj.at("pp_blocks");
  const int64_t pp = r.layout.pp;
  NDT_CHECK(b.is_array() && !b.empty() && static_cast<int64_t>(b.size()) <= L &&
                static_cast<int64_t>(b.size()) % pp == 0,
            "checkpoint ", F, ": \"layout.pp_blocks\" is ", b.dump(),
            "; it must be a list of one entry per pipeline stage: a multiple of \"layout.pp\" ", pp,
            " entries, at most \"model.n_layer\" ", L, kFix);
  int64_t sum = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const nlohmann::json& v = b[i];
    const bool ok = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(L)) &&
                    v.get<int64_t>() >= 1 && v.get<int64_t>() <= L;
    NDT_CHECK(ok, "checkpoint ", F, ": \"layout.pp_blocks\" is ", b.dump(), "; its entry ", i, " is ",
              v.dump(), ", not a number of blocks in [1, ", L, "]", kFix);
    const int64_t n = v.get<int64_t>();
    r.pp_blocks.push_back(n);
    sum += n;
  }
  NDT_CHECK(sum == L, "checkpoint ", F, ": \"layout.pp_blocks\" is ", b.dump(), ", ", sum,
            " blocks in all; \"model.n_layer\" is ", L, kFix);
}

// The model (bounded so that no product of its sizes overflows) and the layout, with the
// splits it implies (before anything divides by it).
void read_model_and_layout(const nlohmann::json& m, const Fields& in, Manifest& r) {
  const std::string& F = in.F;
  const nlohmann::json& mj = in.object(m, "model");
  read_model(mj, in, r.model);
  const nlohmann::json& lj = in.object(m, "layout");
  constexpr int64_t kRanks = 1 << 20;
  r.layout.dp_replicate = in.integer(lj, "layout", "dp_replicate", 1, kRanks);
  r.layout.dp_shard = in.integer(lj, "layout", "dp_shard", 1, kRanks);
  r.layout.cp = in.integer(lj, "layout", "cp", 1, kRanks);
  r.layout.tp = in.integer(lj, "layout", "tp", 1, kRanks);
  read_pipeline(lj, in, r);
  r.layout.ep = lj.contains("ep") ? in.integer(lj, "layout", "ep", 2, kRanks) : 1;
  NDT_CHECK(
      r.layout.ep == 1 || (r.layout.dp_shard % r.layout.ep == 0 && r.model.n_experts % r.layout.ep == 0),
      "checkpoint ", F, ": \"layout.ep\" is ", r.layout.ep, ", which must divide \"layout.dp_shard\" ",
      r.layout.dp_shard, " and the model's ", r.model.n_experts, " experts", kFix);
  const int64_t tp = r.layout.tp;
  NDT_CHECK(r.model.n_head % tp == 0 && r.model.kv_heads() % tp == 0 && r.model.mlp_hidden() % tp == 0 &&
                r.model.padded_vocab() % tp == 0,
            "checkpoint ", F, ": \"layout.tp\" is ", tp, ", which does not divide the model's ",
            r.model.n_head, " heads (", r.model.kv_heads(), " key/value heads), ", r.model.mlp_hidden(),
            " MLP units and ", r.model.padded_vocab(), " vocabulary rows", kFix);
}

// The files: exactly one per writer (pipeline stage x tensor-parallel rank x FSDP shard),
// each with its size and checksum; and no other weights file in the directory.
void read_files(const nlohmann::json& m, const Fields& in, Manifest& r) {
  const std::string& F = in.F;
  const nlohmann::json& fj = in.object(m, "files");
  const int64_t pp = r.layout.pp, writers = pp * r.layout.tp * r.fsdp();
  NDT_CHECK(static_cast<int64_t>(fj.size()) == writers, "checkpoint ", F, ": \"files\" lists ", fj.size(),
            fj.size() == 1 ? " file" : " files", " but \"layout\" has ", writers,
            writers == 1 ? " writer" : " writers",
            pp > 1 ? " (pp x tp x dp_shard x cp)" : " (tp x dp_shard x cp)", kFix);
  for (int64_t stage = 0; stage < pp; ++stage)
    for (int64_t t = 0; t < r.layout.tp; ++t)
      for (int64_t f = 0; f < r.fsdp(); ++f) {
        const std::string name = shard_file(pp, stage, t, f), field = "files." + name;
        NDT_CHECK(fj.contains(name) && fj[name].is_object(), "checkpoint ", F, ": \"files\" lacks ", name,
                  " (writer ", pp > 1 ? "pp " + std::to_string(stage) + ", " : "", "tp ", t, ", fsdp ", f,
                  " of the layout)", kFix);
        const nlohmann::json& e = fj[name];
        ShardFile s;
        s.bytes = static_cast<uint64_t>(in.integer(e, field, "bytes", 0, kMax));
        NDT_CHECK(
            e.contains("xxh64") && e["xxh64"].is_string() && e["xxh64"].get<std::string>().size() == 16 &&
                e["xxh64"].get<std::string>().find_first_not_of("0123456789abcdef") == std::string::npos,
            "checkpoint ", F, ": \"", field, ".xxh64\" is ",
            e.contains("xxh64") ? e["xxh64"].dump() : "missing", ", not 16 hex digits", kFix);
        s.xxh64 = e["xxh64"].get<std::string>();
        r.files[name] = s;
      }
  // exactly these files are read: a weights file in the directory that the manifest does not
  // list is not part of this checkpoint (a checkpoint directory is written whole, then renamed)
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(r.dir, ec)) {
    const std::string name = e.path().filename().string();
    NDT_CHECK(e.path().extension() != ".safetensors" || r.files.count(name), "checkpoint ", r.dir, " holds ",
              name, ", which ", kManifest,
              " does not list; it is not part of this checkpoint: remove it, or resume "
              "an older checkpoint (write its step_* name into latest)");
  }
}

Manifest read_manifest(const std::string& path, std::ostream* warn) {
  Manifest r;
  r.dir = path;
  r.file = (fs::path(path) / kManifest).string();
  const nlohmann::json m = read_sealed(path, r.file, warn);
  const Fields in{r.file};
  read_position(m, in, r);
  read_model_and_layout(m, in, r);
  read_files(m, in, r);
  return r;
}

// Where a parameter lives in the writers' files: the pipeline stage that wrote it, that
// stage's unit holding it (an index into the stage's layout) and the parameter there.
struct Source {
  int64_t stage = 0;
  size_t unit = 0;
  const nn::FlatParam* param = nullptr;
};

// The writers' files, each opened once, on first use: its size and checksum are verified and
// its tensors checked against its writer's layout before any byte of it is used.
//
// The writers' layouts follow from the manifest: stage s of the pipeline held the units of
// GPT(model, pipeline_part(pp_blocks, pp, s)) (its blocks, and of the embeddings what its
// stage used), TP-split and sharded over fsdp; its writers differ only in which slice and
// shard they hold. A parameter is found by name, in the first stage that holds it: the tied
// embeddings are on the first and the last stage, identical copies (their gradients summed
// between the two), so the first stage's is read.
class Writers {
 public:
  explicit Writers(const Manifest& m) : m_(m) {
    for (int64_t s = 0; s < m.layout.pp; ++s) {
      models::GPT old(m.model, dist::pipeline_part(m.pp_blocks, m.layout.pp, s));
      dist::split_tensor_parallel(old, m.layout.tp, 0);
      nn::ShardSpec shard{0, m.fsdp()};
      if (m.layout.ep > 1) {  // each ep rank's experts in units apart, over fsdp / ep writers
        dist::split_experts(old, m.layout.ep, 0);
        shard.experts = {0, m.fsdp() / m.layout.ep};
      }
      units_.push_back(nn::flat_layout(old.units(m.layout.ep > 1), shard));
    }
    for (int64_t s = 0; s < m.layout.pp; ++s)
      for (size_t i = 0; i < units_[s].size(); ++i)
        for (const nn::FlatParam& p : units_[s][i].params) where_.try_emplace(p.spec.name, Source{s, i, &p});
  }
  const Manifest& manifest() const { return m_; }
  // pipeline stage s's units, as each of its writers laid them out
  const std::vector<nn::FlatUnit>& units(int64_t s) const { return units_[s]; }
  const Source& source(const std::string& param) const {
    auto it = where_.find(param);
    NDT_CHECK(it != where_.end(), "checkpoint ", m_.dir, ": no parameter ", param, " in the layout of its ",
              kManifest);
    return it->second;
  }

  // Which writer (tp rank, fsdp rank) holds shard f of unit u for slice q of its parameters:
  // tp rank q's; in a unit of experts (layout.ep > 1), ep rank q's experts, sharded over the
  // writers holding them, every tp rank alike: shard f of those is fsdp rank (dp shard
  // (f / CS) ep + q, cp x sp position f % CS), as DeviceMesh::ep_shard orders them
  std::pair<int64_t, int64_t> writer(const nn::FlatUnit& u, int64_t q, int64_t f) const {
    if (!u.experts) return {q, f};
    const int64_t CS = m_.layout.cp;  // cp x sp (manifest_of)
    return {0, ((f / CS) * m_.layout.ep + q) * CS + f % CS};
  }

  // the file of pipeline stage s, tensor-parallel rank t and FSDP shard f
  const io::SafeTensorsReader& file(int64_t s, int64_t t, int64_t f) {
    const std::string name = shard_file(m_.layout.pp, s, t, f);
    std::unique_ptr<io::SafeTensorsReader>& r = open_[name];
    if (r) return *r;
    const ShardFile& e = m_.files.at(name);  // listed: read_manifest checked the set
    verify_file(m_.dir, name, e.bytes, e.xxh64);
    r = std::make_unique<io::SafeTensorsReader>((fs::path(m_.dir) / name).string());
    const std::string where = "checkpoint file " + r->path() + ": ";
    // every unit of the stage, an empty one too (the embeddings of a middle stage: (0))
    const std::vector<nn::FlatUnit>& units = units_[s];
    for (const nn::FlatUnit& u : units)
      for (const char* kind : {"data.", "m.", "v."}) {
        const std::string n = kind + u.name;
        NDT_CHECK(r->has(n), where, "lacks tensor ", n, ", which the layout of ", kManifest, " needs");
        const io::SafeTensorsReader::Entry& en = r->entries().at(n);
        NDT_CHECK(en.dtype == "F32", where, "tensor ", n, " has dtype ", en.dtype,
                  ", ndtrain writes F32; the file was not written by ndtrain");
        NDT_CHECK(en.shape == Shape{u.shard_numel}, where, "tensor ", n, " has shape ", shape_str(en.shape),
                  ", the layout of ", kManifest, " needs (", u.shard_numel, ")");
      }
    for (const auto& [n, en] : r->entries()) {
      bool known = false;
      for (const nn::FlatUnit& u : units)
        known = known || n == "data." + u.name || n == "m." + u.name || n == "v." + u.name;
      NDT_CHECK(known, where, "holds tensor ", n, ", which the layout of ", kManifest, " has no place for");
    }
    return *r;
  }

 private:
  const Manifest& m_;
  std::vector<std::vector<nn::FlatUnit>> units_;  // per pipeline stage
  std::map<std::string, Source> where_;           // parameter name -> its first stage's unit
  std::map<std::string, std::unique_ptr<io::SafeTensorsReader>> open_;
};

// Throws, naming the file, the tensor and the parameter, when a piece read from a shard file
// holds NaN or Inf (or, for v, AdamW's second moments, a negative value).
void check_piece(const Tensor& piece, const std::string& file, const std::string& tensor,
                 const std::string& param, bool non_negative) {
  const Tensor h = piece.dtype() == DType::f32 ? piece : piece.to(DType::f32);
  const float* x = h.data<float>();
  for (int64_t i = 0; i < h.numel(); ++i)
    if (!std::isfinite(x[i]) || (non_negative && x[i] < 0))
      NDT_FAIL("checkpoint file ", file, ": ", tensor, " holds ",
               std::isnan(x[i])   ? "NaN"
               : std::isinf(x[i]) ? "Inf"
                                  : "a negative value",
               " in ", param,
               "; the file is damaged or was saved from a diverged run: resume an older checkpoint");
}

// Reads `kind` ("data", "m" or "v") of every unit of this rank's layout from the writers'
// files into dst[i] (shard-sized), wherever each element lives in the writers' layout: each
// parameter found by name in the writers' stages (Writers::source), so that any pipeline
// layout reads any other's.
// The rows of wte past model.vocab_size are padding (zero, never trained: their logits are
// masked), so they are never read and stay zero: a checkpoint written with another
// model.vocab_multiple loads, its padding dropped or extended.
void read_kind(Writers& w, const models::GPTConfig& cfg, const nn::FlatParams& params,
               const std::string& kind, const std::vector<Tensor>& dst) {
  for (size_t i = 0; i < params.units.size(); ++i) {
    const nn::FlatUnit& u = params.units[i];
    Tensor staging = dst[i].device().is_cpu() ? Tensor() : Tensor::empty({kPiece}, dst[i].dtype());
    kernels::fill(dst[i], 0.0);  // padding and alignment gaps stay zero
    for (const nn::FlatParam& p : u.params) {
      const Source& src = w.source(p.spec.name);
      const nn::FlatUnit& ou = w.units(src.stage)[src.unit];  // the writers' unit that holds it
      const nn::FlatParam* op = src.param;
      const std::string tensor = kind + "." + ou.name;
      const int64_t live = models::GPT::vocab_rows(p.spec.name) ? cfg.vocab_size * cfg.n_embd
                                                                : numel_of(p.spec.global_shape());
      nn::for_each_shard_run(u, p, [&](int64_t to, int64_t g, int64_t len) {
        len = std::clamp<int64_t>(live - g, 0, len);
        for (int64_t k = 0; k < len;) {
          // which writer's slice holds global element g + k, and where in its unit buffer
          const auto [q, l] = nn::tp_local_of(op->spec, g + k);
          nn::ParamSpec sq = op->spec;
          sq.tp.rank = q;
          const int64_t run = nn::tp_global_run(sq, l).second, off = op->offset + l;
          const int64_t f = off / ou.shard_numel, in = off % ou.shard_numel;
          const int64_t n = std::min({len - k, run, ou.shard_numel - in, kPiece});
          const Tensor target = dst[i].narrow(0, to + k, n);
          const auto [t, writer] = w.writer(ou, q, f);
          const io::SafeTensorsReader& r = w.file(src.stage, t, writer);
          const Tensor piece = dst[i].device().is_cpu() ? target : staging.narrow(0, 0, n);
          r.read_range(tensor, in, piece);
          check_piece(piece, r.path(), tensor, p.spec.name, kind == "v");
          if (!dst[i].device().is_cpu()) target.copy_(piece);
          k += n;
        }
      });
    }
  }
}

// The model must be the writers' but for the vocabulary's padding (model.vocab_multiple).
void check_model(const Manifest& m, const models::GPTConfig& cfg) {
  models::GPTConfig theirs = m.model;
  theirs.vocab_multiple = cfg.vocab_multiple;
  NDT_CHECK(model_json(theirs) == model_json(cfg), "checkpoint ", m.dir, " holds the model ",
            model_json(m.model).dump(), " but the config describes ", model_json(cfg).dump(),
            "; resume with the same [model] section (model.vocab_multiple may differ)");
}

std::vector<Tensor> data_of(const nn::FlatParams& params) {
  std::vector<Tensor> data;
  for (const nn::FlatUnit& u : params.units) data.push_back(u.data);
  return data;
}

}  // namespace

TrainState load_sharded(const std::string& path, const models::GPTConfig& cfg, const nn::FlatParams& params,
                        optim::AdamW& opt, std::ostream* warn) {
  const Manifest m = read_manifest(path, warn);  // checked whole before any value is used
  check_model(m, cfg);
  Writers w(m);
  read_kind(w, cfg, params, "data", data_of(params));
  read_kind(w, cfg, params, "m", opt.m());
  read_kind(w, cfg, params, "v", opt.v());
  opt.set_steps_taken(m.adam_steps);
  TrainState s;
  s.step = m.step;
  s.loader = m.loader;
  s.extra = m.extra;
  s.tokenizer = read_tokenizer_files(path);
  return s;
}

void load_sharded_weights(const std::string& path, const models::GPTConfig& cfg, const nn::FlatParams& params,
                          std::ostream* warn) {
  const Manifest m = read_manifest(path, warn);
  check_model(m, cfg);
  Writers w(m);
  read_kind(w, cfg, params, "data", data_of(params));
}

namespace {

// Refuses an output that would write over a checkpoint: the checkpoint directory being read
// or anything inside it (a shard, checkpoint.json, a new file), or a file inside any other
// checkpoint directory (one holding checkpoint.json), also when reached through symlinks or
// "..". The writer's temporary file (out.tmp, files.h) is checked too.
void check_export_target(const std::string& path, const std::string& out) {
  NDT_CHECK(!out.empty() && !path.empty(),
            "export of weights: the checkpoint and the output must be non-empty paths");
  auto resolved = [](const std::string& p) {
    std::error_code ec;
    const fs::path a = fs::absolute(p, ec);
    fs::path r = fs::weakly_canonical(a, ec);
    if (ec) r = a.lexically_normal();
    return r.has_filename() ? r : r.parent_path();  // "dir/" names dir
  };
  const fs::path ckpt = resolved(path);
  for (const std::string& target : {out, out + ".tmp"}) {
    const fs::path o = resolved(target);
    const bool inside = std::mismatch(ckpt.begin(), ckpt.end(), o.begin(), o.end()).first == ckpt.end();
    NDT_CHECK(!inside, "export to ", target, " refused: it is ",
              o == ckpt ? "the checkpoint directory " : "inside the checkpoint ", path,
              " being read and would write over it; write the file outside the checkpoint");
  }
  std::error_code ec;
  for (fs::path d = resolved(out).parent_path(); d.has_relative_path(); d = d.parent_path())
    NDT_CHECK(!fs::exists(d / kManifest, ec), "export to ", out, " refused: it is inside the checkpoint ",
              d.string(), " and would change it; write the file outside every checkpoint directory");
}

}  // namespace

models::GPTConfig sharded_model_config(const std::string& path) {
  NDT_CHECK(is_sharded(path), path,
            " is not a sharded checkpoint (no checkpoint.json of format \"sharded\")");
  return read_manifest(path, nullptr).model;
}

std::string export_weights(const std::string& given, const std::string& out, DType dtype, std::ostream& note,
                           bool merge) {
  check_export_target(given, out);  // before anything is read or written
  NDT_CHECK(fs::exists(given), "checkpoint ", given,
            " does not exist: give a checkpoint's step folder (checkpoint.dir/step_NNNNNNNN) or the "
            "checkpoint.dir, whose latest checkpoint is exported");
  std::string path = given;
  if (fs::is_directory(given) && !fs::exists(fs::path(given) / kManifest)) {  // a checkpoint.dir
    const std::optional<std::string> latest = latest_checkpoint(given);
    NDT_CHECK(latest.has_value(), given, " is neither a checkpoint (no ", kManifest,
              ") nor a checkpoint.dir (no latest or step_* folder)");
    path = *latest;
  }
  if (is_lora_checkpoint(path)) return export_lora(path, out, merge, dtype, note);  // train/checkpoint/lora.h
  NDT_CHECK(!merge, "--merge is for a LoRA run's checkpoint (lora.rank > 0); ", path,
            " holds a whole model: export it without --merge");
  NDT_CHECK(is_sharded(path) || !fs::exists(fs::path(path) / kManifest), "checkpoint ", path,
            " is not sharded: its model.safetensors is already one file with GPT-2 names");
  const Manifest m = read_manifest(path, &std::cerr);
  const bool one_file = out.size() > 12 && out.ends_with(".safetensors");
  const TokenizerFiles tokenizer = one_file ? TokenizerFiles{} : read_tokenizer_files(path);  // checked now
  Writers w(m);
  for (int64_t s = 0; s < m.layout.pp; ++s)  // every file checked before the model is allocated
    for (int64_t t = 0; t < m.layout.tp; ++t)
      for (int64_t f = 0; f < m.fsdp(); ++f) w.file(s, t, f);
  models::GPT gpt(m.model);
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f32, 0);
  read_kind(w, m.model, params, "data", data_of(params));
  if (one_file) {  // ndtrain's names: GPT-2's are Hugging Face's, a llama's those of its full checkpoints
    save_weights(out, gpt, params, {{"step", std::to_string(m.step)}});
  } else {
    export_hf(out, gpt, params, dtype, tokenizer, note);
  }
  return path;
}

}  // namespace ndt::ckpt
