#include "train/sharded.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "dist/tensor_parallel/tensor_parallel.h"
#include "tensor/kernels.h"
#include "train/files.h"
#include "train/safetensors.h"

namespace fs = std::filesystem;

namespace ndt::ckpt {
namespace {

constexpr const char* kManifest = "checkpoint.json";
constexpr int64_t kPiece = int64_t(1) << 18;  // elements read at a time

std::string shard_file(int64_t tp_rank, int64_t fsdp_rank) {
  return "shard_tp" + std::to_string(tp_rank) + "_fsdp" + std::to_string(fsdp_rank) + ".safetensors";
}

nlohmann::json model_json(const models::GPTConfig& c) {
  return {{"n_layer", c.n_layer},       {"n_head", c.n_head},         {"n_embd", c.n_embd},
          {"vocab_size", c.vocab_size}, {"block_size", c.block_size}, {"vocab_multiple", c.vocab_multiple}};
}

nlohmann::json read_manifest(const std::string& path) {
  std::ifstream f(fs::path(path) / kManifest);
  NDT_CHECK(f.good(), "checkpoint ", path, " has no ", kManifest, "; it is incomplete");
  try {
    nlohmann::json m;
    f >> m;
    return m;
  } catch (const nlohmann::json::exception& e) {
    NDT_FAIL("checkpoint ", path, "/", kManifest, " is malformed (", e.what(), ")");
  }
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

std::string save_sharded(const std::string& dir, const TrainState& state, const nn::FlatParams& params,
                         const optim::AdamW& opt, const dist::DeviceMesh& mesh, const models::GPTConfig& cfg,
                         int keep, PruneLog* prune_log) {
  dist::Communicator& world = mesh.world();
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
  const std::string file = shard_file(mesh.coords().tp, mesh.fsdp_rank());
  std::string error;
  uint64_t bytes = 0, hash = 0;
  if (writer) {
    try {
      io::SafeTensorsWriter w;
      for (size_t i = 0; i < params.units.size(); ++i) {
        w.add("data." + params.units[i].name, params.units[i].data);
        w.add("m." + params.units[i].name, opt.m()[i]);
        w.add("v." + params.units[i].name, opt.v()[i]);
      }
      w.write((tmp / file).string());  // complete and fsynced when it returns
      bytes = fs::file_size(tmp / file);
      hash = io::file_xxh64((tmp / file).string());
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
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
    const dist::ParallelDims& d = mesh.dims();
    nlohmann::json m = {
        {"format", "sharded"},
        {"step", state.step},
        {"adam_steps", opt.steps_taken()},
        {"loader_epoch", state.loader.epoch},
        {"loader_window", state.loader.window},
        {"extra", state.extra},
        {"model", model_json(cfg)},
        {"layout", {{"dp_replicate", d.dp_replicate}, {"dp_shard", d.dp_shard}, {"cp", d.cp}, {"tp", d.tp}}},
        {"files", nlohmann::json::object()}};
    for (int64_t r = 0; r < n; ++r) {
      if (got[5 * r] == 0) continue;
      const dist::ParallelDims::Coords c = d.coords(r);
      const uint64_t h =
          (static_cast<uint64_t>(got[5 * r + 3]) << 32) | static_cast<uint64_t>(got[5 * r + 4]);
      m["files"][shard_file(c.tp, c.shard * d.cp + c.cp)] = {{"bytes", static_cast<uint64_t>(got[5 * r + 2])},
                                                             {"xxh64", io::hex64(h)}};
    }
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
    nlohmann::json m;
    f >> m;
    return m.value("format", "full") == "sharded";
  } catch (...) {
    return false;
  }
}

namespace {

// Reads `kind` ("data", "m" or "v") of every unit of this rank's layout from the writers'
// files into dst[i] (shard-sized), wherever each element lives in the writers' layout.
void read_kind(const std::string& path, const nlohmann::json& m, const models::GPTConfig& cfg,
               const nn::FlatParams& params, const std::string& kind, const std::vector<Tensor>& dst) {
  const auto& L = m.at("layout");
  const int64_t old_tp = L.at("tp").get<int64_t>(),
                old_fsdp = L.at("dp_shard").get<int64_t>() * L.at("cp").get<int64_t>();
  // the writers' unit layout: the same for every writer but for which slice and shard it is
  models::GPT old(cfg);
  dist::split_tensor_parallel(old, old_tp, 0);
  const std::vector<nn::FlatUnit> ol = nn::plan(old.units(), nn::ShardSpec{0, old_fsdp});
  NDT_CHECK(ol.size() == params.units.size(), "checkpoint ", path, ": ", ol.size(), " units, the model has ",
            params.units.size());
  std::map<std::string, std::unique_ptr<io::SafeTensorsReader>> readers;
  auto reader = [&](int64_t t, int64_t f) -> io::SafeTensorsReader& {
    const std::string name = shard_file(t, f);
    auto& r = readers[name];
    if (!r) {
      verify_checkpoint(path, {name});  // its size and checksum, before any byte is used
      r = std::make_unique<io::SafeTensorsReader>((fs::path(path) / name).string());
    }
    return *r;
  };
  for (size_t i = 0; i < params.units.size(); ++i) {
    const nn::FlatUnit& u = params.units[i];
    NDT_CHECK(ol[i].name == u.name, "checkpoint ", path, ": unit ", ol[i].name, " where the model has ",
              u.name);
    const std::string tensor = kind + "." + u.name;
    Tensor staging = dst[i].device().is_cpu() ? Tensor() : Tensor::empty({kPiece}, dst[i].dtype());
    kernels::fill(dst[i], 0.0);  // padding and alignment gaps stay zero
    for (const nn::FlatParam& p : u.params) {
      const nn::FlatParam* op = nullptr;
      for (const nn::FlatParam& q : ol[i].params)
        if (q.spec.name == p.spec.name) op = &q;
      NDT_CHECK(op, "checkpoint ", path, ": no parameter ", p.spec.name);
      nn::for_each_shard_run(u, p, [&](int64_t to, int64_t g, int64_t len) {
        for (int64_t k = 0; k < len;) {
          // which writer's slice holds global element g + k, and where in its unit buffer
          const auto [q, l] = nn::tp_local_of(op->spec, g + k);
          nn::ParamSpec sq = op->spec;
          sq.tp.rank = q;
          const int64_t run = nn::tp_global_run(sq, l).second, off = op->offset + l;
          const int64_t f = off / ol[i].shard_numel, in = off % ol[i].shard_numel;
          const int64_t n = std::min({len - k, run, ol[i].shard_numel - in, kPiece});
          const Tensor target = dst[i].narrow(0, to + k, n);
          if (dst[i].device().is_cpu()) {
            reader(q, f).read_range(tensor, in, target);
          } else {
            reader(q, f).read_range(tensor, in, staging.narrow(0, 0, n));
            target.copy_(staging.narrow(0, 0, n));
          }
          k += n;
        }
      });
    }
  }
}

void check_model(const std::string& path, const nlohmann::json& m, const models::GPTConfig& cfg) {
  NDT_CHECK(m.at("model") == model_json(cfg), "checkpoint ", path, " holds the model ", m.at("model").dump(),
            " but the config describes ", model_json(cfg).dump(), "; resume with the same [model] section");
}

}  // namespace

TrainState load_sharded(const std::string& path, const models::GPTConfig& cfg, const nn::FlatParams& params,
                        optim::AdamW& opt) {
  load_sharded_weights(path, cfg, params);  // checks the manifest and the model first
  const nlohmann::json m = read_manifest(path);
  try {
    read_kind(path, m, cfg, params, "m", opt.m());
    read_kind(path, m, cfg, params, "v", opt.v());
    opt.set_steps_taken(m.at("adam_steps").get<int64_t>());
    TrainState s;
    s.step = m.at("step").get<int64_t>();
    s.loader.epoch = m.at("loader_epoch").get<int64_t>();
    s.loader.window = m.at("loader_window").get<int64_t>();
    for (auto& [k, v] : m.at("extra").items()) s.extra[k] = v.get<std::string>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    NDT_FAIL("checkpoint ", path, "/", kManifest, " is malformed (", e.what(), ")");
  }
}

void load_sharded_weights(const std::string& path, const models::GPTConfig& cfg,
                          const nn::FlatParams& params) {
  const nlohmann::json m = read_manifest(path);
  NDT_CHECK(m.value("format", "full") == "sharded", "checkpoint ", path, " is not sharded");
  try {
    check_model(path, m, cfg);
    std::vector<Tensor> data;
    for (const nn::FlatUnit& u : params.units) data.push_back(u.data);
    read_kind(path, m, cfg, params, "data", data);
  } catch (const nlohmann::json::exception& e) {
    NDT_FAIL("checkpoint ", path, "/", kManifest, " is malformed (", e.what(), ")");
  }
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

void export_weights(const std::string& path, const std::string& out) {
  check_export_target(path, out);  // before anything is read or written
  const nlohmann::json m = read_manifest(path);
  NDT_CHECK(m.value("format", "full") == "sharded", "checkpoint ", path,
            " is not sharded: its model.safetensors is already one file with GPT-2 names");
  models::GPTConfig cfg;
  try {
    const auto& j = m.at("model");
    cfg.n_layer = j.at("n_layer");
    cfg.n_head = j.at("n_head");
    cfg.n_embd = j.at("n_embd");
    cfg.vocab_size = j.at("vocab_size");
    cfg.block_size = j.at("block_size");
    cfg.vocab_multiple = j.at("vocab_multiple");
  } catch (const nlohmann::json::exception& e) {
    NDT_FAIL("checkpoint ", path, "/", kManifest, " is malformed (", e.what(), ")");
  }
  models::GPT gpt(cfg);
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f32, 0);
  std::vector<Tensor> data;
  for (const nn::FlatUnit& u : params.units) data.push_back(u.data);
  read_kind(path, m, cfg, params, "data", data);
  save_weights(out, gpt, params, {{"step", std::to_string(m.at("step").get<int64_t>())}});
}

}  // namespace ndt::ckpt
