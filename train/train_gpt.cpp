// train_gpt: train a GPT from an INI config. See `train_gpt --help` and docs/config.md.
#include <iostream>

#include "train/trainer.h"

int main(int argc, char** argv) { return ndt::train::train_main(argc, argv, std::cout, std::cerr); }
