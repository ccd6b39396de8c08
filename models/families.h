// ndtrain: the list of model families, the one place that names them all.
//
// X(arch) for each: models/families/<arch>.cpp defines models::kFamily_<arch> (the model's side,
// models/family.h) and train/families/<arch>.cpp train::kTools_<arch> (Hugging Face names and
// config.json keys, the planner's costs: train/families/family_tools.h). Adding a family: its two
// files, its fields in models/gpt_config.h, and its line here.
#pragma once

#define NDT_MODEL_FAMILIES(X) \
  X(gpt2)                     \
  X(llama)
