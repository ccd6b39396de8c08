// ndtrain: the GPT family to and from Hugging Face model folders (the names and layouts of
// transformers' LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM; io::HfFolder reads
// and writes the folder itself).
//
//   models::GPTConfig c = ckpt::model_config(io::read_hf_config("Llama-3.2-1B/config.json"));
//   ckpt::load_hf_local(io::HfFolder("Llama-3.2-1B"), gpt, params);   // this rank's elements
//   ckpt::export_hf("out/hf", gpt, whole_params, DType::bf16);        // from_pretrained loads it
//
// How a llama's parameters map (ours: Linear weights in (in, out), HF: nn.Linear's (out, in)):
//
//   wte.weight (Vp, C)               model.embed_tokens.weight (V, C); the padded rows are zero
//   lm_head.weight (Vp, C)           lm_head.weight (V, C) (none when tie_word_embeddings)
//   ln_f.weight                      model.norm.weight
//   h.i.ln_1.weight, h.i.ln_2.weight model.layers.i.input_layernorm, .post_attention_layernorm
//   h.i.attn.c_attn.weight (C, NKV (G+2) HS)
//                                    q_proj (NH HS, C), k_proj, v_proj (NKV HS, C), transposed
//                                    and packed by kv group: for group g, its G query heads,
//                                    then k_g, then v_g (nn::GroupedQueryAttention); the
//                                    same for their biases (Qwen2)
//   h.i.attn.c_proj.weight (C, C)    self_attn.o_proj.weight, transposed
//   h.i.mlp.{gate,up,down}_proj      mlp.{gate,up,down}_proj.weight, transposed
//
// Rotary embeddings follow transformers' convention (rotate_half over the two halves of each
// head), so no weight is permuted. A GPT-2 folder keeps GPT-2's own names and layout.
//
// Loading reads one tensor of the folder at a time: a parameter that is only renamed is
// read piece by piece, straight into this rank's shard; one that is transposed or packed
// is assembled whole on the CPU (the largest is one block matrix, I x C) and this rank's
// elements copied from it. Everything is checked (every tensor present, of its shape,
// finite; nothing left over) before any value is copied.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "models/gpt.h"
#include "nn/flat.h"
#include "train/checkpoint/tokenizer_files.h"
#include "train/io/hf_folder.h"

namespace ndt::ckpt {

// Whether `path` is a Hugging Face model folder (a directory holding config.json).
bool is_hf_folder(const std::string& path);

// The model a folder's config.json describes (block_size: max_position_embeddings). Throws
// ndt::Error for what ndtrain cannot build (a llama with biases on o_proj).
models::GPTConfig model_config(const io::HfConfig& hf);
// The config.json of a model (the dtype written as torch_dtype).
io::HfConfig hf_config(const models::GPTConfig& c, DType dtype);

// Every tensor gpt's whole model needs present in the folder with its shape, nothing left
// over, and a stored lm_head of a tied model equal to the embeddings: read from the
// safetensors headers (and for that one comparison, the two tensors), nothing allocated for
// the model. Throws ndt::Error naming the folder and the tensors.
void check_hf_folder(const io::HfFolder& folder, const models::GPT& gpt);

// This rank's elements of every parameter (its tensor-parallel slice, its FSDP shard), from
// the folder, after check_hf_folder. Throws ndt::Error naming the folder and the tensor for a missing, extra,
// mis-shaped or non-finite tensor, before anything is copied.
void load_hf_local(const io::HfFolder& folder, const models::GPT& gpt, const nn::FlatParams& params);

// Our whole tensors (whole(name): a parameter's value or gradient, as one process holds it)
// under the folder's names and shapes, in float64: what export writes, and what tests compare
// with transformers' gradients.
std::vector<std::pair<std::string, Tensor>> hf_tensors(
    const models::GPT& gpt, const std::function<Tensor(const std::string&)>& whole);

// Writes the model (params: whole, as one process holds them) as a Hugging Face folder in
// `dtype` (f32 or bf16), sharded like transformers past max_shard_bytes (io::HfFolderWriter).
void export_hf(const std::string& dir, const models::GPT& gpt, const nn::FlatParams& params, DType dtype,
               int64_t max_shard_bytes = io::HfFolderWriter::kDefaultMaxShardBytes);
// The same with a checkpoint's tokenizer (export_tokenizer): tokenizer.json and the files
// beside it, the special ids in config.json, generation_config.json; what the folder lacks,
// and why, is one line on `note`.
void export_hf(const std::string& dir, const models::GPT& gpt, const nn::FlatParams& params, DType dtype,
               const TokenizerFiles& tokenizer, std::ostream& note,
               int64_t max_shard_bytes = io::HfFolderWriter::kDefaultMaxShardBytes);

}  // namespace ndt::ckpt
