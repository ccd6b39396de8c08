// ndtrain: Hugging Face model folders, read and written as transformers' from_pretrained and
// save_pretrained do: config.json beside the weights, either one model.safetensors or shards
// model-00001-of-0000N.safetensors listed by model.safetensors.index.json. This is the I/O
// layer only: which tensor names a model has, and how they map to ndtrain's, is the model's.
//
//   io::HfFolder in("Llama-3.2-1B");                     // config.json parsed strictly, shards opened
//   const io::HfConfig& c = in.config();                 // c.hidden_size, c.rope_theta, c.llama3_scaling
//   Tensor w = in.get("model.layers.0.self_attn.q_proj.weight");          // f32 CPU copy
//   in.read_range(name, begin, dst);                     // or piece by piece from its mapped shard
//   in.bytes_read();                                     // the tensor bytes get and read_range read
//
//   io::HfFolderWriter out;
//   out.add("model.embed_tokens.weight", emb);           // CPU tensors; dtype kept (bf16 -> BF16)
//   out.add_file("tokenizer.json", text);                // other files of the folder, written with it
//   out.write("export", c);                              // config.json + model.safetensors, or shards
//                                                        // + index past 5 GB (transformers' "5GB")
//
// config.json is read strictly (train/io/hf_config.h).
//
// Writing (HfFolderWriter::write) never leaves a half-written folder in place of a good one:
//   - DIR absent: everything is written into the sibling DIR.ndt-partial, which is renamed to
//     DIR at the end (DIR appears whole or not at all).
//   - DIR present: everything is first written into DIR/.ndt-partial; then the old entry points
//     (model.safetensors, model.safetensors.index.json) are removed, the new shard files and
//     config.json renamed into DIR, and the entry point (model.safetensors or the index)
//     renamed last; shards model-NNNNN-of-MMMMM.safetensors of an earlier export that the new
//     one does not use are removed. Only files of these names (and those add_file names,
//     renamed in before the entry point) are replaced or removed: a README in DIR stays, and
//     so does a tokenizer the export does not write. A crash during the renames
//     leaves DIR with no weight entry point (transformers then fails loudly) rather than a mix
//     of two exports; writing again repairs it. One writer per DIR at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensor/tensor.h"
#include "train/io/hf_config.h"
#include "train/io/safetensors.h"

namespace ndt::io {

// A Hugging Face model folder opened for reading: config.json parsed, every weight file
// memory-mapped and its header checked up front (mapping costs no reads).
class HfFolder {
 public:
  explicit HfFolder(const std::string& dir);  // throws ndt::Error naming the folder and file
  HfFolder(const HfFolder&) = delete;
  HfFolder& operator=(const HfFolder&) = delete;

  const std::string& dir() const { return dir_; }
  const HfConfig& config() const { return config_; }
  bool has(const std::string& name) const { return where_.count(name) > 0; }
  const SafeTensorsReader::Entry& entry(const std::string& name) const;  // dtype, shape, bytes
  const SafeTensorsReader& reader(const std::string& name) const;        // the shard holding it
  Tensor get(const std::string& name, DType dtype = DType::f32) const;   // a CPU copy
  // Elements [begin, begin + dst.numel()) of the flattened tensor into dst (a contiguous CPU
  // tensor): only those bytes of its shard are read (SafeTensorsReader::read_range).
  void read_range(const std::string& name, int64_t begin, const Tensor& dst) const;
  // The bytes of tensor data (as stored: 2 per bf16 element) read through get and read_range
  // since the folder was opened; reads through reader(name) directly are not counted.
  int64_t bytes_read() const { return bytes_read_; }
  std::vector<std::string> names() const;  // every tensor, sorted
  std::vector<std::string> files() const;  // the weight files' paths, in shard order

 private:
  size_t shard_of(const std::string& name) const;
  std::string dir_;
  HfConfig config_;
  std::vector<std::unique_ptr<SafeTensorsReader>> shards_;
  std::map<std::string, size_t> where_;  // tensor -> index in shards_
  mutable std::atomic<int64_t> bytes_read_{0};
};

// Collects tensors, then writes a folder transformers loads (see the top of this file for how
// DIR is replaced). Shards are cut as huggingface_hub's split_torch_state_dict_into_shards
// does: tensors in the order added; a new shard starts when the next tensor would take the
// current one past max_shard_bytes (tensor bytes, headers not counted); a tensor larger than
// that gets a shard of its own. Every file's header carries {"format": "pt"}.
class HfFolderWriter {
 public:
  static constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;  // transformers' "5GB"
  void add(const std::string& name, const Tensor& t);              // CPU copy kept if t is on a GPU
  // Another file of the folder (tokenizer.json, generation_config.json, ...), written and
  // replaced with the weights; a plain name other than config.json and the weights' names.
  void add_file(const std::string& name, const std::string& bytes);
  void write(const std::string& dir, const HfConfig& config,
             int64_t max_shard_bytes = kDefaultMaxShardBytes) const;

 private:
  std::vector<std::pair<std::string, Tensor>> tensors_;
  std::map<std::string, std::string> files_;  // add_file's
};

}  // namespace ndt::io
