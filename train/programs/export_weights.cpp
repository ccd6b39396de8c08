// export_weights: a sharded checkpoint as whole parameters for Hugging Face transformers,
// init_from, sampling or other tools: a model folder (config.json and safetensors, sharded
// like transformers' past 5 GB) that AutoModelForCausalLM.from_pretrained loads, or one
// safetensors file with ndtrain's names (for GPT-2, Hugging Face's GPT-2 names).
//
//   build/export_weights out/ckpt/step_00001000 out/hf                    # a folder, float32
//   build/export_weights --dtype bfloat16 out/ckpt/step_00001000 out/hf   # a folder, bfloat16
//   build/export_weights out/ckpt/step_00001000 gpt2.safetensors          # GPT-2: one file
//
// A folder is written as io::HfFolderWriter says (never half-written in place of a good one).
// The output is written to OUT.tmp and renamed into place, so a failed export leaves no
// half-written file; an output inside a checkpoint directory is refused.
#include <iostream>
#include <string>
#include <vector>

#include "train/checkpoint/sharded.h"

namespace {

constexpr const char* kUsage =
    "usage: export_weights [--dtype float32|bfloat16] CHECKPOINT_DIR OUT\n"
    "  writes the whole parameters of a sharded checkpoint (checkpoint.format = sharded): OUT a directory:\n"
    "  a Hugging Face model folder (config.json, safetensors) for transformers' from_pretrained and\n"
    "  model.init_from; OUT ending in .safetensors: one file with ndtrain's names (GPT-2: Hugging Face's). OUT must lie\n"
    "  outside every checkpoint directory. --dtype: of the folder's tensors (default float32)\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args;
  ndt::DType dtype = ndt::DType::f32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (a == "--dtype") {
      const std::string v = i + 1 < argc ? argv[++i] : "";
      if (v != "float32" && v != "bfloat16") {
        std::cerr << "export_weights: error: --dtype takes float32 or bfloat16, got '" << v << "'\n";
        return 2;
      }
      dtype = v == "bfloat16" ? ndt::DType::bf16 : ndt::DType::f32;
      continue;
    }
    if (a.size() > 1 && a[0] == '-') {
      std::cerr << "export_weights: error: unknown option " << a << " (see --help)\n";
      return 2;
    }
    args.push_back(a);
  }
  if (args.size() != 2) {
    std::cerr << "export_weights: error: expected CHECKPOINT_DIR OUT, got " << args.size()
              << " arguments (see --help)\n";
    return 2;
  }
  try {
    ndt::ckpt::export_weights(args[0], args[1], dtype);
    std::cout << "wrote " << args[1] << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "export_weights: error: " << e.what() << "\n";
    return 1;
  }
}
