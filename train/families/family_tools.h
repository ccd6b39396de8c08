// ndtrain: what the training tools know of each model family (models/families.h lists them;
// models/family.h is what the model itself knows): how the family is stored in a Hugging Face
// folder (its model_types, the config.json fields beyond the shared ones, its tensors' names and
// layouts), and what the planner counts of its block. One file per family,
// train/families/<arch>.cpp, defining train::kTools_<arch>.
//
//   const train::FamilyTools& t = train::family_tools(cfg.arch);   // or tools_for_model_type("qwen2")
//   t.to_hf(cfg, hf);                                               // hf.model_type, its own fields
//   std::map<std::string, HfSource> s = hf_sources(cfg);           // wte.weight <- model.embed_tokens.weight
//   const BlockKind& k = *t.planner;                                 // memory, work (block_kinds.h)
#pragma once

#include <map>
#include <string>
#include <vector>

#include "models/gpt_config.h"
#include "train/io/hf_config.h"

namespace ndt::train {

struct BlockKind;  // train/planner/block_kinds.h

// How one of our parameters is made from a folder's tensors.
struct HfSource {
  enum Kind { renamed, transposed, packed_qkv, experts } kind = renamed;
  // renamed, transposed: one; packed_qkv: q, k, v; experts: one (out, in) matrix per expert,
  // stacked transposed into our (E, in, out)
  std::vector<std::string> names;
};

struct FamilyTools {
  const char* arch;  // model.arch

  // ---- Hugging Face folders (train/checkpoint/hf.h)
  // The config.json model_types read as this family, with transformers' class for each.
  struct ModelType {
    const char* name;          // "qwen2"
    const char* architecture;  // "Qwen2ForCausalLM"
  };
  std::vector<ModelType> model_types;
  // config.json (train/io/hf_config.h): a model_type's own keys into hf, under its names and
  // defaults, refusing the options ndtrain would ignore; the checks every HfConfig of the
  // family passes, read or about to be written (keys named as the model_type names them);
  // its own keys written.
  void (*read_config)(const io::HfKeys& k, io::HfConfig& hf);
  void (*check_config)(const io::HfConfig& hf, const std::string& where);
  void (*write_config)(const io::HfConfig& hf, nlohmann::json& j);
  // The folder's fields beyond the shared sizes (layers, heads, width, vocabulary, positions,
  // norm epsilon) into the model, and back (to_hf sets hf.model_type); from_hf throws
  // ndt::Error for what the family cannot build.
  void (*from_hf)(const io::HfConfig& hf, models::GPTConfig& c);
  void (*to_hf)(const models::GPTConfig& c, io::HfConfig& hf);
  // Every parameter of the whole model -> its source in a folder.
  std::map<std::string, HfSource> (*sources)(const models::GPTConfig& c);
  // A prefix the folder's names may lack ("transformer." on some GPT-2 folders), or "".
  const char* optional_prefix;

  // ---- the planner
  const BlockKind* planner;
};

// The tools of model.arch `arch`, or of a folder's model_type; throw ndt::Error naming the known ones.
const FamilyTools& family_tools(const std::string& arch);
const FamilyTools& tools_for_model_type(const std::string& model_type);
const FamilyTools* find_tools_for_model_type(const std::string& model_type);  // nullptr: unknown
// "gpt2, llama, mistral and qwen2": every model_type read; transformers' class of one.
std::string model_type_names();
const char* architecture_of(const std::string& model_type);

}  // namespace ndt::train
