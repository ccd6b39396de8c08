// train_gpt: train a GPT from an INI config. See `train_gpt --help` and docs/training.md.
#include <iostream>

#include "tensor/threads.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
  ndt::use_cpu_defaults(argv);
  return ndt::train::train_main(argc, argv, std::cout, std::cerr);
}
