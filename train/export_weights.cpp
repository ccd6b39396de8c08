// export_weights: a sharded checkpoint as one safetensors file of whole parameters with
// GPT-2 (Hugging Face) names, for init_from, sampling or other tools.
//
//   build/export_weights out/ckpt/step_00001000 gpt2.safetensors
#include <iostream>

#include "train/sharded.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: export_weights CHECKPOINT_DIR OUT.safetensors\n"
                 "  writes the whole parameters of a sharded checkpoint (checkpoint.format = sharded) to one "
                 "file\n";
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
