// export_weights: a sharded checkpoint as whole parameters for Hugging Face transformers,
// init_from, sampling or other tools: a model folder (config.json and safetensors, sharded
// like transformers' past 5 GB, with the tokenizer the checkpoint carries: tokenizer.json,
// tokenizer_config.json, generation_config.json, the special ids in config.json; see
// train/checkpoint/tokenizer_files.h) that AutoTokenizer, AutoModelForCausalLM.from_pretrained
// and pipeline load, or one safetensors file with ndtrain's names (for GPT-2, Hugging Face's
// GPT-2 names). What a folder lacks (the tokenizer of an older checkpoint), and why, is one
// line on stderr.
//
//   build/export_weights out/ckpt/step_00001000 out/hf                    # a folder, float32
//   build/export_weights --dtype bfloat16 out/ckpt/step_00001000 out/hf   # a folder, bfloat16
//   build/export_weights out/ckpt/step_00001000 gpt2.safetensors          # GPT-2: one file
//   build/export_weights out/ckpt out/hf                                  # the latest checkpoint
//   build/export_weights out/lora/ckpt out/adapter             # a LoRA run: a PEFT adapter folder
//   build/export_weights --merge out/lora/ckpt out/merged      # ... its base with the adapters merged
//
// A folder is written as io::HfFolderWriter says (never half-written in place of a good one).
// The output is written to OUT.tmp and renamed into place, so a failed export leaves no
// half-written file; an output inside a checkpoint directory is refused.
#include <iostream>
#include <string>
#include <vector>

#include "train/checkpoint/sharded.h"
#include "train/command_line.h"

int main(int argc, char** argv) {
  namespace po = boost::program_options;
  std::string dtype = "float32";
  bool merge = false;
  std::vector<std::string> args;
  po::options_description opts(
      "export_weights: the whole parameters of a sharded checkpoint (checkpoint.format = sharded)\n\n"
      "Usage: export_weights [--dtype float32|bfloat16] CHECKPOINT_DIR OUT\n"
      "  CHECKPOINT_DIR a checkpoint's step folder, or checkpoint.dir (its latest checkpoint)\n"
      "  OUT a directory: a Hugging Face model folder (config.json, safetensors, the run's tokenizer)\n"
      "  for transformers and model.init_from; OUT ending in .safetensors: one file with ndtrain's names\n"
      "  (GPT-2: Hugging Face's). OUT must lie outside every checkpoint directory.\n"
      "  A LoRA run's checkpoint (lora.rank > 0): OUT is a PEFT adapter folder (adapter_config.json,\n"
      "  adapter_model.safetensors) for PeftModel.from_pretrained; with --merge, its base model\n"
      "  (model.init_from) with the adapters merged in, as a Hugging Face model folder.\n\nOptions");
  opts.add_options()("help,h", "print this help")("dtype", po::value(&dtype)->default_value(dtype),
                                                  "of the folder's tensors: float32 or bfloat16")(
      "merge", po::bool_switch(&merge), "a LoRA run's checkpoint: write the merged model, not the adapter")(
      "paths", po::value(&args), "CHECKPOINT_DIR OUT (the two arguments)");
  po::positional_options_description pos;
  pos.add("paths", -1);
  try {
    po::variables_map vm;
    if (!ndt::train::parse_command_line(argc, argv, opts, pos, {}, vm)) return 0;  // --help
    if (dtype != "float32" && dtype != "bfloat16")
      throw ndt::Error("--dtype takes float32 or bfloat16, got '" + dtype + "'");
    if (args.size() != 2)
      throw ndt::Error("expected CHECKPOINT_DIR OUT, got " + std::to_string(args.size()) + " arguments");
  } catch (const std::exception& e) {
    std::cerr << "export_weights: error: " << e.what() << " (see --help)\n";
    return 2;
  }
  try {
    const std::string step = ndt::ckpt::export_weights(
        args[0], args[1], dtype == "bfloat16" ? ndt::DType::bf16 : ndt::DType::f32, std::cerr, merge);
    std::cout << "wrote " << args[1] << " from " << step << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "export_weights: error: " << e.what() << "\n";
    return 1;
  }
}
