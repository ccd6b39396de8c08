// export_weights: a sharded checkpoint as one safetensors file of whole parameters with
// GPT-2 (Hugging Face) names, for init_from, sampling or other tools.
//
//   build/export_weights out/ckpt/step_00001000 gpt2.safetensors
//
// The output is written to OUT.tmp and renamed into place, so a failed export leaves no
// half-written file; an output inside a checkpoint directory is refused.
#include <cstring>
#include <iostream>

#include "train/checkpoint/sharded.h"

namespace {

constexpr const char* kUsage =
    "usage: export_weights CHECKPOINT_DIR OUT.safetensors\n"
    "  writes the whole parameters of a sharded checkpoint (checkpoint.format = sharded) to one file\n"
    "  with GPT-2 names; OUT must lie outside every checkpoint directory\n";

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::cout << kUsage;
      return 0;
    }
  for (int i = 1; i < argc; ++i)
    if (argv[i][0] == '-' && argv[i][1] != '\0') {
      std::cerr << "export_weights: error: unknown option " << argv[i] << " (see --help)\n";
      return 2;
    }
  if (argc != 3) {
    std::cerr << "export_weights: error: expected CHECKPOINT_DIR OUT.safetensors, got " << argc - 1
              << " arguments (see --help)\n";
    return 2;
  }
  try {
    ndt::ckpt::export_weights(argv[1], argv[2]);
    std::cout << "wrote " << argv[2] << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "export_weights: error: " << e.what() << "\n";
    return 1;
  }
}
