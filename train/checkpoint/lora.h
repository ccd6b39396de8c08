// ndtrain: a LoRA run's checkpoints and its Hugging Face PEFT adapter folders.
//
// A LoRA run (lora.rank > 0) trains only its adapters (nn/lora.h), so its checkpoints hold
// only them, whole in any layout (tensor parallelism's slices and the pipeline stages'
// adapters gathered onto rank 0, ckpt::save_run; each rank reads its elements on resume): model.safetensors
// with the adapters by ndtrain's names (h.0.self_attn.q_proj.lora_A, ...) and state.safetensors with their
// AdamW moments, the data position, and the [lora] settings and the base (model.init_from and its config) in
// the metadata ("lora.rank", "lora.base", ...). The base model is not copied: it is read again from
// model.init_from.
//
//   st.extra.merge(ckpt::lora_metadata(gpt, init_from));        // what the checkpoint says
//   ckpt::export_lora("ckpt/step_00000100", "adapter", false, DType::f32, std::cerr);   // PEFT
//   ckpt::export_lora("ckpt/step_00000100", "merged", true, DType::f32, std::cerr);     // HF model
//   nn::LoraConfig c = ckpt::read_peft_config("adapter");     // lora.init_from: its settings,
//   ckpt::load_peft_adapters("adapter", "llama", adapters);   // then its tensors
//   ckpt::merge_adapter("adapter", gpt);                      // generate --adapter
//
// A PEFT folder is what PeftModel.from_pretrained(base, DIR) loads: adapter_config.json (r,
// lora_alpha, target_modules, use_rslora, lora_dropout, base_model_name_or_path, task_type
// CAUSAL_LM, peft_type LORA) and adapter_model.safetensors with PEFT's names
// (base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight; GPT-2:
// base_model.model.transformer.h.0.attn.c_attn.lora_A.weight). Merged, the base's linears
// get W += scale (B A)^T in their columns (the Llama's packed c_attn: q's, k's or v's) and
// the model is written as a Hugging Face folder, as export_weights writes any model.
#pragma once

#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "nn/flat.h"

namespace ndt::ckpt {

// What a LoRA run's checkpoint records of it (TrainState::extra): the [lora] settings, the
// targets it resolved to, and its base (the path given as model.init_from; its config.json).
std::map<std::string, std::string> lora_metadata(const models::GPT& gpt, const std::string& base);
// Whether a state's metadata (TrainState::extra) is a LoRA run's.
bool is_lora_state(const std::map<std::string, std::string>& extra);

// The adapters (params: whole, unsharded) by name into a safetensors file, and back (every
// name and shape checked before anything is copied; one line naming what differs).
void save_adapters(const std::string& path, const nn::FlatParams& params,
                   const std::map<std::string, std::string>& metadata);
void load_adapters(const std::string& path, const nn::FlatParams& params);

// The adapters as one process holds them (the single-process layout, on the CPU; their
// values overwritten by whoever reads into them), for a model of cfg with adapters `lora`.
struct WholeAdapters {
  std::unique_ptr<models::GPT> gpt;  // described only, with its adapters
  nn::FlatParams params;
};
WholeAdapters whole_adapters(const models::GPTConfig& cfg, const nn::LoraConfig& lora);
// Whole adapters (and, with m non-empty, their AdamW moments m, v: one buffer per unit) into
// this rank's `local` (mlocal, vlocal): its elements of each of its parameters, found by
// name (tensor parallelism: its slices; a pipeline stage: its blocks' adapters).
void scatter_adapters(const nn::FlatParams& whole, const std::vector<Tensor>& m, const std::vector<Tensor>& v,
                      const nn::FlatParams& local, const std::vector<Tensor>& mlocal,
                      const std::vector<Tensor>& vlocal);

// Whether `path` (a checkpoint's step folder, or a checkpoint.dir: its latest) holds a LoRA
// run's checkpoint; its step folder in *step.
bool is_lora_checkpoint(const std::string& path, std::string* step = nullptr);

// export_weights of a LoRA run's checkpoint: a PEFT adapter folder at `out`, or with merge the
// base model (read from the checkpoint's lora.base) with the adapters merged in, as a Hugging
// Face model folder in `dtype`. Written to out.tmp and renamed. Returns the step folder.
std::string export_lora(const std::string& path, const std::string& out, bool merge, DType dtype,
                        std::ostream& note);

// Whether `dir` is a PEFT adapter folder (holds adapter_config.json).
bool is_peft_folder(const std::string& dir);

// A PEFT adapter folder's LoRA settings (r, lora_alpha, target_modules, use_rslora,
// lora_dropout), checked: one line naming an option ndtrain does not apply (use_dora,
// modules_to_save, bias, lora_bias, layers_to_transform, rank_pattern, alpha_pattern, a regex
// target_modules, ...) or a folder without adapter_model.safetensors.
nn::LoraConfig read_peft_config(const std::string& dir);

// The folder's adapter_model.safetensors (PEFT's names) into `params`, the adapters of a model
// of family `arch` (whole; ndtrain's names): every name and shape checked before anything is
// copied, one line naming a tensor the run lacks, has too many of, or shaped for another base.
void load_peft_adapters(const std::string& dir, const std::string& arch, const nn::FlatParams& params);

// A run's starting weights: the model's own (model.init_from, `base` opened from base_path;
// each rank reads only its elements) into `model`, and the adapters of a PEFT folder
// (lora.init_from, `adapters`; this rank's elements of them) into `adapter_params`; either path may be
// "" (nothing to load). Returns the lines to say ("initialized from ...", "adapters from ...").
struct WeightSource;
std::string load_start_weights(const WeightSource& base, const std::string& base_path,
                               const std::string& adapters, const models::GPT& gpt, nn::FlatParams& model,
                               const nn::FlatParams& adapter_params, std::ostream* warn);

// generate --adapter: `path` (a PEFT folder, or a LoRA run's checkpoint) merged into gpt's
// weights (materialized, float32, on the host): W += scale (B A)^T in each adapted linear's
// columns, as export_weights --merge does. Returns what was merged, for a line of output.
std::string merge_adapter(const std::string& path, const models::GPT& gpt);

}  // namespace ndt::ckpt
