#include "train/checkpoint/load.h"

#include <filesystem>

#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/hf.h"
#include "train/checkpoint/lora.h"
#include "train/checkpoint/sharded.h"

namespace fs = std::filesystem;

namespace ndt::ckpt {

std::string WeightSource::str() const {
  switch (kind) {
    case Kind::kHfFolder:
      return "Hugging Face folder " + path;
    case Kind::kSharded:
      return "checkpoint " + path;
    case Kind::kFile:
      break;
  }
  return "file " + path;
}

WeightSource find_weights(const std::string& path) {
  WeightSource w;
  NDT_CHECK(fs::exists(path), path,
            " does not exist: give a Hugging Face model folder, a checkpoint (its "
            "step folder or checkpoint.dir) or a safetensors file");
  if (is_hf_folder(path)) {
    w.kind = WeightSource::Kind::kHfFolder;
    w.path = path;
    w.hf = std::make_shared<const io::HfFolder>(path);
    return w;
  }
  std::string dir = path;
  if (fs::is_directory(dir) && !is_sharded(dir)) {  // a checkpoint.dir: its newest complete checkpoint
    const std::optional<std::string> latest = latest_checkpoint(dir);
    NDT_CHECK(latest.has_value(), path,
              " is neither a Hugging Face model folder (no config.json) nor a "
              "checkpoint (no checkpoint.json, no latest or step_* folder)");
    dir = *latest;
  }
  NDT_CHECK(!(fs::is_directory(dir) && is_lora_checkpoint(dir)), path,
            " is a LoRA run's checkpoint: it holds adapters, not a model. Merge them into their base with "
            "`export_weights --merge ",
            path, " OUT` and give OUT (generate: or give the base as --model and this as --adapter)");
  if (fs::is_directory(dir) && is_sharded(dir)) {
    w.kind = WeightSource::Kind::kSharded;
    w.path = dir;
  } else {  // a file, or a full checkpoint's step folder: its model.safetensors
    w.kind = WeightSource::Kind::kFile;
    w.path = fs::is_directory(dir) ? (fs::path(dir) / "model.safetensors").string() : dir;
  }
  return w;
}

models::GPTConfig model_config_of(const WeightSource& w) {
  switch (w.kind) {
    case WeightSource::Kind::kHfFolder: {
      const models::GPTConfig c = model_config(w.hf->config());
      try {
        models::check_field_ranges(c);
      } catch (const Error& e) {
        NDT_FAIL(w.hf->dir(), "/config.json describes a model outside what ndtrain builds: ", e.what());
      }
      return c;
    }
    case WeightSource::Kind::kSharded:
      return sharded_model_config(w.path);
    case WeightSource::Kind::kFile:
      break;
  }
  NDT_FAIL(w.str(),
           " holds weights without the model's description: give a Hugging Face folder (export_weights "
           "writes one) or a sharded checkpoint (checkpoint.format = sharded)");
}

void check_weights(const WeightSource& w, const models::GPT& gpt) {
  if (w.kind == WeightSource::Kind::kHfFolder) check_hf_folder(*w.hf, gpt);
}

void load_weights(const WeightSource& w, const models::GPT& gpt, nn::FlatParams& params, std::ostream* warn) {
  switch (w.kind) {
    case WeightSource::Kind::kHfFolder:
      load_hf_local(*w.hf, gpt, params);
      break;
    case WeightSource::Kind::kSharded:
      load_sharded_weights(w.path, gpt.cfg, params, warn);  // its parameters, not its optimizer
      break;
    case WeightSource::Kind::kFile:
      load_weights_local(w.path, gpt, params);
      break;
  }
  params.refresh_compute();  // mixed precision: the copies the model computes with
}

}  // namespace ndt::ckpt
