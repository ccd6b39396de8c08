// ndtrain: model weights with Hugging Face GPT-2 names, and training checkpoints.
//
// Weights: a safetensors file with HF GPT-2 names (wte.weight, wpe.weight,
// h.{i}.ln_1.weight, h.{i}.attn.c_attn.weight [C, 3C] in Conv1D (in x out) layout, ...,
// ln_f.bias), optionally under a "transformer." prefix (a file holding both X and
// transformer.X is refused: one of them would be dropped), F32/BF16/F16. So a model can start
// from GPT-2 weights downloaded from the Hub (docs/gpt2-weights.md), and our checkpoints
// load there too. lm_head.weight, if present, must equal wte.weight (tied) unless the model
// has its own (an untied llama: then it is that parameter, saved with vocab_size rows as
// wte); attn.bias and attn.masked_bias (causal-mask buffers) are ignored.
//
// Checkpoints: <dir>/step_NNNNNNNN/{model.safetensors, state.safetensors} and <dir>/latest
// naming the newest complete one. A checkpoint is written into a temporary directory and
// renamed into place, then `latest` is replaced atomically, so a crash mid-write leaves the
// previous checkpoint intact and `latest` pointing at it. Each checkpoint directory also
// holds checkpoint.json, written last, with the size and XXH64 checksum of each file;
// load_checkpoint (and load_weights of a checkpoint's model.safetensors) verify them
// before any value is used. Weights holding NaN or Inf are never saved nor loaded. The run's
// tokenizer goes beside them, listed under checkpoint.json's "tokenizer" (tokenizer_files.h).
//
//   ckpt::save_weights("gpt.safetensors", gpt, params);
//   ckpt::load_weights("gpt2.safetensors", gpt, params);   // throws on missing/extra/mis-shaped
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "models/gpt.h"
#include "nn/flat.h"
#include "optim/adamw.h"
#include "train/checkpoint/tokenizer_files.h"
#include "train/data/data.h"

namespace ndt::ckpt {

void save_weights(const std::string& path, const models::GPT& gpt, const nn::FlatParams& params,
                  const std::map<std::string, std::string>& metadata = {});
// Validates every name and shape first, and only then copies into params.
void load_weights(const std::string& path, const models::GPT& gpt, const nn::FlatParams& params);

struct TrainState {
  int64_t step = 0;  // steps completed
  data::LoaderState loader;
  std::map<std::string, std::string> extra;  // e.g. config text, for messages
  TokenizerFiles tokenizer;                  // the run's tokenizer, written beside the weights
};

// AdamW's moments as whole unit buffers, one (numel) tensor per unit: what a checkpoint
// holds, whatever the layout that wrote it (sharded runs gather them first, and keep only
// their shard of what they load), so a checkpoint resumes in any layout.
struct Moments {
  std::vector<Tensor> m, v;
  int64_t steps = 0;  // AdamW steps taken (bias correction)
};

// Pruning old checkpoints (keep > 0) never fails a save: the new checkpoint is complete and
// `latest` names it before anything is deleted. An old checkpoint that cannot be deleted
// stays on disk and is reported as one "warning: ..." line on *out, once per path
// (`reported` remembers the paths from save to save). Without a log: std::cerr, every time.
struct PruneLog {
  explicit PruneLog(std::ostream* out = nullptr) : out(out) {}
  std::ostream* out;
  std::set<std::string> reported;
};

// Writes a complete checkpoint of step `state.step`; keeps the newest `keep` (0: all).
// The parameters' values must be whole (gathered when sharded).
std::string save_checkpoint(const std::string& dir, const models::GPT& gpt, const nn::FlatParams& params,
                            const Moments& moments, const TrainState& state, int keep,
                            PruneLog* prune_log = nullptr);
std::string save_checkpoint(const std::string& dir, const models::GPT& gpt, const nn::FlatParams& params,
                            const optim::AdamW& opt, const TrainState& state, int keep,
                            PruneLog* prune_log = nullptr);  // unsharded
// Moves the complete checkpoint directory `tmp` (written and fsynced) to <dir>/<name>, points
// <dir>/latest at it, and keeps the newest `keep` checkpoints (0: all). Returns the path.
std::string publish_checkpoint(const std::string& dir, const std::string& name, const std::string& tmp,
                               int keep, PruneLog* prune_log = nullptr);
// The checkpoint to resume from: the directory named by <dir>/latest, or the newest complete
// step_* directory when latest is missing or names an older one (a crash between a
// checkpoint's rename and latest's update); nullopt when there is none. A latest that is
// not a file, empty or malformed is an error.
std::optional<std::string> latest_checkpoint(const std::string& dir);
// The step of a checkpoint directory name "step_<digits>", or nullopt.
std::optional<int64_t> step_of(const std::string& name);
// Checks the files of a checkpoint directory (all, or those named in `only`) against
// the sizes and checksums in its checkpoint.json; throws one line naming the bad file.
// Every name in `only` must be listed there.
void verify_checkpoint(const std::string& path, const std::vector<std::string>& only = {});
// Checks one file of a checkpoint directory against its size and checksum (16 hex digits);
// throws one line naming the file.
void verify_file(const std::string& dir, const std::string& name, uint64_t bytes, const std::string& xxh64);
// Loads weights (into the parameters' values, which must be whole), the moments (whole
// buffers, on the CPU) and the state from a checkpoint directory.
TrainState load_checkpoint(const std::string& path, const models::GPT& gpt, const nn::FlatParams& params,
                           Moments& moments);
TrainState load_checkpoint(const std::string& path, const models::GPT& gpt, const nn::FlatParams& params,
                           optim::AdamW& opt);  // unsharded

// RAM-efficient loading, for any layout: each rank reads, from the memory-mapped files,
// only the bytes of its own elements (its tensor-parallel slice of each parameter, and of
// that its FSDP shard) into its shards (params.units[i].data); no rank holds the model.
void load_weights_local(const std::string& path, const models::GPT& gpt, const nn::FlatParams& params);
// The same for a checkpoint: weights, this rank's shards of the AdamW moments (m and v, one
// shard-sized tensor per unit), and the state. `whole` is the single-process layout of the
// units (nn::flat_layout of the undivided model), which the checkpoint's moment buffers follow but
// for the vocabulary's padding: a checkpoint written with another model.vocab_multiple loads
// (the padded rows of wte and of an untied lm_head are zero and never trained; they are
// dropped or added as zeros). The rank's units and parameters are found there by name: under
// pipeline parallelism `gpt` and `params` are one stage's part (its blocks, and of the unit
// "embeddings" only what the stage uses).
TrainState load_checkpoint_local(const std::string& path, const models::GPT& gpt,
                                 const nn::FlatParams& params, const std::vector<nn::FlatUnit>& whole,
                                 const std::vector<Tensor>& m, const std::vector<Tensor>& v,
                                 int64_t* adam_steps);

// "NaN" or "Inf" for the first value of t (any floating dtype) that is not finite, or null:
// what the loaders refuse in a weights file or a model folder, each naming its source.
const char* non_finite_kind(const Tensor& t);

}  // namespace ndt::ckpt
