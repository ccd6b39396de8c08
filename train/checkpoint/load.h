// ndtrain: weights from whatever a user points at, read into this rank's shards. train_gpt's
// model.init_from and generate's --model both come here, so both take the same things:
//
//   a Hugging Face model folder         config.json and safetensors (sharded or not)
//   a sharded checkpoint                its step folder, or the checkpoint.dir (its newest one)
//   a safetensors file                  GPT-2's Hugging Face names, or a full checkpoint's
//                                       model.safetensors (its step folder names it too)
//
//   const ckpt::WeightSource src = ckpt::find_weights(path);     // what path is: opened once
//   models::GPT gpt(ckpt::model_config_of(src));                  // generate: the model it holds
//   nn::FlatParams params = nn::materialize(gpt.units(), ...);
//   ckpt::load_weights(src, gpt, params);                         // each rank its own elements
#pragma once

#include <memory>
#include <ostream>
#include <string>

#include "models/gpt.h"
#include "nn/flat.h"
#include "train/io/hf_folder.h"

namespace ndt::ckpt {

struct WeightSource {
  enum class Kind { kHfFolder, kSharded, kFile };
  Kind kind = Kind::kFile;
  std::string path;                        // the folder or file that is read
  std::shared_ptr<const io::HfFolder> hf;  // kHfFolder: the folder, its config.json parsed once
  std::string str() const;                 // "Hugging Face folder DIR", "checkpoint DIR", "file F"
};

// Throws ndt::Error naming `path` and what it is not (a missing path; a folder that is neither
// a model folder nor holds a checkpoint).
WeightSource find_weights(const std::string& path);

// The model the source holds: a folder's config.json, a sharded checkpoint's manifest, its
// sizes in train_gpt's ranges (models::check_field_ranges). A safetensors file has no model
// description: throws, saying which sources have one.
models::GPTConfig model_config_of(const WeightSource& w);

// Every tensor the described model needs, present in the source with its shape (a Hugging
// Face folder's safetensors headers; a checkpoint's manifest was checked when it was read),
// before anything is allocated: a config.json that contradicts its weights is one error, not
// an allocation of the size it claims. Throws ndt::Error naming the tensors.
void check_weights(const WeightSource& w, const models::GPT& gpt);

// This rank's elements of every parameter (its TP slice, its FSDP shard) from the source;
// every tensor checked (names, shapes, finite values) before anything is copied. Warnings
// (an old sharded manifest) go to `warn` (null: none, as on every rank but one). The
// bf16 copies a mixed-precision model computes with are refreshed.
void load_weights(const WeightSource& w, const models::GPT& gpt, nn::FlatParams& params,
                  std::ostream* warn = nullptr);

}  // namespace ndt::ckpt
